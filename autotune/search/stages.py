"""The tuning methodology the seed articles teach by hand, as stages of one study.

1. baseline        — the engine's defaults; every result is a gain over it (runner.py).
2. context         — ``context_len`` = the workload's longest request + headroom. When the
                     baseline broke the SLO, this run already moves the knobs its symptoms point
                     to (``slo_first``), and so do the graph runs and the scenario's first trial.
3. memory_edge     — raise the memory fraction in 0.02 steps (or bisect) until it fails *under
                     the workload's peak shape*; keep the last stable value minus one step.
4. cuda_graph      — double the captured max batch while giving back 0.02 of memory; keep it
                     only if throughput improves beyond the measured noise.
5. scenario        — Optuna over the remaining batching/scheduling knobs, warm-started with the
                     articles' recommended configurations for the workload's scenario.
6. validation      — finalists re-run with fresh engines, ranked by median (runner.py).

Each stage stores its decision in the study (``stage.<name>`` user attribute) and its trials
are tagged with the stage, so a resumed run continues where it stopped. A stage with nothing
to tune (no such knob in the space, a CPU engine) is skipped with a message, never faked.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from autotune.config import CategoricalParam, FloatParam, IntParam, SearchSpace, Workload
from autotune.outcomes import Outcome
from autotune.runtime.hostmem import GIB, NodeMemory, node_memory
from autotune.search.record import StageState, TrialRecord, set_memory_edge, trial_record, trial_records
from autotune.search.runner import STAGE_BASELINE, StudyRun
from autotune.search.stage import Stage
from autotune.search.storage import primary_value
from autotune.search.trial import graph_facts

__all__ = [
    "MemoryProbe",
    "conservativeness_next",
    "graph_sizes",
    "memory_verdict",
    "peak_workload",
    "plan_budget",
    "predict_memory_edge",
    "scenario_of",
    "sequential_stages",
    "skip_stage",
    "slo_first",
    "slo_first_move",
    "slo_first_stored",
    "snap_to_space",
]

STEP = 0.02
MEMORY, GRAPH, CONTEXT = "memory_fraction", "cuda_graph_max_bs", "context_len"
SLO_FIRST = "slo_first"


# ------------------------------------------------------------------------------ budget
def plan_budget(total: int, space: SearchSpace) -> dict[str, int]:
    """Split the trial budget: a few probes for the memory edge, one per graph size, the rest
    (at least a third) for the scenario search."""
    memory = min(max(3, total // 4), 8) if MEMORY in space.params else 0
    graph = max(0, len(graph_sizes(space)) - 1)
    scenario = max(total - memory - graph, math.ceil(total / 3))
    return {Stage.MEMORY_EDGE: memory, Stage.CUDA_GRAPH: graph, Stage.SCENARIO: scenario}


# ------------------------------------------------------------------------------ memory edge
@dataclass
class MemoryProbe:
    """Where the memory edge lies, from the fractions tried so far.

    ``results`` maps fraction → "ok" | "too_high" | "too_low". The engine's behaviour is
    monotonic in the fraction (too low: no room for KV; too high: OOM), so the edge is the
    highest "ok" below the lowest "too_high".
    """

    start: float
    high: float
    mode: str = "step"  # or "bisect"
    step: float = STEP
    # A walk from a fixed start keeps one step below its last stable value. A bracket around a
    # predicted edge runs its values under the peak shape itself, so the highest one that held is
    # kept as it is: on a small card that step is several percent of the KV pool.
    back_off: bool = True

    def next(self, results: Mapping[float, str]) -> float | None:
        if not results:
            return self.start
        lo = max((f for f, r in results.items() if r in ("ok", "too_low")), default=None)
        hi = min((f for f, r in results.items() if r == "too_high"), default=None)
        if lo is None:  # even the start failed high: step down
            assert hi is not None
            nxt = self._snap(hi - 2 * self.step)
            return nxt if nxt >= self.step and nxt not in results else None
        ceiling = hi if hi is not None else self._snap(self.high + self.step)
        if ceiling - lo <= self.step + 1e-9:
            return None
        nxt = lo + self.step if self.mode == "step" else self._snap((lo + ceiling) / 2)
        nxt = min(max(nxt, self._snap(lo + self.step)), self._snap(ceiling - self.step))
        return None if nxt > self.high + 1e-9 or nxt in results else self._snap(nxt)

    def edge(self, results: Mapping[float, str]) -> float | None:
        """The last stable value, minus one safety step when a failure was seen above it."""
        ok = [f for f, r in results.items() if r == "ok"]
        if not ok:
            return None
        best = max(ok)
        failed_above = any(r == "too_high" and f > best for f, r in results.items())
        backed = self._snap(best - self.step)
        return backed if self.back_off and failed_above and backed >= min(ok) else best

    def _snap(self, value: float) -> float:
        return round(round(value / self.step) * self.step, 4)


# What serving adds beyond a start-up profile is unknown before a run under load: allocator
# slack, blocks reserved after warm-up, mixed prefill/decode shapes. The tuning articles find
# vLLM's --gpu-memory-utilization stable up to about 0.92–0.95 for single-GPU models, i.e. 5 % of
# the card kept free, and runtime OOMs grow with the largest prefill batch. A prior only: the
# probes that follow verify it under peak load and move it on the 0.02 grid.
RUNTIME_MARGIN = 0.05  # of the card
ACTIVATION_GROWTH = 0.5  # of the profiled activation peak


def predict_memory_edge(facts: Mapping[str, Any], low: float, high: float) -> float | None:
    """The highest memory fraction the baseline's start-up numbers say survives peak load, on the
    0.02 grid within [low, high]; None when the engine did not log what the prediction needs.

    ``memory_budget`` tells what the fraction means. ``total``: it caps everything the engine
    allocates, the profiled activation peak and graph estimate included, so what lies outside it
    (free − fraction × total) must hold only what serving adds beyond the profile. ``static``: it
    is the share of free memory kept for weights and KV, so the rest must hold the activations,
    the graphs and the run-time margin. An engine that profiles no activations (SGLang) logs no
    peak: the margin alone stands for them there, and the probes that follow check it.
    """
    budget = facts.get("memory_budget")
    try:
        total, free = float(facts["mem_total_gib"]), float(facts["mem_free_gib"])
        act = float(facts["activation_peak_gib"] if budget == "total" else facts.get("activation_peak_gib") or 0.0)
        graphs = float(facts.get("graph_gib") or 0.0)
    except (KeyError, TypeError, ValueError):
        return None
    margin = RUNTIME_MARGIN * total + ACTIVATION_GROWTH * act
    if budget == "total":
        # The graph pool's excess over vLLM's estimate (≈ 0.05 GiB on an 8B model) is left to the
        # margin: taking it off as well put the RTX 4090 case's start one step under its edge.
        fraction = (free - margin) / total
    elif budget == "static":
        fraction = 1.0 - (act + graphs + margin) / free
    else:
        return None
    snapped = math.floor(fraction / STEP + 1e-9) * STEP
    return round(min(max(snapped, low), high), 4)


def memory_verdict(outcome: str, facts: Mapping[str, Any]) -> str:
    """What a memory-probe trial says of its fraction: ``ok``, ``too_high``, ``too_low`` or ``failed``."""
    if outcome in (Outcome.OK, Outcome.SLO_VIOLATION):
        return "ok"
    if outcome == Outcome.KV_INSUFFICIENT:
        return "too_low"
    if outcome in (Outcome.OOM_STARTUP, Outcome.OOM_RUNTIME):
        return "too_high"
    return "failed"  # crash/timeout: says nothing about memory; retried by the runner


def peak_workload(workload: Workload, concurrency: int) -> Workload:
    """The workload's peak shape: every slot busy with the longest request, all at once, so the
    KV pool, the largest prefill batch and the activation peak are all exercised.

    One request per slot is enough. Requests of one length that start together also end
    together, so a second round would repeat the first step for step; and when the engine holds
    fewer at once than ``concurrency``, the ones it queues already join as others finish, mixing
    prefill with decode within this one round."""
    return workload.model_copy(
        update={
            "name": f"{workload.name}-peak",
            "dataset": workload.peak_dataset(),
            "num_prompts": concurrency,
            "warmup_requests": 0,
            "arrival": workload.arrival.model_copy(update={"concurrency": concurrency, "request_rate": math.inf}),
            "slos": {},
            "max_error_rate": 0.0,
        }
    )


def _memory_semantics(run: StudyRun) -> tuple[float, float, str]:
    """(safe start, upper bound, what the knob means for the installed engine)."""
    p = run.job.space.params[MEMORY]
    assert isinstance(p, FloatParam)
    meaning = run.adapter.memory_semantics(run.engine_version())
    high = p.high if meaning.ceiling is None else min(p.high, meaning.ceiling)
    return max(p.low, meaning.start), high, meaning.note


def _on_cpu(run: StudyRun) -> bool:
    return run.adapter.runs_on_cpu() or any(r.facts.get("kv_device") == "cpu" for r in trial_records(run.trials()))


def _cpu_ceiling(run: StudyRun) -> tuple[float, NodeMemory]:
    """The highest fraction of the node that fits in what is available now, less the margin."""
    host = node_memory()
    margin = run.job.study.host_memory_margin_gib * GIB
    return math.floor(max(0.0, host.available - margin) / host.total / STEP) * STEP, host


def memory_edge(run: StudyRun, quota: int, fixed: dict[str, Any], mode: str) -> float | None:
    """Find the highest memory fraction that survives the peak load; returns it (or None)."""
    state = run.stage_state(Stage.MEMORY_EDGE)
    if state is not None and state.done:
        return state.edge
    if MEMORY not in run.job.space.params:
        skip_stage(run, Stage.MEMORY_EDGE, "the search space has no memory_fraction")
        return None
    pinned = run.adapter.pinned_kv_pool(run.flags(fixed))
    if pinned:
        skip_stage(run, Stage.MEMORY_EDGE, pinned)
        return None
    cpu = _on_cpu(run)
    start, high, note = _cpu_semantics(run) if cpu else _memory_semantics(run)  # high: the host's ceiling on CPU
    predicted = None if cpu else _predicted_start(run, start, high)
    if predicted is not None:
        start = predicted
        note += f"; the defaults' start-up memory predicts {predicted:.2f}, probing from there"
    run.progress.message(f"memory edge ({mode}): {note}")
    probe = MemoryProbe(start=start, high=high, mode=mode, back_off=predicted is None)
    peak = peak_workload(run.job.workload, _peak_concurrency(run, fixed))
    results = _probe_results(run)
    capped = ""
    while len(run.finished(Stage.MEMORY_EDGE)) < quota and not run.out_of_time():
        fraction = probe.next(results)
        if fraction is None:
            break
        if cpu:  # other processes may have taken memory since the last probe: read it again
            ceiling, host = _cpu_ceiling(run)
            if fraction > ceiling + 1e-9:
                capped = f"; stopped below {fraction:.2f}: the host has {host.describe()} now"
                break
        result = run.run(
            Stage.MEMORY_EDGE, explicit={**fixed, MEMORY: fraction}, workload=peak, extra={"probe": fraction}
        )
        verdict = memory_verdict(str(result.outcome), result.facts)
        if verdict != "failed":
            results[fraction] = verdict
        run.retry_failed()
        results = _probe_results(run)
    edge = probe.edge(results)
    key = f"context={fixed.get(CONTEXT, 'default')},graph={fixed.get(GRAPH, 'default')}"
    pool = _pool_at(run, edge)
    run.set_stage_state(
        Stage.MEMORY_EDGE,
        StageState(
            done=True,
            edge=edge,
            results={str(k): v for k, v in results.items()},
            key=key,
            mode=mode,
            note=note,
            ceiling=high if cpu and high < _space_high(run) else None,  # the host, not the space, capped it
            kv_cache_memory_bytes=pool or None,
        ),
    )
    set_memory_edge(run.study, key, edge)
    run.progress.message(_edge_line(edge, results, key, pool) + capped)
    return edge


def _predicted_start(run: StudyRun, low: float, high: float) -> float | None:
    """Where to start probing: the edge the earliest served run's start-up memory predicts."""
    for r in trial_records(run.trials()):
        if r.outcome in (Outcome.OK, Outcome.SLO_VIOLATION) and r.workload_override is None:
            return predict_memory_edge(r.facts, low, high)
    return None


