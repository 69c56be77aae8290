"""Files written from a study on request: the Pareto front as JSON, the trial table as CSV or
Parquet. A file that cannot be written is one line naming the option and the reason."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna

from autotune.config import Objective, ObjectiveTerm, parse_model
from autotune.errors import ConfigError
from autotune.report.table import parquet_ready
from autotune.search.record import study_config, trial_record
from autotune.search.storage import pareto_front

__all__ = ["objective_terms", "write_csv", "write_front", "write_parquet"]


def write_front(st: optuna.Study, path: Path) -> Path:
    metrics = [t.metric for t in objective_terms(st)]
    points = [
        {
            "trial": t.number,
            "values": dict(zip(metrics, t.values, strict=False)),
            "flags": trial_record(t).flags,
            "export": f"autotune export {st.study_name} --trial {t.number}",
        }
        for t in pareto_front(st)
    ]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        front = {"schema_version": 1, "study": st.study_name, "objectives": metrics, "front": points}
        path.write_text(json.dumps(front, indent=2) + "\n")
    except OSError as err:
        raise ConfigError(f"cannot write {path}: {err.strerror or err}; check -o") from None
    return path


def objective_terms(st: optuna.Study) -> list[ObjectiveTerm]:
    objective = (study_config(st).get("workload") or {}).get("objective", {})
    return parse_model(Objective, objective, "study config").terms


def write_csv(frame: Any, path: Path) -> None:
    try:
        frame.to_csv(path, index=False)
    except OSError as err:
        raise ConfigError(f"--csv {path}: cannot write it ({err.strerror or err})") from None


def write_parquet(frame: Any, path: Path) -> None:
    try:
        parquet_ready(frame).to_parquet(path, index=False)
    except ImportError:
        raise ConfigError("--parquet needs pyarrow: pip install pyarrow (or use --csv)") from None
    except OSError as err:
        raise ConfigError(f"--parquet {path}: cannot write it ({err.strerror or err})") from None
