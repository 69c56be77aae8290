"""GPU and model presets: the hardware and architecture numbers the performance model reads.

GPU numbers come from NVIDIA's datasheets (dense tensor-core peaks, no sparsity); ``torch_total_gib``
is what ``torch.cuda.mem_get_info`` reports as total (what vLLM logs as total memory), and
``smi_total_mib`` is ``nvidia-smi --query-gpu=memory.total`` (what SGLang's auto defaults read).
Model numbers come from each model's ``config.json`` on the Hugging Face Hub; ``params`` is the
parameter count of the released checkpoint.

Names are matched case-insensitively on the full Hub id (``meta-llama/Llama-3.1-8B-Instruct``),
on the part after the slash, or on a short alias (``llama-3.1-8b``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["GPUS", "MODELS", "GpuPreset", "ModelPreset", "find_gpu", "find_model"]


@dataclass(frozen=True)
class GpuPreset:
    """One GPU model.

    Attributes:
        name: Preset name used in ``AUTOTUNE_SIM_GPU``.
        device_name: What ``torch.cuda.get_device_name`` prints.
        torch_total_gib: Total memory as torch reports it (GiB, 2**30 bytes).
        smi_total_mib: ``memory.total`` as nvidia-smi reports it (MiB).
        hbm_bytes_s: Peak memory bandwidth, bytes/s.
        bf16_flops: Dense bf16 tensor-core peak, FLOP/s.
        fp8_flops: Dense fp8 peak, FLOP/s (0 where the GPU has no fp8 tensor cores).
        link_bytes_s: Per-direction GPU-to-GPU bandwidth used by tensor-parallel all-reduce.
        link_latency_s: Latency of one small all-reduce.
        hopper: True for SM90 (SGLang picks fa3 there; vLLM's A100 rule excludes it).
        is_a100: vLLM's batch defaults treat A100s apart from other ≥70 GiB GPUs.
        p2p: Whether two of these GPUs reach each other's memory directly (NVLink, or PCIe
            peer-to-peer on data-centre cards). GeForce drivers turn PCIe peer-to-peer off (a
            pair of RTX 4090s, or RTX 3090s without an NVLink bridge): NCCL then goes through
            host memory and vLLM disables its custom all-reduce, so neither keeps its buffers
            on the GPU (``memory.NCCL_GIB``).
    """

    name: str
    device_name: str
    torch_total_gib: float
    smi_total_mib: int
    hbm_bytes_s: float
    bf16_flops: float
    fp8_flops: float
    link_bytes_s: float
    link_latency_s: float
    hopper: bool = False
    is_a100: bool = False
    p2p: bool = True


@dataclass(frozen=True)
class ModelPreset:
    """One model architecture.

    Attributes:
        hub_id: The Hugging Face id the engines are launched with.
        aliases: Short names accepted in place of the hub id.
        architecture: ``config.json`` ``architectures[0]``.
        layers: Decoder layers.
        hidden: Hidden size.
        heads: Attention (query) heads.
        kv_heads: Key/value heads (GQA).
        head_dim: Dimension of one head.
        intermediate: Dense MLP intermediate size (for MoE: the shared/dense part, 0 if none).
        vocab: Vocabulary size.
        params: Total parameters of the checkpoint.
        max_position: ``max_position_embeddings`` (the engines' derived max length).
        experts: Routed experts per MoE layer (0 for dense models).
        experts_per_token: Experts each token is routed to.
        expert_intermediate: Intermediate size of one expert.
        bos: Whether the tokenizer prepends a BOS token.
        tie_embeddings: Whether the LM head shares the embedding matrix.
    """

    hub_id: str
    architecture: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    params: int
    max_position: int
    experts: int = 0
    experts_per_token: int = 0
    expert_intermediate: int = 0
    bos: bool = False
    tie_embeddings: bool = False
    aliases: tuple[str, ...] = field(default=())

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def expert_params(self) -> int:
        """Parameters in all routed experts (gate, up and down projections of every layer)."""
        return self.layers * self.experts * 3 * self.hidden * self.expert_intermediate

    @property
    def embedding_params(self) -> int:
        """Embedding plus LM head (stay bf16 under weight quantization)."""
        return self.vocab * self.hidden * (1 if self.tie_embeddings else 2)

    @property
    def active_params(self) -> int:
        """Parameters one token touches (all of them for a dense model)."""
        if not self.is_moe:
            return self.params
        per_expert = self.expert_params // self.experts
        return self.params - self.expert_params + per_expert * self.experts_per_token


_TB = 1e12
GPUS: dict[str, GpuPreset] = {
    gpu.name: gpu
    for gpu in (
        # H100 SXM5: 3.35 TB/s HBM3, 989 TFLOP/s dense bf16, 1979 fp8, NVLink4 900 GB/s total.
        GpuPreset(
            "H100-80GB", "NVIDIA H100 80GB HBM3", 79.19, 81559, 3.35 * _TB, 989e12, 1979e12, 450e9, 8e-6, hopper=True
        ),
        # H200 SXM: 4.8 TB/s HBM3e, same compute as H100.
        GpuPreset("H200-141GB", "NVIDIA H200", 139.81, 143771, 4.8 * _TB, 989e12, 1979e12, 450e9, 8e-6, hopper=True),
        # A100 SXM4 80GB: 2.039 TB/s HBM2e, 312 TFLOP/s bf16, NVLink3 600 GB/s total.
        GpuPreset(
            "A100-80GB", "NVIDIA A100-SXM4-80GB", 79.15, 81920, 2.039 * _TB, 312e12, 0.0, 300e9, 10e-6, is_a100=True
        ),
        # A100 SXM4 40GB: 1.555 TB/s HBM2.
        GpuPreset(
            "A100-40GB", "NVIDIA A100-SXM4-40GB", 39.39, 40960, 1.555 * _TB, 312e12, 0.0, 300e9, 10e-6, is_a100=True
        ),
        # L4: 300 GB/s GDDR6, 121 TFLOP/s bf16, 242 fp8; PCIe Gen4 only.
        GpuPreset("L4", "NVIDIA L4", 22.03, 23034, 0.3 * _TB, 121e12, 242e12, 25e9, 25e-6),
        # RTX 4090: 1008 GB/s GDDR6X, 165 TFLOP/s bf16 (fp32 accumulate), 330 fp8; no NVLink/P2P.
        GpuPreset(
            "RTX-4090", "NVIDIA GeForce RTX 4090", 23.65, 24564, 1.008 * _TB, 165e12, 330e12, 25e9, 30e-6, p2p=False
        ),
        # RTX 3090: 936 GB/s GDDR6X, 71 TFLOP/s dense bf16 (fp16 accumulate; NVIDIA GA102 whitepaper),
        # no fp8; torch total 23.58 GiB as vLLM logs it (vllm-project/vllm#10517). No NVLink/P2P assumed.
        GpuPreset("RTX-3090", "NVIDIA GeForce RTX 3090", 23.58, 24576, 0.936 * _TB, 71e12, 0.0, 25e9, 30e-6, p2p=False),
    )
}

MODELS: tuple[ModelPreset, ...] = (
    ModelPreset(
        "meta-llama/Llama-3.1-8B-Instruct",
        "LlamaForCausalLM",
        layers=32,
        hidden=4096,
        heads=32,
        kv_heads=8,
        head_dim=128,
        intermediate=14336,
        vocab=128256,
        params=8_030_261_248,
        max_position=131072,
        bos=True,
        aliases=("llama-3.1-8b", "llama3.1-8b", "llama-3-8b"),
    ),
    ModelPreset(
        "meta-llama/Llama-3.1-70B-Instruct",
        "LlamaForCausalLM",
        layers=80,
        hidden=8192,
        heads=64,
        kv_heads=8,
        head_dim=128,
        intermediate=28672,
        vocab=128256,
        params=70_553_706_496,
        max_position=131072,
        bos=True,
        aliases=("llama-3.1-70b", "llama3.1-70b"),
    ),
    ModelPreset(
        "Qwen/Qwen2.5-7B-Instruct",
        "Qwen2ForCausalLM",
        layers=28,
        hidden=3584,
        heads=28,
        kv_heads=4,
        head_dim=128,
        intermediate=18944,
        vocab=152064,
        params=7_615_616_512,
        max_position=32768,
        aliases=("qwen2.5-7b",),
    ),
    ModelPreset(
        "Qwen/Qwen2.5-72B-Instruct",
        "Qwen2ForCausalLM",
        layers=80,
        hidden=8192,
        heads=64,
        kv_heads=8,
        head_dim=128,
        intermediate=29568,
        vocab=152064,
        params=72_706_203_648,
        max_position=32768,
        aliases=("qwen2.5-72b",),
    ),
    ModelPreset(
        "Qwen/Qwen3-30B-A3B",
        "Qwen3MoeForCausalLM",
        layers=48,
        hidden=2048,
        heads=32,
        kv_heads=4,
        head_dim=128,
        intermediate=0,
        vocab=151936,
        params=30_532_122_624,
        max_position=40960,
        experts=128,
        experts_per_token=8,
        expert_intermediate=768,
        aliases=("qwen3-30b-a3b",),
    ),
    # Validation-set models (autotune_sim/fidelity.py); dimensions from each checkpoint's config.json.
    ModelPreset(
        "Qwen/Qwen3-235B-A22B",
        "Qwen3MoeForCausalLM",
        layers=94,
        hidden=4096,
        heads=64,
        kv_heads=4,
        head_dim=128,
        intermediate=0,
        vocab=151936,
        params=235_093_634_560,
        max_position=40960,
        experts=128,
        experts_per_token=8,
        expert_intermediate=1536,
        aliases=("qwen3-235b-a22b", "qwen3-235b-a22b-fp8"),
    ),
    ModelPreset(
        "Qwen/Qwen3-14B",
        "Qwen3ForCausalLM",
        layers=40,
        hidden=5120,
        heads=40,
        kv_heads=8,
        head_dim=128,
        intermediate=17408,
        vocab=151936,
        params=14_768_307_200,
        max_position=40960,
        aliases=("qwen3-14b", "qwen3-14b-awq"),
    ),
    ModelPreset(
        "deepseek-ai/DeepSeek-R1-Distill-Qwen-14B",
        "Qwen2ForCausalLM",
        layers=48,
        hidden=5120,
        heads=40,
        kv_heads=8,
        head_dim=128,
        intermediate=13824,
        vocab=152064,
        params=14_770_033_664,
        max_position=131072,
        aliases=("deepseek-r1-distill-qwen-14b", "qwen2.5-14b"),
    ),
    # vLLM's default model when none is given.
    ModelPreset(
        "Qwen/Qwen3-0.6B",
        "Qwen3ForCausalLM",
        layers=28,
        hidden=1024,
        heads=16,
        kv_heads=8,
        head_dim=128,
        intermediate=3072,
        vocab=151936,
        params=751_632_384,
        max_position=40960,
        tie_embeddings=True,
        aliases=("qwen3-0.6b",),
    ),
)


def _norm(name: str) -> str:
    return name.strip().rstrip("/").lower()


def find_model(name: str) -> ModelPreset | None:
    """The preset a model argument names, or None (the engine then fails as for a missing model)."""
    key = _norm(name)
    for model in MODELS:
        names = {model.hub_id.lower(), model.hub_id.split("/")[-1].lower(), *model.aliases}
        if key in names or key.split("/")[-1] in names:
            return model
    return None


def find_gpu(name: str) -> GpuPreset | None:
    """The GPU preset for ``AUTOTUNE_SIM_GPU`` (case-insensitive; ``h100`` finds ``H100-80GB``)."""
    key = _norm(name).replace("_", "-")
    exact = {g.name.lower(): g for g in GPUS.values()}
    if key in exact:
        return exact[key]
    matches = [g for g in GPUS.values() if g.name.lower().startswith(key)]
    return matches[0] if len(matches) == 1 else None