def _cpu_semantics(run: StudyRun) -> tuple[float, float, str]:
    """vLLM-CPU without VLLM_CPU_KVCACHE_SPACE: the fraction is of the node's memory and the KV
    cache is that share minus the worker's own memory; probe up from the space's low end (the
    refusals down there are cheap and tell where the pool starts), never above what the host has."""
    p = run.job.space.params[MEMORY]
    assert isinstance(p, FloatParam)
    ceiling, host = _cpu_ceiling(run)
    start = max(STEP, math.ceil(p.low / STEP - 1e-9) * STEP)
    high = round(min(p.high, ceiling), 4)
    note = (
        f"vLLM-CPU reserves --gpu-memory-utilization × node memory and gives the KV cache what its worker "
        f"does not use; {host.describe()}, keeping {run.job.study.host_memory_margin_gib:g} GiB for the host "
        f"→ probing {start:.2f}–{high:.2f}"
    )
    return round(start, 4), high, note


def _space_high(run: StudyRun) -> float:
    p = run.job.space.params[MEMORY]
    assert isinstance(p, FloatParam)
    return p.high


def _pool_at(run: StudyRun, fraction: float | None) -> int | None:
    """The KV pool in bytes that the engine logged at this probe (for ``kv_cache_memory_bytes``)."""
    for r in trial_records(run.finished(Stage.MEMORY_EDGE)):
        gib = r.facts.get("kv_gib")
        if fraction is not None and r.probe == fraction and gib:
            return int(float(gib) * GIB)
    return None


