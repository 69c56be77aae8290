"""The memory edge: the highest memory fraction that survives the workload's peak shape, probed
in 0.02 steps (or bisected) from the edge the defaults' start-up memory predicts."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from autotune.config import CategoricalParam, FloatParam, IntParam, Workload
from autotune.outcomes import Outcome
from autotune.runtime.hostmem import GIB, NodeMemory, node_memory
from autotune.search.record import StageState, set_memory_edge, trial_records
from autotune.search.runner import StudyRun
from autotune.search.stage import Stage
from autotune.search.stages.common import (
    CONTEXT,
    GRAPH,
    MEMORY,
    STEP,
    on_cpu,
    skip_stage,
)


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
# Rounds of a full KV pool a probe sends at most: the first fills the pool, the second joins as
# the first finishes (prefill mixed with decode); a third would repeat them step for step.
PROBE_ROUNDS = 2


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


def peak_requests(facts: Mapping[str, Any], fraction: float, request_tokens: int) -> int | None:
    """At most how many peak-shape requests a probe at ``fraction`` needs: ``PROBE_ROUNDS`` times
    what its KV pool could hold at once, were all the memory the fraction grants beyond the
    weights KV (an upper bound: the pool is smaller by the activations, graphs and non-torch
    memory, so the first round always fills it). ``request_tokens``: what each request keeps in
    the pool (a shared prefix counted once). None when the start-up facts do not say.

    Where one slot per request would queue hundreds behind a pool that holds a few (a 70B model
    on two cards), the probe runs them one after another for hours of engine time and learns
    nothing the first two rounds did not show."""
    budget = facts.get("memory_budget")
    try:
        total, free = float(facts["mem_total_gib"]), float(facts["mem_free_gib"])
        weights, per_token = float(facts["weights_gib"]), float(facts["kv_bytes_per_token"])
    except (KeyError, TypeError, ValueError):
        return None
    of = {"total": total, "static": free}.get(str(budget))  # what the fraction is a share of
    if of is None or per_token <= 0:
        return None
    held = max(0.0, fraction * of - weights) * GIB / per_token / max(1, request_tokens)
    return PROBE_ROUNDS * max(1, math.ceil(held))


def memory_verdict(outcome: str, facts: Mapping[str, Any]) -> str:
    """What a memory-probe trial says of its fraction: ``ok``, ``too_high``, ``too_low`` or ``failed``."""
    if outcome in (Outcome.OK, Outcome.SLO_VIOLATION):
        return "ok"
    if outcome == Outcome.KV_INSUFFICIENT:
        return "too_low"
    if outcome in (Outcome.OOM_STARTUP, Outcome.OOM_RUNTIME):
        return "too_high"
    return "failed"  # crash/timeout: says nothing about memory; retried by the runner


def peak_workload(workload: Workload, concurrency: int, requests: int | None = None) -> Workload:
    """The workload's peak shape: every slot busy with the longest request, all at once, so the
    KV pool, the largest prefill batch and the activation peak are all exercised.

    One request per slot is enough. Requests of one length that start together also end
    together, so a second round would repeat the first step for step; and when the engine holds
    fewer at once than ``concurrency``, the ones it queues already join as others finish, mixing
    prefill with decode within this one round. ``requests`` caps that round where the engine
    can hold only a few at once (:func:`peak_requests`)."""
    return workload.model_copy(
        update={
            "name": f"{workload.name}-peak",
            "dataset": workload.peak_dataset(),
            "num_prompts": min(concurrency, requests or concurrency),
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
    cpu = on_cpu(run)
    start, high, note = _cpu_semantics(run) if cpu else _memory_semantics(run)  # high: the host's ceiling on CPU
    predicted = None if cpu else _predicted_start(run, start, high)
    if predicted is not None:
        start = predicted
        note += f"; the defaults' start-up memory predicts {predicted:.2f}, probing from there"
    run.progress.message(f"memory edge ({mode}): {note}")
    probe = MemoryProbe(start=start, high=high, mode=mode, back_off=predicted is None)
    slots = _peak_concurrency(run, fixed)
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
        peak = _probe_workload(run, slots, fraction)
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
    facts = _served_facts(run)
    return None if facts is None else predict_memory_edge(facts, low, high)


def _served_facts(run: StudyRun) -> Mapping[str, Any] | None:
    """The start-up facts of the study's earliest served run (None before one served)."""
    return next((r.facts for r in trial_records(run.trials()) if r.served_its_workload), None)


def _probe_workload(run: StudyRun, slots: int, fraction: float) -> Workload:
    """The peak shape a probe at ``fraction`` runs: one request per slot, or two rounds of the
    most its KV pool can hold when that is fewer (said when it is)."""
    workload = run.job.workload
    # The served run's KV bytes per token hold for the probe: both run the study's KV dtype (a
    # searched one is the scenario stage's, after the edge).
    facts = _served_facts(run)
    distinct = workload.longest_request_tokens - workload.dataset.prefix_len  # the prefix is held once
    cap = None if facts is None else peak_requests(facts, fraction, distinct)
    if cap is not None and cap < slots:
        run.progress.message(
            f"memory probe at {fraction:.2f}: {cap} peak-shape requests, {PROBE_ROUNDS} rounds of the most its "
            f"KV pool can hold, not one per slot ({slots})"
        )
    return peak_workload(workload, slots, cap)


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
