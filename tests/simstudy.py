"""One simulated-study set-up for the tests that run the tuner's loop on the simulator.

The engine is ``python -m autotune_sim <kind>`` serving Llama-3.1-8B on a simulated H100 with a
fixed seed; each test module keeps only what it varies (workload, space, study settings, the
speed-up its timing allows).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from autotune.config import EngineSettings, SearchSpace, StudySettings, Workload, parse_model
from autotune.search.tune import TuneJob

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
#: Fast enough for a study in seconds; a module whose assertions read wall-clock rates sets its own.
SPEEDUP = 50
#: A small chat-shaped run: 24 requests at 16 concurrent, a bound no simulated run comes near.
SMALL_WORKLOAD: dict[str, Any] = {
    "name": "sim-small",
    "dataset": {"input_len": 256, "output_len": 32},
    "num_prompts": 24,
    "warmup_requests": 1,
    "arrival": {"concurrency": 16},
    "slos": {"p95_ttft_ms": 10000},
}


def sim_env(speedup: float = SPEEDUP, **extra: str) -> dict[str, str]:
    """The simulator's environment: an H100, seed 0, ``speedup`` × faster than modelled time."""
    return {"AUTOTUNE_SIM_GPU": "H100-80GB", "AUTOTUNE_SIM_SPEEDUP": f"{speedup:g}", "AUTOTUNE_SIM_SEED": "0", **extra}


def sim_engine(
    kind: str = "vllm", *, speedup: float = SPEEDUP, env: dict[str, str] | None = None, **settings: Any
) -> EngineSettings:
    """A simulated engine of ``kind`` (``vllm`` or ``sglang``); ``settings`` override any field."""
    fields = {
        "kind": kind,
        "model": MODEL,
        "command": [sys.executable, "-m", "autotune_sim", kind],
        "env": sim_env(speedup, **(env or {})),
        "startup_timeout_s": 60,
        "simulated": True,
        **settings,
    }
    return parse_model(EngineSettings, fields, "test engine")


def sim_job(
    results_dir: Path,
    space: dict[str, Any] | SearchSpace,
    *,
    engine: EngineSettings | None = None,
    workload: dict[str, Any] | Workload = SMALL_WORKLOAD,
    **study: Any,
) -> TuneJob:
    """A tuning job on the simulator; ``study`` gives StudySettings fields (name ``t``, seed 1 unless set)."""
    return TuneJob(
        engine=engine or sim_engine(),
        space=space if isinstance(space, SearchSpace) else parse_model(SearchSpace, space, "test space"),
        workload=workload if isinstance(workload, Workload) else parse_model(Workload, workload, "test workload"),
        study=parse_model(StudySettings, {"name": "t", "results_dir": results_dir, "seed": 1, **study}, "test study"),
    )


def unlaunched_job(tmp_path: Path, space: dict[str, Any], workload: dict[str, Any]) -> TuneJob:
    """A study job for tests that store trials by hand or stop at the launch: a vLLM adapter whose
    command (``python -c pass``) is never started."""
    engine = {"kind": "vllm", "model": "m", "command": [sys.executable, "-c", "pass"]}
    return TuneJob(
        engine=parse_model(EngineSettings, engine, "engine"),
        space=parse_model(SearchSpace, space, "space"),
        workload=parse_model(Workload, workload, "workload"),
        study=parse_model(StudySettings, {"name": "n", "results_dir": tmp_path, "seed": 3}, "study"),
    )