def _edge_line(edge: float | None, results: Mapping[float, str], key: str, pool: int | None = None) -> str:
    """The stage's closing line: an edge only when a probe failed above the value kept."""
    tried = ", ".join(f"{f:.2f} {v}" for f, v in sorted(results.items()))
    in_bytes = f" (KV pool {pool / GIB:.2f} GiB: kv_cache_memory_bytes={pool})" if pool else ""
    if edge is None:
        return f"memory edge: not found — no probe passed under peak load ({key}); tried {tried or 'nothing'}"
    if not any(v == "too_high" and f > edge for f, v in results.items()):
        return (
            f"memory edge: not reached — every probe up to {max(results):.2f} passed under peak load "
            f"({len(results)} probes, {key}); keeping {edge:.2f}{in_bytes}"
        )
    return f"memory edge: {edge:.2f}{in_bytes} under peak load ({key}); tried {tried}"


def _probe_results(run: StudyRun) -> dict[float, str]:
    out: dict[float, str] = {}
    for r in trial_records(run.finished(Stage.MEMORY_EDGE)):
        verdict = memory_verdict(str(r.outcome), r.facts)
        if verdict != "failed" and r.probe is not None:
            out[float(r.probe)] = verdict
    return out


def _peak_concurrency(run: StudyRun, fixed: Mapping[str, Any]) -> int:
    """How many requests run at once at peak: the largest max_running the space allows."""
    value = fixed.get("max_running")
    if value is not None:
        return int(value)
    p = run.job.space.params.get("max_running")
    if isinstance(p, IntParam):
        return p.high
    if isinstance(p, CategoricalParam):
        return int(max(p.choices))
    return run.job.workload.arrival.concurrency or 256


