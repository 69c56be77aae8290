"""The search over a space on every slot — the whole space (``--method search``) or what the earlier
stages left (the scenario stage) — and when it may end before its budget: its space used up, or
no gain beyond the study's measured noise while more of the space is left than the budget could
measure (``search/stopping.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autotune.config import SearchSpace
from autotune.search.record import StageState, trial_record
from autotune.search.runner import StudyRun
from autotune.search.stage import Stage
from autotune.search.stages.common import Dispatch, Task
from autotune.search.stages.context import baseline, measure_noise
from autotune.search.stopping import stall_reason

__all__ = ["plain_search", "search_stall"]


def plain_search(run: StudyRun, dispatch: Dispatch) -> None:
    """``--method search``: the baseline and its noise runs, then one search over the whole space."""

    def start() -> None:
        run.retry_failed()
        baseline(run)
        measure_noise(run)

    def search_trial(first: bool) -> None:
        run.run(Stage.SEARCH, sample=run.job.space)
        measure_noise(run)  # when the defaults did not serve, on the first search trial that did

    dispatch.sequential(start)
    quota = run.job.study.trials
    task = Task(
        Stage.SEARCH,
        lambda t: trial_record(t).stage == Stage.SEARCH,
        quota,
        search_trial,
        lambda: search_stall(run, Stage.SEARCH, quota, run.job.space, {}),
    )
    dispatch.fill([task])


def search_stall(run: StudyRun, stage: str, quota: int, space: SearchSpace, fixed: Mapping[str, Any]) -> str | None:
    """Why the search stage (over ``space``, with ``fixed`` on top) may end before ``quota``
    (said and recorded once), or None: its space was used up (:meth:`StudyRun.end_used_up`),
    or it stopped improving while more of its space is left than its budget could measure."""
    state = run.stage_state(stage)
    if state is not None and state.stalled:
        return state.stalled
    directions = run.study.directions
    if not run.job.study.stop_when_done or len(directions) > 1:  # a Pareto front has no one best
        return None
    noise = run.noise().measured
    if noise is None:  # a gain cannot be told from the noise before the noise is measured
        return None
    finished = run.finished(stage)
    why = stall_reason(finished, directions[0], quota, noise)
    if why is not None:  # only then is it worth listing the space for what is left of it
        why = stall_reason(finished, directions[0], quota, noise, run.unmeasured(space, fixed))
    if why is not None:
        run.progress.message(why)
        run.set_stage_state(stage, StageState(done=True, noise=noise, stalled=why))
    return why
