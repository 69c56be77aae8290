"""Validation and the verdict: the finalists and the engine's defaults re-run on fresh engines,
round by round, each finalist ranked by the median of its runs, and the best one's gain over the
defaults judged on the paired rounds (``search/verdict.py``).

Round by round: each round re-runs the defaults and every finalist once, under the same machine
conditions, so the gain of round i is a paired comparison.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from autotune.search.objective import is_feasible
from autotune.search.record import DEFAULTS, set_validation, set_verdict, trial_record, trial_records, validation
from autotune.search.runner import StudyRun
from autotune.search.stage import Stage
from autotune.search.stages.common import Dispatch, Task
from autotune.search.storage import best_trial, feasible_trials, primary_value
from autotune.search.verdict import paired_gains, paired_verdict, slo_misses

__all__ = [
    "DEFAULTS",
    "finalists",
    "round_task",
    "store_paired_verdict",
    "store_runs",
    "validate",
    "validation_groups",
    "validation_runs",
]


def validate(run: StudyRun, dispatch: Dispatch) -> None:
    """Re-run the finalists and the defaults ``validation_runs`` times, round by round, then
    store each finalist's median and the verdict."""
    cfg = run.job.study
    if cfg.finalists == 0 or cfg.validation_runs == 0:
        return
    chosen = finalists(run, cfg.finalists)
    groups = validation_groups(run, chosen)
    for round_ in range(1, cfg.validation_runs + 1):
        dispatch.fill([round_task(run, key, params, round_) for key, params in groups])
        if run.out_of_time():
            break
    store_validation(run, chosen)


def round_task(run: StudyRun, key: int | str, params: Mapping[str, Any], quota: int) -> Task:
    """Validation runs of ``key`` (a finalist's number, or :data:`DEFAULTS`) up to ``quota``."""
    return Task(
        f"validation:{key}",
        lambda t: trial_record(t).stage == Stage.VALIDATION and trial_record(t).validates == key,
        quota,
        lambda first: run.run(Stage.VALIDATION, explicit=params, extra={"validates": key}),
    )


def finalists(run: StudyRun, n: int) -> list[FrozenTrial]:
    """The ``n`` best feasible trials, best first."""
    candidates = feasible_trials(run.study)
    maximize = run.study.directions[0] == optuna.study.StudyDirection.MAXIMIZE
    return sorted(candidates, key=lambda t: primary_value(t) or 0.0, reverse=maximize)[:n]


def validation_groups(run: StudyRun, chosen: list[FrozenTrial]) -> list[tuple[int | str, dict[str, Any]]]:
    """(key, params) of each configuration validation re-runs: the finalists, and the engine's
    defaults beside them (key :data:`DEFAULTS`) unless a finalist is the defaults."""
    groups: list[tuple[int | str, dict[str, Any]]] = [(f.number, trial_record(f).params or {}) for f in chosen]
    if run.job.study.baseline and all(params for _, params in groups):
        groups.insert(0, (DEFAULTS, {}))
    return groups


def validation_runs(run: StudyRun, key: int | str) -> list[FrozenTrial]:
    """Finished validation runs of one finalist (its number) or of the defaults (:data:`DEFAULTS`)."""
    return [t for t in run.finished(Stage.VALIDATION) if trial_record(t).validates == key]


def store_validation(run: StudyRun, chosen: list[FrozenTrial]) -> None:
    """Once the re-runs are done: each finalist's median and spread, and the verdict against
    the defaults' runs of the same rounds."""
    for finalist in chosen:
        _store_finalist(run, finalist)
    defaults_key = next((f.number for f in chosen if not trial_record(f).params), DEFAULTS)
    _store_verdict(run, chosen, defaults_key)


def _store_finalist(run: StudyRun, finalist: FrozenTrial) -> None:
    # The finalist's own run was feasible (that made it a finalist): its re-runs decide.
    store_runs(run, finalist.number, [finalist, *validation_runs(run, finalist.number)])


def store_runs(run: StudyRun, number: int, runs: list[FrozenTrial]) -> None:
    """The median and spread of one configuration's ``runs``, stored as trial ``number``'s
    validation: a run that missed the SLOs or failed counts as 0 and makes it unstable."""
    ok = [is_feasible(r.outcome, r.constraints) for r in trial_records(runs)]
    values = [float(primary_value(t) or 0.0) if good else 0.0 for t, good in zip(runs, ok, strict=True)]
    median = statistics.median(values) if values else 0.0
    record = {
        "values": values,
        "median": median,
        "spread": (max(values) - min(values)) / median if median else 0.0,
        # A finalist that fails any re-run is not a safe deployment: it cannot win.
        "stable": all(ok),
    }
    set_validation(run.study, {**validation(run.study), number: record})


def _store_verdict(run: StudyRun, chosen: list[FrozenTrial], defaults_key: int | str) -> None:
    """Whether the best finalist beats the defaults beyond the noise of the paired runs."""
    best = best_trial(run.study)
    if best is None or not chosen:
        return
    defaults, winner = validation_runs(run, defaults_key), validation_runs(run, best.number)
    store_paired_verdict(run, best.number, defaults, winner, winner_is_defaults=not trial_record(best).params)


def store_paired_verdict(
    run: StudyRun, number: int, defaults: list[FrozenTrial], winner: list[FrozenTrial], *, winner_is_defaults: bool
) -> dict[str, Any]:
    """The verdict on trial ``number`` from the defaults' and its runs, round by round; stored."""
    sign = 1.0 if run.study.directions[0] == optuna.study.StudyDirection.MAXIMIZE else -1.0
    # Goodput already counts only the requests that met their bounds (bench/metrics.py).
    priced = run.job.workload.objective.metric == "request_goodput"
    pairs = paired_gains(defaults, winner, sign, priced=priced)
    misses = slo_misses(defaults, winner) if run.job.workload.slos else None
    said = paired_verdict(number, pairs, winner_is_defaults=winner_is_defaults, misses=misses)
    set_verdict(run.study, said)
    return said
