"""The simulator held to published real measurements: a FITTED set and a VALIDATION set.

``FITTED`` holds the facts the model's constants were fitted to (each names the constant); they
show the fit still holds and do not count as evidence. ``VALIDATION`` holds published
measurements that no constant was fitted to; they say how far to trust a modelled number of
that kind. Every published number below was read in the source named next to it (a GitHub
issue or pull request that pastes an engine log or a benchmark result); none is estimated.
A quantity marked *derived* is simple arithmetic on published numbers (a ratio of two latencies
from the same run), said so in its row.

``python benchmarks/sim_fidelity.py`` prints the table. The validation set is append-only:
``validation_record.json`` holds the digest of every row as it was recorded (its published value,
setup, source and label), and ``tests/sim/test_fidelity.py`` fails when a recorded row was edited,
relabelled or dropped, or a row left for the fitted set comes back. A row used in any fit moves
to the fitted set for good (``Fact.moved``), with its near-copies. Every summary — the median,
each band — is over all validation rows, known misses included.

Retired: the 1.7–1.8× CUDA-graph speed-up of a multimodal 7B model (vllm-project/vllm-omni#7960)
that an earlier fit of the eager constants used; the SGLang flashinfer row replaced it.
The SGLang triton row of the same PR (a different attention backend, its own timings) stays in
the validation set.

Version notes. vLLM before 0.21 did not subtract a CUDA-graph memory estimate from the KV budget,
so rows from older versions are modelled without one (``graphs=False``). vLLM V0 (≤ 0.6) without
chunked prefill profiles ``max(max_model_len, 2048)`` tokens; with chunked prefill (automatic
above a 32K max length) 2048.

Categories: ``kv`` (KV-cache size), ``memory`` (weights, non-torch, activation peak),
``decode`` (decode step / TPOT), ``eager`` (steps without CUDA graphs), ``ttft`` (prefill),
``moe`` (an MoE model), ``sglang-kv`` (``mem_fraction_static`` → ``max_total_num_tokens``).

``error_band(category)`` is the validated error of one kind of number: the largest |error| over
that category's validation rows, and how many rows that is (none: the kind is not validated).
``python -m autotune_sim error-bands`` prints every band as JSON, so a program that only runs
the simulator as a command (the tuner, which shows it next to modelled numbers) reads it as data.
"""

from __future__ import annotations

import functools
import hashlib
import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from autotune_sim.kvcache import BlockPool
from autotune_sim.memory import GIB, SglangMemory, VllmMemory, footprint, plan_sglang, plan_vllm, step_bytes
from autotune_sim.offline import simulate
from autotune_sim.perf import GraphMode, PerfModel, StepShape
from autotune_sim.presets import GPUS, ModelPreset, find_model
from autotune_sim.scheduler import SimRequest, VllmScheduler
from autotune_sim.stats import EngineStats

__all__ = [
    "CATEGORIES",
    "FITTED",
    "GOAL_BAND",
    "GOAL_MEDIAN",
    "VALIDATION",
    "Band",
    "Fact",
    "Summary",
    "bands_json",
    "error_band",
    "summarise",
]

GOAL_BAND = 0.25  # every validation row within ±25 %
GOAL_MEDIAN = 0.10  # median |error| of the validation rows ≤ 10 %


@dataclass(frozen=True)
class Fact:
    """One published measurement and how the live model computes the same quantity.

    Attributes:
        name: Short description of the quantity.
        category: See the module docstring.
        source: URL of the issue / PR / page where the number was read.
        engine: Engine and version as the source states it.
        gpu: GPU as the source states it.
        model: Checkpoint.
        tp: Tensor-parallel size.
        dtype: Weight dtype / quantization.
        setup: Lengths, concurrency or rate, and other settings of the run.
        published: The published number.
        unit: Its unit.
        compute: The live model's number for the same setup.
        fitted_to: For a FITTED fact, the constant(s) fitted to it.
        known_miss: Why this validation row is not expected to meet the goal (None if it is), as
            labelled when the row was recorded: never edited.
        later: What a later model change says of the row, beside its label.
        moved: For a row recorded as validation and later used in a fit (or a near-copy of a
            fitted fact: same source and setup, or the same quantity and profile), why it left
            the validation set; it stays in the fitted set for good (``validation_record.json``).
    """

    name: str
    category: str
    source: str
    engine: str
    gpu: str
    model: str
    tp: int
    dtype: str
    setup: str
    published: float
    unit: str
    compute: Callable[[], float] = field(repr=False)
    fitted_to: str | None = None
    known_miss: str | None = None
    moved: str | None = None  # why a row left the validation set for good (used in a fit, or a near-copy)
    # What a later model change says of a row: added beside its label, which stays as recorded.
    later: str | None = None

    def modelled(self) -> float:
        return float(self.compute())

    def ratio(self) -> float:
        return self.modelled() / self.published


def _model(name: str) -> ModelPreset:
    model = find_model(name)
    assert model is not None, name
    return model


# ------------------------------------------------------------------------------ computations
def _vllm_plan(
    model: str,
    gpu: str,
    *,
    util: float,
    batched: int,
    seqs: int,
    max_len: int,
    tp: int = 1,
    quantization: str | None = None,
    kv_dtype: str = "auto",
    graphs: bool = False,
) -> tuple[float, int]:
    """(KV bytes, KV tokens) of vLLM's start-up plan for one rank."""
    m = _model(model)
    fp = footprint(m, tp=tp, quantization=quantization, kv_dtype=kv_dtype, p2p=GPUS[gpu].p2p)
    sizes = [1, 2, 4, *range(8, 513, 8)] if graphs else []
    plan = plan_vllm(
        VllmMemory(
            gpu=GPUS[gpu],
            fp=fp,
            utilization=util,
            max_batched_tokens=batched,
            max_num_seqs=seqs,
            capture_sizes=sizes,
            graphs_per_size=2 if graphs else 0,
            block_size=16,
            max_model_len=max_len,
            derived_max_len=m.max_position,
            check_free=False,
        )
    )
    return plan.kv_bytes, plan.kv_tokens


