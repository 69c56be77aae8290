"""SGLang's command line per version, and its resolution hooks (``arg_groups/*_hook.py``).

``AUTOTUNE_SIM_SGLANG_VERSION`` picks the release (``RELEASES``: 0.5.23 default, 0.5.20, 0.5.15,
0.5.9). From 0.5.15 CUDA-graph flags are per phase (``--cuda-graph-max-bs-decode`` /
``--cuda-graph-max-bs-prefill``); 0.5.15-0.5.19 keep ``--cuda-graph-max-bs`` as a deprecated alias,
and from 0.5.20 it is an ambiguous prefix (argparse exit 2) exactly as in the real parser. 0.5.9
has the old flag set (``--cuda-graph-max-bs``, ``--cuda-graph-bs``, ``--disable-cuda-graph``).

Defaults resolved from the GPU (``memory_hook.py``): chunked prefill size and decode-graph max
batch by ``nvidia-smi`` memory, then ``mem_fraction_static`` = (memory − reserved) ÷ memory with
reserved = 512 + 1.5 × max(chunk, 2048) + TP×PP/8 × 1024 + 2 × decode max bs + 8 × prefill sizes
(MB), at least 10 GiB above 60 GiB of memory.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from autotune_sim.dialects.base import capture_sizes, human_readable_int
from autotune_sim.presets import GpuPreset, ModelPreset

__all__ = ["RELEASES", "SUPPORTED_VERSIONS", "Release", "SglangConfig", "build_parser", "resolve"]


@dataclass(frozen=True)
class Release:
    """What one SGLang release serves and prints, as read from its own files (the adapter's tests
    hold these against ``tests/engines/data/sglang-releases``).

    Attributes:
        version: The release.
        per_phase_graphs: ``--cuda-graph-max-bs-decode`` and friends (0.5.15+).
        graph_aliases: The old ``--cuda-graph-max-bs`` / ``--cuda-graph-bs`` kept as deprecated
            aliases of the per-phase flags (0.5.15-0.5.19).
        attn_dp_size: ``--attn-dp-size``, with ``--enable-dp-attention`` deprecated (0.5.22+).
        ready_route: ``GET /ready`` is served (0.5.20+).
        sizes_on: Where the decode graph sizes are logged: ``"bs_line"`` (0.5.9's
            ``Capture cuda graph bs [..]``), ``"begin"`` (0.5.15-0.5.22) or ``"end"`` (0.5.23).
        logs_reduced_cap: Says when the KV pool lowers ``--max-running-requests`` (0.5.15+).
        weight_cache: ``--weight-cache-mode/-socket/-timeout`` and the standalone
            ``sglang.srt.weight_cache.daemon`` (0.5.23).
    """

    version: str
    per_phase_graphs: bool
    graph_aliases: bool
    attn_dp_size: bool
    ready_route: bool
    sizes_on: str
    logs_reduced_cap: bool
    weight_cache: bool = False


RELEASES = {
    r.version: r
    for r in (
        Release("0.5.23", True, False, True, True, "end", True, weight_cache=True),
        Release("0.5.20", True, False, False, True, "begin", True),
        Release("0.5.15", True, True, False, False, "begin", True),
        Release("0.5.9", False, False, False, False, "bs_line", False),
    )
}
SUPPORTED_VERSIONS = tuple(RELEASES)
POLICIES = ["fcfs", "lpm", "random", "dfs-weight", "lof", "priority", "routing-key", "hrrn", "shortest-prefill-first"]
ATTENTION = [
    "triton",
    "torch_native",
    "flex_attention",
    "dsa",
    "nsa",
    "qsa",
    "dsv4",
    "compressed",
    "fa3",
    "fa4",
    "flashinfer",
    "llada2_cfg_flashinfer",
    "flashmla",
    "trtllm_mla",
    "cutedsl_mla",
    "tokenspeed_mla",
    "trtllm_mha",
    "hpc_ops",
    "minicpm_flashattn",
    "minicpm_flashinfer",
    "aiter",
    "wave",
    "intel_amx",
    "ascend",
    "intel_xpu",
]
QUANT = [
    "awq",
    "fp8",
    "mxfp8",
    "gptq",
    "gptq_marlin",
    "awq_marlin",
    "bitsandbytes",
    "gguf",
    "modelopt",
    "modelopt_fp8",
    "modelopt_fp4",
    "w8a8_int8",
    "w8a8_fp8",
    "moe_wna16",
    "mxfp4",
    "compressed-tensors",
    "quark",
]
KV_DTYPES = ["auto", "fp8_e5m2", "fp8_e4m3", "mxfp8", "bf16", "bfloat16", "nvfp4", "fp4_mx_block16"]
PREFILL_STEPS = [(4, 33, 4), (48, 257, 16), (288, 513, 32), (576, 1025, 64), (1280, 4097, 256), (4608, 1 << 20, 512)]
DECODE_STEPS = [
    (1, 2, 1),
    (2, 3, 1),
    (4, 5, 1),
    (8, 9, 1),
    (12, 13, 1),
    (16, 257, 8),
    (272, 512, 16),
    (512, 1 << 20, 32),
]


def _flag_json(value: str) -> dict[str, Any]:
    parsed = json.loads(value)
    if not isinstance(parsed, dict):
        raise ValueError("expected a JSON object")
    return parsed


def build_parser(version: str) -> argparse.ArgumentParser:
    """SGLang's ``launch_server`` parser for ``version`` (``allow_abbrev`` on, as upstream)."""
    release = RELEASES[version]
    new = release.per_phase_graphs
    parser = argparse.ArgumentParser(prog="sglang serve" if new else "launch_server.py")

    def group(title: str) -> Any:
        return parser.add_argument_group(title) if new else parser

    parser.add_argument("--config", type=str, help="Read CLI options from a config file. Must be a YAML file.")
    g = group("model")
    g.add_argument(
        "--model-path",
        "--model",
        dest="model_path",
        required=True,
        help="The path of the model weights. This can be a local folder or a Hugging Face repo ID.",
    )
    g.add_argument("--tokenizer-path", help="The path of the tokenizer.")
    g.add_argument("--trust-remote-code", action="store_true", help="Allow custom models defined on the Hub.")
    g.add_argument("--context-length", type=human_readable_int, help="The model's maximum context length.")
    g.add_argument("--served-model-name", help="Override the model name returned by /v1/models.")
    g.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "half", "float16", "bfloat16", "float", "float32"],
        help="Data type for model weights and activations.",
    )
    g.add_argument("--quantization", choices=QUANT, help="The quantization method.")
    g.add_argument("--kv-cache-dtype", default="auto", choices=KV_DTYPES, help="Data type for kv cache storage.")
    if release.weight_cache:
        _weight_cache_args(g)
    g = group("serving")
    g.add_argument("--host", default="127.0.0.1", help="The host of the HTTP server.")
    g.add_argument("--port", type=int, default=30000, help="The port of the HTTP server.")
    g.add_argument("--skip-server-warmup", action="store_true", help="If set, skip warmup.")
    g.add_argument("--api-key", help="Set API key of the server.")
    g.add_argument("--stream-interval", type=int, default=1, help="The interval for streaming in tokens.")
    if new:
        g.add_argument(
            "--sampling-defaults",
            default="model",
            choices=["openai", "model"],
            help="Where default sampling parameters come from.",
        )
        g.add_argument(
            "--stream-response-default-include-usage",
            action="store_true",
            help="Include usage in streamed responses by default.",
        )
    g.add_argument("--watchdog-timeout", type=float, default=300, help="Set watchdog timeout in seconds.")
    g = group("memory")
    g.add_argument("--mem-fraction-static", type=float, help="The fraction of the memory used for static allocation.")
    g.add_argument(
        "--max-total-tokens", type=human_readable_int, help="Cap on the number of tokens in the memory pool."
    )
    g.add_argument("--page-size", type=int, help="The number of tokens in a page.")
    g.add_argument("--disable-radix-cache", action="store_true", help="Disable RadixAttention for prefix caching.")
    g.add_argument("--enable-hierarchical-cache", action="store_true", help="Enable hierarchical cache.")
    g = group("schedule")
    g.add_argument("--max-running-requests", type=int, help="The maximum number of running requests.")
    g.add_argument("--chunked-prefill-size", type=int, help="Tokens in a prefill chunk; -1 disables chunking.")
    g.add_argument("--max-prefill-tokens", type=human_readable_int, default=16384, help="Tokens in a prefill batch.")
    g.add_argument("--schedule-policy", default="fcfs", choices=POLICIES, help="The scheduling policy.")
    g.add_argument(
        "--schedule-conservativeness",
        type=float,
        default=1.0,
        help="How conservative the schedule policy is. Larger is more conservative.",
    )
    g.add_argument("--enable-mixed-chunk", action="store_true", help="Mix prefill and decode in a batch.")
    g.add_argument("--num-continuous-decode-steps", type=int, default=1, help="Continuous decoding steps.")
    g.add_argument("--disable-overlap-schedule", action="store_true", help="Disable the overlap scheduler.")
    g = group("parallel")
    g.add_argument(
        "--tp-size", "--tensor-parallel-size", dest="tp_size", type=int, default=1, help="The tensor parallelism size."
    )
    g.add_argument(
        "--dp-size", "--data-parallel-size", dest="dp_size", type=int, default=1, help="The data parallelism size."
    )
    g.add_argument(
        "--pp-size",
        "--pipeline-parallel-size",
        dest="pp_size",
        type=int,
        default=1,
        help="The pipeline parallelism size.",
    )
    if release.attn_dp_size:
        g.add_argument(
            "--attn-dp-size",
            "--attention-data-parallel-size",
            dest="attn_dp_size",
            type=int,
            default=1,
            help="The attention data parallelism size.",
        )
        g.add_argument("--enable-dp-attention", action="store_true", help="Deprecated: use --attn-dp-size.")
    else:
        g.add_argument("--enable-dp-attention", action="store_true", help="Enable data parallelism for attention.")
    g = group("exec")
    g.add_argument("--attention-backend", choices=ATTENTION, help="Choose the kernels for attention layers.")
    if new:
        g.add_argument("--prefill-attention-backend", help="Attention backend for prefill.")
        g.add_argument("--decode-attention-backend", help="Attention backend for decode.")
        g.add_argument("--cuda-graph-max-bs-decode", type=int, help="The maximum batch size of decode CUDA graphs.")
        g.add_argument("--cuda-graph-max-bs-prefill", type=int, help="The maximum tokens of prefill CUDA graphs.")
        g.add_argument("--cuda-graph-bs-decode", type=int, nargs="+", help="Batch sizes of decode CUDA graphs.")
        g.add_argument("--cuda-graph-bs-prefill", type=int, nargs="+", help="Token counts of prefill CUDA graphs.")
        g.add_argument(
            "--cuda-graph-backend-decode",
            choices=["full", "breakable", "disabled"],
            help="CUDA graph backend for decode.",
        )
        g.add_argument(
            "--cuda-graph-backend-prefill",
            choices=["full", "breakable", "disabled"],
            help="CUDA graph backend for prefill.",
        )
        g.add_argument("--disable-decode-cuda-graph", action="store_true", help="Disable decode CUDA graphs.")
        g.add_argument("--disable-prefill-cuda-graph", action="store_true", help="Disable prefill CUDA graphs.")
        g.add_argument("--cuda-graph-config", type=_flag_json, help="JSON with per-phase CUDA graph settings.")
        if release.graph_aliases:
            g.add_argument(
                "--cuda-graph-max-bs",
                dest="cuda_graph_max_bs_decode",
                type=int,
                help="Deprecated alias for --cuda-graph-max-bs-decode.",
            )
            g.add_argument(
                "--cuda-graph-bs",
                dest="cuda_graph_bs_decode",
                type=int,
                nargs="+",
                help="Deprecated alias for --cuda-graph-bs-decode.",
            )
        g.add_argument(
            "--disable-cuda-graph",
            action="store_true",
            help="Deprecated: use --cuda-graph-backend-decode disabled and --cuda-graph-backend-prefill disabled.",
        )
    else:
        g.add_argument("--cuda-graph-max-bs", type=int, help="Set the maximum batch size for cuda graph.")
        g.add_argument("--cuda-graph-bs", type=int, nargs="+", help="Set the list of batch sizes for cuda graph.")
        g.add_argument("--disable-cuda-graph", action="store_true", help="Disable cuda graph.")
        g.add_argument("--disable-cuda-graph-padding", action="store_true", help="Disable cuda graph padding.")
    g.add_argument("--enable-torch-compile", action="store_true", help="Optimize the model with torch.compile.")
    g.add_argument("--torch-compile-max-bs", type=int, default=32, help="Maximum batch size for torch compile.")
    g.add_argument("--speculative-algorithm", help="Speculative algorithm.")
    # Accepted so spaces can tune them; the simulator models no speculative decoding.
    g.add_argument("--speculative-num-draft-tokens", type=int, help="Draft tokens verified per step.")
    g.add_argument("--speculative-num-steps", type=int, help="Draft steps (EAGLE/NEXTN).")
    g.add_argument("--speculative-eagle-topk", type=int, help="Draft branches per step (EAGLE/NEXTN).")
    g.add_argument("--speculative-ngram-max-match-window-size", type=int, help="NGRAM: longest match window.")
    g = group("observability")
    g.add_argument("--enable-metrics", action="store_true", help="Enable log prometheus metrics.")
    g.add_argument("--enable-cache-report", action="store_true", help="Report cached tokens in usage.")
    g.add_argument("--log-level", default="info", help="The logging level of all loggers.")
    g.add_argument("--log-level-http", help="The logging level of HTTP server.")
    g.add_argument("--decode-log-interval", type=int, default=40, help="The log interval of decode batch.")
    g.add_argument("--random-seed", type=int, help="The random seed.")
    return parser


