"""One schema for every study's trial table: the fixed columns keep their type whatever a study holds."""

from __future__ import annotations

from typing import Any

import optuna
import pandas as pd

from autotune.report.table import FIXED_TYPES, parquet_ready, trials_frame


def _study(simulated: bool, runs: list[dict[str, Any]]) -> optuna.Study:
    study = optuna.create_study(direction="maximize")
    study.set_user_attr("config", {"engine": {"kind": "vllm", "simulated": simulated}})
    for attrs in runs:
        value = attrs.pop("value", None)
        state = optuna.trial.TrialState.COMPLETE if value is not None else optuna.trial.TrialState.FAIL
        study.add_trial(optuna.trial.create_trial(state=state, value=value, user_attrs=attrs))
    return study


def test_validates_simulated_and_empty_columns_have_one_type_in_every_study() -> None:
    # One study validated a finalist beside the defaults on the simulator; the other ran on an
    # engine, validated only a finalist that is the defaults, and has no metrics at all.
    first = _study(
        True,
        [
            {"stage": "baseline", "outcome": "ok", "value": 100.0, "metrics": {"output_throughput": 100}},
            {"stage": "validation", "outcome": "ok", "value": 120.0, "validates": 0},
            {"stage": "validation", "outcome": "ok", "value": 101.0, "validates": "defaults"},
        ],
    )
    second = _study(
        False,
        [
            {"stage": "baseline", "outcome": "crash"},
            {"stage": "validation", "outcome": "crash", "validates": 0},
        ],
    )
    tables = [parquet_ready(trials_frame(s, exact=True)) for s in (first, second)]
    for table in tables:
        assert {c: str(table[c].dtype) for c in FIXED_TYPES} == FIXED_TYPES
    assert tables[0]["validates"].tolist() == [pd.NA, 0, pd.NA]
    assert tables[0]["validates_defaults"].tolist() == [pd.NA, False, True]
    assert tables[0]["simulated"].all() and not tables[1]["simulated"].any()
