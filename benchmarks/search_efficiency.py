"""Search efficiency on the simulator: engine-seconds and trials to reach 97 % of the exhaustive optimum.

Run: ``python benchmarks/search_efficiency.py [--seeds 10] [--budget 40] [--cases NAME ...]
[--methods staged tpe ...] [--noise 0.02] [--fresh-study] [--repeats] [--json out.json]``.

Every trial is evaluated in-process with the simulator's own pieces: the engine's flag resolution
(``vllm_args.resolve`` / ``sglang_args.resolve``), its start-up memory plan (``plan_vllm`` /
``plan_sglang``), the engine's scheduler stepped by ``autotune_sim.offline.simulate`` for serving,
and ``step_bytes`` of every served step against the plan's run-time free memory for OOMs under
load. So the whole discretised space can be evaluated and its true optimum is known.

**Cost.** A trial costs what the simulator charges in modelled seconds: start-up (imports, weight
load, torch.compile, profiling, graph capture, from the dialects' own constants), the benchmark's
modelled duration, and the exit after an engine death. A start that fails costs the time up to its
failure; a run that dies of an OOM costs the time up to the step that ran out of memory.

**Noise.** Each served run's throughput is the modelled value × (1 + ε), ε ~ N(0, ``--noise``),
drawn per run: methods decide on what they measured. A trial reaches the target when its
configuration's noise-free value is ≥ 97 % of the noise-free optimum of the same surface, and it
is feasible (served, SLOs met) without noise too, so a lucky draw never counts as a find.

**One study per method, as in the product.** Every run a method decides itself (the baseline,
stage runs, memory probes with their peak-shape throughput) is told to its sampler's study with
the values it set inside the space, as ``autotune tune`` records every trial in one study: the
sampler starts with what the stages measured. ``--fresh-study`` starts each sampler's study
empty instead (the benchmark before it mirrored the product).

**No repeats, as in the product.** When the product's sampler proposes a configuration the
method measured already, that trial is withdrawn before it runs (no engine time, no place in the
budget) and a random unmeasured point of the same space runs instead
(``autotune/search/novelty.py``). ``--repeats`` re-runs it instead; the peers (``bo5``, ``grid``)
always do.

Methods, each with the same trial budget (every run counts, probes included):

* ``staged`` — the product's stage decisions (``autotune.search.stages``): baseline, context,
  memory edge under ``peak_workload``, the CUDA-graph walk with 0.02 give-back, then TPE over the
  remaining knobs warm-started from ``SCENARIOS``;
* ``tpe`` / ``random`` — the product's plain search: baseline, then its sampler over the space;
* ``bo5`` — the peer-style Bayesian optimisation of novitalabs/autotuner ("BO with 5 random
  starts"): baseline, then Optuna's ``TPESampler(n_startup_trials=5)`` (univariate). Optuna's
  GPSampler needs torch, which the tuner does not install;
* ``grid`` — vLLM's ``auto_tune.sh``: a start-up-only memory probe from 0.98 down, then
  max-num-seqs × max-num-batched-tokens in its loop order.

All numbers are modelled by autotune's simulator, not measured on hardware.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

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
from autotune.search.novelty import config_key, unmeasured_point
from autotune.search.objective import score
from autotune.search.space import distribution, fits, suggest, suggest_param
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
    predict_memory_edge,
    scenario_of,
    slo_first_move,
    snap_to_space,
)
from autotune.search.tune import make_sampler
from autotune_sim.dialects import sglang as sglang_dialect
from autotune_sim.dialects import sglang_args, vllm_args
from autotune_sim.dialects import vllm as vllm_dialect
from autotune_sim.dialects.base import new_pool
from autotune_sim.memory import (
    GIB,
    SglangMemory,
    VllmMemory,
    footprint,
    plan_sglang,
    plan_vllm,
    step_bytes,
)
from autotune_sim.offline import simulate
from autotune_sim.perf import GraphMode, PerfModel, StepShape
from autotune_sim.presets import GPUS, find_model
from autotune_sim.scheduler import SglangScheduler, SimRequest, VllmScheduler
from autotune_sim.settings import SimSettings
from autotune_sim.stats import EngineStats

__all__ = ["CASES", "METHODS", "Case", "SimObjective", "exhaustive", "run_method", "summarise"]

TARGET = 0.97
KV_DTYPE = "kv_cache_dtype"
Params = dict[str, Any]


# ------------------------------------------------------------------------------ spaces and cases
def _space(*, seqs: list[int], tokens: list[int], graphs: list[int], kv_dtype: bool = False) -> SearchSpace:
    params: dict[str, Any] = {
        MEMORY: FloatParam(type="float", low=0.80, high=0.98, step=STEP),
        "max_running": CategoricalParam(type="categorical", choices=list(seqs)),
        "batched_tokens": CategoricalParam(type="categorical", choices=list(tokens)),
        GRAPH: CategoricalParam(type="categorical", choices=list(graphs)),
    }
    if kv_dtype:
        params[KV_DTYPE] = CategoricalParam(type="categorical", choices=["auto", "fp8"])
    return SearchSpace(params=params)


SPACE = _space(seqs=[32, 64, 128, 256, 512, 1024], tokens=[2048, 4096, 8192, 16384], graphs=[256, 512, 768])
SMALL_SPACE = _space(seqs=[16, 32, 64, 128, 256, 512], tokens=[1024, 2048, 4096, 8192], graphs=[128, 256, 512])


@dataclass(frozen=True)
class Case:
    name: str
    engine: str  # "vllm" | "sglang"
    model: str
    gpu: str
    tp: int
    workload: Workload
    space: SearchSpace = SPACE
    why: str = ""

    @property
    def context_len(self) -> int:
        # The context stage's rule (stages.context); every method gets it, as auto_tune.sh fixes it too.
        return int(math.ceil(self.workload.longest_request_tokens * 1.1 / 256) * 256)


def _workload(
    name: str, isl: int, osl: int, concurrency: int, prompts: int, slos: dict[str, float] | None = None
) -> Workload:
    return Workload(
        name=name,
        dataset=Dataset(input_len=isl, output_len=osl, range_ratio=0.5),
        num_prompts=prompts,
        arrival=Arrival(concurrency=concurrency),
        slos=slos or {},
    )


LLAMA8B, QWEN7B, QWEN72B = "meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-72B-Instruct"
MOE, LLAMA70B = "Qwen/Qwen3-30B-A3B", "meta-llama/Llama-3.1-70B-Instruct"

CASES = [
    Case(
        "qwen7b-l4-offline",
        "vllm",
        QWEN7B,
        "L4",
        1,
        _workload("offline", 512, 256, 256, 384),
        SMALL_SPACE,
        "24 GB card: the default's batched tokens and graphs leave little KV; it preempts",
    ),
    Case(
        "llama8b-4090-chat-kvdtype",
        "vllm",
        LLAMA8B,
        "RTX-4090",
        1,
        _workload("chat", 1024, 192, 96, 192, {"p95_tpot_ms": 60.0}),
        _space(
            seqs=[16, 32, 64, 128, 256, 512], tokens=[1024, 2048, 4096, 8192], graphs=[128, 256, 512], kv_dtype=True
        ),
        "24 GB card with an fp8 KV-cache choice: the KV pool bounds the batch",
    ),
    Case(
        "llama8b-h100-chat-p95",
        "vllm",
        LLAMA8B,
        "H100-80GB",
        1,
        _workload("chat", 2048, 256, 256, 512, {"p95_tpot_ms": 40.0}),
        why="p95 TPOT SLO: the default runs all 256 requests in one decode batch and breaks it",
    ),
    Case(
        "llama8b-a100-40-longctx",
        "vllm",
        LLAMA8B,
        "A100-40GB",
        1,
        _workload("long", 12288, 256, 24, 48),
        why="long context on a 40 GB card: the KV pool holds few 18k-token requests",
    ),
    Case(
        "qwen3moe-h100-tp2-offline",
        "vllm",
        MOE,
        "H100-80GB",
        2,
        _workload("offline", 1024, 256, 256, 512),
        why="MoE at TP 2, offline throughput at high concurrency",
    ),
    Case(
        "qwen72b-tp4-h100-chat",
        "vllm",
        QWEN72B,
        "H100-80GB",
        4,
        _workload("chat", 1024, 128, 64, 128, {"p95_ttft_ms": 10000.0, "p95_tpot_ms": 40.0}),
        why="TP 4 chat under p95 TTFT and TPOT bounds: the default breaks the TPOT bound",
    ),
    Case(
        "sglang-llama8b-h100-chat",
        "sglang",
        LLAMA8B,
        "H100-80GB",
        1,
        _workload("chat", 2048, 256, 256, 512, {"p95_tpot_ms": 40.0}),
        _space(seqs=[32, 64, 128, 256, 512, 1024], tokens=[2048, 4096, 8192, 16384], graphs=[128, 256, 512]),
        "SGLang dialect, chat under a p95 TPOT SLO that the default breaks",
    ),
    Case(
        "sglang-qwen7b-l4-offline",
        "sglang",
        QWEN7B,
        "L4",
        1,
        _workload("offline", 512, 256, 256, 384),
        SMALL_SPACE,
        "SGLang on a 24 GB card: the auto fraction and 8-wide decode graphs are far from the optimum",
    ),
    Case(
        "llama70b-tp2-h100-offline",
        "vllm",
        LLAMA70B,
        "H100-80GB",
        2,
        _workload("offline", 1024, 256, 256, 512),
        why="70B at TP 2: weights take most of the card, the memory edge decides the KV pool",
    ),
]


# ------------------------------------------------------------------------------ one engine run
@dataclass(frozen=True)
class Boot:
    """What start-up decided: a failure (and when), or the engine ready to serve."""

    failure: Outcome | None
    seconds: float  # modelled start-up time, or time to the failure
    facts: Mapping[str, Any] = field(default_factory=dict)
    runtime_free: float = 0.0  # bytes a served step may use
    plan: Any = None
    cfg: Any = None


@dataclass(frozen=True)
class Served:
    """A noise-free modelled run: its duration, tokens, latencies and memory high-water marks."""

    duration_s: float
    output_tokens: int
    ttfts: tuple[float, ...]
    tpots: tuple[float, ...]
    need_marks: tuple[tuple[float, float], ...]  # (time, step bytes) each time the peak rose
    eager_decode_steps: int
    preemptions: int
    running_peak: int

    def oom_time(self, free: float) -> float | None:
        """When the first step needed more than ``free`` bytes (None: never)."""
        return next((t for t, need in self.need_marks if need > free), None)


class _Watch(PerfModel):
    """The perf model, also keeping the clock, the step-memory high-water marks and the decode
    steps that ran without a graph."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.t = 0.0
        self.peak = 0.0
        self.marks: list[tuple[float, float]] = []
        self.eager_decode = 0

    def step_time(self, shape: StepShape) -> float:
        need = step_bytes(self.fp, shape.tokens, shape.sampled)
        if need > self.peak:
            self.peak = need
            self.marks.append((self.t, need))
        if shape.decode_seqs == shape.tokens and shape.graph is GraphMode.EAGER:
            self.eager_decode += 1
        dt = super().step_time(shape)
        self.t += dt
        return dt