def _weight_cache_args(group: Any) -> None:
    """0.5.23's weight-cache flags (``arg_groups/fields/model.py``)."""
    group.add_argument(
        "--weight-cache-mode",
        default="off",
        choices=["off", "daemon", "client"],
        help="Weight cache mode. 'off': normal disk loading. 'daemon': launch weight cache daemon (holds weights "
        "in GPU memory). Engine-spawned daemons are co-terminal with the engine and do NOT persist across "
        "restarts, so this alone does not speed up restart (the first start is slower). For fast recovery, run "
        "the standalone daemon (python -m sglang.srt.weight_cache.daemon) and connect with 'client'. 'client': "
        "connect to existing daemon and load via IPC.",
    )
    group.add_argument(
        "--weight-cache-socket",
        help="Unix socket path for weight cache daemon (client mode).If not set, derives the path from "
        "SGLANG_WEIGHT_CACHE_SOCKET_TEMPLATE using the caller's physical GPU UUID.",
    )
    group.add_argument(
        "--weight-cache-timeout",
        type=int,
        default=1800,
        help="Timeout in seconds for weight cache daemon readiness (default: 1800).",
    )


class StartupError(Exception):
    """A configuration SGLang rejects; ``where`` is ``main`` (exit 1) or ``scheduler`` (tree killed)."""

    def __init__(self, where: str, lines: Sequence[str]) -> None:
        super().__init__(lines[-1])
        self.where, self.lines = where, list(lines)


