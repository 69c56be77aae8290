"""Step-time model: a roofline over one forward pass plus launch overhead.

One engine step runs one forward pass over a batch of decode tokens and prefill chunks. Its
time on one rank is

    max(bytes moved ÷ (HBM bandwidth × BW_EFFICIENCY), FLOPs ÷ (peak × MFU))
      + tensor-parallel all-reduce time + launch overhead

* **Bytes**: the weights the step touches (all of them for a dense model; for an MoE the
  non-expert weights plus the experts its tokens are routed to, E × (1 − (1 − k/E)^T) per layer
  for T tokens and k of E experts), plus the KV cache read by attention and the new KV written.
* **FLOPs**: 2 × active parameters per token (the GEMMs) plus attention: 4 × heads × head_dim
  per (query, key) pair — the decode context of each decoding sequence, and c × (p + c/2) for a
  prefill chunk of c tokens after p cached ones.
* **All-reduce** (TP > 1): two per layer, ring cost 2(TP−1)/TP × bytes ÷ link bandwidth plus a
  fixed latency.
* **Pipeline parallelism** splits the layers; a step crosses every stage, so PP buys memory, not
  step time (no micro-batch overlap is modelled).
* **Launch overhead**: with a full CUDA graph the step pays a fixed replay cost; piecewise graphs
  (attention runs eagerly between graphed pieces) add a little per layer; eager PyTorch pays a
  large per-layer kernel-launch and Python cost. Graphs apply only up to the captured size, so
  they give a large speed-up at small batch and little at large batch, where the GPU time
  dominates. Calibration (FITTED set, ``autotune_sim/fidelity.py``): SGLang's batch-1 decode of
  Llama-3-8B, 7.35 ms with graphs and 8.23 ms without (sgl-project/sglang#1401, flashinfer);
  modelled 1.14× for Llama-3.1-8B on an H100 at batch 1. The earlier fit (1.7–1.8×,
  vllm-project/vllm-omni#7960, a multimodal model) is retired.

Efficiencies are assumptions, not measurements: decode reaches ~82 % of peak bandwidth and
large prefills ~60 % of peak FLOP/s on these GPUs in public benchmarks.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from autotune_sim.memory import Footprint
from autotune_sim.presets import GpuPreset, ModelPreset

__all__ = ["GraphMode", "PerfModel", "StepShape"]

BW_EFFICIENCY = 0.82
MFU = 0.6
GRAPH_OVERHEAD_S = 0.35e-3
PIECEWISE_PER_LAYER_S = 15e-6
# Eager launch cost, fitted to SGLang's published batch-1 decode of Llama-3-8B on an
# H100-class GPU with the flashinfer backend: 7.35 ms with CUDA graphs, 8.23 ms without
# (sgl-project/sglang#1401), i.e. 0.88 ms more than a graph replay: 0.3 ms + 32 layers × 30 µs
# = 1.26 ms in place of 0.35 ms. An earlier fit was 1.0 ms + 200 µs/layer (7.4 ms for 32
# layers, fitted to a multimodal model's 1.7–1.8×, vllm-omni#7960), which put the fidelity rows
# sglang#1401 triton eager (+43 %), flashinfer eager (+61 %) far off; now triton eager −23 %
# (validation), vllm#20469 eager TPOT on A100 see benchmarks/sim_fidelity.py. The cost is
# additive: the published eager penalty (0.9–2.2 ms on a ~6 ms step) shows the launches are not
# hidden behind GPU time at batch 1, and at large batch they are a small share of the step.
EAGER_BASE_S = 0.3e-3
EAGER_PER_LAYER_S = 30e-6
PER_SEQ_OVERHEAD_S = 1.5e-6  # input preparation and sampling bookkeeping per sampled sequence


class GraphMode(Enum):
    """How a step was launched."""

    FULL = "full"
    PIECEWISE = "piecewise"
    EAGER = "eager"


@dataclass(frozen=True, slots=True)
class StepShape:
    """What one forward pass computes.

    Attributes:
        tokens: Batched tokens (decode tokens plus prefill chunk tokens).
        decode_seqs: Sequences decoding one token.
        decode_context: Sum of the context lengths those sequences attend over.
        prefill_attn: Sum over prefill chunks of ``chunk × (prefix + chunk / 2)``.
        prefill_context: Sum over prefill chunks of the cached prefix they read.
        sampled: Sequences that sample a token in this step.
        graph: Launch mode.
    """

    tokens: int
    decode_seqs: int
    decode_context: int
    prefill_attn: float
    prefill_context: int
    sampled: int
    graph: GraphMode


class PerfModel:
    """Step times for one model on one GPU type and parallel layout."""

    def __init__(
        self,
        model: ModelPreset,
        gpu: GpuPreset,
        fp: Footprint,
        *,
        tp: int = 1,
        pp: int = 1,
        fp8_compute: bool = False,
    ) -> None:
        self.model, self.gpu, self.fp, self.tp, self.pp = model, gpu, fp, tp, pp
        self._bandwidth = gpu.hbm_bytes_s * BW_EFFICIENCY
        peak = gpu.fp8_flops if fp8_compute and gpu.fp8_flops else gpu.bf16_flops
        self._flops = peak * MFU
        per_param = fp.weight_bytes / max(1.0, model.params / (tp * pp))
        if model.is_moe:
            self._expert_bytes = model.expert_params / (tp * pp) * per_param
        else:
            self._expert_bytes = 0.0
        self._dense_bytes = fp.weight_bytes - self._expert_bytes
        self._active_flops_per_token = 2.0 * model.active_params / (tp * pp)
        heads = model.heads / tp
        self._attn_flops_per_pair = 4.0 * heads * model.head_dim * fp.layers
        self._layers = fp.layers
        self._ring = 2.0 * (tp - 1) / tp if tp > 1 else 0.0

    def weight_bytes(self, tokens: int) -> float:
        """Weight bytes a step over ``tokens`` tokens reads on one rank."""
        if not self._expert_bytes:
            return self._dense_bytes
        share = self.model.experts_per_token / self.model.experts
        touched = 1.0 - (1.0 - share) ** max(1, tokens)
        return self._dense_bytes + self._expert_bytes * touched

    def gpu_time(self, shape: StepShape) -> float:
        """Roofline time of the forward pass on one rank (no launch overhead)."""
        kv_tokens = shape.decode_context + shape.prefill_context + shape.tokens
        moved = self.weight_bytes(shape.tokens) + kv_tokens * self.fp.kv_bytes_per_token
        flops = shape.tokens * self._active_flops_per_token
        flops += (shape.decode_context + shape.prefill_attn) * self._attn_flops_per_pair
        t = max(moved / self._bandwidth, flops / self._flops)
        if self._ring:
            size = shape.tokens * self.model.hidden * 2.0
            t += 2 * self._layers * (self.gpu.link_latency_s + self._ring * size / self.gpu.link_bytes_s)
        return t * self.pp

    def overhead(self, graph: GraphMode, sampled: int) -> float:
        """CPU-side launch cost of a step in this mode."""
        if graph is GraphMode.FULL:
            base = GRAPH_OVERHEAD_S
        elif graph is GraphMode.PIECEWISE:
            base = GRAPH_OVERHEAD_S + PIECEWISE_PER_LAYER_S * self.model.layers
        else:
            base = EAGER_BASE_S + EAGER_PER_LAYER_S * self.model.layers
        return base + PER_SEQ_OVERHEAD_S * sampled

    def step_time(self, shape: StepShape) -> float:
        """Modelled seconds of one engine step."""
        return self.gpu_time(shape) + self.overhead(shape.graph, shape.sampled)

    def decode_step(self, batch: int, context: int, graph: GraphMode) -> float:
        """Convenience: a pure decode step of ``batch`` sequences with ``context`` tokens each."""
        shape = StepShape(batch, batch, batch * context, 0.0, 0, batch, graph)
        return self.step_time(shape)

    def bandwidth_bound(self, batch: int, context: int) -> float:
        """The pure memory-bandwidth bound of a decode step at peak bandwidth (for calibration)."""
        moved = self.weight_bytes(batch) + batch * (context + 1) * self.fp.kv_bytes_per_token
        return moved / self.gpu.hbm_bytes_s * self.pp
