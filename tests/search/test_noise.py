"""The study's one noise figure: measured from configurations it ran more than once, used by
``cannot_win`` against what the incumbent would score again, and never taken from a cut run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.distributions import IntDistribution
from optuna.trial import TrialState
from simstudy import unlaunched_job

from autotune.bench.earlystop import CANNOT_WIN, EarlyStop, EarlyStopPolicy
from autotune.bench.metrics import RequestRecord
from autotune.config import Workload, parse_model
from autotune.engines import get_adapter
from autotune.search.noise import FLOOR, expected_best_of, study_noise
from autotune.search.progress import NullProgress
from autotune.search.runner import StudyRun
from autotune.search.storage import open_study
from autotune.search.trial import early_stop_policy

SPACE = {"params": {"max_running": {"type": "categorical", "choices": [16, 32, 64]}}}
WORKLOAD = {"name": "w", "dataset": {"input_len": 64, "output_len": 8}, "num_prompts": 1000}
METRIC = "output_throughput"


def _run(tmp_path: Path) -> StudyRun:
    job = unlaunched_job(tmp_path, SPACE, WORKLOAD)
    study = open_study("n", job.storage_url, directions=["maximize"], sampler=optuna.samplers.RandomSampler(seed=0))
    return StudyRun(job, get_adapter(job.engine), study, NullProgress())


def _trial(
    run: StudyRun,
    max_running: int | None,
    value: float,
    stage: str = "search",
    state: TrialState = TrialState.COMPLETE,
    **attrs: Any,
) -> None:
    """A stored trial of ``max_running`` (None: the engine's defaults) that served ``value``."""
    params = {} if max_running is None else {"max_running": max_running}
    # Any batch size: a test may store more configurations than the space lists.
    distributions = {} if max_running is None else {"max_running": IntDistribution(1, 1024)}
    run.study.add_trial(
        optuna.trial.create_trial(
            state=state,
            params=params,
            distributions=distributions,
            value=value if state == TrialState.COMPLETE else None,
            intermediate_values={} if state == TrialState.COMPLETE else {0: value},
            user_attrs={
                "stage": stage,
                "params": params,
                "flags": run.flags(params),
                "outcome": "ok",
                "metrics": {METRIC: value},
                **attrs,
            },
        )
    )


def test_no_configuration_measured_twice_is_no_noise_and_no_cut(tmp_path: Path) -> None:
    run = _run(tmp_path)
    _trial(run, None, 100.0, stage="baseline")
    _trial(run, 32, 130.0)
    noise = run.noise()
    assert noise.measured is None and "not measured" in noise.describe()
    assert noise.margin == FLOOR  # what a comparison that cannot wait (the graph stage) allows for
    policy = early_stop_policy(run.job.study, "search", False, run._incumbent, run._measured_noise)
    assert policy is not None and CANNOT_WIN not in policy.reasons


def test_the_defaults_launched_twice_give_the_noise_and_say_so(tmp_path: Path) -> None:
    run = _run(tmp_path)
    _trial(run, None, 100.0, stage="baseline")
    _trial(run, None, 90.0, stage="noise")
    _trial(run, 32, 130.0)
    noise = run.noise()
    assert noise.measured == pytest.approx(10 / 95)  # (max - min) / median of the two launches
    assert noise.describe() == "run-to-run noise ±10.5% (widest of 1 measured: trials 0, 1: 100.0 and 90.0)"


def test_the_widest_group_counts_and_a_close_pair_is_held_to_the_floor(tmp_path: Path) -> None:
    run = _run(tmp_path)
    _trial(run, None, 100.0, stage="baseline")
    _trial(run, None, 100.5, stage="noise")
    assert run.noise().measured == FLOOR and "floor" in run.noise().source
    _trial(run, 32, 120.0)
    _trial(run, 32, 96.0, stage="validation", validates=2)  # a finalist's re-run on a fresh engine
    assert run.noise().measured == pytest.approx(24 / 108)
    assert "trials 2, 3" in run.noise().source


def test_a_cut_run_or_a_peak_probe_measures_no_noise(tmp_path: Path) -> None:
    run = _run(tmp_path)
    _trial(run, 32, 120.0)
    _trial(run, 32, 60.0, state=TrialState.PRUNED)  # a partial run: cut against an incumbent
    _trial(run, 32, 30.0, workload_override={"name": "peak"})  # another workload
    assert study_noise(run.study.trials, METRIC).measured is None


def test_a_lucky_incumbent_does_not_cut_a_configuration_whose_median_beats_its_median(tmp_path: Path) -> None:
    """The incumbent's configuration served 115 once and 95 on its second launch (median 105);
    a candidate steady at 100 tok/s ran against it. Against the lucky 115 and an assumed 5 %
    it was cut; against the median and the measured noise it runs on."""
    run = _run(tmp_path)
    _trial(run, None, 115.0, stage="baseline")
    _trial(run, None, 95.0, stage="noise")
    assert run._incumbent() == pytest.approx(105.0)
    policy = early_stop_policy(run.job.study, "search", False, run._incumbent, run._measured_noise)
    assert policy is not None and CANNOT_WIN in policy.reasons
    assert policy.incumbent == pytest.approx(105.0) and policy.noise_margin == pytest.approx(20 / 105)
    assert _cut_at(policy, rate=100.0) is None
    assert _cut_at(policy, rate=60.0) is not None  # a candidate far below still is cut


def test_an_incumbent_with_one_run_is_taken_down_by_the_noise(tmp_path: Path) -> None:
    run = _run(tmp_path)
    _trial(run, None, 100.0, stage="baseline")
    _trial(run, None, 90.0, stage="noise")
    _trial(run, 32, 130.0)  # the best so far, from one run
    assert run._incumbent() == pytest.approx(130.0 * (1 - 10 / 95))


def test_the_best_of_many_single_runs_is_taken_down_by_more(tmp_path: Path) -> None:
    """The best of ten configurations measured once each is likely the luckiest of ten draws:
    its run is taken down by the noise times how far the best of ten lies above their mean."""
    run = _run(tmp_path)
    _trial(run, None, 100.0, stage="baseline")
    _trial(run, None, 90.0, stage="noise")
    for i, value in enumerate([105.0, 98.0, 110.0, 101.0, 95.0, 103.0, 99.0, 97.0, 130.0]):
        _trial(run, 16 + i, value)  # nine more configurations, one run each
    noise = 10 / 95
    assert expected_best_of(10) == pytest.approx(1.55, abs=0.01)
    assert run._incumbent() == pytest.approx(130.0 * (1 - noise * expected_best_of(10)))
    assert expected_best_of(1) == 0.0 and expected_best_of(2) < 1.0 < expected_best_of(5) < expected_best_of(20)


def test_a_configuration_cut_once_may_run_again_in_full(tmp_path: Path) -> None:
    run = _run(tmp_path)
    _trial(run, None, 100.0, stage="baseline")
    _trial(run, None, 90.0, stage="noise")
    _trial(run, 32, 50.0, state=TrialState.PRUNED)
    assert run._was_cut(run.flags({"max_running": 32})) and not run._was_cut(run.flags({"max_running": 16}))
    again = early_stop_policy(run.job.study, "search", False, run._incumbent, run._measured_noise, full=True)
    assert again is not None and CANNOT_WIN not in again.reasons


def _served(end: float) -> RequestRecord:
    record = RequestRecord(success=True, ttft=0.1, latency=0.19, expected_output_len=10)
    record.output_tokens, record.n_chunks, record.end_time, record.itl = 10, 10, end, [0.01] * 9
    return record


def _cut_at(policy: EarlyStopPolicy, rate: float) -> float | None:
    """When a run streaming ``rate`` tokens/s (20 ten-token requests a second, 10 at a time) is
    cut under ``policy``, or None when it runs its 30 s."""
    workload = parse_model(Workload, {**WORKLOAD, "arrival": {"concurrency": 10}}, "workload")
    watch = EarlyStop(policy, workload)
    watch.begin(0.0, [10] * 1000)
    now = 0.0
    while now < 30.0:
        now += 0.1
        while watch.completed < int(now * 20):
            watch.observe(_served(now))
        if watch.tick(now, int(rate * now)) is not None:
            return now
    return None
