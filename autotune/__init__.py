"""autotune: a closed-loop auto-tuner for LLM serving engines (vLLM, SGLang).

What a notebook needs, importable from the top (each loaded on first use, so ``import autotune``
stays light)::

    import autotune
    best = autotune.run_study(job)                    # a TuneJob: engine, space, workload, study
    frame = autotune.load_trials("nightly")           # one row per trial, from results/
    study = autotune.load_study("nightly", url)       # the Optuna study itself
    autotune.export_trial(study, best, "docker")      # the trial as a launch file
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["TuneJob", "__version__", "export_trial", "load_study", "load_trials", "run_study"]
__version__ = "0.1.0"

_HOMES = {
    "TuneJob": "autotune.search.tune",
    "run_study": "autotune.search.tune",
    "load_study": "autotune.search.storage",
    "load_trials": "autotune.report.table",
    "export_trial": "autotune.report.launch",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'autotune' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)


def __dir__() -> list[str]:
    return sorted(__all__)