@dataclass
class SglangConfig:
    """Resolved server arguments."""

    @property
    def release(self) -> Release:
        return RELEASES[self.version]

    version: str
    model: ModelPreset
    model_path: str
    served_name: str
    host: str
    port: int
    api_key: str | None
    dtype: str
    kv_dtype: str
    quantization: str | None
    tp: int
    pp: int
    dp: int
    mem_fraction_static: float
    max_running_user: int | None
    max_total_tokens: int | None
    chunked_prefill_size: int
    max_prefill_tokens: int
    context_length: int
    conservativeness: float
    policy: str
    mixed_chunk: bool
    decode_backend: str
    decode_sizes: list[int]
    prefill_backend: str
    prefill_sizes: list[int]
    page_size: int
    radix_cache: bool
    stream_interval: int
    include_usage: bool
    enable_metrics: bool
    decode_log_interval: int
    skip_warmup: bool
    seed: int
    attention_backend: str
    weight_cache_mode: str = "off"
    weight_cache_socket: str | None = None
    weight_cache_timeout: int = 1800
    warnings: list[str] = field(default_factory=list)
    args: dict[str, Any] = field(default_factory=dict)

    @property
    def decode_max_bs(self) -> int:
        return max(self.decode_sizes) if self.decode_sizes else 0

    @property
    def prefill_max_tokens(self) -> int:
        return max(self.prefill_sizes) if self.prefill_sizes else 0