def _kv_gib(**kw: object) -> Callable[[], float]:
    return lambda: _vllm_plan(**kw)[0] / GIB  # type: ignore[arg-type]


def _kv_tokens(**kw: object) -> Callable[[], float]:
    return lambda: float(_vllm_plan(**kw)[1])  # type: ignore[arg-type]


def _activation_gib(model: str, tokens: int, seqs: int, tp: int = 1) -> Callable[[], float]:
    return lambda: step_bytes(footprint(_model(model), tp=tp), tokens, seqs, runtime=False) / GIB


def _weights_gib(model: str, tp: int = 1, quantization: str | None = None) -> Callable[[], float]:
    return lambda: footprint(_model(model), tp=tp, quantization=quantization).weight_bytes / GIB


def _non_torch_gib(model: str, tp: int = 1, gpu: str = "H100-80GB") -> Callable[[], float]:
    return lambda: footprint(_model(model), tp=tp, p2p=GPUS[gpu].p2p).non_torch_bytes / GIB


def _sglang_tokens(model: str, gpu: str, fraction: float, tp: int, quantization: str | None) -> Callable[[], float]:
    def run() -> float:
        fp = footprint(_model(model), tp=tp, quantization=quantization, p2p=GPUS[gpu].p2p)
        plan = plan_sglang(SglangMemory(GPUS[gpu], fp, fraction, None, 1, [1], []))
        return float(plan.kv_tokens)

    return run


def _decode_ms(model: str, gpu: str, batch: int, context: int, graph: GraphMode) -> Callable[[], float]:
    def run() -> float:
        m = _model(model)
        perf = PerfModel(m, GPUS[gpu], footprint(m))
        return 1000.0 * perf.decode_step(batch, context, graph)

    return run


def _ratio(a: Callable[[], float], b: Callable[[], float]) -> Callable[[], float]:
    return lambda: a() / b()


@functools.cache
def _awq_a100_eager() -> tuple[float, float]:
    """(TTFT, TPOT) in seconds of vllm#20469's run, modelled once for both of its rows."""
    return _serve(
        "qwen3-14b",
        "A100-80GB",
        quantization="awq",
        isl=16000,
        osl=200,
        concurrency=1,
        graph_mode="NONE",
        batched=2048,
        seqs=30,
        requests=2,
    )


def _serve(
    model: str,
    gpu: str,
    *,
    quantization: str | None,
    isl: int,
    osl: int,
    concurrency: int,
    graph_mode: str,
    batched: int,
    seqs: int,
    requests: int = 4,
) -> tuple[float, float]:
    """(mean TTFT s, mean TPOT s) of a closed-loop run through the vLLM scheduler and step model."""
    m = _model(model)
    fp = footprint(m, quantization=quantization)
    sched = VllmScheduler(
        BlockPool(200_000, 16, True),
        EngineStats(max_model_len=isl + osl + 16),
        lambda seed, i: 1000 + i % 7,
        max_num_seqs=seqs,
        max_batched_tokens=batched,
        chunked_prefill=True,
        long_prefill_threshold=0,
        priority_policy=False,
        reserve_full_isl=True,
        graph_mode=graph_mode,
        max_capture=512,
    )
    result = simulate(
        sched,
        PerfModel(m, GPUS[gpu], fp),
        requests=requests,
        concurrency=concurrency,
        prompt=lambda i: [(i * 131 + j) % 30000 + 300 for j in range(isl)],
        output_len=osl,
    )
    per_request = result.duration_s * concurrency / requests
    tpot = (per_request - result.mean_ttft_s) / (osl - 1)
    return result.mean_ttft_s, tpot


@dataclass(frozen=True)
class _Load:
    """A closed-loop serving run of fixed lengths on vLLM's scheduler, its KV pool from the
    start-up plan (``util``, ``max_len``), as a published benchmark ran it."""

    model: str
    gpu: str
    isl: int
    osl: int
    concurrency: int
    requests: int
    seqs: int
    batched: int
    util: float
    max_len: int
    graph_mode: str
    quantization: str | None = None


class _Clock(PerfModel):
    """The step model, also keeping the modelled time."""

    t = 0.0

    def step_time(self, shape: StepShape) -> float:
        dt = super().step_time(shape)
        self.t += dt
        return dt


class _TimedVllm(VllmScheduler):
    """vLLM's scheduler, also recording each finished request's TPOT as ``vllm bench serve``
    defines it: (latency − TTFT) / (output tokens − 1)."""

    clock: _Clock
    tpots: list[float]
    latencies: list[float]

    def finish(self, req: SimRequest) -> None:
        self.tpots.append((self.clock.t - req.first_token) / max(1, req.generated - 1))
        self.latencies.append(self.clock.t - req.arrival)
        super().finish(req)