def _timed(base: type) -> type:
    """The scheduler class, also recording each finished request's TTFT and TPOT."""

    class Timed(base):  # type: ignore[misc, valid-type]
        watch: _Watch
        latencies: list[tuple[float, float]]

        def finish(self, req: SimRequest) -> None:
            ttft = req.first_token - req.arrival
            tpot = (self.watch.t - req.first_token) / max(1, req.generated - 1)
            self.latencies.append((ttft, tpot))
            super().finish(req)

    return Timed


_TimedVllm, _TimedSglang = _timed(VllmScheduler), _timed(SglangScheduler)


def _lengths(workload: Workload) -> tuple[int, int, int]:
    d = workload.dataset
    out = d.output_dist
    return d.input_dist.low, d.input_dist.high, (out.low + out.high) // 2


@functools.lru_cache(maxsize=8192)
def _prompt(i: int, lo: int, hi: int) -> tuple[int, ...]:
    """A deterministic prompt whose length is spread uniformly over [lo, hi] (kept: every served
    run of a case asks for the same prompts)."""
    n = lo + (i * 7919) % (hi - lo + 1)
    return tuple((i * 31 + j) % 30000 + 300 for j in range(n))


def _drive(sched: Any, perf: _Watch, workload: Workload) -> Served:
    lo, hi, out = _lengths(workload)
    sched.watch, sched.latencies = perf, []
    result = simulate(
        sched,
        perf,
        requests=workload.num_prompts,
        concurrency=workload.arrival.concurrency or workload.num_prompts,
        prompt=lambda i: _prompt(i, lo, hi),
        output_len=out,
    )
    return Served(
        duration_s=result.duration_s,
        output_tokens=result.output_tokens,
        ttfts=tuple(a for a, _ in sched.latencies),
        tpots=tuple(b for _, b in sched.latencies),
        need_marks=tuple(perf.marks),
        eager_decode_steps=perf.eager_decode,
        preemptions=result.preemptions + result.retractions,
        running_peak=result.max_running,
    )


