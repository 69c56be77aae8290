"""CUDA-graph coverage: the captured max batch walked up while giving back 0.02 of memory, kept
only beyond the measured noise, stopped once the engine's own counters show full coverage."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from autotune.config import CategoricalParam, IntParam, SearchSpace
from autotune.outcomes import Outcome
from autotune.search.record import StageState
from autotune.search.runner import StudyRun
from autotune.search.stage import Stage
from autotune.search.stages.common import (
    GRAPH,
    MEMORY,
    STEP,
    existing_run,
    on_cpu,
    skip_stage,
)


def graph_sizes(space: SearchSpace) -> list[int]:
    """The CUDA-graph batch sizes the coverage stage may try, smallest first."""
    p = space.params.get(GRAPH)
    if isinstance(p, CategoricalParam):
        return sorted(int(c) for c in p.choices)
    if isinstance(p, IntParam):
        sizes, s = [], p.low
        while s <= p.high:
            sizes.append(s)
            s *= 2
        return sizes
    return []


def cuda_graph(run: StudyRun, fixed: dict[str, Any], noise: float, move: Mapping[str, Any]) -> dict[str, Any]:
    """Walk the captured max batch up (256 → 512 → 768 …) giving back 0.02 of memory per step;
    keep a larger size only when throughput beats the current best by more than the noise. The
    runs carry the SLO-first ``move``: a size judged on runs that break the SLO would be rejected."""
    state = run.stage_state(Stage.CUDA_GRAPH)
    if state is not None and state.done:
        return dict(state.fixed or {})
    sizes = graph_sizes(run.job.space)
    if not sizes:
        skip_stage(run, Stage.CUDA_GRAPH, "the search space has no cuda_graph_max_bs")
        return {}
    if on_cpu(run):
        skip_stage(run, Stage.CUDA_GRAPH, "the CPU build captures no CUDA graphs")
        return {}
    best: dict[str, Any] | None = None
    best_value = -math.inf
    eager_from = 0  # the fewest tokens of a step seen without a graph: a smaller size adds none
    for i, size in enumerate(sizes):
        if run.out_of_time():
            break
        if size < eager_from:
            run.progress.message(
                f"cuda graph max bs {size}: skipped — the steps without a graph had {eager_from:,} tokens or more "
                "(vLLM's --cudagraph-metrics table), so capturing up to this size puts none of them in a graph"
            )
            continue
        choice = {**fixed, GRAPH: size}
        if MEMORY in fixed:
            choice[MEMORY] = round(fixed[MEMORY] - STEP * i, 4)
        ran = {**move, **choice}
        t = existing_run(run, Stage.CUDA_GRAPH, ran) or run.run(Stage.CUDA_GRAPH, explicit=ran).summary()
        value = t["value"] if t["outcome"] == Outcome.OK else -math.inf
        keep = value > -math.inf and (best is None or value > best_value * (1 + noise))
        verdict = _graph_verdict(t["outcome"], value, best_value, noise, keep)
        graphs = t.get("graphs") or {}
        run.progress.message(f"cuda graph max bs {size}{_captured_text(graphs)}: {verdict}")
        if keep:
            best, best_value = choice, value
        if value > -math.inf:
            eager_from = int(graphs.get("eager_min_tokens") or 0)
        evidence = _full_coverage(graphs, sizes[-1]) if value > -math.inf and size != sizes[-1] else None
        if evidence:
            run.progress.message(
                f"cuda graph max bs {size}: {evidence}: larger sizes cannot add coverage, only memory; stopping here"
            )
            break
    decision = {k: v for k, v in (best or {}).items() if k in (GRAPH, MEMORY)}
    run.set_stage_state(Stage.CUDA_GRAPH, StageState(done=True, fixed=decision, noise=noise))
    return decision


def _full_coverage(graphs: Mapping[str, Any], largest: int) -> str | None:
    """Why no larger captured size can put another step in a graph, from the engine's own step
    counts (never from sampled gauges), or None when the run does not show it.

    SGLang counts its decode passes with and without a graph. vLLM's ``--cudagraph-metrics``
    tables count every step by its token count and runtime mode; a step runs without a graph when
    its tokens exceed the captured max, so a step of more tokens than the largest size the space
    allows stays eager whatever size is captured."""
    if graphs.get("decode_passes") and graphs.get("cuda_graph_false_share") == 0:
        return f"every one of {graphs['decode_passes']:,} decode passes ran in a graph (the engine's pass counter)"
    steps = graphs.get("graph_steps")
    if not steps:
        return None
    if graphs.get("cuda_graph_false_share") == 0:
        return f"every one of {steps:,} steps ran in a graph (vLLM's --cudagraph-metrics table)"
    smallest = graphs.get("eager_min_tokens")
    if smallest is not None and smallest > largest:
        return (
            f"the steps without a graph all had {smallest:,} tokens or more, above the largest size tried "
            f"({largest}) (vLLM's --cudagraph-metrics table, {steps:,} steps)"
        )
    return None


def _captured_text(graphs: Mapping[str, Any]) -> str:
    """What the engine's log and counters say it captured: a size above the running cap is
    clipped by the engine, and batches above the captured max run without a graph."""
    parts = []
    if "cuda_graph_max_bs" in graphs:
        parts.append(f"captured up to {graphs['cuda_graph_max_bs']}")
    if "cuda_graph_false_share" in graphs:
        # SGLang counts decode passes; vLLM's table counts every step, prefill chunks too.
        steps = "steps" if "graph_steps" in graphs else "decode steps"
        parts.append(f"{graphs['cuda_graph_false_share']:.0%} of {steps} without a graph")
    return f" ({', '.join(parts)})" if parts else ""


def _graph_verdict(outcome: str, value: float, best: float, noise: float, keep: bool) -> str:
    """What one graph size did, in words that match the numbers (a slower run is called slower)."""
    if value == -math.inf:
        return f"{outcome} → rejected"
    if not math.isfinite(best):
        return f"{value:,.1f} → kept (the first size)"
    change = value / best - 1 if best else 0.0
    if keep:
        return f"{value:,.1f}, {change:+.1%} vs the best so far → kept (above the +{noise:.0%} noise)"
    if change < 0:
        return f"{value:,.1f}, slower by {-change:.1%} → rejected"
    return f"{value:,.1f}, {change:+.1%} vs the best so far → rejected (within the +{noise:.0%} noise)"
