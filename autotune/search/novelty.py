"""A sampled trial measures a configuration the study has not measured yet.

TPE re-proposes its incumbent once its model has settled on it (on real vLLM-CPU it ran one point
of a 10-point space three times in 8 trials), and a small discrete space runs out of new points.
A repeat run of a search trial finds nothing: the noise it would measure is what finalist
validation measures, on fresh engines, round by round. So when the sampler proposes a
configuration measured already, the trial is withdrawn before its engine starts, and a random
point of the same space that nothing has measured runs instead: the exploration TPE's own start-up
trials do. When random draws find none, a space small enough to list is searched point by point;
once every point of it is measured the search has nothing left to learn and ends (the caller
says so). Only in a space too large to list, when none of :data:`DRAWS` draws is new, does the
repeat run.

A configuration the twin screened (:func:`screened`) is no new point for that random draw either:
the twin ruled it out, and only the sampler proposing it again makes it run.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.config import SearchSpace
from autotune.search.record import SCREENED, TrialRecord, trial_records
from autotune.search.space import draw, finite_points
from autotune.search.storage import superseded

__all__ = ["DRAWS", "config_key", "measured", "screened", "unmeasured_point"]

#: Random draws tried for an unmeasured point before the space counts as used up.
DRAWS = 64
# States of a configuration that was measured or is being measured: served or failed for its
# flags (told COMPLETE), or running. A FAIL is an infrastructure failure that the retry logic
# re-runs: it measured nothing. A cut (PRUNED, cannot_win) is not a measurement either: it was
# judged against an incumbent that may have been lucky, so the configuration may be proposed
# again, and then it runs in full (``StudyRun._was_cut``).
_MEASURING = (TrialState.COMPLETE, TrialState.RUNNING)


def config_key(flags: Mapping[str, Any]) -> str:
    """One engine configuration, comparable across trials (flags as a trial records them)."""
    return json.dumps(flags, sort_keys=True, default=str)


def measured(trials: Iterable[FrozenTrial]) -> dict[str, int]:
    """Configuration key → the first trial that measured it (or is measuring it) under the
    study's workload; peak-shape probes measure something else and do not count."""
    trials = list(trials)
    replaced = superseded(trials)
    seen: dict[str, int] = {}
    for t, r in zip(trials, trial_records(trials), strict=True):
        if t.state in _MEASURING and t.number not in replaced and r.flags and not r.is_probe:
            seen.setdefault(config_key(r.flags), t.number)
    return seen


def screened(records: Iterable[TrialRecord]) -> set[str]:
    """Keys of the configurations the twin ruled out before their engines started."""
    return {config_key(r.flags) for r in records if r.outcome == SCREENED and r.flags}


def unmeasured_point(
    space: SearchSpace, is_new: Callable[[dict[str, Any]], bool], study: optuna.Study, seed: int | None
) -> dict[str, Any] | None:
    """Values of ``space`` for a random point that ``is_new`` accepts, or None when there is none.

    Random draws come first: they keep each parameter's scale (a log-scale knob is drawn
    log-uniformly), as the sampler's own start-up trials do. When :data:`DRAWS` of them found
    nothing, a space small enough to list (:func:`~autotune.search.space.finite_points`) is
    searched point by point, so None there means every point was measured."""
    sampler = optuna.samplers.RandomSampler(seed=seed)
    for _ in range(DRAWS):
        values = draw(space, sampler, study)
        if is_new(values):
            return values
    new = [point for point in finite_points(space) or [] if is_new(point)]
    return random.Random(seed).choice(new) if new else None
