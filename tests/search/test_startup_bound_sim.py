"""``max_startup_s`` on the simulator: a trial is judged on its engine's modelled seconds to ready
(weights, then engine init, as its log gives them), not on the simulator's compressed wall time."""

from __future__ import annotations

from pathlib import Path

import pytest
from simstudy import SMALL_WORKLOAD, sim_job

from autotune.search.record import trial_records
from autotune.search.storage import load_study
from autotune.search.tune import run_study

SPACE = {"params": {"max_running": {"type": "categorical", "choices": [64]}}}


def _study(tmp_path: Path, bound: float) -> list:  # type: ignore[type-arg]
    job = sim_job(
        tmp_path / str(bound), SPACE, workload={**SMALL_WORKLOAD, "max_startup_s": bound},
        method="search", trials=1, finalists=0, noise_runs=0,
    )  # fmt: skip
    run_study(job)
    return trial_records(load_study(job.study.name, job.storage_url).trials)


@pytest.mark.sim
def test_engines_slower_to_ready_than_the_bound_are_infeasible(tmp_path: Path) -> None:
    slow = _study(tmp_path, 5.0)
    split = slow[0].facts["startup"]
    modelled = split["weights_s"] + split["init_s"]
    assert modelled > 5.0 and slow[0].timings["startup_s"] < modelled  # the wall clock ran faster
    assert [r.outcome for r in slow] == ["slo_violation", "slo_violation"]
    assert slow[0].violations["startup"] == pytest.approx((modelled - 5.0) / 5.0, rel=1e-6)
    roomy = _study(tmp_path, 60.0)
    assert [r.outcome for r in roomy] == ["ok", "ok"] and roomy[0].constraints["startup"] < 0
