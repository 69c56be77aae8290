"""A tuned configuration on a new engine release, beside that release's defaults: both re-run
on fresh engines round by round, as validation runs the finalists, and the tuned flags judged on
the paired rounds (``autotune recheck``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from autotune.search.record import DEFAULTS, trial_record
from autotune.search.runner import StudyRun
from autotune.search.stages.common import Dispatch
from autotune.search.stages.validation import round_task, store_paired_verdict, store_runs, validation_runs

__all__ = ["TUNED", "recheck_rounds", "tuned_runs"]

#: The ``validates`` key of the tuned configuration's runs.
TUNED = "tuned"


def recheck_rounds(tuned: Mapping[str, Any], rounds: int) -> Callable[[StudyRun, Dispatch], None]:
    """The method of a recheck study: ``rounds`` rounds of the defaults and the ``tuned`` flags
    (a resumed study keeps the rounds it has), then the verdict on the tuned flags."""

    def method(run: StudyRun, dispatch: Dispatch) -> None:
        groups: list[tuple[str, dict[str, Any]]] = [(DEFAULTS, {}), (TUNED, dict(tuned))]
        for round_ in range(1, rounds + 1):
            dispatch.fill([round_task(run, key, params, round_) for key, params in groups])
            if run.out_of_time():
                break
        defaults, ours = validation_runs(run, DEFAULTS), tuned_runs(run)
        served = [t for t in ours if trial_record(t).served_its_workload]
        # The verdict names the run an updated launch script is written from.
        number = served[0].number if served else (ours[0].number if ours else -1)
        if ours:
            store_runs(run, number, ours)
        store_paired_verdict(run, number, defaults, ours, winner_is_defaults=not tuned)

    return method


def tuned_runs(run: StudyRun) -> list[Any]:
    """The tuned configuration's finished runs, first round first."""
    return sorted(validation_runs(run, TUNED), key=lambda t: t.number)