@functools.cache
def _served_under_load(load: _Load) -> tuple[float, float, float]:
    """(output tokens per second, mean TPOT, mean request latency; in seconds) of one run."""
    m = _model(load.model)
    fp = footprint(m, quantization=load.quantization)
    tokens = _vllm_plan(
        load.model,
        load.gpu,
        util=load.util,
        batched=load.batched,
        seqs=load.seqs,
        max_len=load.max_len,
        quantization=load.quantization,
    )[1]
    sched = _TimedVllm(
        BlockPool(tokens // 16, 16, True),
        EngineStats(max_model_len=load.max_len),
        lambda seed, i: 1000 + i % 7,
        max_num_seqs=load.seqs,
        max_batched_tokens=load.batched,
        chunked_prefill=True,
        long_prefill_threshold=0,
        priority_policy=False,
        reserve_full_isl=False,
        graph_mode=load.graph_mode,
        max_capture=512,
    )
    sched.clock, sched.tpots, sched.latencies = _Clock(m, GPUS[load.gpu], fp), [], []
    body = [1000 + j % 29000 for j in range(load.isl - 1)]
    result = simulate(
        sched,
        sched.clock,
        requests=load.requests,
        concurrency=load.concurrency,
        prompt=lambda i: [300 + i, *body],  # each request its own first token: no shared prefix
        output_len=load.osl,
    )
    return result.output_throughput, statistics.fmean(sched.tpots), statistics.fmean(sched.latencies)


def _load_throughput(load: _Load) -> Callable[[], float]:
    return lambda: _served_under_load(load)[0]


def _load_tpot_ms(load: _Load) -> Callable[[], float]:
    return lambda: 1000.0 * _served_under_load(load)[1]


def _load_request_rates(load: _Load) -> Callable[[], float]:
    """Concurrency × one request's output tokens per second: the aggregate a client reports when
    it multiplies the per-request rate by its concurrency (L4BENCH)."""
    return lambda: load.concurrency * load.osl / _served_under_load(load)[2]


# ----------------------------------------------------------------------------------- sources
PR10511 = "https://github.com/vllm-project/vllm/pull/10511"
I10517 = "https://github.com/vllm-project/vllm/issues/10517"
I13061 = "https://github.com/vllm-project/vllm/issues/13061"
I21348 = "https://github.com/vllm-project/vllm/issues/21348"
I20469 = "https://github.com/vllm-project/vllm/issues/20469"
SG1401 = "https://github.com/sgl-project/sglang/pull/1401"
CAL = "autotune_sim/calibration.py sources"
# llm-d-planner PR #205 committed the raw server logs of a vLLM 0.19.0 sizing sweep (and removed
# them in a later commit of the PR): H100 80GB, --gpu-memory-utilization 0.95, --max-model-len
# 8192, no prefix caching, max_num_batched_tokens 8192 and max_num_seqs 1024 by default, and
# VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS False (no graph estimate in the KV budget).
P205 = "https://github.com/llm-d-incubation/llm-d-planner/blob/d3121e059da88662db39a926a3ead964be97359b/accuracy/results/v0.19.0/logs/"
P205_SETUP = "util 0.95, max_model_len 8192, batched 8192, 1024 seqs"
_P205 = {"gpu": "H100-80GB", "util": 0.95, "batched": 8192, "seqs": 1024, "max_len": 8192}
# ree2raz/inference-bench: its own streaming client (not vllm bench serve), 100 chat requests of
# ~200 prompt tokens and max_tokens 128 (not forced; most reach it), 3 repeats, medians of p50s.
# Its throughput is the per-request rate times the concurrency (12.99 tok/s × 64 = 831.3).
L4BENCH = "https://github.com/ree2raz/inference-bench/blob/3f89896e497d33bc34b27a9beb6aebb20a876732/results/summary.csv"
# GPUStack's performance lab: `vllm serve Qwen/Qwen3-14B` (defaults) on one H100 SXM, driven by
# `vllm bench serve` with every request sent at once (request rate inf).
GPUSTACK_Q14 = "https://github.com/gpustack/gpustack/blob/7ae332aaf05783e657560ef927c527b156e2536d/docs/performance-lab/qwen3-14b/h100.md"

_LLAMA = "llama-3.1-8b"
_R1_14B = "deepseek-r1-distill-qwen-14b"
_Q235 = "qwen3-235b-a22b"
_ISSUE_7960 = "vllm-project/vllm-omni#7960 (as cited in perf.py)"

_FIT_TARGETS: tuple[Fact, ...] = (
    Fact(
        "GPU KV cache size (tokens)",
        "kv",
        CAL + " [a]: vllm-project/vllm issue 'NIXL_ERR_BACKEND' log",
        "vLLM (V1, pre-0.21)",
        "H100 80GB",
        "Llama-3.1-8B-Instruct",
        1,
        "bf16",
        "util 0.9, max_model_len 131072",
        442_160,
        "tokens",
        _kv_tokens(model=_LLAMA, gpu="H100-80GB", util=0.9, batched=8192, seqs=1024, max_len=131072, graphs=True),
        fitted_to="NON_TORCH_GIB, WEIGHT_BUFFERS_GIB, CUDA_CONTEXT_GIB (memory.py)",
    ),
    Fact(
        "model loading took (GiB)",
        "memory",
        CAL + " [a][c]",
        "vLLM",
        "H100 80GB",
        "Llama-3.1-8B-Instruct",
        1,
        "bf16",
        "start-up",
        14.99,
        "GiB",
        _weights_gib(_LLAMA),
        fitted_to="WEIGHT_BUFFERS_GIB (memory.py)",
    ),
    Fact(
        "profile activation peak (GiB)",
        "memory",
        CAL + " [c]",
        "vLLM",
        "80 GB card",
        "Llama-3.1-8B-Instruct",
        1,
        "bf16",
        "8192 tokens / 256 seqs",
        1.21,
        "GiB",
        _activation_gib(_LLAMA, 8192, 256),
        fitted_to="act_bytes_per_token coefficients (memory.footprint)",
    ),
    Fact(
        "non_torch_memory (GiB)",
        "memory",
        "memory.py NON_TORCH_GIB comment (vLLM log, 8B model)",
        "vLLM",
        "80 GB card",
        "8B model",
        1,
        "bf16",
        "start-up",
        0.32,
        "GiB",
        _non_torch_gib(_LLAMA),
        fitted_to="NON_TORCH_GIB (memory.py)",
    ),
    Fact(
        "eager penalty per decode step, flashinfer (ms, derived: 8.23 − 7.35)",
        "eager",
        SG1401,
        "SGLang 0.3 (Sep 2024)",
        "not named (H100-class)",
        "Meta-Llama-3-8B",
        1,
        "bf16",
        "batch 1, input 128, output 8; --disable-cuda-graph vs CUDA graph",
        8.23 - 7.35,
        "ms",
        lambda: (
            _decode_ms(_LLAMA, "H100-80GB", 1, 132, GraphMode.EAGER)()
            - _decode_ms(_LLAMA, "H100-80GB", 1, 132, GraphMode.FULL)()
        ),
        fitted_to="EAGER_BASE_S, EAGER_PER_LAYER_S (perf.py)",
    ),
)

_RECORDED: tuple[Fact, ...] = (
    # ---- vLLM memory profile, Llama-3-8B on one and two H100s (vLLM ~0.6.5, PR #10511 sanity logs)
    Fact(
        "PyTorch activation peak memory (GiB)",
        "memory",
        PR10511,
        "vLLM 0.6.5-dev (V0)",
        "H100 80GB",
        "Meta-Llama-3-8B",
        1,
        "bf16",
        "default: max_model_len 8192 → 8192 profiled tokens, 256 seqs",
        1.26,
        "GiB",
        _activation_gib(_LLAMA, 8192, 256),
        moved="near-copy of the fitted activation peak (1.21 GiB, the same 8,192-token / 256-sequence profile)",
    ),
    Fact(
        "PyTorch activation peak memory (GiB)",
        "memory",
        PR10511,
        "vLLM 0.6.5-dev (V0)",
        "H100 80GB",
        "Meta-Llama-3-8B",
        2,
        "bf16",
        "-tp 2, 8192 profiled tokens, 256 seqs",
        1.26,
        "GiB",
        _activation_gib(_LLAMA, 8192, 256, tp=2),
        moved="the TP-2 activation model was changed to match this row",
    ),
    Fact(
        "model weights take (GiB)",
        "memory",
        PR10511,
        "vLLM 0.6.5-dev (V0)",
        "H100 80GB",
        "Meta-Llama-3-8B",
        2,
        "bf16",
        "-tp 2",
        7.48,
        "GiB",
        _weights_gib(_LLAMA, tp=2),
        moved="near-copy of the fitted weights (14.99 GiB at TP 1, halved)",
    ),
    Fact(
        "non_torch_memory (GiB)",
        "memory",
        PR10511,
        "vLLM 0.6.5-dev (V0)",
        "H100 80GB",
        "Meta-Llama-3-8B",
        1,
        "bf16",
        "TP 1",
        1.79,
        "GiB",
        _non_torch_gib(_LLAMA),
        known_miss="the same quantity logs 0.32 GiB in later vLLM (the fitted fact) and 0.35 GiB on an RTX 3090 "
        "(vllm#10517); this dev build's 1.79 GiB at TP 1 is not reproduced by one constant",
        moved="used in a fit: NCCL_GIB (memory.py) is the TP 2 row's increment over this row, the same build",
    ),
    Fact(
        "non_torch_memory (GiB)",
        "memory",
        PR10511,
        "vLLM 0.6.5-dev (V0)",
        "H100 80GB",
        "Meta-Llama-3-8B",
        2,
        "bf16",
        "-tp 2 (NVLink)",
        3.58,
        "GiB",
        _non_torch_gib(_LLAMA, tp=2),
        known_miss="same build as the TP 1 row (1.79 GiB at TP 1); the TP 2 increment (+1.79 GiB) is what the "
        "model's NCCL term targets",
        moved="used in a fit: NCCL_GIB (memory.py) is this row's increment over the same build's TP 1 row "
        "(3.58 − 1.79 GiB); the total is not reproduced, as the model's TP 1 part is later builds' 0.32 GiB",
    ),
    Fact(
        "available_kv_cache_memory (GiB)",
        "kv",
        PR10511,
        "vLLM 0.6.5-dev (V0)",
        "H100 80GB",
        "Meta-Llama-3-8B",
        1,
        "bf16",
        "util 0.90, max_model_len 8192, no graph estimate (pre-0.21)",
        53.29,
        "GiB",
        _kv_gib(model=_LLAMA, gpu="H100-80GB", util=0.9, batched=8192, seqs=256, max_len=8192),
    ),
    # ---- vLLM on one RTX 3090 (vllm#10517): V0, max_model_len 20000 / 29000 → no chunked prefill
    Fact(
        "non_torch_memory (GiB)",
        "memory",
        I10517,
        "vLLM V0 (late 2024)",
        "RTX 3090",
        "Llama-3.1-8B-Instruct",
        1,
        "bf16",
        "util 0.90",
        0.35,
        "GiB",
        _non_torch_gib(_LLAMA),
        moved="near-copy of the fitted non-torch memory (0.32 GiB, an 8B model at TP 1)",
    ),
    Fact(
        "kv_cache_size (GiB)",
        "kv",
        I10517,
        "vLLM V0 (late 2024)",
        "RTX 3090",
        "Llama-3.1-8B-Instruct",
        1,
        "bf16",
        "util 0.90, max_model_len 20000 (profiles 20000 tokens)",
        3.81,
        "GiB",
        _kv_gib(model=_LLAMA, gpu="RTX-3090", util=0.9, batched=20000, seqs=256, max_len=20000),
    ),
    Fact(
        "kv_cache_size (GiB)",
        "kv",
        I10517,
        "vLLM V0 (late 2024)",
        "RTX 3090",
        "Llama-3.1-8B-Instruct",
        1,
        "bf16",
        "util 0.90, max_model_len 29000 (profiles 29000 tokens)",
        2.89,
        "GiB",
        _kv_gib(model=_LLAMA, gpu="RTX-3090", util=0.9, batched=29000, seqs=256, max_len=29000),
        known_miss=(
            "this build's profile grows ~110 KB per profiled token (published peak_torch_memory 17.06 → 17.98 GiB"
            " for 20000 → 29000 tokens, same issue) against ~149 KB/token in the H100 profile the activation "
            "coefficient is fitted to; one coefficient does not fit both, and at 29000 tokens the gap is 35 % of "
            "a small KV pool"
        ),
    ),
    # ---- vLLM TP 2 on two RTX 4090s (vllm#13061): V0, max_model_len 131072 → chunked prefill, 2048 tokens
    Fact(
        "model weights took (GB as logged; GiB)",
        "memory",
        I13061,
        "vLLM V0 (Feb 2025)",
        "2× RTX 4090",
        "DeepSeek-R1-Distill-Qwen-14B",
        2,
        "bf16",
        "--tensor_parallel_size 2",
        13.9476,
        "GiB",
        _weights_gib(_R1_14B, tp=2),
        known_miss=None,
    ),
    Fact(
        "non_torch_memory (GiB)",
        "memory",
        I13061,
        "vLLM V0 (Feb 2025)",
        "2× RTX 4090",
        "DeepSeek-R1-Distill-Qwen-14B",
        2,
        "bf16",
        "TP 2 over PCIe (no NVLink)",
        0.25,
        "GiB",
        _non_torch_gib(_R1_14B, tp=2),
        known_miss=(
            "the model's NCCL_GIB (0.7 GiB for any TP > 1) describes NVLink pairs; this PCIe pair of RTX 4090s "
            "logs 0.25 GiB in all (no peer-to-peer, so likely no custom all-reduce buffers); footprint() does not"
            " know the link"
        ),
        later=(
            "computed on the H100 preset, as recorded; footprint() now adds NCCL buffers only where the GPU "
            "has peer-to-peer (GpuPreset.p2p: an RTX 4090 has not), which this row's setup never asked of it"
        ),
    ),
    Fact(
        "PyTorch activation peak memory (GiB)",
        "memory",
        I13061,
        "vLLM V0 (Feb 2025)",
        "2× RTX 4090",
        "DeepSeek-R1-Distill-Qwen-14B",
        2,
        "bf16",
        "chunked prefill: 2048 profiled tokens, 256 seqs",
        0.19,
        "GiB",
        _activation_gib(_R1_14B, 2048, 256, tp=2),
        known_miss=(
            "0.19 GiB is less than the model's fp32 logits for 256 profiled sequences (0.145 GiB) plus one MLP "
            "output for 2048 tokens; this V0 build's chunked-prefill profile evidently samples fewer sequences; "
            "not modelled"
        ),
    ),
    Fact(
        "KV cache capacity (tokens)",
        "kv",
        I13061,
        "vLLM V0 (Feb 2025)",
        "2× RTX 4090",
        "DeepSeek-R1-Distill-Qwen-14B",
        2,
        "bf16",
        "util 0.98, max_model_len 131072, 2048 profiled tokens",
        81_536,
        "tokens",
        _kv_tokens(model=_R1_14B, gpu="RTX-4090", util=0.98, batched=2048, seqs=256, max_len=131072, tp=2),
    ),
    # ---- MoE, TP 4, FP8: Qwen3-235B-A22B-FP8 on 4× H100 (vllm#21348), vLLM and SGLang
    Fact(
        "GPU KV cache size (tokens)",
        "moe",
        I21348,
        "vLLM V1 (July 2025, pre-0.21)",
        "4× H100 80GB",
        "Qwen3-235B-A22B-FP8",
        4,
        "fp8",
        "defaults: util 0.9, max_model_len 40960, 8192 batched tokens",
        178_880,
        "tokens",
        _kv_tokens(
            model=_Q235, gpu="H100-80GB", util=0.9, batched=8192, seqs=1024, max_len=40960, tp=4, quantization="fp8"
        ),
        known_miss=(
            "vLLM's profile of this FP8 MoE reserves ~5.6 GiB per rank more than the model's activations (fused-"
            "MoE and FP8 block-quant workspaces are not modelled); the SGLang row for the same checkpoint and "
            "GPUs is within 4 %, so weights and KV bytes per token are right"
        ),
    ),
    Fact(
        "KV Cache is allocated. #tokens",
        "sglang-kv",
        I21348,
        "SGLang (July 2025)",
        "4× H100 80GB",
        "Qwen3-235B-A22B-FP8",
        4,
        "fp8",
        "--tp 4 --mem-fraction-static 0.93",
        367_404,
        "tokens",
        _sglang_tokens(_Q235, "H100-80GB", 0.93, 4, "fp8"),
    ),
    # ---- SGLang decode at batch 1, with and without CUDA graphs (sglang#1401, bench_latency)
    # The GPU is not named in the PR; 7.06 ms for 16 GB of weights is below an A100-80GB's 7.9 ms
    # bandwidth floor, so the run was on an H100-class card (modelled on H100 SXM).
    Fact(
        "decode latency, flashinfer, CUDA graph (ms)",
        "decode",
        SG1401,
        "SGLang 0.3 (Sep 2024)",
        "not named (H100-class, see comment)",
        "Meta-Llama-3-8B",
        1,
        "bf16",
        "batch 1, input 128, output 8",
        7.35,
        "ms",
        _decode_ms(_LLAMA, "H100-80GB", 1, 132, GraphMode.FULL),
        moved="used in a fit: the fitted eager penalty is 8.23 − 7.35 ms of this PR's flashinfer pair",
    ),
    Fact(
        "decode latency, triton, CUDA graph (ms)",
        "decode",
        SG1401,
        "SGLang 0.3 (Sep 2024)",
        "not named (H100-class)",
        "Meta-Llama-3-8B",
        1,
        "bf16",
        "batch 1, input 128, output 8",
        7.06,
        "ms",
        _decode_ms(_LLAMA, "H100-80GB", 1, 132, GraphMode.FULL),
        moved="near-copy of a fitted row: the same PR, setup and card as the flashinfer pair the eager "
        "constants were fitted to",
    ),
    Fact(
        "decode latency, triton, --disable-cuda-graph (ms)",
        "eager",
        SG1401,
        "SGLang 0.3 (Sep 2024)",
        "not named (H100-class)",
        "Meta-Llama-3-8B",
        1,
        "bf16",
        "batch 1, input 128, output 8",
        9.28,
        "ms",
        _decode_ms(_LLAMA, "H100-80GB", 1, 132, GraphMode.EAGER),
        moved="near-copy of a fitted row: the triton twin of the flashinfer eager pair the eager constants "
        "were fitted to",
    ),
    # ---- vLLM eager serving on one A100 80GB, long prompt (vllm#20469)
    Fact(
        "Mean TPOT (ms), --enforce-eager",
        "eager",
        I20469,
        "vLLM 0.9.1",
        "A100 80GB",
        "Qwen3-14B-AWQ",
        1,
        "awq int4",
        "benchmark_serving random 16000 in / 200 out, max-concurrency 1",
        20.63,
        "ms",
        lambda: 1000.0 * _awq_a100_eager()[1],
        known_miss=(
            "published 20.6 ms is 2.7x the bandwidth roofline of 10 GB of AWQ weights + 2.6 GB of KV on an A100; "
            "int4 GEMV at batch 1 does not reach the bandwidth the model assumes, and the run also used a guided-"
            "decoding backend; the old eager constants (9 ms/step) matched it (0.81) only by a launch cost "
            "SGLang's eager rows refute"
        ),
    ),
    Fact(
        "Mean TTFT (ms), 16000-token prompt",
        "ttft",
        I20469,
        "vLLM 0.9.1",
        "A100 80GB",
        "Qwen3-14B-AWQ",
        1,
        "awq int4",
        "benchmark_serving random 16000 in / 200 out, max-concurrency 1",
        3345.37,
        "ms",
        lambda: 1000.0 * _awq_a100_eager()[0],
    ),
    # ---- rows recorded 2026-12-07, before any change to the model they test ----
    # vLLM 0.19.0 start-up logs of llm-d-planner PR #205 (see P205): TP 1/2/4, FP8 weights, FP8 KV.
    *(
        Fact(
            "GPU KV cache size (tokens)",
            "kv",
            P205 + log,
            "vLLM 0.19.0 (V1)",
            f"{tp}× H100 80GB" if tp > 1 else "H100 80GB",
            model,
            tp,
            dtype,
            P205_SETUP + extra,
            float(tokens),
            "tokens",
            _kv_tokens(model=preset, tp=tp, quantization=quant, kv_dtype=kv, **_P205),
        )
        for log, model, preset, tp, dtype, quant, kv, extra, tokens in (
            (
                "meta-llama-llama-3-1-8b---h100-80gb--tp1pp1dp1--8192.log",
                "Llama-3.1-8B-Instruct",
                _LLAMA,
                1,
                "bf16",
                None,
                "auto",
                "",
                476_016,
            ),
            (
                "meta-llama-llama-3-1-8b---h100-80gb--tp2pp1dp1--8192.log",
                "Llama-3.1-8B-Instruct",
                _LLAMA,
                2,
                "bf16",
                None,
                "auto",
                "",
                1_044_688,
            ),
            (
                "meta-llama-llama-3-1-8b---h100-80gb--tp4pp1dp1--8192.log",
                "Llama-3.1-8B-Instruct",
                _LLAMA,
                4,
                "bf16",
                None,
                "auto",
                "",
                2_209_792,
            ),
            (
                "qwen-qwen2-5-7b-instruct--h100-80gb--tp2pp1dp1--8192.log",
                "Qwen2.5-7B-Instruct",
                "qwen2.5-7b",
                2,
                "bf16",
                None,
                "auto",
                "",
                2_390_592,
            ),
            (
                "qwen-qwen2-5-7b-instruct--h100-80gb--tp4pp1dp1--8192.log",
                "Qwen2.5-7B-Instruct",
                "qwen2.5-7b",
                4,
                "bf16",
                None,
                "auto",
                "",
                5_043_280,
            ),
            (
                "qwen-qwen2-5-72b-instruc--h100-80gb--tp2pp1dp1--8192.log",
                "Qwen2.5-72B-Instruct",
                "qwen2.5-72b",
                2,
                "bf16",
                None,
                "auto",
                "",
                19_920,
            ),
            (
                "fp8dyn-llama-3-3-70b--h100-80gb--tp2pp1dp1--8192.log",
                "Llama-3.3-70B-Instruct-fp8-dynamic",
                "llama-3.1-70b",
                2,
                "fp8 W8A8 (compressed-tensors)",
                "compressed-tensors",
                "auto",
                "",
                244_304,
            ),
            (
                "fp8dyn-llama-3-3-70b--h100-80gb--tp4pp1dp1--8192.log",
                "Llama-3.3-70B-Instruct-fp8-dynamic",
                "llama-3.1-70b",
                4,
                "fp8 W8A8 (compressed-tensors)",
                "compressed-tensors",
                "auto",
                "",
                708_992,
            ),
            (
                "meta-llama-llama-3---h100-80gb--tp1pp1dp1--8192-qfp8.log",
                "Llama-3.1-8B-Instruct",
                _LLAMA,
                1,
                "fp8 (--quantization fp8, online)",
                "fp8",
                "auto",
                "",
                529_248,
            ),
            (
                "meta-llama---h100-80gb--tp1pp1dp1--8192-dtbf16-kvfp8.log",
                "Llama-3.1-8B-Instruct",
                _LLAMA,
                1,
                "bf16",
                None,
                "fp8",
                ", --kv-cache-dtype fp8",
                952_032,
            ),
            (
                "qwen-qwen2---h100-80gb--tp1pp1dp1--8192-dtbf16-kvfp8.log",
                "Qwen2.5-7B-Instruct",
                "qwen2.5-7b",
                1,
                "bf16",
                None,
                "fp8",
                ", --kv-cache-dtype fp8",
                2_192_000,
            ),
        )
    ),
    Fact(
        "GPU KV cache size (tokens)",
        "moe",
        P205 + "qwen-qwen3-30b-a3b--h100-80gb--tp1pp1dp1--8192.log",
        "vLLM 0.19.0 (V1)",
        "H100 80GB",
        "Qwen3-30B-A3B",
        1,
        "bf16",
        P205_SETUP,
        168_288.0,
        "tokens",
        _kv_tokens(model="qwen3-30b-a3b", **_P205),
    ),
    Fact(
        "Model loading took (GiB)",
        "memory",
        P205 + "qwen-qwen2-5-72b-instruc--h100-80gb--tp2pp1dp1--8192.log",
        "vLLM 0.19.0 (V1)",
        "2× H100 80GB",
        "Qwen2.5-72B-Instruct",
        2,
        "bf16",
        "-tp 2, per GPU",
        67.8,
        "GiB",
        _weights_gib("qwen2.5-72b", tp=2),
    ),
    Fact(
        "Model loading took (GiB)",
        "memory",
        P205 + "fp8dyn-llama-3-3-70b--h100-80gb--tp2pp1dp1--8192.log",
        "vLLM 0.19.0 (V1)",
        "2× H100 80GB",
        "Llama-3.3-70B-Instruct-fp8-dynamic",
        2,
        "fp8 W8A8 (compressed-tensors)",
        "-tp 2, per GPU",
        33.88,
        "GiB",
        _weights_gib("llama-3.1-70b", tp=2, quantization="compressed-tensors"),
    ),
    Fact(
        "Model loading took (GiB)",
        "memory",
        P205 + "meta-llama-llama-3---h100-80gb--tp1pp1dp1--8192-qfp8.log",
        "vLLM 0.19.0 (V1)",
        "H100 80GB",
        "Llama-3.1-8B-Instruct",
        1,
        "fp8 (--quantization fp8, online)",
        "TP 1",
        8.49,
        "GiB",
        _weights_gib(_LLAMA, quantization="fp8"),
    ),
    Fact(
        "non-torch forward increase memory (GiB)",
        "memory",
        P205 + "meta-llama-llama-3-1-8b---h100-80gb--tp2pp1dp1--8192.log",
        "vLLM 0.19.0 (V1)",
        "2× H100 80GB",
        "Llama-3.1-8B-Instruct",
        2,
        "bf16",
        "-tp 2, per GPU",
        2.07,
        "GiB",
        _non_torch_gib(_LLAMA, tp=2),
        known_miss=(
            "vLLM 0.19 logs ~2.1 GiB of non-torch memory per rank at TP 2 and 4 on NVLink H100s (0.25 GiB at TP 1 in "
            "the same sweep); the model adds one 0.7 GiB NCCL_GIB for any TP > 1, sized to an older build"
        ),
        later="NCCL_GIB is now fitted to vllm#10511's TP 2 increment (another build, 1.79 GiB), which this row checks",
    ),
    Fact(
        "non-torch forward increase memory (GiB)",
        "memory",
        P205 + "fp8dyn-llama-3-3-70b--h100-80gb--tp4pp1dp1--8192.log",
        "vLLM 0.19.0 (V1)",
        "4× H100 80GB",
        "Llama-3.3-70B-Instruct-fp8-dynamic",
        4,
        "fp8 W8A8 (compressed-tensors)",
        "-tp 4, per GPU",
        2.21,
        "GiB",
        _non_torch_gib("llama-3.1-70b", tp=4),
        known_miss=(
            "vLLM 0.19 logs ~2.1 GiB of non-torch memory per rank at TP 2 and 4 on NVLink H100s (0.25 GiB at TP 1 in "
            "the same sweep); the model adds one 0.7 GiB NCCL_GIB for any TP > 1, sized to an older build"
        ),
        later="NCCL_GIB is now fitted to vllm#10511's TP 2 increment (another build, 1.79 GiB), which this row checks",
    ),
    Fact(
        "torch peak memory increase (GiB)",
        "memory",
        P205 + "qwen-qwen2-5-72b-instruc--h100-80gb--tp2pp1dp1--8192.log",
        "vLLM 0.19.0 (V1)",
        "2× H100 80GB",
        "Qwen2.5-72B-Instruct",
        2,
        "bf16",
        "-tp 2, per GPU; profile of 8192 tokens, 1024 seqs",
        2.29,
        "GiB",
        _activation_gib("qwen2.5-72b", 8192, 1024, tp=2),
    ),
    # vLLM 0.8.5 (V1, piecewise CUDA graphs) on one L4, Qwen2.5-7B-Instruct, --max-num-seqs 64
    # (L4BENCH); p50 TPOT per request, modelled as the mean (every request has the same lengths).
    *(
        Fact(
            name,
            category,
            L4BENCH,
            "vLLM 0.8.5 (V1)",
            "L4",
            "Qwen2.5-7B-Instruct",
            1,
            "bf16",
            f"~200 in / max 128 out, concurrency {c}, 100 requests, --max-num-seqs 64, util 0.90",
            value,
            unit,
            compute(_Load("qwen2.5-7b", "L4", 200, 128, c, 100, 64, 2048, 0.9, 32768, "PIECEWISE")),
        )
        for name, category, c, value, unit, compute in (
            ("TPOT p50 (ms), batch 1", "decode", 1, 58.3, "ms", _load_tpot_ms),
            ("TPOT p50 (ms)", "decode-load", 16, 61.9, "ms", _load_tpot_ms),
            ("TPOT p50 (ms)", "decode-load", 64, 75.7, "ms", _load_tpot_ms),
            (
                "throughput, concurrency × per-request tok/s",
                "throughput-load",
                16,
                254.33,
                "tok/s",
                _load_request_rates,
            ),
            ("throughput, concurrency × per-request tok/s", "throughput-load", 64, 831.3, "tok/s", _load_request_rates),
        )
    ),
    # vLLM 0.11.0 defaults on one H100 SXM, Qwen3-14B, 500 requests of 4000 in / 200 out at once
    # (GPUSTACK_Q14): the KV pool, not max_num_seqs, bounds how many run.
    *(
        Fact(
            name,
            category,
            GPUSTACK_Q14,
            "vLLM 0.11.0 (V1)",
            "H100 80GB SXM",
            "Qwen3-14B",
            1,
            "bf16",
            "vllm bench serve random 4000 in / 200 out, 500 prompts, request rate inf; vllm serve defaults",
            value,
            unit,
            compute(_Load("qwen3-14b", "H100-80GB", 4000, 200, 500, 500, 1024, 8192, 0.9, 40960, "FULL_AND_PIECEWISE")),
            known_miss=(
                "2.0 M prompt tokens served in 227.6 s is ~9,200 tokens/s in all, about a quarter of the card's "
                "dense bf16 peak for a 14.8 B model; the step model runs compute-bound prefill chunks at "
                "0.6 of peak (perf.MFU), so it prefills faster, decodes in larger batches sooner (lower TPOT) and "
                "finishes sooner (higher throughput)"
            ),
        )
        for name, category, value, unit, compute in (
            ("Output token throughput (tok/s)", "throughput-load", 438.56, "tok/s", _load_throughput),
            ("Mean TPOT (ms)", "decode-load", 132.45, "ms", _load_tpot_ms),
        )
    ),
)

#: Published measurements no constant was fitted to: the evidence. Append-only — a recorded
#: row's value, setup and source are never edited (``validation_record.json`` holds their digests).
VALIDATION: tuple[Fact, ...] = tuple(f for f in _RECORDED if f.moved is None)
#: What the constants were fitted to, and the rows that left the validation set for good.
FITTED: tuple[Fact, ...] = (*_FIT_TARGETS, *(f for f in _RECORDED if f.moved is not None))


# ---------------------------------------------------------------------------------- the record
RECORD = Path(__file__).with_name("validation_record.json")


def digest(fact: Fact) -> str:
    """What may never change once a row is recorded: its quantity, source, setup, published
    value and its known-miss label, word for word (a ``later`` note beside it may be added)."""
    fields = (fact.name, fact.category, fact.source, fact.engine, fact.gpu, fact.model, fact.tp, fact.dtype)
    blob = json.dumps([*fields, fact.setup, fact.published, fact.unit, fact.known_miss])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def record_problems(record: dict[str, dict[str, str]]) -> list[str]:
    """How the sets differ from the record (``{"validation": {digest: row}, "fitted": {...}}``):
    an edited, relabelled or dropped validation row, a fitted row back in validation, a new row
    not yet recorded. Empty when the sets keep the record."""
    validation = {digest(f): f for f in VALIDATION}
    fitted = {digest(f): f for f in FITTED}
    problems = [
        f"recorded validation row {row!r} ({key}) was edited, relabelled or dropped: add a new row instead"
        for key, row in record["validation"].items()
        if key not in validation and key not in fitted
    ]
    problems += [
        f"row {row!r} ({key}) left the validation set for a fit: it cannot come back"
        for key, row in record["fitted"].items()
        if key in validation
    ]
    problems += [
        f'row {_label(f)!r} is not recorded: add "{key}": "{_label(f)}" to {RECORD.name}'
        for key, f in validation.items()
        if key not in record["validation"]
    ]
    problems += [
        f'row {_label(f)!r} moved to the fitted set: add "{key}": "{_label(f)}" to its "fitted" section'
        for key, f in fitted.items()
        if f.moved is not None and key not in record["fitted"]
    ]
    return problems


def _label(fact: Fact) -> str:
    return f"{fact.category}: {fact.name} ({fact.source.rsplit('/', 2)[-2:][-1]}, {fact.setup})"


# ------------------------------------------------------------------------------------ summary
@dataclass(frozen=True)
class Summary:
    """How the validation set fares against the goal, over every row (known misses included)."""

    median_abs_error: float  # over every validation row
    worst_by_category: dict[str, tuple[Fact, float]]
    outside_band: list[tuple[Fact, float]]  # every row outside ±25 %, known misses included
    known_misses: list[tuple[Fact, float]]  # rows labelled a miss when recorded, still outside ±25 %
    # Rows labelled a miss when recorded that a later physical change brought within ±25 % (the
    # label stays: it is part of the record).
    recovered: list[tuple[Fact, float]]

    @property
    def ok(self) -> bool:
        return not self.outside_band and self.median_abs_error <= GOAL_MEDIAN


def summarise(facts: tuple[Fact, ...] = VALIDATION) -> Summary:
    """Median |error| over every row, worst row per category, rows outside the band and misses."""
    errors = [(fact, fact.ratio() - 1.0) for fact in facts]
    worst: dict[str, tuple[Fact, float]] = {}
    for fact, err in errors:
        if fact.category not in worst or abs(err) > abs(worst[fact.category][1]):
            worst[fact.category] = (fact, err)
    return Summary(
        statistics.median(abs(e) for _, e in errors) if errors else 0.0,
        worst,
        [(f, e) for f, e in errors if abs(e) > GOAL_BAND],
        [(f, e) for f, e in errors if f.known_miss is not None and abs(e) > GOAL_BAND],
        [(f, e) for f, e in errors if f.known_miss is not None and abs(e) <= GOAL_BAND],
    )


# ------------------------------------------------------------------------------- error bands
# One category per kind of number the product shows (a modelled number is printed with its own
# kind's band, or as not validated): the rows' categories, and the two kinds a tuning study's
# load produces that no published row measures yet.
CATEGORIES = {
    "kv": "KV-cache size",
    "memory": "memory (weights, non-torch, activation peak)",
    "decode": "decode step / TPOT at batch 1",
    "decode-load": "TPOT / ITL under load",
    "throughput-load": "output throughput under load",
    "eager": "steps without CUDA graphs",
    "ttft": "TTFT (prefill)",
    "moe": "MoE KV-cache size",
    "sglang-kv": "SGLang KV tokens",
}


@dataclass(frozen=True)
class Band:
    """How far a modelled number of one kind was from published measurements.

    ``max_abs_error`` is None when the category has no validation row: the number is then not
    validated, and is shown as such.
    """

    category: str
    label: str
    max_abs_error: float | None
    rows: int


def error_band(category: str, facts: tuple[Fact, ...] = VALIDATION) -> Band:
    """The largest |modelled/published − 1| over every validation row of the category, known
    misses included (a miss is a row the model gets wrong: it widens the band it belongs to)."""
    if category not in CATEGORIES:
        raise ValueError(f"unknown fidelity category {category!r}; known: {', '.join(CATEGORIES)}")
    errors = [abs(f.ratio() - 1.0) for f in facts if f.category == category]
    return Band(category, CATEGORIES[category], max(errors) if errors else None, len(errors))


def bands_json() -> str:
    """Every category's band, as ``python -m autotune_sim error-bands`` prints it."""
    bands = {c: error_band(c) for c in CATEGORIES}
    return json.dumps(
        {c: {"label": b.label, "max_abs_error": b.max_abs_error, "rows": b.rows} for c, b in bands.items()}
    )