def gpu_defaults(gpu: GpuPreset, tp: int) -> tuple[int, int]:
    """(chunked_prefill_size, decode graph max bs) from nvidia-smi memory (``memory_hook.py``)."""
    mem = gpu.smi_total_mib
    small_tp = tp < 4
    if mem < 20 * 1024:
        return 2048, 8
    if mem < 35 * 1024:
        return 4096, 48 if small_tp else 160
    if mem < 60 * 1024:
        return 4096, 32 if small_tp else 160
    if mem < 160 * 1024:
        return 8192, 256 if small_tp else 512
    return 16384, 512


def auto_fraction(gpu: GpuPreset, chunk: int, tp: int, pp: int, decode_bs: int, prefill_sizes: int) -> float:
    """SGLang's automatic ``mem_fraction_static``."""
    mem = gpu.smi_total_mib
    reserved = 512 + 1.5 * max(chunk, 2048) + tp * pp / 8 * 1024 + 2 * decode_bs + 8 * prefill_sizes
    if mem > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((mem - reserved) / mem, 3)


def resolve(
    ns: argparse.Namespace, version: str, gpu: GpuPreset, model: ModelPreset, env: dict[str, str], num_gpus: int
) -> SglangConfig:
    """Apply SGLang's resolution hooks; raise StartupError where SGLang fails."""
    release = RELEASES[version]
    new = release.per_phase_graphs
    warnings: list[str] = []
    if getattr(ns, "weight_cache_mode", "off") != "off" and ns.speculative_algorithm is not None:
        raise StartupError(
            "main",
            [
                "ValueError: --weight-cache-mode is not supported together with speculative decoding "
                "(--speculative-algorithm): the weight cache daemon does not export the draft model's weights. "
                "Disable one of them (--weight-cache-mode off) for this configuration."
            ],
        )
    tp, pp, dp = ns.tp_size, ns.pp_size, ns.dp_size
    context = ns.context_length or model.max_position
    if (
        ns.context_length
        and ns.context_length > model.max_position
        and env.get("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN") != "1"
    ):
        raise StartupError(
            "main",
            [
                f"ValueError: User-specified context_length ({ns.context_length}) is greater than the derived "
                f"context_length ({model.max_position}). This may lead to incorrect model outputs or CUDA errors. "
                "To allow overriding this maximum, set the env var SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1"
            ],
        )
    if ns.schedule_conservativeness < 0:
        raise StartupError("main", ["ValueError: schedule_conservativeness must be >= 0"])
    if tp * pp * dp > num_gpus:
        raise StartupError(
            "scheduler",
            [
                "RuntimeError: CUDA error: invalid device ordinal",
                "CUDA kernel errors might be asynchronously reported at some other API call.",
            ],
        )
    if model.heads % tp:
        raise StartupError(
            "scheduler",
            [
                f"AssertionError: Number of attention heads ({model.heads}) must be "
                f"divisible by tensor model parallel size ({tp})."
            ],
        )
    chunk_default, bs_default = gpu_defaults(gpu, tp)
    chunk = ns.chunked_prefill_size if ns.chunked_prefill_size is not None else chunk_default
    page = ns.page_size or 1
    if chunk > 0 and chunk % page:
        raise StartupError(
            "main", [f"ValueError: chunked_prefill_size ({chunk}) must be divisible by page_size ({page})"]
        )
    decode_backend, decode_sizes, prefill_backend, prefill_sizes = _graphs(ns, new, bs_default, chunk, warnings)
    fraction = ns.mem_fraction_static
    if fraction is None:
        fraction = auto_fraction(gpu, chunk, tp, pp, max(decode_sizes, default=0), len(prefill_sizes))
    if release.attn_dp_size and ns.enable_dp_attention:
        warnings.append(
            "--enable-dp-attention is deprecated and will be removed in a future release. Use --attn-dp-size instead."
        )
    backend = ns.attention_backend or ("fa3" if gpu.hopper else "flashinfer")
    served = ns.served_model_name or ns.model_path
    cfg = SglangConfig(
        version=version,
        model=model,
        model_path=ns.model_path,
        served_name=served,
        host=ns.host,
        port=ns.port,
        api_key=ns.api_key,
        dtype=ns.dtype,
        kv_dtype=ns.kv_cache_dtype,
        quantization=ns.quantization,
        tp=tp,
        pp=pp,
        dp=dp,
        mem_fraction_static=fraction,
        max_running_user=ns.max_running_requests,
        max_total_tokens=ns.max_total_tokens,
        chunked_prefill_size=chunk,
        max_prefill_tokens=ns.max_prefill_tokens,
        context_length=context,
        conservativeness=ns.schedule_conservativeness,
        policy=ns.schedule_policy,
        mixed_chunk=ns.enable_mixed_chunk,
        decode_backend=decode_backend,
        decode_sizes=decode_sizes,
        prefill_backend=prefill_backend,
        prefill_sizes=prefill_sizes,
        page_size=page,
        radix_cache=not ns.disable_radix_cache,
        stream_interval=ns.stream_interval,
        include_usage=bool(getattr(ns, "stream_response_default_include_usage", False)),
        enable_metrics=ns.enable_metrics,
        decode_log_interval=max(1, ns.decode_log_interval),
        skip_warmup=ns.skip_server_warmup,
        seed=ns.random_seed if ns.random_seed is not None else 0,
        attention_backend=backend,
        weight_cache_mode=getattr(ns, "weight_cache_mode", "off"),
        weight_cache_socket=getattr(ns, "weight_cache_socket", None),
        weight_cache_timeout=getattr(ns, "weight_cache_timeout", 1800),
        warnings=warnings,
    )
    cfg.args = _resolved_args(ns, cfg, new)
    return cfg