def _p95(values: tuple[float, ...]) -> float:
    ranked = sorted(values)
    return ranked[min(len(ranked) - 1, math.ceil(0.95 * len(ranked)) - 1)] if ranked else math.nan


class VllmEngine:
    """vLLM 0.32 as the simulator models it, without the server."""

    name = "vllm"
    flags: ClassVar[dict[str, str]] = {
        MEMORY: "--gpu-memory-utilization",
        "max_running": "--max-num-seqs",
        "batched_tokens": "--max-num-batched-tokens",
        GRAPH: "--max-cudagraph-capture-size",
        "context_len": "--max-model-len",
        KV_DTYPE: "--kv-cache-dtype",
    }
    exit_after_death_s = vllm_dialect.EXIT_AFTER_DEATH_S

    def __init__(self, case: Case) -> None:
        self.case = case
        self.settings = SimSettings(gpu=GPUS[case.gpu], num_gpus=max(8, case.tp))

    def boot(self, params: Mapping[str, Any]) -> Boot:
        v = vllm_dialect
        argv = ["--model", self.case.model, "--tensor-parallel-size", str(self.case.tp)]
        argv += [x for k, val in params.items() for x in (self.flags[k], str(val))]
        try:
            ns = vllm_args.build_parser(self.settings.vllm_version).parse_args(vllm_args.preprocess(argv))
            cfg = vllm_args.resolve(ns, self.settings, {})
        except vllm_args.ConfigFailure:
            return Boot(Outcome.INVALID_FLAGS, v.IMPORT_S)
        fp = footprint(cfg.model, tp=cfg.tp, pp=cfg.pp, kv_dtype=cfg.kv_dtype)
        plan = plan_vllm(self._memory(cfg, fp))
        t = v.IMPORT_S + v.CORE_START_S
        if plan.failure == "free_memory":
            return Boot(Outcome.OOM_STARTUP, t)
        t += self.settings.weight_read_s(fp.weight_bytes * cfg.tp * cfg.pp)
        if plan.failure == "load_oom":
            return Boot(Outcome.OOM_STARTUP, t)
        t += (v.COMPILE_S if cfg.compile else 0.0) + v.PROFILE_S
        if plan.failure in ("no_kv", "kv_too_small", "auto_fit_impossible"):
            return Boot(Outcome.KV_INSUFFICIENT, t)
        if plan.graph_actual:
            t += v.CAPTURE_S_PER_GRAPH * len(cfg.capture_sizes) * cfg.graphs_per_size
        if plan.failure is not None:
            return Boot(Outcome.OOM_STARTUP, t)
        return Boot(None, t, self._facts(cfg, fp, plan), plan.runtime_free, plan, cfg)

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

    @staticmethod
    def _facts(cfg: Any, fp: Any, plan: Any) -> dict[str, Any]:
        """What vLLM logs at start-up (its "Free memory on device … Actual usage is …" line, the
        graph pool line and the KV cache size), in the units the log gives, as the vLLM adapter
        reads them."""
        return {
            "memory_budget": "total",  # the fraction caps everything the engine allocates
            "mem_total_gib": plan.total / GIB,
            "mem_free_gib": plan.free_at_start / GIB,
            "weights_gib": plan.consumed / GIB,
            "activation_peak_gib": plan.peak / GIB,
            "graph_gib": plan.graph_actual / GIB,
            "kv_bytes_per_token": fp.kv_bytes_per_token,
            "kv_tokens": plan.kv_tokens,
            "resolved_knobs": {"max_running": cfg.max_num_seqs, "batched_tokens": cfg.max_num_batched_tokens},
        }

    def schedule_key(self, boot: Boot, workload: Workload) -> tuple[Any, ...]:
        cfg, plan = boot.cfg, boot.plan
        blocks = self._useful_blocks(cfg, plan, workload)
        return (blocks, cfg.max_num_seqs, cfg.max_num_batched_tokens, cfg.max_capture, plan.max_model_len, cfg.kv_dtype)

    @staticmethod
    def _useful_blocks(cfg: Any, plan: Any, workload: Workload) -> int:
        # A pool larger than every admitted request can use behaves like an unlimited one, so
        # fractions above that point share one run.
        longest = workload.longest_request_tokens
        slots = min(cfg.max_num_seqs, workload.arrival.concurrency or workload.num_prompts)
        return min(plan.num_blocks - 1, slots * (math.ceil(longest / cfg.block_size) + 1) + 1)

    def serve(self, boot: Boot, workload: Workload) -> Served:
        cfg, plan = boot.cfg, boot.plan
        fp = footprint(cfg.model, tp=cfg.tp, pp=cfg.pp, kv_dtype=cfg.kv_dtype)
        sched = _TimedVllm(
            new_pool(self._useful_blocks(cfg, plan, workload), cfg.block_size, False),
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
        return _drive(sched, _Watch(cfg.model, self.settings.gpu, fp, tp=cfg.tp, pp=cfg.pp), workload)


class SglangEngine:
    """SGLang 0.5.23 as the simulator models it, without the server."""

    name = "sglang"
    flags: ClassVar[dict[str, str]] = {
        MEMORY: "--mem-fraction-static",
        "max_running": "--max-running-requests",
        "batched_tokens": "--chunked-prefill-size",
        GRAPH: "--cuda-graph-max-bs-decode",
        "context_len": "--context-length",
        KV_DTYPE: "--kv-cache-dtype",
    }
    exit_after_death_s = 0.0  # the launcher SIGKILLs its tree at once (sglang.py _scheduler_failed)

    def __init__(self, case: Case) -> None:
        self.case = case
        self.settings = SimSettings(gpu=GPUS[case.gpu], num_gpus=max(8, case.tp))
        model = find_model(case.model)
        assert model is not None
        self.model = model

    def boot(self, params: Mapping[str, Any]) -> Boot:
        s = sglang_dialect
        argv = ["--model-path", self.case.model, "--tp-size", str(self.case.tp)]
        argv += [x for k, val in params.items() for x in (self.flags[k], str(val))]
        version = self.settings.sglang_version
        try:
            ns = sglang_args.build_parser(version).parse_args(argv)
            cfg = sglang_args.resolve(ns, version, self.settings.gpu, self.model, {}, self.settings.num_gpus)
        except sglang_args.StartupError as err:
            return Boot(Outcome.INVALID_FLAGS, s.MAIN_IMPORT_S + (s.SCHEDULER_START_S if err.where != "main" else 0))
        except SystemExit:
            return Boot(Outcome.INVALID_FLAGS, s.MAIN_IMPORT_S)
        fp = footprint(cfg.model, tp=cfg.tp, pp=cfg.pp, kv_dtype=cfg.kv_dtype)
        plan = plan_sglang(self._memory(cfg, fp))
        t = s.MAIN_IMPORT_S + s.SCHEDULER_START_S + self.settings.weight_read_s(fp.weight_bytes * cfg.tp * cfg.pp)
        if plan.failure in ("weights_no_room", "not_enough_memory"):
            return Boot(Outcome.KV_INSUFFICIENT, t)
        if plan.failure == "pool_oom":
            return Boot(Outcome.OOM_STARTUP, t)
        t += s.CAPTURE_S_PER_PREFILL_SIZE * len(cfg.prefill_sizes)
        if plan.failure == "capture_oom_prefill":
            return Boot(Outcome.OOM_STARTUP, t)
        t += s.CAPTURE_S_PER_DECODE_BS * len(cfg.decode_sizes)
        if plan.failure is not None:
            return Boot(Outcome.OOM_STARTUP, t)
        return Boot(None, t, self._facts(cfg, fp, plan), plan.runtime_free, plan, cfg)

    def _memory(self, cfg: Any, fp: Any) -> SglangMemory:
        return SglangMemory(
            gpu=self.settings.gpu,
            fp=fp,
            mem_fraction_static=cfg.mem_fraction_static,
            max_total_tokens=cfg.max_total_tokens,
            page_size=cfg.page_size,
            decode_sizes=cfg.decode_sizes,
            prefill_sizes=cfg.prefill_sizes,
        )

    def _facts(self, cfg: Any, fp: Any, plan: Any) -> dict[str, Any]:
        """What SGLang logs at start-up (memory baseline, load weight begin/end, KV cache
        allocated, capture ends, the summary line), in the log's units, as the SGLang adapter
        reads them. SGLang profiles no activations, so no activation peak."""
        return {
            "memory_budget": "static",  # the fraction of free memory kept for weights and KV
            "mem_total_gib": self.settings.gpu.torch_total_gib,
            "mem_free_gib": plan.pre / GIB,
            "weights_gib": (plan.pre - plan.after_weights) / GIB,
            "graph_gib": (plan.prefill_graph + plan.decode_graph) / GIB,
            "kv_bytes_per_token": fp.kv_bytes_per_token,
            "kv_tokens": plan.kv_tokens,
            "resolved_knobs": {
                "max_running": self._max_running(cfg, plan.kv_tokens),
                "batched_tokens": cfg.chunked_prefill_size,
            },
        }

    @staticmethod
    def _max_running(cfg: Any, tokens: int) -> int:
        # SGLang's cap (sglang.py ``_max_running``): the user's, or clamp(tokens/context × 512,
        # 2048, 4096), never above half the pool's tokens.
        if cfg.max_running_user is not None:
            return max(1, min(cfg.max_running_user, tokens // 2))
        return max(1, min(min(max(int(tokens / cfg.context_length * 512), 2048), 4096), tokens // 2))

    def schedule_key(self, boot: Boot, workload: Workload) -> tuple[Any, ...]:
        cfg, plan = boot.cfg, boot.plan
        pages = self._useful_pages(cfg, plan, workload)
        running = self._max_running(cfg, plan.kv_tokens)
        return (pages, running, cfg.chunked_prefill_size, cfg.decode_max_bs, cfg.prefill_max_tokens, cfg.kv_dtype)

    def _useful_pages(self, cfg: Any, plan: Any, workload: Workload) -> int:
        page = sglang_dialect.PAGE
        slots = min(self._max_running(cfg, plan.kv_tokens), workload.arrival.concurrency or workload.num_prompts)
        return min(plan.kv_tokens // page, slots * (math.ceil(workload.longest_request_tokens / page) + 1))

    def serve(self, boot: Boot, workload: Workload) -> Served:
        cfg, plan = boot.cfg, boot.plan
        fp = footprint(cfg.model, tp=cfg.tp, pp=cfg.pp, kv_dtype=cfg.kv_dtype)
        sched = _TimedSglang(
            new_pool(self._useful_pages(cfg, plan, workload), sglang_dialect.PAGE, False),
            EngineStats(max_model_len=cfg.context_length),
            lambda seed, i: 1000 + i % 7,
            max_running=self._max_running(cfg, plan.kv_tokens),
            chunked_prefill_size=cfg.chunked_prefill_size,
            max_prefill_tokens=cfg.max_prefill_tokens,
            conservativeness=cfg.conservativeness,
            policy=cfg.policy,
            mixed_chunk=cfg.mixed_chunk,
            decode_graph_max_bs=cfg.decode_max_bs,
            prefill_graph_max_tokens=cfg.prefill_max_tokens,
            seed=0,
        )
        return _drive(sched, _Watch(cfg.model, self.settings.gpu, fp, tp=cfg.tp, pp=cfg.pp), workload)


ENGINES: dict[str, Callable[[Case], Any]] = {"vllm": VllmEngine, "sglang": SglangEngine}


# ------------------------------------------------------------------------------ the objective
@dataclass(frozen=True)
class Result:
    """One trial: what the method saw (``outcome``, ``value``, ``metrics``, all with noise), what
    the configuration truly gives (``true_outcome``, ``true_value``), and its cost."""

    outcome: Outcome
    value: float | None
    cost_s: float
    metrics: Mapping[str, float] = field(default_factory=dict)
    facts: Mapping[str, Any] = field(default_factory=dict)
    true_outcome: Outcome | None = None
    true_value: float | None = None

    @property
    def feasible(self) -> bool:
        return self.outcome == Outcome.OK

    @property
    def truly_feasible(self) -> bool:
        return (self.true_outcome or self.outcome) == Outcome.OK


class SimObjective:
    """One case's trial evaluator. Start-up plans and served runs are cached: the model is
    deterministic, and the noise is drawn per run on top."""

    def __init__(self, case: Case, noise: float = 0.02) -> None:
        self.case, self.noise = case, noise
        self.engine = ENGINES[case.engine](case)
        self._boots: dict[tuple[Any, ...], Boot] = {}
        self._served: dict[tuple[Any, ...], Served] = {}

    def boot(self, params: Mapping[str, Any]) -> Boot:
        key = tuple(sorted(params.items()))
        if key not in self._boots:
            self._boots[key] = self.engine.boot(params)
        return self._boots[key]

    def __call__(
        self, params: Mapping[str, Any], workload: Workload | None = None, rng: random.Random | None = None
    ) -> Result:
        """Start-up, then serve ``workload`` (the case's by default); noise from ``rng``."""
        workload = workload or self.case.workload
        boot = self.boot(params)
        if boot.failure is not None:
            return Result(boot.failure, None, boot.seconds)
        served = self._serve(boot, workload)
        oom_at = served.oom_time(boot.runtime_free)
        if oom_at is not None:
            return Result(Outcome.OOM_RUNTIME, None, boot.seconds + oom_at + self.engine.exit_after_death_s)
        true_metrics = _metrics(served, 1.0)
        true_outcome = _verdict(true_metrics, workload)
        eps = rng.gauss(0.0, self.noise) if rng is not None else 0.0
        metrics = _metrics(served, max(0.5, 1.0 + eps))
        facts = {
            **boot.facts,
            "preemptions": served.preemptions,
            "eager_decode_steps": served.eager_decode_steps,
            "running_peak": served.running_peak,
        }
        return Result(
            _verdict(metrics, workload),
            metrics["output_throughput"],
            boot.seconds + served.duration_s,
            metrics,
            facts,
            true_outcome,
            true_metrics["output_throughput"],
        )

    def _serve(self, boot: Boot, workload: Workload) -> Served:
        d = workload.dataset
        shape = (d.input_dist.low, d.input_dist.high, d.output_dist.high, workload.num_prompts)
        key = (shape, workload.arrival.concurrency, *self.engine.schedule_key(boot, workload))
        if key not in self._served:
            self._served[key] = self.engine.serve(boot, workload)
        return self._served[key]

    def startup_only(self, params: Mapping[str, Any]) -> tuple[Outcome, float]:
        """What auto_tune.sh's probe sees: does the engine start (``/health`` answers), and when."""
        boot = self.boot(params)
        return boot.failure or Outcome.OK, boot.seconds


def _metrics(served: Served, speed: float) -> dict[str, float]:
    """Client metrics of a run whose steps all ran ``speed`` times as fast as modelled."""
    return {
        "output_throughput": served.output_tokens / served.duration_s * speed,
        "mean_ttft_ms": 1000 * statistics.fmean(served.ttfts) / speed if served.ttfts else math.nan,
        "p95_ttft_ms": 1000 * _p95(served.ttfts) / speed,
        "p95_tpot_ms": 1000 * _p95(served.tpots) / speed,
        "error_rate": 0.0,
    }


def _verdict(metrics: Mapping[str, float], workload: Workload) -> Outcome:
    return Outcome.OK if not score(Outcome.OK, metrics, workload).violations else Outcome.SLO_VIOLATION


# ------------------------------------------------------------------------------ exhaustive
def grid_points(space: SearchSpace) -> Iterator[Params]:
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
    """The true optimum: the best noise-free throughput over every point that is served, meets
    its SLOs and survives the workload without an OOM."""
    ctx = {"context_len": obj.case.context_len}
    best, arg = 0.0, {}
    for params in grid_points(obj.case.space):
        r = obj({**params, **ctx})
        if r.truly_feasible and r.true_value is not None and r.true_value > best:
            best, arg = r.true_value, params
    return best, arg


# ------------------------------------------------------------------------------ methods
@dataclass
class Trial:
    stage: str
    params: Params
    result: Result


@dataclass
class Ledger:
    """The trials a method ran, in order, under a trial budget (every run counts)."""

    obj: SimObjective
    budget: int
    rng: random.Random
    trials: list[Trial] = field(default_factory=list)
    #: Tell every run the method decided itself (baseline, stage runs, probes) to its sampler's
    #: study, as the product's one study records it. False (``--fresh-study``): the sampler's
    #: study starts empty, as the benchmark ran before it mirrored the product.
    told: bool = True
    study: optuna.Study | None = None  # the study runs are told to (set by ``_study``)
    #: The product's rule (autotune/search/novelty.py): a sampled point the ledger measured
    #: already is withdrawn before it runs, and an unmeasured one runs instead. The peer BO and
    #: ``--repeats`` re-run it.
    skip_repeats: bool = True
    measured: dict[str, int] = field(default_factory=dict)  # configuration → its first run's index

    @property
    def full(self) -> bool:
        return len(self.trials) >= self.budget

    @property
    def space(self) -> SearchSpace:
        return self.obj.case.space

    def run(self, stage: str, params: Params, workload: Workload | None = None, *, sampled: bool = False) -> Result:
        flags = self.flags(stage, params)
        result = self.obj(flags, workload, self.rng)
        if workload is None and not result.outcome.retryable:
            self.measured.setdefault(config_key(flags), len(self.trials))
        self.trials.append(Trial(stage, params, result if workload is None else _probe_only(result)))
        if self.study is not None and not sampled:
            _record(self, params, result, workload or self.obj.case.workload)
        return result

    def flags(self, stage: str, params: Params) -> Params:
        return {"context_len": self.obj.case.context_len, **params} if stage != "baseline" else params


def _probe_only(result: Result) -> Result:
    # A probe runs the peak shape, not the workload: it says where memory breaks, not what the
    # workload gets, so its throughput never counts towards the objective.
    return Result(result.outcome, None, result.cost_s, facts=result.facts)


def _tell(ledger: Ledger, study: optuna.Study, trial: optuna.Trial, result: Result) -> None:
    metrics = result.metrics if result.outcome.served else {}
    s = score(result.outcome, metrics, ledger.obj.case.workload)
    for name, slack in s.constraints.items():
        trial.set_constraint(name, slack)
    study.tell(trial, s.value)


def _in_space(ledger: Ledger, params: Params) -> Params:
    """The values a run set inside the search space: what the product records as its params."""
    space = ledger.space.params
    return {k: v for k, v in params.items() if k in space and fits(distribution(space[k]), v)}


def _record(ledger: Ledger, params: Params, result: Result, workload: Workload) -> None:
    """runner.StudyRun: a run with explicit values is a trial of the study, told like any other
    (a probe with its peak-shape throughput). A retryable failure is left out: the product tells
    it as FAIL, which TPE does not learn from."""
    assert ledger.study is not None
    if result.outcome.retryable:
        return
    recorded = _in_space(ledger, params)
    s = score(result.outcome, result.metrics if result.outcome.served else {}, workload)
    ledger.study.add_trial(
        optuna.trial.create_trial(
            params=recorded,
            distributions={k: distribution(ledger.space.params[k]) for k in recorded},
            values=s.values[:1],
            system_attrs={"constraints": list(s.constraints.values())},
        )
    )


def _ask_tell(
    ledger: Ledger, study: optuna.Study, space: SearchSpace, fixed: Params, stage: str, hint: Params | None = None
) -> Result:
    """One Optuna trial: sample ``space`` (``hint``: values to try first), run with ``fixed``,
    tell value and constraints. In a told study the fixed values inside the space are recorded
    too, as the product's runner enqueues them."""
    recorded = _in_space(ledger, fixed) if ledger.study is not None else {}
    trial, params = _ask(ledger, study, space, fixed, recorded, hint)
    if ledger.skip_repeats and config_key(ledger.flags(stage, params)) in ledger.measured:
        point = unmeasured_point(
            space,
            lambda values: config_key(ledger.flags(stage, {**fixed, **values})) not in ledger.measured,
            study,
            ledger.rng.randrange(2**31),
        )
        if point is not None:  # withdrawn: no engine time, no place in the budget
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            trial, params = _ask(ledger, study, space, fixed, recorded, point)
    result = ledger.run(stage, params, sampled=True)
    _tell(ledger, study, trial, result)
    return result


def _ask(
    ledger: Ledger, study: optuna.Study, space: SearchSpace, fixed: Params, recorded: Params, hint: Params | None
) -> tuple[optuna.Trial, Params]:
    if hint or recorded:
        study.enqueue_trial({**(hint or {}), **recorded}, skip_if_exists=False)
    trial = study.ask()
    for name in recorded:
        suggest_param(trial, name, ledger.space.params[name])
    return trial, {**fixed, **suggest(trial, space)}


def _study(ledger: Ledger, sampler: optuna.samplers.BaseSampler) -> optuna.Study:
    """A new study for the method's sampler; when the ledger tells, every later run goes into it."""
    study = optuna.create_study(direction="maximize", sampler=sampler)
    if ledger.told:
        ledger.study = study
    return study


def _product_sampler(method: str, seed: int, budget: int) -> optuna.samplers.BaseSampler:
    return make_sampler(StudySettings(name="bench", trials=budget, seed=seed, sampler=method))  # type: ignore[arg-type]


def plain_search(ledger: Ledger, sampler: optuna.samplers.BaseSampler, stage: str) -> None:
    """The product's non-staged method: the defaults first (the baseline), then the sampler."""
    study = _study(ledger, sampler)
    ledger.run("baseline", {})
    while not ledger.full:
        _ask_tell(ledger, study, ledger.space, {}, stage)


_PEER_MEMORY = [0.98, 0.96, 0.94, 0.92, 0.90]  # auto_tune.sh's 0.98 → 0.90, on the 0.02 grid


def peer_grid(ledger: Ledger, seed: int) -> None:
    """auto_tune.sh: start-up-only probe with the largest seqs/tokens, then the grid."""
    del seed  # deterministic
    seqs = ledger.space.params["max_running"].choices  # type: ignore[union-attr]
    tokens = ledger.space.params["batched_tokens"].choices  # type: ignore[union-attr]
    largest = {"max_running": max(seqs), "batched_tokens": max(tokens)}
    util = None
    for fraction in _PEER_MEMORY:
        params = {**largest, MEMORY: fraction}
        started, seconds = ledger.obj.startup_only({**params, "context_len": ledger.obj.case.context_len})
        ledger.trials.append(Trial("grid_probe", params, Result(started, None, seconds)))
        if started not in (Outcome.OOM_STARTUP, Outcome.KV_INSUFFICIENT):
            util = fraction
            break
    if util is None:
        return
    for s, t in itertools.product(seqs, tokens):
        if ledger.full:
            return
        ledger.run("grid", {MEMORY: util, "max_running": s, "batched_tokens": t})


#: What staged may use beyond the fixed-start walk (``--levers``): ``predict`` starts the memory
#: probes at the edge the baseline's start-up memory predicts; ``slo`` moves the knobs the
#: baseline's SLO verdict points at, from the context run on.
ALL_LEVERS = frozenset({"predict", "slo"})


def staged(ledger: Ledger, seed: int, levers: frozenset[str] = ALL_LEVERS) -> None:
    """The product's stage decisions, each run counted as a trial (validation is skipped: reach is
    judged on noise-free values, so re-runs would add cost and no find)."""
    budget = plan_budget(ledger.budget, ledger.space)
    study = _study(ledger, _product_sampler("tpe", seed, ledger.budget))
    baseline = ledger.run("baseline", {})
    move = _slo_move(ledger, baseline) if "slo" in levers else {}
    context = ledger.run("context", move)
    if "slo" in levers and not move:
        move = _slo_move(ledger, context)
    fixed: Params = {}
    # stages._predicted_start: the earliest served run of the study's workload.
    start = _probe_start(ledger, baseline if baseline.outcome.served else context, "predict" in levers)
    edge = _memory_edge(ledger, budget["memory_edge"], start)
    if edge is not None:
        fixed[MEMORY] = edge
    fixed.update(_graph_walk(ledger, fixed, move))
    rest = SearchSpace(params={k: v for k, v in ledger.space.params.items() if k not in fixed})
    hint: Params | None = {
        **snap_to_space(rest, SCENARIOS[scenario_of(ledger.obj.case.workload)]),
        **snap_to_space(rest, move),
    }
    while not ledger.full:
        _ask_tell(ledger, study, rest, fixed, "scenario", hint)
        hint = None


def _slo_move(ledger: Ledger, run: Result) -> Params:
    """stages.slo_first_move on a served run of the defaults."""
    if not run.outcome.served:
        return {}
    violations = score(run.outcome, run.metrics, ledger.obj.case.workload).violations
    found = slo_first_move(violations, run.facts, ledger.space)
    return found[0] if found else {}


def _probe_start(ledger: Ledger, run: Result, predict: bool) -> float | None:
    """Where the memory probes start: the edge ``run``'s start-up memory predicts (None: the
    product's fixed 0.80)."""
    mem = ledger.space.params[MEMORY]
    assert isinstance(mem, FloatParam)
    if not predict or not run.outcome.served:
        return None
    return predict_memory_edge(run.facts, max(mem.low, 0.80), mem.high)


def _memory_edge(ledger: Ledger, quota: int, predicted: float | None) -> float | None:
    """stages.memory_edge: step from the predicted edge (a bracket, kept without a back-off) or up
    from 0.80, under the peak shape (concurrency = the largest max_running of the space, the other
    knobs at the engine's defaults)."""
    mem = ledger.space.params[MEMORY]
    assert isinstance(mem, FloatParam)
    start = predicted if predicted is not None else max(mem.low, 0.80)
    probe = MemoryProbe(start=start, high=mem.high, mode="step", back_off=predicted is None)
    peak = peak_workload(ledger.obj.case.workload, max(ledger.space.params["max_running"].choices))  # type: ignore[union-attr]
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


def _graph_walk(ledger: Ledger, fixed: Params, knobs: Params, noise: float = 0.03) -> Params:
    """stages.cuda_graph: larger captured batch, 0.02 less memory, kept only beyond noise; stop
    once a size ran every decode step in a graph (the product's pass-counter rule)."""
    best: Params | None = None
    best_value = -math.inf
    sizes = graph_sizes(ledger.space)
    for i, size in enumerate(sizes):
        if ledger.full:
            break
        choice = {**fixed, GRAPH: size}
        if MEMORY in fixed:
            choice[MEMORY] = round(fixed[MEMORY] - STEP * i, 4)
        r = ledger.run("cuda_graph", {**knobs, **choice})
        value = r.value if r.feasible and r.value is not None else -math.inf
        if (best is None or value > best_value * (1 + noise)) and value > -math.inf:
            best, best_value = choice, value
        if value > -math.inf and r.facts.get("eager_decode_steps") == 0:
            break
    return {k: v for k, v in (best or {}).items() if k in (GRAPH, MEMORY)}


METHODS: dict[str, Callable[[Ledger, int], None]] = {
    "staged": staged,
    "staged-fixed-start": lambda ledger, seed: staged(ledger, seed, frozenset()),
    "staged-predict-only": lambda ledger, seed: staged(ledger, seed, frozenset({"predict"})),
    "tpe": lambda ledger, seed: plain_search(ledger, _product_sampler("tpe", seed, ledger.budget), "tpe"),
    "random": lambda ledger, seed: plain_search(ledger, _product_sampler("random", seed, ledger.budget), "random"),
    "bo5": lambda ledger, seed: plain_search(ledger, optuna.samplers.TPESampler(seed=seed, n_startup_trials=5), "bo5"),
    "grid": peer_grid,
}


#: Peers' methods: they re-run a point their sampler proposes again.
PEERS = frozenset({"bo5", "grid"})


def run_method(
    obj: SimObjective, method: str, seed: int, budget: int, *, told: bool = True, skip_repeats: bool = True
) -> list[Trial]:
    rng = random.Random(f"{obj.case.name}/{method}/{seed}")
    ledger = Ledger(obj, budget, rng, told=told, skip_repeats=skip_repeats and method not in PEERS)
    METHODS[method](ledger, seed)
    return ledger.trials[:budget]


# ------------------------------------------------------------------------------ scoring
@dataclass(frozen=True)
class Reach:
    """When one seed's run first held a configuration within the target of the optimum."""

    trials: int | None
    seconds: float | None
    best: float  # the pick's noise-free value / optimum


def reach(trials: list[Trial], optimum: float, target: float = TARGET) -> Reach:
    spent = 0.0
    found: tuple[int, float] | None = None
    for i, t in enumerate(trials, 1):
        spent += t.result.cost_s
        good = t.result.truly_feasible and (t.result.true_value or 0.0) >= target * optimum
        if good and found is None:
            found = (i, spent)
    chosen = pick(trials)
    best = (chosen.result.true_value or 0.0) / optimum if chosen and chosen.result.truly_feasible else 0.0
    return Reach(found[0] if found else None, found[1] if found else None, best)


def pick(trials: list[Trial]) -> Trial | None:
    """What the method would hand the user: its best measured feasible trial."""
    served = [t for t in trials if t.result.feasible and t.result.value is not None]
    return max(served, key=lambda t: t.result.value or 0.0, default=None)


def _spread(values: list[float | None], budget_mark: float) -> tuple[float, float, float]:
    """Median and p25–p75 over seeds, a seed that never reached counting as ``budget_mark``."""
    ranked = sorted(v if v is not None else budget_mark for v in values)
    q = statistics.quantiles(ranked, n=4, method="inclusive") if len(ranked) > 1 else [ranked[0]] * 3
    return statistics.median(ranked), q[0], q[2]


def summarise(reaches: list[Reach], budget: int) -> dict[str, Any]:
    """Per method: reached share, median and p25–p75 of engine-seconds and trials to the target
    (infinite where a seed did not reach it), and the median pick."""
    n = len(reaches)
    hit = sum(r.trials is not None for r in reaches)
    sec = _spread([r.seconds for r in reaches], math.inf)
    tri = _spread([float(r.trials) if r.trials else None for r in reaches], math.inf)
    return {
        "reached": hit,
        "seeds": n,
        "seconds": sec,
        "trials": tri,
        "best": statistics.median(r.best for r in reaches),
        "budget": budget,
    }


def _fmt(spread: tuple[float, float, float], unit: str) -> str:
    med, lo, hi = spread

    def one(v: float) -> str:
        return "not reached" if math.isinf(v) else f"{v:,.0f}{unit}"

    if math.isinf(lo):
        return "not reached"
    return f"{one(med)} ({one(lo)} to {one(hi)})"


@dataclass
class CaseReport:
    case: str
    optimum: float
    argmax: Params
    default_share: float
    default_outcome: str
    methods: dict[str, dict[str, Any]]
    seconds: float


def evaluate_case(
    case: Case,
    seeds: int,
    budget: int,
    methods: list[str],
    noise: float,
    log: Callable[[str], None],
    *,
    told: bool = True,
    skip_repeats: bool = True,
) -> CaseReport:
    started = time.monotonic()
    obj = SimObjective(case, noise)
    optimum, arg = exhaustive(obj)
    default = obj({})
    log(f"  {case.name}: optimum {optimum:,.0f} tok/s at {arg} ({time.monotonic() - started:.0f} s)")
    out: dict[str, dict[str, Any]] = {}
    for method in methods:
        runs = (run_method(obj, method, seed, budget, told=told, skip_repeats=skip_repeats) for seed in range(seeds))
        reaches = [reach(trials, optimum) for trials in runs]
        out[method] = summarise(reaches, budget)
        log(f"    {method}: {out[method]['reached']}/{seeds} reached ({time.monotonic() - started:.0f} s)")
    share = (default.true_value or 0.0) / optimum if default.truly_feasible else 0.0
    outcome = str(default.true_outcome or default.outcome)
    return CaseReport(case.name, optimum, arg, share, outcome, out, time.monotonic() - started)


def table(reports: list[CaseReport]) -> str:
    lines = [
        "| case | default / optimum | method | reached 97 % | engine-s to 97 %: median (p25 to p75) "
        "| trials to 97 %: median (p25 to p75) | median pick / optimum |",
        "|---|---|---|---|---|---|---|",
    ]
    for rep in reports:
        default = f"{100 * rep.default_share:.0f} %" + (
            "" if rep.default_outcome == "ok" else f" ({rep.default_outcome})"
        )
        for method, m in rep.methods.items():
            lines.append(
                f"| {rep.case} | {default} | {method} | {m['reached']}/{m['seeds']} | {_fmt(m['seconds'], '')} "
                f"| {_fmt(m['trials'], '')} | {100 * m['best']:.1f} % |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--budget", type=int, default=40, help="trials per method and seed")
    ap.add_argument("--cases", nargs="*", default=[c.name for c in CASES], choices=[c.name for c in CASES])
    ap.add_argument("--methods", nargs="*", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--noise", type=float, default=0.02, help="relative sd of a run's throughput")
    ap.add_argument("--json", help="write the results here as JSON")
    ap.add_argument(
        "--fresh-study",
        action="store_true",
        help="start each sampler's study empty instead of telling it the method's own runs (as the product does)",
    )
    ap.add_argument(
        "--repeats",
        action="store_true",
        help="let the product's methods re-run a point their sampler proposes again (the product withdraws it)",
    )
    args = ap.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    started = time.monotonic()

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    reports = []
    for case in (c for c in CASES if c.name in args.cases):
        mirror = {"told": not args.fresh_study, "skip_repeats": not args.repeats}
        reports.append(evaluate_case(case, args.seeds, args.budget, args.methods, args.noise, log, **mirror))
    print(table(reports))
    print("\nExhaustive optima (noise-free output tok/s):")
    for rep in reports:
        print(f"- {rep.case}: {rep.optimum:,.0f} at {rep.argmax}")
    print(
        f"\n{args.seeds} seeds, budget {args.budget} trials, noise {args.noise:g}; "
        f"run time {time.monotonic() - started:.0f} s. All numbers are modelled by the simulator, not measured."
    )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump([rep.__dict__ for rep in reports], fh, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
