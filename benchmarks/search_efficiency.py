"""Search efficiency on the simulator: trials to reach 97 % of the exhaustive optimum.

Run: ``python benchmarks/search_efficiency.py [--seeds 5] [--budget 40] [--cases NAME ...]``.

Each trial is evaluated in-process with the simulator's own pieces (vLLM's flag resolution,
``plan_vllm`` for start-up, ``autotune_sim.offline.simulate`` for serving, ``step_bytes`` against
the plan's run-time free memory for OOMs under load), so the whole discretised space can be
evaluated and its true optimum is known. Methods compared, each with the same trial budget:

* ``staged``  — the product's stage decisions (``plan_budget``, ``MemoryProbe`` under
  ``peak_workload``, the CUDA-graph walk with 0.02 give-back, then TPE warm-started from
  ``SCENARIOS`` via ``snap_to_space``); every run, probes included, counts as a trial;
* ``tpe``     — the product's TPE sampler over the whole space, failures told as infeasible;
* ``random``  — the product's random sampler;
* ``grid``    — vLLM's ``auto_tune.sh``: a start-up-only memory probe from 0.98 down, then
  max-num-seqs × max-num-batched-tokens in its loop order.

All numbers are modelled by autotune's simulator, not measured on hardware.
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import optuna

from autotune.config import (
    Arrival,
    CategoricalParam,
    Dataset,
    FloatParam,
    SearchSpace,
    StudySettings,
    Workload,
)
from autotune.outcomes import Outcome
from autotune.search.objective import score
from autotune.search.space import suggest
from autotune.search.stages import (
    GRAPH,
    MEMORY,
    SCENARIOS,
    STEP,
    MemoryProbe,
    graph_sizes,
    memory_verdict,
    peak_workload,
    plan_budget,
    scenario_of,
    snap_to_space,
)
from autotune.search.tune import make_sampler
from autotune_sim.dialects.base import new_pool
from autotune_sim.dialects.vllm_args import ConfigFailure, build_parser, preprocess, resolve
from autotune_sim.memory import VllmMemory, footprint, plan_vllm, step_bytes
from autotune_sim.offline import simulate
from autotune_sim.perf import PerfModel, StepShape
from autotune_sim.presets import GPUS
from autotune_sim.scheduler import VllmScheduler
from autotune_sim.settings import SimSettings
from autotune_sim.stats import EngineStats

__all__ = ["CASES", "SPACE", "Case", "SimObjective", "exhaustive", "run_method", "trials_to"]

TARGET = 0.97
Params = dict[str, Any]

SPACE = SearchSpace(
    params={
        MEMORY: FloatParam(type="float", low=0.80, high=0.98, step=STEP),
        "max_running": CategoricalParam(type="categorical", choices=[32, 64, 128, 256, 512, 1024]),
        "batched_tokens": CategoricalParam(type="categorical", choices=[2048, 4096, 8192, 16384]),
        GRAPH: CategoricalParam(type="categorical", choices=[256, 512, 768]),
    }
)
FLAG = {
    MEMORY: "--gpu-memory-utilization",
    "max_running": "--max-num-seqs",
    "batched_tokens": "--max-num-batched-tokens",
    GRAPH: "--max-cudagraph-capture-size",
    "context_len": "--max-model-len",
}
_PEER_MEMORY = [0.98, 0.96, 0.94, 0.92, 0.90]  # auto_tune.sh's 0.98 → 0.90, on this space's 0.02 grid


# ------------------------------------------------------------------------------ cases
@dataclass(frozen=True)
class Case:
    name: str
    model: str
    gpu: str
    tp: int
    workload: Workload

    @property
    def context_len(self) -> int:
        # The context stage's rule (stages.context); every method gets it, as auto_tune.sh fixes it too.
        return int(math.ceil(self.workload.longest_request_tokens * 1.1 / 256) * 256)


def _workload(name: str, isl: int, osl: int, concurrency: int, prompts: int, slos: dict[str, float]) -> Workload:
    return Workload(
        name=name,
        dataset=Dataset(input_len=isl, output_len=osl, range_ratio=0.5),
        num_prompts=prompts,
        arrival=Arrival(concurrency=concurrency),
        slos=slos,
    )


CASES = [
    Case(
        "llama8b-h100-chat",
        "meta-llama/Llama-3.1-8B-Instruct",
        "H100-80GB",
        1,
        _workload("chat", 1024, 128, 128, 256, {"mean_ttft_ms": 1200.0}),
    ),
    Case("qwen7b-l4-offline", "Qwen/Qwen2.5-7B-Instruct", "L4", 1, _workload("offline", 512, 256, 128, 256, {})),
    Case(
        "llama8b-a100-40-longctx",
        "meta-llama/Llama-3.1-8B-Instruct",
        "A100-40GB",
        1,
        _workload("long", 8192, 128, 16, 32, {}),
    ),
    Case(
        "qwen72b-tp4-h100-chat",
        "Qwen/Qwen2.5-72B-Instruct",
        "H100-80GB",
        4,
        _workload("chat", 1024, 128, 64, 128, {"mean_ttft_ms": 1600.0}),
    ),
]


# ------------------------------------------------------------------------------ objective
@dataclass(frozen=True)
class Result:
    outcome: Outcome
    value: float | None  # output tok/s when served (ok or SLO violation)
    metrics: Mapping[str, float] = field(default_factory=dict)

    @property
    def feasible(self) -> bool:
        return self.outcome == Outcome.OK


class _MemoryWatch(PerfModel):
    """The perf model, also recording the largest run-time step memory (the engine's OOM check)."""

    peak_need = 0.0

    def step_time(self, shape: StepShape) -> float:
        self.peak_need = max(self.peak_need, step_bytes(self.fp, shape.tokens, shape.sampled))
        return super().step_time(shape)


class SimObjective:
    """One case's trial evaluator; served runs are cached because the model is deterministic."""

    def __init__(self, case: Case) -> None:
        self.case = case
        self.settings = SimSettings(gpu=GPUS[case.gpu], num_gpus=max(8, case.tp))
        self._cache: dict[tuple[Any, ...], tuple[float, ...]] = {}
        self.evaluations = 0

    def argv(self, params: Mapping[str, Any]) -> list[str]:
        argv = ["--model", self.case.model, "--tensor-parallel-size", str(self.case.tp)]
        for name, value in params.items():
            argv += [FLAG[name], str(value)]
        return argv

    def __call__(self, params: Mapping[str, Any], workload: Workload | None = None) -> Result:
        """Start-up (memory plan), then serve ``workload`` (the case's by default)."""
        workload = workload or self.case.workload
        self.evaluations += 1
        try:
            cfg = resolve(
                build_parser(self.settings.vllm_version).parse_args(preprocess(self.argv(params))), self.settings, {}
            )
        except ConfigFailure:
            return Result(Outcome.INVALID_FLAGS, None)
        fp = footprint(cfg.model, tp=cfg.tp, pp=cfg.pp)
        plan = plan_vllm(self._memory(cfg, fp))
        if plan.failure in ("no_kv", "kv_too_small", "auto_fit_impossible"):
            return Result(Outcome.KV_INSUFFICIENT, None)
        if plan.failure is not None:
            return Result(Outcome.OOM_STARTUP, None)
        duration, tokens, ttft, need = self._serve(cfg, fp, plan, workload)
        if need > plan.runtime_free:
            return Result(Outcome.OOM_RUNTIME, None)
        metrics = {"output_throughput": tokens / duration, "mean_ttft_ms": 1000 * ttft, "error_rate": 0.0}
        served = score(Outcome.OK, metrics, workload)
        outcome = Outcome.OK if not served.violations else Outcome.SLO_VIOLATION
        return Result(outcome, metrics["output_throughput"], metrics)

    def _memory(self, cfg: Any, fp: Any) -> VllmMemory:
        return VllmMemory(
            gpu=self.settings.gpu,
            fp=fp,
            utilization=cfg.utilization,
            max_batched_tokens=cfg.max_num_batched_tokens,
            max_num_seqs=cfg.max_num_seqs,
            capture_sizes=cfg.capture_sizes if cfg.graphs_per_size else [],
            graphs_per_size=cfg.graphs_per_size,
            block_size=cfg.block_size,
            max_model_len=cfg.max_model_len,
            derived_max_len=cfg.derived_max_len,
        )

    def _serve(self, cfg: Any, fp: Any, plan: Any, workload: Workload) -> tuple[float, ...]:
        """(modelled seconds, output tokens, mean TTFT, largest step memory), cached on what
        changes the schedule: a pool larger than every admitted request can use behaves like an
        unlimited one, so fractions above that point share one run."""
        d = workload.dataset
        longest = int(d.input_len * (1 + d.range_ratio)) + d.output_len
        concurrency = workload.arrival.concurrency or workload.num_prompts
        slots = min(cfg.max_num_seqs, concurrency)
        blocks = min(plan.num_blocks - 1, slots * (math.ceil(longest / cfg.block_size) + 1) + 1)
        shape = (d.input_len, d.output_len, d.range_ratio, workload.num_prompts, concurrency)
        key = (shape, blocks, cfg.max_num_seqs, cfg.max_num_batched_tokens, cfg.max_capture, plan.max_model_len)
        if key not in self._cache:
            self._cache[key] = self._simulate(cfg, fp, plan, workload, blocks)
        return self._cache[key]

    def startup_only(self, params: Mapping[str, Any]) -> Outcome:
        """What auto_tune.sh's probe sees: does the engine start (``/health`` answers)?"""
        self.evaluations += 1
        cfg = resolve(
            build_parser(self.settings.vllm_version).parse_args(preprocess(self.argv(params))), self.settings, {}
        )
        plan = plan_vllm(self._memory(cfg, footprint(cfg.model, tp=cfg.tp, pp=cfg.pp)))
        if plan.failure in ("no_kv", "kv_too_small", "auto_fit_impossible"):
            return Outcome.KV_INSUFFICIENT
        return Outcome.OOM_STARTUP if plan.failure else Outcome.OK

    def _simulate(self, cfg: Any, fp: Any, plan: Any, workload: Workload, blocks: int) -> tuple[float, ...]:
        sched = VllmScheduler(
            new_pool(blocks, cfg.block_size, False),
            EngineStats(max_model_len=plan.max_model_len),
            lambda seed, i: 1000 + i % 7,
            max_num_seqs=cfg.max_num_seqs,
            max_batched_tokens=cfg.max_num_batched_tokens,
            chunked_prefill=cfg.chunked_prefill,
            long_prefill_threshold=cfg.long_prefill_threshold,
            priority_policy=False,
            reserve_full_isl=cfg.reserve_full_isl,
            graph_mode=cfg.cudagraph_mode,
            max_capture=cfg.max_capture,
        )
        perf = _MemoryWatch(cfg.model, self.settings.gpu, fp, tp=cfg.tp, pp=cfg.pp)
        d = workload.dataset
        result = simulate(
            sched,
            perf,
            requests=workload.num_prompts,
            concurrency=workload.arrival.concurrency or workload.num_prompts,
            prompt=lambda i: _prompt(i, d.input_len, d.range_ratio),
            output_len=d.output_len,
        )
        return result.duration_s, float(result.output_tokens), result.mean_ttft_s, perf.peak_need


def _prompt(i: int, length: int, ratio: float) -> list[int]:
    """A deterministic prompt whose length is spread uniformly over vLLM's random range."""
    lo, hi = int(length * (1 - ratio)), int(length * (1 + ratio))
    n = lo + (i * 7919) % (hi - lo + 1)
    return [(i * 31 + j) % 30000 + 300 for j in range(n)]


# ------------------------------------------------------------------------------ exhaustive
def grid_points(space: SearchSpace = SPACE) -> Iterator[Params]:
    axes: list[tuple[str, list[Any]]] = []
    for name, p in space.params.items():
        if isinstance(p, FloatParam):
            assert p.step
            n = round((p.high - p.low) / p.step)
            axes.append((name, [round(p.low + i * p.step, 4) for i in range(n + 1)]))
        elif isinstance(p, CategoricalParam):
            axes.append((name, list(p.choices)))
    for values in itertools.product(*(v for _, v in axes)):
        yield dict(zip((n for n, _ in axes), values, strict=True))


def exhaustive(obj: SimObjective) -> tuple[float, Params]:
    """The true optimum: the best feasible throughput over every point of the space."""
    ctx = {"context_len": obj.case.context_len}
    best, arg = 0.0, {}
    for params in grid_points():
        r = obj({**params, **ctx})
        if r.feasible and r.value is not None and r.value > best:
            best, arg = r.value, params
    return best, arg


# ------------------------------------------------------------------------------ methods
@dataclass
class Trial:
    stage: str
    params: Params
    result: Result


@dataclass
class Ledger:
    """The trials a method ran, in order, under a budget (every run counts)."""

    obj: SimObjective
    budget: int
    trials: list[Trial] = field(default_factory=list)

    @property
    def full(self) -> bool:
        return len(self.trials) >= self.budget

    def run(self, stage: str, params: Params, workload: Workload | None = None) -> Result:
        flags = {"context_len": self.obj.case.context_len, **params} if stage != "baseline" else params
        result = self.obj(flags, workload)
        self.trials.append(Trial(stage, params, result if workload is None else _probe_only(result)))
        return result


def _probe_only(result: Result) -> Result:
    # A probe runs the peak shape, not the workload: it says where memory breaks, not what the
    # workload gets, so its throughput never counts towards the objective.
    return Result(result.outcome, None)


def _study(method: str, seed: int, budget: int) -> optuna.Study:
    sampler = make_sampler(StudySettings(name="bench", trials=budget, seed=seed, sampler=method))  # type: ignore[arg-type]
    return optuna.create_study(direction="maximize", sampler=sampler)


def _ask_tell(ledger: Ledger, study: optuna.Study, space: SearchSpace, fixed: Params, stage: str) -> None:
    """One Optuna trial: sample ``space``, run with ``fixed``, tell value and constraints."""
    trial = study.ask()
    params = {**fixed, **suggest(trial, space)}
    result = ledger.run(stage, params)
    metrics = result.metrics if result.outcome.served else {}
    s = score(result.outcome, metrics, ledger.obj.case.workload)
    for name, slack in s.constraints.items():
        trial.set_constraint(name, slack)
    study.tell(trial, s.value)


def optuna_search(ledger: Ledger, method: str, seed: int) -> None:
    study = _study(method, seed, ledger.budget)
    while not ledger.full:
        _ask_tell(ledger, study, SPACE, {}, method)


def peer_grid(ledger: Ledger, seed: int) -> None:
    """auto_tune.sh: start-up-only probe with the largest seqs/tokens, then the grid."""
    del seed  # deterministic
    seqs = SPACE.params["max_running"].choices  # type: ignore[union-attr]
    tokens = SPACE.params["batched_tokens"].choices  # type: ignore[union-attr]
    largest = {"max_running": max(seqs), "batched_tokens": max(tokens), GRAPH: 512}
    util = None
    for fraction in _PEER_MEMORY:
        started = ledger.obj.startup_only({**largest, MEMORY: fraction, "context_len": ledger.obj.case.context_len})
        ledger.trials.append(Trial("grid_probe", {**largest, MEMORY: fraction}, Result(started, None)))
        if started not in (Outcome.OOM_STARTUP, Outcome.KV_INSUFFICIENT):
            util = fraction
            break
    if util is None:
        return
    for s, t in itertools.product(seqs, tokens):
        if ledger.full:
            return
        ledger.run("grid", {MEMORY: util, "max_running": s, "batched_tokens": t, GRAPH: 512})


def staged(ledger: Ledger, seed: int) -> None:
    """The product's stage decisions, each run counted as a trial (validation is skipped: the
    simulator is deterministic, so re-runs would repeat the same number)."""
    budget = plan_budget(ledger.budget, SPACE)
    ledger.run("baseline", {})
    ledger.run("context", {})
    fixed: Params = {}
    edge = _memory_edge(ledger, budget["memory_edge"])
    if edge is not None:
        fixed[MEMORY] = edge
    fixed.update(_graph_walk(ledger, fixed))
    rest = SearchSpace(params={k: v for k, v in SPACE.params.items() if k not in fixed})
    study = _study("tpe", seed, ledger.budget)
    hint = snap_to_space(rest, SCENARIOS[scenario_of(ledger.obj.case.workload)])
    if hint:
        study.enqueue_trial(hint)
    while not ledger.full:
        _ask_tell(ledger, study, rest, fixed, "scenario")


def _memory_edge(ledger: Ledger, quota: int) -> float | None:
    """stages.memory_edge: step up from 0.80 under the peak shape (concurrency = the largest
    max_running of the space, the other knobs at the engine's defaults)."""
    mem = SPACE.params[MEMORY]
    assert isinstance(mem, FloatParam)
    probe = MemoryProbe(start=max(mem.low, 0.80), high=mem.high, mode="step")
    peak = peak_workload(ledger.obj.case.workload, max(SPACE.params["max_running"].choices))  # type: ignore[union-attr]
    results: dict[float, str] = {}
    for _ in range(quota):
        fraction = probe.next(results)
        if fraction is None or ledger.full:
            break
        r = ledger.run("memory_edge", {MEMORY: fraction}, workload=peak)
        verdict = memory_verdict(str(r.outcome), {})
        if verdict != "failed":
            results[fraction] = verdict
    return probe.edge(results)


def _graph_walk(ledger: Ledger, fixed: Params, noise: float = 0.03) -> Params:
    """stages.cuda_graph: larger captured batch, 0.02 less memory, kept only beyond noise."""
    best: Params | None = None
    best_value = -math.inf
    for i, size in enumerate(graph_sizes(SPACE)):
        if ledger.full:
            break
        choice = {**fixed, GRAPH: size}
        if MEMORY in fixed:
            choice[MEMORY] = round(fixed[MEMORY] - STEP * i, 4)
        r = ledger.run("cuda_graph", choice)
        value = r.value if r.feasible and r.value is not None else -math.inf
        if (best is None or value > best_value * (1 + noise)) and value > -math.inf:
            best, best_value = choice, value
    return {k: v for k, v in (best or {}).items() if k in (GRAPH, MEMORY)}


METHODS: dict[str, Callable[[Ledger, int], None]] = {
    "staged": staged,
    "tpe": lambda ledger, seed: optuna_search(ledger, "tpe", seed),
    "random": lambda ledger, seed: optuna_search(ledger, "random", seed),
    "grid": peer_grid,
}


def run_method(obj: SimObjective, method: str, seed: int, budget: int) -> list[Trial]:
    ledger = Ledger(obj, budget)
    METHODS[method](ledger, seed)
    return ledger.trials[:budget]


# ------------------------------------------------------------------------------ scoring
def trials_to(trials: list[Trial], optimum: float, target: float = TARGET) -> int | None:
    """1-based index of the first feasible trial within ``target`` of the optimum."""
    for i, t in enumerate(trials, 1):
        if t.result.feasible and t.result.value is not None and t.result.value >= target * optimum:
            return i
    return None


def pick(trials: list[Trial]) -> Trial | None:
    served = [t for t in trials if t.result.feasible and t.result.value is not None]
    return max(served, key=lambda t: t.result.value or 0.0, default=None)


def survives_peak(obj: SimObjective, params: Params) -> bool:
    """The pick under the peak shape at its own max_running: no OOM at run time."""
    concurrency = int(params.get("max_running") or obj.case.workload.arrival.concurrency or 256)
    peak = peak_workload(obj.case.workload, concurrency)
    r = obj({"context_len": obj.case.context_len, **params}, peak)
    return r.outcome not in (Outcome.OOM_RUNTIME, Outcome.OOM_STARTUP)


def _fmt_median(counts: list[int | None], budget: int) -> str:
    reached = [c for c in counts if c is not None]
    if len(reached) * 2 <= len(counts):  # the median seed did not reach it
        return f"not reached in {budget} ({len(reached)}/{len(counts)} seeds did)"
    ranked = sorted(c if c is not None else budget + 1 for c in counts)
    med = statistics.median(ranked)
    tail = "" if len(reached) == len(counts) else f" ({len(reached)}/{len(counts)} seeds)"
    return f"{med:g}{tail}"


def evaluate_case(case: Case, seeds: int, budget: int) -> list[tuple[str, ...]]:
    obj = SimObjective(case)
    optimum, arg = exhaustive(obj)
    rows: list[tuple[str, ...]] = []
    for method in METHODS:
        counts, best, peak_ok, fails = [], [], [], []
        for seed in range(seeds):
            trials = run_method(obj, method, seed, budget)
            counts.append(trials_to(trials, optimum))
            chosen = pick(trials)
            best.append((chosen.result.value or 0.0) / optimum if chosen else 0.0)
            peak_ok.append(chosen is not None and survives_peak(obj, chosen.params))
            fails.append(sum(not t.result.outcome.served for t in trials))
        rows.append(
            (
                case.name,
                method,
                _fmt_median(counts, budget),
                f"{100 * statistics.median(best):.1f} %",
                f"{sum(peak_ok)}/{seeds}",
                f"{statistics.median(fails):g}",
            )
        )
    rows.append((case.name, "exhaustive", f"{sum(1 for _ in grid_points())}", f"{optimum:,.0f} tok/s", str(arg), ""))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--budget", type=int, default=40)
    ap.add_argument("--cases", nargs="*", default=[c.name for c in CASES])
    args = ap.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    started = time.monotonic()
    print("| case | method | median trials to 97 % | median best / optimum | pick survives peak | median failed runs |")
    print("|---|---|---|---|---|---|")
    for case in (c for c in CASES if c.name in args.cases):
        for row in evaluate_case(case, args.seeds, args.budget):
            print("| " + " | ".join(row) + " |", flush=True)
    print(f"\nbenchmark run time: {time.monotonic() - started:.0f} s; numbers are modelled, not measured.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
