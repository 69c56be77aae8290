"""A simulated trial's engine time, in modelled seconds, by phase (for the trial-cost benchmarks).

* ``load``, ``compile``, ``capture``: the seconds the engine logged (``facts.startup``);
* ``other start``: the simulator's import and engine-core start constants plus its profiling
  (engine init minus compile and capture); without a logged split, the start-up's wall time ×
  the speed-up;
* ``benchmark``: the run's duration (first request sent to last answer), already in modelled time
  (the client reads the simulator's stamps) — not the tuner's own work around it, which runs at
  wall speed on any engine;
* ``teardown``: wall time × the speed-up.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autotune_sim.dialects.vllm import CORE_START_S, IMPORT_S

PHASES = ("load", "compile", "capture", "other start", "benchmark", "teardown")


def engine_seconds(
    facts: Mapping[str, Any], timings: Mapping[str, float], metrics: Mapping[str, Any], speedup: float
) -> dict[str, float]:
    """Modelled engine seconds of one trial, per phase of :data:`PHASES`."""
    split = facts.get("startup") or {}
    logged = {
        "load": split.get("weights_s", 0.0),
        "compile": split.get("compile_s", 0.0),
        "capture": split.get("capture_s", 0.0),
    }
    init = split.get("init_s")
    if init:
        other = IMPORT_S + CORE_START_S + max(init - logged["compile"] - logged["capture"], 0.0)
    else:
        other = timings.get("startup_s", 0.0) * speedup
    served = metrics.get("duration")
    bench = float(served) if served is not None else timings.get("bench_s", 0.0) * speedup
    return {**logged, "other start": other, "benchmark": bench, "teardown": timings.get("teardown_s", 0.0) * speedup}
