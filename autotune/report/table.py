"""One row per trial (stage, outcome, flags, metrics, engine facts) as a pandas DataFrame."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import pandas as pd

from autotune.search.record import DEFAULTS, study_config, trial_record, validation
from autotune.search.storage import default_storage_url, load_study

__all__ = ["FIXED_TYPES", "KEY_METRICS", "load_trials", "parquet_ready", "trials_frame"]

KEY_METRICS = (
    "output_throughput",
    "request_throughput",
    "mean_ttft_ms",
    "p95_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "p95_tpot_ms",
    "p99_itl_ms",
    "p95_e2el_ms",
    "error_rate",
)


#: The columns every study's table has, with one type each, whatever the study holds: a notebook
#: that concatenates studies gets one schema (the ``param.``, ``fact.``, ``time.`` and
#: ``startup.`` columns follow the study's space and engine).
FIXED_TYPES: dict[str, str] = {
    "trial": "Int64",
    "stage": "string",
    "outcome": "string",
    "early_stop": "string",
    "value": "Float64",
    "validated_median": "Float64",
    "validated_spread": "Float64",
    "validates": "Int64",  # a validation run: the finalist's trial number (none for the defaults)
    "validates_defaults": "boolean",  # a validation run of the engine's defaults
    "simulated": "boolean",  # measured on the simulator, not on an engine
    "host": "string",
    **dict.fromkeys(KEY_METRICS, "Float64"),
    "reason": "string",
    "log_path": "string",
}


def _row(t: optuna.trial.FrozenTrial, checked: dict[str, Any], simulated: bool) -> dict[str, Any]:
    r = trial_record(t)
    row: dict[str, Any] = {
        "trial": t.number,
        "stage": r.stage,
        "outcome": r.outcome or t.state.name.lower(),
        "early_stop": (r.early_stop or {}).get("reason"),
        "value": t.values[0] if t.values else None,
        "validated_median": checked.get("median"),
        "validated_spread": checked.get("spread"),
        "validates": r.validates if isinstance(r.validates, int) else None,
        "validates_defaults": r.validates == DEFAULTS if r.validates is not None else None,
        "simulated": simulated,
        "host": r.host or None,
    }
    row.update({f"param.{k}": v for k, v in (r.params or {}).items()})
    row.update({k: r.metrics.get(k) for k in KEY_METRICS})
    row.update({f"fact.{k}": v for k, v in r.facts.items() if not isinstance(v, (dict, list))})
    row.update({f"time.{k}": v for k, v in r.timings.items()})
    row.update({f"startup.{k}": v for k, v in (r.facts.get("startup") or {}).items()})
    row["reason"] = r.reason or ""
    row["log_path"] = r.log_path or ""
    return row


def trials_frame(study: optuna.Study, *, exact: bool = False) -> pd.DataFrame:
    """Every trial of the study, in trial order; absent values are NaN/None.

    ``exact`` keeps each value as it was recorded (object columns, None where absent): an
    integer knob stays ``2048`` rather than becoming ``2048.0`` in a column with gaps, which is
    what a table or a CSV file should show.
    """
    checked = validation(study)
    simulated = bool((study_config(study).get("engine") or {}).get("simulated"))
    rows = [_row(t, checked.get(t.number, {}), simulated) for t in study.get_trials(deepcopy=False)]
    if not exact:
        return pd.DataFrame(rows)
    columns = list(dict.fromkeys(key for row in rows for key in row))
    return pd.DataFrame([[row.get(c) for c in columns] for row in rows], columns=columns, dtype=object)


def _column_kind(values: list[Any]) -> str:
    present = [v for v in values if v is not None and not (isinstance(v, float) and v != v)]
    if not present:
        return "empty"
    if all(isinstance(v, bool) for v in present):
        return "bool"
    if all(isinstance(v, int) and not isinstance(v, bool) for v in present):
        return "int"
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present):
        return "float"
    if all(isinstance(v, str) for v in present):
        return "str"
    return "mixed"


def parquet_ready(frame: pd.DataFrame) -> pd.DataFrame:
    """An ``exact`` frame with one Arrow type per column: integers as nullable Int64, booleans as
    nullable booleans, numbers as floats, and a column of mixed kinds (a categorical knob with
    numbers and words) as text."""
    out = frame.copy()
    for column in out.columns:
        values = list(out[column])
        kind = _column_kind(values)
        if column in FIXED_TYPES:
            out[column] = _typed(values, FIXED_TYPES[column])
        elif kind == "int":
            out[column] = pd.array([None if _missing(v) else v for v in values], dtype="Int64")
        elif kind == "bool":
            out[column] = pd.array([None if _missing(v) else v for v in values], dtype="boolean")
        elif kind == "float":
            out[column] = pd.array([None if _missing(v) else float(v) for v in values], dtype="Float64")
        elif kind in ("mixed", "str"):
            out[column] = pd.array([None if _missing(v) else _text(v) for v in values], dtype="string")
        else:
            out[column] = pd.array([None] * len(values), dtype="string")
    return out


def _typed(values: list[Any], dtype: str) -> Any:
    """A fixed column in its one type (a float column's whole numbers stay floats)."""
    casts: dict[str, Callable[[Any], Any]] = {"Float64": float, "Int64": int, "boolean": bool, "string": _text}
    cast = casts[dtype]
    return pd.array([None if _missing(v) else cast(v) for v in values], dtype=dtype)


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and value != value)


def _text(value: Any) -> str:
    return json.dumps(value, separators=(",", ":")) if isinstance(value, (dict, list)) else str(value)


def load_trials(study: str, results: Path | str = "results", storage: str | None = None) -> pd.DataFrame:
    """A stored study's trials as a DataFrame (one row per trial), for a notebook.

    Args:
        study: The study's name.
        results: The results folder ``autotune tune --results`` wrote (its SQLite file).
        storage: An Optuna storage URL instead (e.g. a shared PostgreSQL study).
    """
    return trials_frame(load_study(study, storage or default_storage_url(Path(results), study)))