def _graphs(
    ns: argparse.Namespace, new: bool, bs_default: int, chunk: int, warnings: list[str]
) -> tuple[str, list[int], str, list[int]]:
    """(decode backend, decode sizes, prefill backend, prefill token sizes)."""
    running_cap = ns.max_running_requests
    if not new:
        max_bs = ns.cuda_graph_max_bs or bs_default
        if running_cap is not None:
            max_bs = min(max_bs, running_cap)
        sizes = sorted(set(ns.cuda_graph_bs)) if ns.cuda_graph_bs else capture_sizes(max_bs, DECODE_STEPS)
        return ("disabled", [], "disabled", []) if ns.disable_cuda_graph else ("full", sizes, "disabled", [])
    cfg = ns.cuda_graph_config or {}
    dec, pre = cfg.get("decode", {}), cfg.get("prefill", {})
    if ns.disable_cuda_graph:
        warnings.append(
            "--disable-cuda-graph is deprecated. Use --cuda-graph-backend-decode disabled and "
            "--cuda-graph-backend-prefill disabled instead."
        )
    decode_backend = dec.get("backend") or ns.cuda_graph_backend_decode or "full"
    prefill_backend = pre.get("backend") or ns.cuda_graph_backend_prefill or "breakable"
    if ns.disable_cuda_graph or ns.disable_decode_cuda_graph:
        decode_backend = dec.get("backend") or "disabled"
    if ns.disable_cuda_graph or ns.disable_prefill_cuda_graph:
        prefill_backend = pre.get("backend") or "disabled"
    max_bs = int(dec.get("max_bs") or ns.cuda_graph_max_bs_decode or bs_default)
    if running_cap is not None:
        max_bs = min(max_bs, running_cap)
    explicit = dec.get("bs") or ns.cuda_graph_bs_decode
    decode_sizes = sorted(set(explicit)) if explicit else capture_sizes(max_bs, DECODE_STEPS)
    max_tokens = int(pre.get("max_bs") or ns.cuda_graph_max_bs_prefill or (chunk if chunk > 0 else 8192))
    explicit = pre.get("bs") or ns.cuda_graph_bs_prefill
    prefill_sizes = sorted(set(explicit)) if explicit else capture_sizes(max_tokens, PREFILL_STEPS)
    return (
        decode_backend,
        decode_sizes if decode_backend != "disabled" else [],
        prefill_backend,
        prefill_sizes if prefill_backend != "disabled" else [],
    )


def _resolved_args(ns: argparse.Namespace, cfg: SglangConfig, new: bool) -> dict[str, Any]:
    """The ``server_args=`` dict: parsed args with the auto values filled in."""
    args = {k: v for k, v in vars(ns).items() if k != "config"}
    args.update(
        mem_fraction_static=cfg.mem_fraction_static,
        chunked_prefill_size=cfg.chunked_prefill_size,
        attention_backend=cfg.attention_backend,
        page_size=cfg.page_size,
        served_model_name=cfg.served_name,
        tokenizer_path=ns.tokenizer_path or ns.model_path,
    )
    if new:
        args["cuda_graph_config"] = {
            "decode": {"backend": cfg.decode_backend, "max_bs": cfg.decode_max_bs},
            "prefill": {"backend": cfg.prefill_backend, "max_bs": cfg.prefill_max_tokens},
        }
        args["cuda_graph_max_bs_decode"] = cfg.decode_max_bs
    else:
        args["cuda_graph_max_bs"] = cfg.decode_max_bs
    return args
