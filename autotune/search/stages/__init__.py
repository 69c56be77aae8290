"""The tuning methodology the seed articles teach by hand, as stages of one study — the whole
method, one module per stage; :func:`run_method` runs it through a :class:`Dispatch` (the
orchestrator's slots and workers, ``search/parallel.py``), and every trial through
:meth:`StudyRun.run <autotune.search.runner.StudyRun.run>`.

1. baseline        — the engine's defaults; every result is a gain over it, and the first
                     served configuration again on a fresh engine measures the study's noise
                     (context.py).
2. context         — ``context_len`` = the workload's longest request + headroom. When the
                     baseline broke the SLO, this run already moves the knobs its symptoms point
                     to (``slo_first``), and so do the graph runs and the scenario's first trial.
3. memory_edge     — raise the memory fraction in 0.02 steps (or bisect) until it fails *under
                     the workload's peak shape*; keep the last stable value minus one step.
4. cuda_graph      — double the captured max batch while giving back 0.02 of memory; keep it
                     only if throughput improves beyond the measured noise.
5. scenario        — Optuna over the remaining batching/scheduling knobs, warm-started with the
                     articles' recommended configurations for the workload's scenario.
6. validation      — finalists and defaults re-run with fresh engines round by round, ranked by
                     median; the verdict on the paired rounds (validation.py).

``--method search`` is the baseline, then one search over the whole space (search.py), then
validation; ``--method memory`` the baseline and the memory edge alone.

Each stage stores its decision in the study (``stage.<name>`` user attribute) and its trials
are tagged with the stage, so a resumed run continues where it stopped. A stage with nothing
to tune (no such knob in the space, a CPU engine) is skipped with a message, never faked.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from autotune.config import SearchSpace
from autotune.search.runner import StudyRun
from autotune.search.stage import Stage
from autotune.search.stages.common import CONTEXT, GRAPH, MEMORY, STEP, Dispatch, Task, skip_stage
from autotune.search.stages.context import (
    SLO_FIRST,
    baseline,
    context,
    measure_noise,
    slo_first,
    slo_first_move,
    slo_first_stored,
)
from autotune.search.stages.graphs import cuda_graph, graph_sizes
from autotune.search.stages.memory import (
    MemoryProbe,
    memory_edge,
    memory_verdict,
    peak_requests,
    peak_workload,
    predict_memory_edge,
)
from autotune.search.stages.scenario import (
    SCENARIOS,
    conservativeness_hint,
    conservativeness_next,
    scenario,
    scenario_of,
    snap_to_space,
)
from autotune.search.stages.search import plain_search, search_stall
from autotune.search.stages.validation import finalists, validate, validation_groups, validation_runs

__all__ = [
    "CONTEXT",
    "GRAPH",
    "MEMORY",
    "SCENARIOS",
    "SLO_FIRST",
    "STEP",
    "Dispatch",
    "MemoryProbe",
    "Task",
    "baseline",
    "conservativeness_hint",
    "conservativeness_next",
    "context",
    "cuda_graph",
    "finalists",
    "graph_sizes",
    "measure_noise",
    "memory_edge",
    "memory_verdict",
    "peak_requests",
    "peak_workload",
    "plain_search",
    "plan_budget",
    "predict_memory_edge",
    "run_method",
    "scenario",
    "scenario_of",
    "search_stall",
    "sequential_stages",
    "skip_stage",
    "slo_first",
    "slo_first_move",
    "slo_first_stored",
    "snap_to_space",
    "validate",
    "validation_groups",
    "validation_runs",
]


def run_method(run: StudyRun, dispatch: Dispatch) -> None:
    """The study's method (``--method``), from its first trial to the verdict."""
    study = run.job.study
    if study.method == "memory":

        def edge_only() -> None:
            baseline(run)
            memory_edge(run, study.trials, {}, study.memory_probe)

        dispatch.sequential(edge_only)
        return
    if study.method == "staged":
        budget = plan_budget(study.trials, run.job.space)
        fixed = dispatch.sequential(lambda: sequential_stages(run, budget, study.memory_probe))
        scenario(run, dispatch, budget[Stage.SCENARIO], fixed)
    else:
        plain_search(run, dispatch)
    validate(run, dispatch)


def plan_budget(total: int, space: SearchSpace) -> dict[str, int]:
    """Split the trial budget: a few probes for the memory edge, one per graph size, the rest
    (at least a third) for the scenario search."""
    memory = min(max(3, total // 4), 8) if MEMORY in space.params else 0
    graph = max(0, len(graph_sizes(space)) - 1)
    scenario = max(total - memory - graph, math.ceil(total / 3))
    return {Stage.MEMORY_EDGE: memory, Stage.CUDA_GRAPH: graph, Stage.SCENARIO: scenario}


def sequential_stages(run: StudyRun, budget: Mapping[str, int], memory_mode: str) -> dict[str, Any]:
    """Baseline, context, memory edge and graph coverage — each step needs the one before — and
    the flags they decided. Stages already done only return their stored decision."""
    run.retry_failed()
    baseline(run)
    measure_noise(run)
    fixed: dict[str, Any] = {}
    move = slo_first(run, Stage.BASELINE)
    fixed.update(context(run, fixed, move))
    measure_noise(run)  # when the defaults did not serve, on the context run's configuration
    move = move or slo_first(run, Stage.CONTEXT)  # the defaults may first serve with the context set
    edge = memory_edge(run, budget[Stage.MEMORY_EDGE], fixed, memory_mode)
    if edge is not None:
        fixed[MEMORY] = edge
    fixed.update(cuda_graph(run, fixed, run.noise().margin, move))
    return fixed
