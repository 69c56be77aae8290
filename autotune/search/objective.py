"""Turn a trial's outcome and measurements into what Optuna learns: a value and constraints.

Constraints follow Optuna's convention (≤ 0 is feasible), one named constraint per SLO plus the
error rate, set on the trial with ``Trial.set_constraint`` (the sampler reads them) and kept in
the trial's ``constraints`` user attribute. A trial that failed
because of its flags (memory, KV pool, rejected flags) is told to Optuna as COMPLETE with the
worst value and a large violation, so TPE learns the region is infeasible; it can never be
"best" because :func:`is_feasible` requires a served outcome and no violation. Failures that
say nothing about the flags (crash, timeout) are told as FAIL and retried.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from autotune.config import THROUGHPUT_KEYS, Workload
from autotune.outcomes import Outcome

__all__ = ["FAILED_VIOLATION", "Score", "is_feasible", "rate_bound_note", "score"]

# Larger than any real SLO slack, so every flag-caused failure ranks below every served trial.
FAILED_VIOLATION = 1e6
_WORST = {"maximize": 0.0, "minimize": 1e12}


@dataclass(frozen=True)
class Score:
    values: list[float]  # one per objective term; the first is the primary objective
    constraints: dict[str, float]  # one per SLO + error rate (+ throughput floor); ≤ 0 feasible
    violations: dict[str, float]  # metric → amount over its bound (only the violated ones)

    @property
    def value(self) -> float:
        return self.values[0]


def _slo_terms(metrics: Mapping[str, float], workload: Workload) -> dict[str, float]:
    """Relative slack per bound: (measured − bound) / bound, so violations are comparable."""
    terms: dict[str, float] = {}
    for key, bound in sorted(workload.slos.items()):
        measured = metrics.get(key)
        # Missing or NaN (no successful request to measure) is a violation, never a pass.
        if measured is None or measured != measured:
            terms[key] = FAILED_VIOLATION
        else:
            terms[key] = (float(measured) - bound) / bound
    error_rate = float(metrics.get("error_rate", 0.0))
    terms["error_rate"] = error_rate - workload.max_error_rate
    floor = workload.objective.throughput_floor
    if floor is not None:
        terms["throughput_floor"] = (floor - float(metrics.get("output_throughput") or 0.0)) / floor
    return terms


def _constraint_names(workload: Workload) -> list[str]:
    names = [*sorted(workload.slos), "error_rate"]
    names += ["throughput_floor"] if workload.objective.throughput_floor is not None else []
    names += ["startup"] if workload.max_startup_s is not None else []
    return names + (["quality"] if workload.quality_min_agreement is not None else [])


def _startup_term(startup_s: float | None, workload: Workload) -> dict[str, float]:
    """Time to ready within ``max_startup_s``, as relative slack like an SLO; not measured is a violation."""
    bound = workload.max_startup_s
    if bound is None:
        return {}
    return {"startup": FAILED_VIOLATION if startup_s is None else (startup_s - bound) / bound}


def _quality_term(agreement: float | None, workload: Workload) -> dict[str, float]:
    """Agreement with the baseline's greedy answers must reach ``quality_min_agreement``.

    No agreement (the baseline itself, which is the reference) is no violation.
    """
    minimum = workload.quality_min_agreement
    if minimum is None:
        return {}
    return {"quality": 0.0 if agreement is None else minimum - agreement}


def _measured(metrics: Mapping[str, float], key: str, direction: str) -> float:
    value = metrics.get(key)
    if value is None or value != value:  # missing or NaN (e.g. no request succeeded)
        return _WORST[direction]
    return float(value)


def score(
    outcome: Outcome,
    metrics: Mapping[str, float],
    workload: Workload,
    quality: float | None = None,
    startup_s: float | None = None,
) -> Score:
    """Value and constraints for a finished trial (served or flag-caused failure); ``quality`` is
    the trial's agreement with the baseline's greedy answers (``quality_agreement``), ``startup_s``
    its engine's seconds from launch to ready."""
    objective = workload.objective
    if not outcome.served:
        worst = [_WORST[t.direction] for t in objective.terms]
        return Score(worst, dict.fromkeys(_constraint_names(workload), FAILED_VIOLATION), {"outcome": FAILED_VIOLATION})
    terms = {**_slo_terms(metrics, workload), **_startup_term(startup_s, workload), **_quality_term(quality, workload)}
    values = [_measured(metrics, t.metric, t.direction) for t in objective.terms]
    return Score(values, terms, {k: v for k, v in terms.items() if v > 0})


def is_feasible(outcome: str | None, constraints: dict[str, float] | list[float] | None) -> bool:
    values = constraints.values() if isinstance(constraints, dict) else constraints or []
    return outcome == Outcome.OK and all(c <= 0 for c in values)


def rate_bound_note(workload: Workload) -> str | None:
    """Why a throughput objective may rank nothing under this workload (or None when it can).

    Requests sent at a set rate make every config that keeps up serve the same tokens/s: the
    objective then separates only configs that fall behind, and the rest differ by noise.
    """
    arrival = workload.arrival
    paced = arrival.ramp_up is not None or math.isfinite(arrival.request_rate)
    metric = workload.objective.metric
    if not paced or metric not in THROUGHPUT_KEYS:
        return None
    rate = "a ramped rate" if arrival.ramp_up is not None else f"{arrival.request_rate:g} requests/s"
    return (
        f"note: workload {workload.name} sends {rate}, so every config that keeps up serves the same "
        f"{metric}; to rank configs by headroom use objective max_slo_rate (capacity search) or a latency "
        "objective, or send requests at a fixed concurrency"
    )
