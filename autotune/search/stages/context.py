"""The start of a study: the baseline (the engine's defaults, every gain is over it), the noise
runs (the first served configuration again, the study's run-to-run noise), the context length
from the workload's longest request, and the SLO-first move when the defaults broke the SLO
(decided once, carried by the next runs)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from autotune.config import CategoricalParam, IntParam, SearchSpace
from autotune.outcomes import Outcome
from autotune.search.record import StageState, TrialRecord, trial_records
from autotune.search.runner import StudyRun
from autotune.search.stage import Stage
from autotune.search.stages.common import (
    CONTEXT,
    MEMORY,
    existing_run,
    knob_text,
    served_record,
    skip_stage,
)

SLO_FIRST = "slo_first"


def baseline(run: StudyRun) -> None:
    """The engine's defaults, once (a resumed study keeps its baseline)."""
    if run.job.study.baseline and not run.finished(Stage.BASELINE) and not run.out_of_time():
        run.run(Stage.BASELINE)


def measure_noise(run: StudyRun) -> None:
    """The study's first served configuration again on fresh engines (``noise_runs``): two
    measurements of one configuration give the study its run-to-run noise before the first
    decision that compares two runs needs it. That is the engine's defaults, right after the
    baseline; when they did not serve (a default context too long for the card), the first run
    that did, so a study whose defaults fail still decides on noise it measured. Called after
    each early run until it has launched its runs; a no-op from then on, and in a study without
    a baseline (it skips the runs that only measure)."""
    wanted = run.job.study.noise_runs if run.job.study.baseline else 0
    if not wanted or len(run.finished(Stage.NOISE)) >= wanted:
        return
    first = next((r for r in trial_records(run.finished()) if _first_measurement(r)), None)
    if first is None:
        return  # nothing served yet: nothing to launch again
    if not run.noise_lock.acquire(blocking=False):
        return  # another slot is measuring it; this one goes on searching
    try:
        while len(run.finished(Stage.NOISE)) < wanted and not run.out_of_time():
            run.run(Stage.NOISE, explicit=first.params or {})
    finally:
        run.noise_lock.release()
    run.progress.message(run.noise().describe())


def _first_measurement(record: TrialRecord) -> bool:
    """A served run of the study's own workload that is not itself a re-run of another."""
    return record.served_its_workload and record.stage not in (Stage.NOISE, Stage.VALIDATION)


def context(run: StudyRun, fixed: dict[str, Any], move: Mapping[str, Any]) -> dict[str, Any]:
    """``context_len`` from the workload's longest request; the run also carries the SLO-first
    ``move`` (it is the first trial after the baseline), which the decision does not keep."""
    state = run.stage_state(Stage.CONTEXT)
    if state is not None and state.done:
        return dict(state.fixed or {})
    if CONTEXT not in run.adapter.knobs:
        skip_stage(run, Stage.CONTEXT, f"{run.adapter.name} has no context-length flag")
        return {}
    settled = {**run.job.engine.fixed_flags, **run.job.space.fixed}
    if CONTEXT in settled or CONTEXT in run.job.space.params:
        skip_stage(run, Stage.CONTEXT, "context_len is already fixed or searched by the space")
        return {}
    longest = run.job.workload.longest_request_tokens
    length = int(math.ceil(longest * 1.1 / 256) * 256)
    run.progress.message(
        f"context: {length} tokens (longest request {longest} + 10 % headroom): "
        "the memory it frees goes to the KV cache"
    )
    choice = {**fixed, **move, CONTEXT: length}
    result = existing_run(run, Stage.CONTEXT, choice) or run.run(Stage.CONTEXT, explicit=choice).summary()
    decision = {CONTEXT: length} if result["outcome"] in (Outcome.OK, Outcome.SLO_VIOLATION) else {}
    run.set_stage_state(Stage.CONTEXT, StageState(done=True, fixed=decision))
    return decision


def slo_first_move(
    violations: Mapping[str, float], facts: Mapping[str, Any], space: SearchSpace
) -> tuple[dict[str, Any], str] | None:
    """When the defaults break the SLO, the knobs to move before anything else, and why.

    TTFT over its bound: prompts wait behind long prefill chunks, so a smaller batched-tokens
    chunk. TPOT over its bound: every decode step carries too many sequences, so fewer running.
    Preemptions: the running set outgrew the KV pool, so more KV when the memory stage will
    raise it (no move here), else fewer running. ``facts`` gives the knobs the engine resolved
    (``resolved_knobs``) and the running peak it logged.
    """
    resolved = facts.get("resolved_knobs") or {}
    wanted: dict[str, Any] = {}
    reasons: list[str] = []
    if any("ttft" in k for k in violations) and resolved.get("batched_tokens"):
        wanted["batched_tokens"] = _below(space, "batched_tokens", int(resolved["batched_tokens"]))
        reasons.append("TTFT over its bound → a smaller prefill chunk")
    running = int(facts.get("running_peak") or resolved.get("max_running") or 0)
    if any("tpot" in k for k in violations) and running:
        wanted["max_running"] = _below(space, "max_running", running)
        reasons.append("TPOT over its bound → fewer sequences per decode step")
    elif (facts.get("preemptions") or 0) > 0 and running and MEMORY not in space.params:
        wanted["max_running"] = _below(space, "max_running", running)
        reasons.append("preemptions → fewer running sequences")
    move = {k: v for k, v in wanted.items() if v is not None}
    return (move, "; ".join(reasons)) if move else None


def _below(space: SearchSpace, name: str, current: int) -> Any:
    """The space's value nearest half of ``current`` and below it (or its smallest), None if not
    searched. Nearest, not at most half: a running peak sampled from gauges can read a little
    under the cap the engine ran (62 of 64), and halving that must still give 32, not 16."""
    p = space.params.get(name)
    if isinstance(p, CategoricalParam):
        values = sorted(int(c) for c in p.choices)
        under = [v for v in values if v < current]
        return min(under, key=lambda v: abs(v - current / 2)) if under else values[0]
    if isinstance(p, IntParam):
        return max(p.low, min(p.high, current // 2))
    return None


def slo_first(run: StudyRun, stage: str) -> dict[str, Any]:
    """The knobs to move first when ``stage``'s served run of the defaults broke the SLO.

    Decided once and stored as the ``slo_first`` stage with its reason, so the context run, the
    graph runs and the scenario's opening trial all carry the same move, and a resume keeps it.
    """
    stored, _ = slo_first_stored(run)
    if stored:
        return stored
    record = served_record(run, stage)
    found = slo_first_move(record.violations, record.facts, run.job.space) if record and record.violations else None
    if found is None:
        return {}
    move, reason = found
    broken = ", ".join(f"{k} +{v:.0%}" for k, v in record.violations.items()) if record else ""
    note = f"the {stage} run broke its SLO ({broken}): {reason}"
    run.set_stage_state(SLO_FIRST, StageState(done=True, fixed=move, note=note))
    run.progress.message(f"SLO first: {note} → {knob_text(move)}, from the next trial on")
    return move


def slo_first_stored(run: StudyRun) -> tuple[dict[str, Any], str | None]:
    """The SLO-first move already decided, and why (empty when none was needed)."""
    state = run.stage_state(SLO_FIRST)
    if state is None or not state.done:
        return {}, None
    return dict(state.fixed or {}), state.note
