"""The scenario stage: a search over the knobs the earlier stages left, on every slot, opened at
the articles' starting point for the workload's scenario (with the SLO-first move on top when the
baseline broke the SLO), each slot's next trial steered by SGLang's conservativeness rule."""

from __future__ import annotations

import functools
import threading
from collections.abc import Mapping
from typing import Any

from autotune.config import CategoricalParam, FloatParam, IntParam, SearchSpace, Workload
from autotune.search.record import trial_record
from autotune.search.runner import StudyRun
from autotune.search.stage import Stage
from autotune.search.stages.common import Dispatch, Task, skip_stage
from autotune.search.stages.context import measure_noise, slo_first_stored
from autotune.search.stages.search import search_stall

SCENARIOS: dict[str, dict[str, Any]] = {
    # The articles' recommended starting points (seed 000, §5), per scenario.
    "online": {"max_running": 64, "batched_tokens": 4096, "schedule_conservativeness": 1.2},
    "offline": {"max_running": 256, "batched_tokens": 16384, "schedule_conservativeness": 0.3},
    "long_context": {"max_running": 32, "batched_tokens": 8192},
    "shared_prefix": {"prefix_caching": True, "schedule_policy": "lpm"},
}


def scenario(run: StudyRun, dispatch: Dispatch, quota: int, fixed: dict[str, Any]) -> None:
    """Up to ``quota`` trials over the space's knobs not in ``fixed`` (decided by earlier stages)."""
    rest = SearchSpace(params={k: v for k, v in run.job.space.params.items() if k not in fixed})
    if not rest.params:
        skip_stage(run, Stage.SCENARIO, "every knob of the space was decided by earlier stages")
        return
    kind = scenario_of(run.job.workload)
    # Only the worker that ran the sequential stages seeds the search, so two workers never
    # both run the articles' starting point.
    opening, why = _opening(run, rest, kind) if dispatch.leads else (None, "")
    follow: dict[int, dict[str, Any] | None] = {}  # thread → hint from its last result

    def start(first: bool) -> None:
        me = threading.get_ident()
        hint = opening if first and opening is not None else follow.get(me)
        if first and opening is not None:
            run.progress.message(f"scenario search ({kind} workload): first trial from {why}")
        result = run.run(Stage.SCENARIO, explicit=fixed, sample=rest, hint=hint)
        follow[me] = conservativeness_next(run, rest, result.facts, result.flags)
        measure_noise(run)  # when no earlier run served, on the first scenario trial that did

    stall = functools.partial(search_stall, run, Stage.SCENARIO, quota, rest, fixed)
    dispatch.fill([Task(Stage.SCENARIO, lambda t: trial_record(t).stage == Stage.SCENARIO, quota, start, stall)])


def _opening(run: StudyRun, rest: SearchSpace, kind: str) -> tuple[dict[str, Any], str]:
    """The scenario's first trial: the articles' starting point, with the SLO-first move on
    top when the baseline broke the SLO (its symptoms outrank a generic recommendation)."""
    articles = snap_to_space(rest, SCENARIOS[kind])
    move, reason = slo_first_stored(run)
    moved = snap_to_space(rest, move)
    why = f"the articles' {articles or 'defaults'}"
    if moved:
        why += f" with the SLO-first move {moved} ({reason})"
    return {**articles, **moved}, why


def scenario_of(workload: Workload) -> str:
    """Which of the articles' scenarios the workload is: shared prefix, long context, online or offline."""
    d = workload.dataset
    if d.prefix_len > 0:
        return "shared_prefix"
    if (d.input_dist.low + d.input_dist.high) / 2 >= 8192:  # a typical prompt, whatever the distribution
        return "long_context"
    return "online" if workload.slos else "offline"


def snap_to_space(space: SearchSpace, wanted: Mapping[str, Any]) -> dict[str, Any]:
    """Keep recommended values the space can express (clipped to ranges, nearest choice)."""
    out: dict[str, Any] = {}
    for name, value in wanted.items():
        p = space.params.get(name)
        if isinstance(p, (IntParam, FloatParam)) and isinstance(value, (int, float)) and not isinstance(value, bool):
            clipped = min(max(value, p.low), p.high)
            out[name] = int(clipped) if isinstance(p, IntParam) else float(clipped)
        elif isinstance(p, CategoricalParam):
            numeric = [c for c in p.choices if isinstance(c, (int, float)) and not isinstance(c, bool)]
            if value in p.choices:
                out[name] = value
            elif numeric and isinstance(value, (int, float)):
                out[name] = min(numeric, key=lambda c: abs(c - value))
        elif p is not None and p.type == "bool" and isinstance(value, bool):
            out[name] = value
    return out


def conservativeness_hint(facts: Mapping[str, Any], current: float) -> float | None:
    """SGLang's rule of thumb: KV underused with a queue → schedule more boldly; retractions →
    more carefully (seed 000, §3.2)."""
    if (facts.get("retractions") or 0) > 0:
        return round(min(current * 1.3, 2.0), 2)
    usage, queue = facts.get("token_usage_peak"), facts.get("queue_peak")
    if usage is not None and usage < 0.9 and (queue or 0) > 0:
        return round(max(current * 0.6, 0.1), 2)
    return None


def conservativeness_next(
    run: StudyRun, rest: SearchSpace, facts: Mapping[str, Any], flags: Mapping[str, Any]
) -> dict[str, Any] | None:
    """SGLang's conservativeness rule applied to a served trial: the point to try next, if any."""
    name = "schedule_conservativeness"
    if name not in rest.params:
        return None
    current = float(flags.get("--schedule-conservativeness", 1.0))
    target = conservativeness_hint(facts, current)
    snapped = snap_to_space(rest, {name: target}) if target is not None else {}
    if snapped:
        run.progress.message(f"schedule conservativeness {current} → trying {snapped[name]} (from the engine's log)")
    return snapped or None
