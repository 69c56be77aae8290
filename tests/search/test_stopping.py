"""When a search may end before its budget: no gain above the noise for a third of the budget."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from benchmark_loader import load_benchmark
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState, create_trial

from autotune.config import EngineSettings, SearchSpace, StudySettings, Workload, parse_model
from autotune.outcomes import Outcome
from autotune.report.status import stopped_line
from autotune.search.record import trial_record
from autotune.search.stopping import MIN_TRIALS, patience_for, stall_reason
from autotune.search.storage import load_study
from autotune.search.tune import TuneJob, run_study

MAX = StudyDirection.MAXIMIZE


def _trial(value: float | None, *, feasible: bool = True) -> FrozenTrial:
    attrs = {
        "stage": "search",
        "outcome": "ok" if value is not None else "crash",
        "constraints": [-1.0 if feasible else 1.0],
    }
    if value is None:
        return create_trial(state=TrialState.FAIL, user_attrs=attrs)
    return create_trial(state=TrialState.COMPLETE, value=value, user_attrs=attrs)


def _search(values: list[float | None]) -> list[FrozenTrial]:
    return [_trial(v) for v in values]


def test_a_search_whose_gains_stay_inside_the_noise_stops_after_its_patience() -> None:
    budget = 30
    patience = patience_for(budget)
    assert patience == 10
    flat = [100.0] + [103.0, 99.0, 104.0, 101.0] * 3  # within 5 % of the first
    assert stall_reason(_search(flat[: patience + 1]), MAX, budget, 0.05) is None  # 10 since the best
    why = stall_reason(_search(flat[: patience + 2]), MAX, budget, 0.05)
    assert why is not None and "last 10" in why and "5%" in why and "12 of 30" in why


def test_a_gain_above_the_noise_restarts_the_count_and_a_failure_counts_as_a_trial() -> None:
    budget = 30
    rising = [100.0] * 8 + [110.0] + [None] + [100.0] * 8  # +10 % at trial 9, then a crash
    assert stall_reason(_search(rising), MAX, budget, 0.05) is None  # 9 since the gain
    assert stall_reason(_search([*rising, 100.0, 100.0]), MAX, budget, 0.05) is not None  # 11 since
    # With a 15 % noise the +10 % was no gain: the count runs from the first trial.
    assert stall_reason(_search(rising[:MIN_TRIALS]), MAX, budget, 0.15) is not None


def test_an_infeasible_trial_is_no_best_and_nothing_feasible_never_stalls() -> None:
    budget = 30
    broke_slo = [_trial(100.0), _trial(200.0, feasible=False), *_search([100.0] * 12)]
    assert stall_reason(broke_slo, MAX, budget, 0.05) is not None  # the 200 broke its SLO
    nothing = [_trial(300.0, feasible=False) for _ in range(25)]
    assert stall_reason(nothing, MAX, budget, 0.05) is None


def test_short_or_finished_searches_never_stop_early() -> None:
    assert stall_reason(_search([100.0] * (MIN_TRIALS - 1)), MAX, 12, 0.05) is None
    assert stall_reason(_search([100.0] * 20), MAX, 20, 0.05) is None  # the budget is spent anyway


def test_a_space_the_rest_of_the_budget_can_cover_is_measured_whole() -> None:
    budget = 30
    flat = _search([100.0] * 14)  # 13 trials since the best: stalled
    assert stall_reason(flat, MAX, budget, 0.05) is not None  # a space too large to list
    assert stall_reason(flat, MAX, budget, 0.05, unmeasured=17) is not None  # more than the 16 trials left
    assert stall_reason(flat, MAX, budget, 0.05, unmeasured=16) is None


def test_a_minimised_objective_gains_downwards() -> None:
    budget = 30
    falling = [100.0] * 5 + [80.0] + [100.0] * 7  # 20 % lower latency at trial 6
    assert stall_reason(_search(falling), MAX, budget, 0.05) is not None  # as a maximum it is no gain
    assert stall_reason(_search(falling), StudyDirection.MINIMIZE, budget, 0.05) is None


@pytest.mark.sim
@pytest.mark.slow
def test_a_flat_simulated_search_ends_early_and_says_why(tmp_path: Path) -> None:
    """Four requests at a time: every max_running above 4 serves alike, so after 12 trials with
    no gain above the noise the search of 30 ends, and status says why."""
    engine = {
        "kind": "vllm",
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "command": [sys.executable, "-m", "autotune_sim", "vllm"],
        "env": {"AUTOTUNE_SIM_SPEEDUP": "50", "AUTOTUNE_SIM_SEED": "0", "VLLM_CACHE_ROOT": str(tmp_path / "cc")},
        "startup_timeout_s": 60,
        "simulated": True,
    }
    workload = {"name": "flat", "dataset": {"input_len": 128, "output_len": 16}, "num_prompts": 24}
    workload["arrival"] = {"concurrency": 4}
    space = {"params": {"max_running": {"type": "int", "low": 8, "high": 256, "log": True}}}
    study = {"name": "f", "results_dir": tmp_path, "seed": 1, "method": "search", "trials": 30, "finalists": 0}
    job = TuneJob(
        engine=parse_model(EngineSettings, engine, "engine"),
        space=parse_model(SearchSpace, space, "space"),
        workload=parse_model(Workload, workload, "workload"),
        study=parse_model(StudySettings, study, "study"),
    )
    run_study(job)
    st = load_study("f", job.storage_url)
    searched = [t for t in st.trials if trial_record(t).stage == "search"]
    assert MIN_TRIALS <= len(searched) < 30, len(searched)
    line = stopped_line(st)
    assert line is not None and line.startswith("search ended early: no search trial in the last 10"), line


def _benchmark() -> Any:
    return load_benchmark("stop_when_done")


def test_the_benchmark_compares_one_seeds_study_with_and_without_the_rule() -> None:
    bench = _benchmark()
    se = sys.modules["search_efficiency"]

    def ledger(values: list[float], pick: int) -> Any:
        trials = [
            se.Trial("search", {}, se.Result(Outcome.OK, v, 10.0, true_outcome=Outcome.OK, true_value=v))
            for v in values
        ]
        return se.Ledger(None, 40, None, trials, trials[pick])

    # The optimum 200 came only at the last of 21 runs: the stop at 13 lost it and kept half.
    full = ledger([100.0] * 20 + [200.0], pick=20)
    stop = bench.compare(ledger([100.0] * 13, pick=0), full, optimum=200.0)
    assert stop.stopped and stop.lost_target and stop.pick_kept == 0.5
    assert abs(stop.saved_share - 8 / 21) < 1e-9
    same = bench.compare(full, full, optimum=200.0)
    assert not same.stopped and not same.lost_target and same.saved_share == 0.0 and same.pick_kept == 1.0