# ------------------------------------------------------------------------------ CUDA graphs
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
    if _on_cpu(run):
        skip_stage(run, Stage.CUDA_GRAPH, "the CPU build captures no CUDA graphs")
        return {}
    best: dict[str, Any] | None = None
    best_value = -math.inf
    for i, size in enumerate(sizes):
        if run.out_of_time():
            break
        choice = {**fixed, GRAPH: size}
        if MEMORY in fixed:
            choice[MEMORY] = round(fixed[MEMORY] - STEP * i, 4)
        ran = {**move, **choice}
        t = _existing(run, Stage.CUDA_GRAPH, ran) or run.run(Stage.CUDA_GRAPH, explicit=ran).summary()
        value = t["value"] if t["outcome"] == Outcome.OK else -math.inf
        keep = value > -math.inf and (best is None or value > best_value * (1 + noise))
        verdict = _graph_verdict(t["outcome"], value, best_value, noise, keep)
        graphs = t.get("graphs") or {}
        run.progress.message(f"cuda graph max bs {size}{_captured_text(graphs)}: {verdict}")
        if keep:
            best, best_value = choice, value
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


def _existing(run: StudyRun, stage: str, params: Mapping[str, Any]) -> dict[str, Any] | None:
    """A finished trial of this stage with these params (so a resume does not repeat it)."""
    for t in run.finished(stage):
        r = trial_record(t)
        if r.params == dict(params):
            # The graph facts too: a resumed graph stage reads its coverage evidence from them.
            return {"value": primary_value(t), "outcome": r.outcome, "graphs": graph_facts(r.facts)}
    return None


