"""A sampled trial never re-runs a configuration the study measured: the repeat is withdrawn
before its engine starts and an unmeasured point of the space runs instead."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState
from simstudy import unlaunched_job
from studyrace import record_after_first_poll

from autotune.config import SearchSpace, parse_model
from autotune.engines import get_adapter
from autotune.search.novelty import config_key, measured, unmeasured_point
from autotune.search.progress import NullProgress
from autotune.search.record import WITHDRAWN, trial_record, write_trial
from autotune.search.runner import StudyRun, Withdrawn
from autotune.search.storage import open_study

pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")  # PartialFixedSampler
SPACE = {"params": {"max_running": {"type": "categorical", "choices": [16, 32, 64]}}}
WORKLOAD = {"name": "w", "dataset": {"input_len": 64, "output_len": 8}, "num_prompts": 8}


class _Launch(Exception):
    """The trial got as far as its launch: the test stops it there."""


class _Messages(NullProgress):
    def __init__(self) -> None:
        self.lines: list[str] = []

    def message(self, text: str) -> None:
        self.lines.append(text)


def _run(tmp_path: Path, proposes: int) -> StudyRun:
    """A study whose sampler always proposes ``max_running = proposes``."""
    job = unlaunched_job(tmp_path, SPACE, WORKLOAD)
    sampler = optuna.samplers.PartialFixedSampler({"max_running": proposes}, optuna.samplers.RandomSampler(seed=0))
    study = open_study("n", job.storage_url, directions=["maximize"], sampler=sampler)
    return StudyRun(job, get_adapter(job.engine), study, _Messages(), placement=_stop_at_launch)


def _stop_at_launch(flags: dict[str, Any]) -> Any:
    raise _Launch


def _measured_trial(run: StudyRun, max_running: int, state: TrialState = TrialState.COMPLETE, **attrs: Any) -> None:
    params = {"max_running": max_running}
    run.study.add_trial(
        optuna.trial.create_trial(
            state=state,
            params=params,
            distributions={"max_running": CategoricalDistribution([16, 32, 64])},
            value=100.0 if state == TrialState.COMPLETE else None,
            user_attrs={"stage": "search", "params": params, "flags": run.flags(params), **attrs},
        )
    )


def _launched(run: StudyRun) -> dict[str, Any]:
    with pytest.raises(_Launch):
        run.run("search", sample=run.job.space)
    launched = run.study.trials[-1]
    assert trial_record(launched).outcome != WITHDRAWN
    return launched.params


def test_a_proposal_measured_already_is_withdrawn_and_an_unmeasured_point_runs(tmp_path: Path) -> None:
    run = _run(tmp_path, proposes=32)
    _measured_trial(run, 32)
    _measured_trial(run, 16)
    assert _launched(run) == {"max_running": 64}  # the one point nothing measured
    proposed = run.study.trials[2]
    assert proposed.params == {"max_running": 32} and proposed.state == TrialState.FAIL
    record = trial_record(proposed)
    assert record.outcome == WITHDRAWN and "trial 0 measured the configuration" in (record.reason or "")
    assert record.engine_pgid is None
    assert any("proposed trial 0's configuration again: trial 3" in line for line in run.progress.lines)  # type: ignore[attr-defined]


def test_a_new_proposal_runs_as_sampled(tmp_path: Path) -> None:
    run = _run(tmp_path, proposes=32)
    _measured_trial(run, 16)
    assert _launched(run) == {"max_running": 32}
    assert len(run.study.trials) == 2


def test_when_every_point_of_the_space_was_measured_the_stage_ends(tmp_path: Path) -> None:
    run = _run(tmp_path, proposes=32)
    for value in (16, 32, 64):
        _measured_trial(run, value)
    with pytest.raises(Withdrawn, match="every configuration of the search space was measured"):
        run.run("search", sample=run.job.space)
    proposed = run.study.trials[-1]
    assert trial_record(proposed).outcome == WITHDRAWN and trial_record(proposed).engine_pgid is None
    state = run.stage_state("search")
    assert state is not None and state.stalled == "every configuration of the search space was measured"
    assert "every configuration of the search space was measured: the search stage ends here" in run.progress.lines  # type: ignore[attr-defined]


def test_a_random_draw_never_runs_what_the_twin_screened_and_the_space_ends(tmp_path: Path) -> None:
    # Left unmeasured are only the configurations the twin screened: the repeat proposal ends
    # the stage instead of launching one of them by chance.
    run = _run(tmp_path, proposes=32)
    _measured_trial(run, 16, state=TrialState.PRUNED, outcome="screened")
    _measured_trial(run, 32)
    _measured_trial(run, 64)
    with pytest.raises(Withdrawn, match="every configuration of the search space was measured or screened"):
        run.run("search", sample=run.job.space)
    assert [t.params for t in run.study.trials if t.state == TrialState.RUNNING] == []
    state = run.stage_state("search")
    assert state is not None and state.stalled == "every configuration of the search space was measured or screened"


def test_a_screened_configuration_the_sampler_proposes_itself_runs(tmp_path: Path) -> None:
    run = _run(tmp_path, proposes=16)
    _measured_trial(run, 16, state=TrialState.PRUNED, outcome="screened")
    _measured_trial(run, 32)
    assert _launched(run) == {"max_running": 16}


def test_in_a_space_too_large_to_list_a_repeat_runs_when_no_draw_is_new(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _run(tmp_path, proposes=32)
    _measured_trial(run, 32)
    monkeypatch.setattr("autotune.search.runner.finite_points", lambda space: None)
    monkeypatch.setattr("autotune.search.runner.unmeasured_point", lambda *args: None)
    assert _launched(run) == {"max_running": 32}
    assert not [t for t in run.study.trials if trial_record(t).outcome == WITHDRAWN]
    assert run.stage_state("search") is None
    assert any("repeats trial 0: every point drawn was measured" in line for line in run.progress.lines)  # type: ignore[attr-defined]


def test_of_two_workers_proposing_one_configuration_at_once_the_later_gives_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another worker asked first; its start record lands only after this worker checked what
    # the study measured, so only the check after this trial's own record can see it.
    run = _run(tmp_path, proposes=32)
    theirs = run.study.ask()
    looks = record_after_first_poll(
        monkeypatch,
        run,
        lambda: write_trial(theirs, stage="search", params={"max_running": 32}, flags=run.flags({"max_running": 32})),
    )
    with pytest.raises(Withdrawn, match="trial 0, asked just before, measures the same configuration"):
        run.run("search", sample=run.job.space)
    assert len(looks) >= 2  # the first look missed the record and the wait saw it
    mine = trial_record(run.study.trials[1])
    assert mine.outcome == WITHDRAWN and mine.engine_pgid is None


@pytest.mark.parametrize(
    ("state", "attrs", "counts"),
    [
        (TrialState.COMPLETE, {}, True),  # served, or failed for its flags
        (TrialState.PRUNED, {}, False),  # cut early against an incumbent: not a measurement
        (TrialState.RUNNING, {}, True),  # being measured
        (TrialState.FAIL, {"outcome": "crash"}, False),  # infrastructure: its retry measures it
        (TrialState.COMPLETE, {"workload_override": {"name": "peak"}}, False),  # a peak-shape probe
    ],
)
def test_what_counts_as_measured(tmp_path: Path, state: TrialState, attrs: dict[str, Any], counts: bool) -> None:
    run = _run(tmp_path, proposes=32)
    _measured_trial(run, 32, state, **attrs)
    assert (config_key(run.flags({"max_running": 32})) in measured(run.study.trials)) is counts


def test_a_retried_failure_is_measured_by_its_retry_only(tmp_path: Path) -> None:
    run = _run(tmp_path, proposes=32)
    _measured_trial(run, 32, TrialState.FAIL, outcome="crash")
    _measured_trial(run, 32, retry_of=0)
    assert measured(run.study.trials) == {config_key(run.flags({"max_running": 32})): 1}


def test_unmeasured_point_draws_from_the_space_until_one_is_new() -> None:
    space = parse_model(SearchSpace, SPACE, "space")
    study = optuna.create_study()
    assert unmeasured_point(space, lambda v: v["max_running"] == 64, study, seed=1) == {"max_running": 64}
    assert unmeasured_point(space, lambda v: False, study, seed=1) is None


def test_unmeasured_point_lists_a_small_space_when_the_draws_miss() -> None:
    space = parse_model(SearchSpace, {"params": {"n": {"type": "int", "low": 1, "high": 2000}}}, "space")
    study = optuna.create_study()
    draws: list[int] = []

    def only_1234(values: dict[str, Any]) -> bool:
        draws.append(values["n"])
        return values["n"] == 1234

    assert unmeasured_point(space, only_1234, study, seed=1) == {"n": 1234}
    assert 1234 not in draws[:64]  # the random draws missed it; listing the space found it


def test_unmeasured_point_in_a_continuous_space_gives_up_after_its_draws() -> None:
    space = parse_model(SearchSpace, {"params": {"f": {"type": "float", "low": 0.5, "high": 0.9}}}, "space")
    seen: list[float] = []
    assert unmeasured_point(space, lambda v: seen.append(v["f"]) or False, optuna.create_study(), seed=1) is None
    assert len(seen) == 64
