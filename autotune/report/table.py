"""One row per trial (stage, outcome, flags, metrics, engine facts) as a pandas DataFrame."""

from __future__ import annotations

from typing import Any

import optuna
import pandas as pd

from autotune.search.storage import validation

__all__ = ["KEY_METRICS", "trials_frame"]

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


def _row(t: optuna.trial.FrozenTrial, checked: dict[str, Any]) -> dict[str, Any]:
    ua = t.user_attrs
    row: dict[str, Any] = {
        "trial": t.number,
        "stage": ua.get("stage", ""),
        "outcome": ua.get("outcome", t.state.name.lower()),
        "value": t.values[0] if t.values else None,
        "validated_median": checked.get("median"),
        "validated_spread": checked.get("spread"),
        "validates": ua.get("validates"),
        "host": ua.get("host"),
    }
    row.update({f"param.{k}": v for k, v in (ua.get("params") or {}).items()})
    metrics = ua.get("metrics") or {}
    row.update({k: metrics.get(k) for k in KEY_METRICS})
    row.update({f"fact.{k}": v for k, v in (ua.get("facts") or {}).items() if not isinstance(v, (dict, list))})
    row.update({f"time.{k}": v for k, v in (ua.get("timings") or {}).items()})
    row["reason"] = ua.get("reason", "")
    row["log_path"] = ua.get("log_path", "")
    return row


def trials_frame(study: optuna.Study) -> pd.DataFrame:
    """Every trial of the study, in trial order; absent values are NaN/None."""
    checked = validation(study)
    return pd.DataFrame([_row(t, checked.get(t.number, {})) for t in study.get_trials(deepcopy=False)])