# ------------------------------------------------------------------------------ scenario search
SCENARIOS: dict[str, dict[str, Any]] = {
    # The articles' recommended starting points (seed 000, §5), per scenario.
    "online": {"max_running": 64, "batched_tokens": 4096, "schedule_conservativeness": 1.2},
    "offline": {"max_running": 256, "batched_tokens": 16384, "schedule_conservativeness": 0.3},
    "long_context": {"max_running": 32, "batched_tokens": 8192},
    "shared_prefix": {"prefix_caching": True, "schedule_policy": "lpm"},
}


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
    record = _served(run, stage)
    found = slo_first_move(record.violations, record.facts, run.job.space) if record and record.violations else None
    if found is None:
        return {}
    move, reason = found
    broken = ", ".join(f"{k} +{v:.0%}" for k, v in record.violations.items()) if record else ""
    note = f"the {stage} run broke its SLO ({broken}): {reason}"
    run.set_stage_state(SLO_FIRST, StageState(done=True, fixed=move, note=note))
    run.progress.message(f"SLO first: {note} → {_knob_text(move)}, from the next trial on")
    return move


def slo_first_stored(run: StudyRun) -> tuple[dict[str, Any], str | None]:
    """The SLO-first move already decided, and why (empty when none was needed)."""
    state = run.stage_state(SLO_FIRST)
    if state is None or not state.done:
        return {}, None
    return dict(state.fixed or {}), state.note


def _served(run: StudyRun, stage: str) -> TrialRecord | None:
    """The stage's first served run of the study's own workload."""
    for r in trial_records(run.finished(stage)):
        if r.outcome in (Outcome.OK, Outcome.SLO_VIOLATION) and r.workload_override is None:
            return r
    return None


def _knob_text(knobs: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in knobs.items())


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


# ------------------------------------------------------------------------------ context
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
    result = _existing(run, Stage.CONTEXT, choice) or run.run(Stage.CONTEXT, explicit=choice).summary()
    decision = {CONTEXT: length} if result["outcome"] in (Outcome.OK, Outcome.SLO_VIOLATION) else {}
    run.set_stage_state(Stage.CONTEXT, StageState(done=True, fixed=decision))
    return decision


def skip_stage(run: StudyRun, stage: str, why: str) -> None:
    """Record ``stage`` as done-by-skipping (once) and say why."""
    if run.stage_state(stage) is None:
        run.progress.message(f"{stage}: skipped — {why}")
        run.set_stage_state(stage, StageState(done=True, skipped=why))


# ------------------------------------------------------------------------------ the sequential stages
def sequential_stages(run: StudyRun, budget: Mapping[str, int], memory_mode: str) -> dict[str, Any]:
    """Baseline, context, memory edge and graph coverage — each step needs the one before — and
    the flags they decided. Stages already done only return their stored decision."""
    run.retry_failed()
    run.baseline()
    run.measure_noise()
    fixed: dict[str, Any] = {}
    move = slo_first(run, STAGE_BASELINE)
    fixed.update(context(run, fixed, move))
    move = move or slo_first(run, Stage.CONTEXT)  # the defaults may first serve with the context set
    edge = memory_edge(run, budget[Stage.MEMORY_EDGE], fixed, memory_mode)
    if edge is not None:
        fixed[MEMORY] = edge
    fixed.update(cuda_graph(run, fixed, run.noise().margin, move))
    return fixed
