"""Two workers that find the same free place in a quota at the same moment: the storage's trial
numbers decide, and the later trial is withdrawn before any engine starts (no stage overshoots)."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from studyrace import record_after_first_poll

from autotune.config import EngineSettings, SearchSpace, StudySettings, Workload, parse_model
from autotune.engines import get_adapter
from autotune.search.parallel import _Gate
from autotune.search.progress import NullProgress, Progress
from autotune.search.record import WITHDRAWN, trial_record, write_trial
from autotune.search.runner import Placement, StudyRun, Withdrawn
from autotune.search.stage import Stage
from autotune.search.stages import Task
from autotune.search.storage import open_study, superseded
from autotune.search.tune import TuneJob, make_sampler

SPACE = {"params": {"max_running": {"type": "int", "low": 8, "high": 256, "log": True}}}
WORKLOAD = {"name": "w", "dataset": {"input_len": 64, "output_len": 8}, "num_prompts": 8}


def _worker(tmp_path: Path, progress: Progress | None = None, placement: Placement | None = None) -> StudyRun:
    """One worker's trial plumbing on the shared study, with its own gate as the parallel
    orchestrator wires it. Its engine command fails at once: no test here may reach a launch."""
    engine = parse_model(
        EngineSettings,
        {"kind": "vllm", "model": "m", "command": [sys.executable, "-c", "raise SystemExit(3)"], "simulated": True},
        "engine",
    )
    job = TuneJob(
        engine=engine,
        space=parse_model(SearchSpace, SPACE, "space"),
        workload=parse_model(Workload, WORKLOAD, "workload"),
        study=parse_model(StudySettings, {"name": "q", "results_dir": tmp_path, "retries": 2}, "study"),
    )
    directions = job.workload.objective.directions
    study = open_study("q", job.storage_url, directions=directions, sampler=make_sampler(job.study))
    gate = _Gate(study)
    return StudyRun(
        job, get_adapter(job.engine), study, progress or NullProgress(), admit=gate.admitted, placement=placement
    )


def _validation_task(run: StudyRun, quota: int = 1) -> Task:
    def start(first: bool) -> None:
        run.run(Stage.VALIDATION, explicit={"max_running": 64}, extra={"validates": 3})

    return Task(
        "validation:3",
        lambda t: trial_record(t).stage == Stage.VALIDATION and trial_record(t).validates == 3,
        quota,
        start,
    )


def _other_workers_trial(study: optuna.Study, *, record: bool = True) -> optuna.Trial:
    trial = study.ask()
    if record:
        write_trial(trial, stage=Stage.VALIDATION, validates=3, params={"max_running": 64})
    return trial


def _gate(run: StudyRun) -> _Gate:
    gate = run.admit.__self__  # type: ignore[attr-defined]
    assert isinstance(gate, _Gate)
    return gate


def test_the_later_of_two_trials_for_one_place_is_withdrawn_before_launch(tmp_path: Path) -> None:
    run = _worker(tmp_path)
    gate, task = _gate(run), _validation_task(run)
    assert gate.reserve(task) == 0  # the place looked free to this worker...
    _other_workers_trial(run.study)  # ...and another worker asked for it first
    with pytest.raises(Withdrawn, match="other workers had filled the validation quota"):
        task.start(True)
    gate.visible()
    mine = run.study.trials[1]
    assert mine.state == TrialState.FAIL
    record = trial_record(mine)
    assert record.outcome == WITHDRAWN and "before its engine started" in (record.reason or "")
    assert record.engine_pgid is None, "an engine started for a withdrawn trial"
    # It does not count, and it is not a failure to re-run.
    assert superseded(run.study.trials) == {1}
    assert gate.count(task.match) == 1
    run.retry_failed()
    assert len(run.study.trials) == 2


def test_a_trial_asked_first_keeps_its_place(tmp_path: Path) -> None:
    ran: list[int] = []
    seen = type("Seen", (NullProgress,), {"trial_started": lambda self, n, s, p: ran.append(n)})()
    # The admitted trial goes on towards its launch: its placement stops it there.
    run = _worker(tmp_path, progress=seen, placement=_refuse_placement)
    gate, task = _gate(run), _validation_task(run)
    assert gate.reserve(task) == 0
    with pytest.raises(RuntimeError, match="placement reached"):
        task.start(True)
    gate.visible()
    assert ran == [0]  # admitted: it went on to start
    assert trial_record(run.study.trials[0]).outcome != WITHDRAWN


def test_a_worker_waits_for_the_start_record_of_a_trial_asked_just_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _worker(tmp_path)
    gate, task = _gate(run), _validation_task(run)
    assert gate.reserve(task) == 0
    theirs = _other_workers_trial(run.study, record=False)  # asked, its record not written yet
    looks = record_after_first_poll(
        monkeypatch, run, lambda: write_trial(theirs, stage=Stage.VALIDATION, validates=3, params={"max_running": 64})
    )
    with pytest.raises(Withdrawn):
        task.start(True)
    assert len(looks) >= 2  # the first look missed the record and the wait saw it
    assert trial_record(run.study.trials[1]).outcome == WITHDRAWN


def test_a_thread_without_a_reservation_is_always_admitted(tmp_path: Path) -> None:
    """Sequential stages and retries are not quota-filling: nothing is withdrawn for them."""
    run = _worker(tmp_path)
    _other_workers_trial(run.study)
    assert _gate(run).admitted(5)


def test_a_slot_waits_out_a_place_counted_twice_instead_of_leaving(tmp_path: Path) -> None:
    """Another slot's trial is stored a moment before its reservation ends: for that moment the
    place counts twice. A slot that believed it would leave a quota of 2 with one trial running."""
    run = _worker(tmp_path)
    gate, task = _gate(run), _validation_task(run, quota=2)
    stored, release = threading.Event(), threading.Event()

    def other_slot() -> None:
        assert gate.reserve(task) == 0
        _other_workers_trial(run.study)  # its start record is stored; its reservation not ended yet
        stored.set()
        release.wait(10)
        gate.visible()

    slot = threading.Thread(target=other_slot)
    slot.start()
    assert stored.wait(10)
    threading.Timer(0.3, release.set).start()
    assert gate.reserve(task) == 1  # the second place, not "full"
    slot.join()
    gate.visible()


def test_a_full_quota_with_no_other_reservation_is_full(tmp_path: Path) -> None:
    run = _worker(tmp_path)
    gate, task = _gate(run), _validation_task(run, quota=1)
    _other_workers_trial(run.study)
    assert gate.reserve(task) is None


def _refuse_placement(flags: dict[str, object]) -> object:
    raise RuntimeError("placement reached")
