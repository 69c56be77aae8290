"""When a search has stopped paying: the evidence that lets ``tune`` end before ``--trials``.

An overnight budget is a guess. Once many search trials in a row have not beaten the best one by
more than the study's run-to-run noise, the next ones are unlikely to either (TPE has by then
sampled near the incumbent and around it), and each costs a full engine start. The rule is
Optuna's stagnation criterion (``optuna.terminator.BestValueStagnationEvaluator``) with two
changes a serving study needs: only feasible trials count (one that broke its SLO is no best),
and an improvement counts only when it is larger than the noise, so a lucky run of an equal
configuration does not reset the count.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from optuna.study import StudyDirection
from optuna.terminator import BaseImprovementEvaluator
from optuna.trial import FrozenTrial, TrialState

from autotune.search.objective import is_feasible
from autotune.search.record import trial_record

__all__ = ["MIN_TRIALS", "NoisyStagnation", "patience_for", "stall_reason"]

# No stop before this many search trials: TPE's first ten are random draws, and a search this short
# has no stagnation to speak of.
MIN_TRIALS = 12


def patience_for(budget: int) -> int:
    """Trials without a gain above the noise that end a search of ``budget`` trials: a third of
    the budget, at least 8 (short searches are not cut short)."""
    return max(8, math.ceil(budget / 3))


class NoisyStagnation(BaseImprovementEvaluator):
    """Trials left before the search counts as stalled (negative: it has).

    Args:
        patience: Trials allowed in a row without a gain above ``noise``.
        noise: The study's relative run-to-run noise; a gain must exceed it to count.
    """

    def __init__(self, patience: int, noise: float) -> None:
        self.patience, self.noise = patience, noise

    def evaluate(self, trials: list[FrozenTrial], study_direction: StudyDirection) -> float:
        """``patience`` minus the finished trials since the last gain above the noise; +inf while
        no trial has served within its SLOs (there is nothing to stagnate at)."""
        finished = [t for t in trials if t.state.is_finished()]
        sign = 1.0 if study_direction == StudyDirection.MAXIMIZE else -1.0
        best: float | None = None
        best_at = -1
        for i, trial in enumerate(finished):
            record = trial_record(trial)
            if trial.state != TrialState.COMPLETE or not trial.values:
                continue
            if not is_feasible(record.outcome, record.constraints):
                continue
            value = sign * trial.values[0]
            if best is None or value > best + self.noise * abs(best):
                best, best_at = value, i
        if best is None:
            return math.inf
        return float(self.patience - (len(finished) - 1 - best_at))


def stall_reason(
    trials: Sequence[FrozenTrial],
    direction: StudyDirection,
    budget: int,
    noise: float,
    unmeasured: int | None = None,
) -> str | None:
    """Why the search may stop now (None: go on). ``trials``: the search stage's, in order;
    ``unmeasured``: the configurations of its space nothing has measured yet (None: too many to
    list). A space the rest of the budget can measure whole is measured whole: the rule's premise,
    that the sampler has by then tried around the incumbent, says little about the few points of
    a small space left untried, and running them costs no more than the budget the user gave."""
    finished = [t for t in trials if t.state.is_finished()]
    if len(finished) < MIN_TRIALS or len(finished) >= budget:
        return None
    if unmeasured is not None and unmeasured <= budget - len(finished):
        return None
    patience = patience_for(budget)
    if NoisyStagnation(patience, noise).evaluate(list(finished), direction) >= 0:
        return None
    return (
        f"no search trial in the last {patience} beat the best by more than the measured noise ({noise:.0%}); "
        f"stopping after {len(finished)} of {budget} trials (--no-stop-when-done runs them all)"
    )
