"""vLLM's command line: its real flag spellings per version, parsing quirks and resolved config.

The parser is a real ``argparse.ArgumentParser`` built like vLLM's ``FlexibleArgumentParser``:
``allow_abbrev`` on (``--kv-cache-memory`` expands, ``--device`` is ambiguous), ``_`` and ``-``
interchangeable in flag names, dotted JSON keys (``-cc.cudagraph_mode=PIECEWISE``), ``k``/``K``
integer suffixes, ``--config file.yaml``, booleans as ``--x`` / ``--no-x`` (0.32) or
``--enable-x`` / ``--disable-x`` (0.33+). Removed flags (``--swap-space``,
``--num-scheduler-steps``, ``--disable-log-requests`` …) are simply absent, so argparse rejects
them with exit 2 as the real engine does. ``--help`` lists every option in argparse's layout
(``--help=all``, ``--help=<Group>`` and ``--help=<substring>`` filter it).

Range and consistency errors are raised as :class:`ConfigFailure` carrying the pydantic-style
text vLLM prints before it exits with code 1.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from autotune_sim.dialects.base import capture_sizes, expand_config, human_readable_int
from autotune_sim.presets import MODELS, ModelPreset, find_model
from autotune_sim.settings import SimSettings

__all__ = ["SUPPORTED_VERSIONS", "ConfigFailure", "VllmConfig", "build_parser", "preprocess", "resolve"]

SUPPORTED_VERSIONS = ("0.32.0", "0.33.0", "0.34.0")
DEFAULT_MODEL = "Qwen/Qwen3-0.6B"
CUDAGRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
JSON_FLAGS = {
    "-cc": "--compilation-config",
    "--compilation-config": "--compilation-config",
    "-sc": "--speculative-config",
    "--speculative-config": "--speculative-config",
    "--hf-overrides": "--hf-overrides",
}
KV_DTYPES = (
    "auto",
    "bfloat16",
    "float16",
    "fp8",
    "fp8_e4m3",
    "fp8_e5m2",
    "fp8_inc",
    "fp8_ds_mla",
    "fp8_per_token_head",
    "int4_per_token_head",
    "int8_per_token_head",
    "nvfp4",
    "nvfp4_4over6",
    "nvfp4_ds_mla",
    "turboquant_3bit_nc",
    "turboquant_4bit_nc",
    "turboquant_k3v4_nc",
    "turboquant_k8v4",
    "ultraquant_4bit",
)


class ConfigFailure(Exception):
    """vLLM refuses this configuration: ``lines`` are printed (stderr) and the process exits 1."""

    def __init__(self, lines: Sequence[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = list(lines)


def validation_error(model: str, field_name: str | None, message: str, value: Any, kind: str) -> ConfigFailure:
    """A pydantic ``ValidationError`` as vLLM prints it."""
    lines = [f"pydantic_core._pydantic_core.ValidationError: 1 validation error for {model}"]
    if field_name:
        lines.append(field_name)
    lines.append(f"  {message} [type={kind}, input_value={value!r}, input_type={type(value).__name__}]")
    lines.append(f"    For further information visit https://errors.pydantic.dev/2.12/v/{kind}")
    return ConfigFailure(lines)


def value_error(model: str, message: str, value: Any = "ArgsKwargs(...)") -> ConfigFailure:
    return validation_error(model, None, f"Value error, {message}", value, "value_error")


# ------------------------------------------------------------------------------------ parser
def _max_len(value: str) -> int:
    return -1 if value.strip().lower() == "auto" else human_readable_int(value)


def _json(value: str) -> dict[str, Any]:
    parsed = json.loads(value)
    if not isinstance(parsed, dict):
        raise ValueError("expected a JSON object")
    return parsed


BOOL = "bool"
# (group, option strings, argparse kwargs or BOOL with default, help)
Spec = tuple[str, tuple[str, ...], Any, str]


def _specs(version: str) -> list[Spec]:
    v34 = version >= "0.34"
    block_default = None
    util_default = None if v34 else 0.92
    kv_choices: dict[str, Any] = {} if v34 else {"choices": KV_DTYPES}
    specs: list[Spec] = [
        ("Frontend", ("--host",), {"type": str, "default": None}, "Host name."),
        ("Frontend", ("--port",), {"type": int, "default": 8000}, "Port number."),
        (
            "Frontend",
            ("--api-key",),
            {"type": str, "nargs": "+", "default": None},
            "If provided, the server will require one of these keys to be presented in the header.",
        ),
        (
            "Frontend",
            ("--uvicorn-log-level",),
            {"choices": ["critical", "debug", "error", "info", "trace", "warning"], "default": "info"},
            "Log level for uvicorn.",
        ),
        ("Frontend", ("--disable-uvicorn-access-log",), (BOOL, False), "Disable uvicorn access log."),
        ("Frontend", ("--root-path",), {"type": str, "default": None}, "FastAPI root_path when app is behind a proxy."),
        ("Frontend", ("--chat-template",), {"type": str, "default": None}, "The file path to the chat template."),
        ("Frontend", ("--enable-auto-tool-choice",), (BOOL, False), "Enable auto tool choice."),
        ("Frontend", ("--tool-call-parser",), {"type": str, "default": None}, "Tool call parser."),
        (
            "Frontend",
            ("--enable-force-include-usage",),
            (BOOL, False),
            "If set to True, including usage on every request.",
        ),
        (
            "Frontend",
            ("--api-server-count", "-asc"),
            {"type": int, "default": None},
            "How many API server processes to run.",
        ),
        ("Frontend", ("--config",), {"type": str, "default": None}, "Read CLI options from a config file (YAML)."),
        (
            "ModelConfig",
            ("--model",),
            {"type": str, "default": DEFAULT_MODEL},
            "Name or path of the Hugging Face model to use.",
        ),
        ("ModelConfig", ("--tokenizer",), {"type": str, "default": None}, "Name or path of the tokenizer."),
        ("ModelConfig", ("--trust-remote-code",), (BOOL, False), "Trust remote code from Hugging Face."),
        (
            "ModelConfig",
            ("--dtype",),
            {"choices": ["auto", "bfloat16", "float", "float16", "float32", "half"], "default": "auto"},
            "Data type for model weights and activations.",
        ),
        ("ModelConfig", ("--seed",), {"type": int, "default": 0}, "Random seed for reproducibility."),
        (
            "ModelConfig",
            ("--max-model-len",),
            {"type": _max_len, "default": None},
            "Model context length (prompt and output). Supports k/m/g/K/M/G suffixes, or 'auto' / -1 "
            "to fit the context to the available GPU memory.",
        ),
        ("ModelConfig", ("--revision",), {"type": str, "default": None}, "The specific model version to use."),
        (
            "ModelConfig",
            ("--served-model-name",),
            {"type": str, "nargs": "+", "default": None},
            "The model name(s) used in the API.",
        ),
        (
            "ModelConfig",
            ("--quantization", "-q"),
            {"type": str, "default": None},
            "Method used to quantize the weights.",
        ),
        (
            "ModelConfig",
            ("--enforce-eager",),
            (BOOL, False),
            "Whether to always use eager-mode PyTorch (disables CUDA graphs).",
        ),
        ("ModelConfig", ("--max-logprobs",), {"type": int, "default": 20}, "Maximum number of log probabilities."),
        ("ModelConfig", ("--disable-sliding-window",), (BOOL, False), "Whether to disable sliding window."),
        (
            "ModelConfig",
            ("--generation-config",),
            {"type": str, "default": "auto"},
            "The folder path to the generation config, 'auto' or 'vllm'.",
        ),
        (
            "ModelConfig",
            ("--hf-overrides",),
            {"type": _json, "default": None},
            "Extra arguments for the Hugging Face config (JSON).",
        ),
        ("LoadConfig", ("--load-format",), {"type": str, "default": "auto"}, "The format of the model weights."),
        ("LoadConfig", ("--download-dir",), {"type": str, "default": None}, "Directory to download weights to."),
        (
            "LoadConfig",
            ("--model-loader-extra-config",),
            {"type": _json, "default": {}},
            "Extra config for model loader (JSON), passed to the loader of the chosen load format.",
        ),
        (
            "CacheConfig",
            ("--block-size",),
            {"type": int, "default": block_default},
            "Size of a contiguous cache block in number of tokens.",
        ),
        (
            "CacheConfig",
            ("--gpu-memory-utilization", "--device-memory-utilization"),
            {"type": float, "default": util_default},
            "The fraction of GPU memory to be used for the model executor, which can range from 0 to 1.",
        ),
        (
            "CacheConfig",
            ("--kv-cache-memory-bytes",),
            {"type": human_readable_int, "default": None},
            "Size of KV Cache per GPU in bytes. By default None; vLLM infers it from gpu_memory_utilization.",
        ),
        (
            "CacheConfig",
            ("--kv-cache-dtype",),
            {"type": str, "default": "auto", **kv_choices},
            "Data type for kv cache storage.",
        ),
        (
            "CacheConfig",
            ("--num-gpu-blocks-override",),
            {"type": int, "default": None},
            "Number of GPU blocks to use. This overrides the profiled num_gpu_blocks if specified.",
        ),
        ("CacheConfig", ("--enable-prefix-caching",), (BOOL, None), "Whether to enable prefix caching."),
        (
            "CacheConfig",
            ("--prefix-caching-hash-algo",),
            {"choices": ["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"], "default": "sha256"},
            "Hash algorithm for prefix caching.",
        ),
        ("CacheConfig", ("--cpu-offload-gb",), {"type": float, "default": 0}, "Space in GiB to offload to CPU."),
        (
            "CacheConfig",
            ("--kv-offloading-size",),
            {"type": float, "default": None},
            "Size of the KV cache offloading buffer in GiB.",
        ),
        (
            "CacheConfig",
            ("--kv-offloading-backend",),
            {"choices": ["native", "lmcache"], "default": "native"},
            "The backend to use for KV cache offloading.",
        ),
        (
            "ParallelConfig",
            ("--tensor-parallel-size", "-tp"),
            {"type": int, "default": 1},
            "Number of tensor parallel groups.",
        ),
        (
            "ParallelConfig",
            ("--pipeline-parallel-size", "-pp"),
            {"type": int, "default": 1},
            "Number of pipeline parallel groups.",
        ),
        (
            "ParallelConfig",
            ("--data-parallel-size", "-dp"),
            {"type": int, "default": 1},
            "Number of data parallel groups.",
        ),
        ("ParallelConfig", ("--device-ids",), {"type": str, "default": None}, "Comma-separated device ids."),
        (
            "ParallelConfig",
            ("--distributed-executor-backend",),
            {"choices": ["external_launcher", "mp", "ray", "uni"], "default": None},
            "Backend to use for distributed model workers.",
        ),
        ("ParallelConfig", ("--enable-expert-parallel",), (BOOL, False), "Use expert parallelism for MoE layers."),
        ("ParallelConfig", ("--disable-custom-all-reduce",), (BOOL, False), "Disable the custom all-reduce kernel."),
        (
            "SchedulerConfig",
            ("--max-num-batched-tokens",),
            {"type": human_readable_int, "default": None},
            "Maximum number of tokens to be processed in a single iteration.",
        ),
        (
            "SchedulerConfig",
            ("--max-num-seqs",),
            {"type": int, "default": None},
            "Maximum number of sequences to be processed in a single iteration.",
        ),
        (
            "SchedulerConfig",
            ("--max-num-active-seqs",),
            {"type": int, "default": None},
            "Maximum number of sequences running on the GPU at once.",
        ),
        (
            "SchedulerConfig",
            ("--max-num-queued-reqs",),
            {"type": int, "default": None},
            "Reject requests with HTTP 503 beyond this many queued requests.",
        ),
        (
            "SchedulerConfig",
            ("--max-num-queued-tokens",),
            {"type": human_readable_int, "default": None},
            "Reject requests with HTTP 503 beyond this many queued prompt tokens.",
        ),
        (
            "SchedulerConfig",
            ("--enable-chunked-prefill",),
            (BOOL, None),
            "If True, prefill requests can be chunked based on the remaining max_num_batched_tokens.",
        ),
        (
            "SchedulerConfig",
            ("--long-prefill-token-threshold",),
            {"type": int, "default": 0},
            "For chunked prefill, a request is considered long if the prompt is longer than this.",
        ),
        (
            "SchedulerConfig",
            ("--scheduling-policy",),
            {"choices": ["fcfs", "priority"], "default": "fcfs"},
            "The scheduling policy to use.",
        ),
        ("SchedulerConfig", ("--async-scheduling",), (BOOL, None), "Overlap scheduling with model execution."),
        (
            "SchedulerConfig",
            ("--scheduler-reserve-full-isl",),
            (BOOL, True),
            "Admit a request only if the whole prompt fits in the KV cache.",
        ),
        (
            "SchedulerConfig",
            ("--stream-interval",),
            {"type": int, "default": 1},
            "The interval (in tokens) between streamed outputs.",
        ),
        (
            "SchedulerConfig",
            ("--performance-mode",),
            {"type": str, "default": None},
            "'throughput' doubles the default batch sizes.",
        ),
        (
            "CompilationConfig",
            ("--optimization-level", "-O"),
            {"type": int, "choices": [0, 1, 2, 3], "default": 2},
            "The optimization level: 0 no compilation or CUDA graphs, 1 piecewise graphs, 2/3 full and piecewise.",
        ),
        (
            "CompilationConfig",
            ("--compilation-config", "-cc"),
            {"type": _json, "default": None},
            "torch.compile and cudagraph capture configuration for the model (JSON).",
        ),
        (
            "CompilationConfig",
            ("--cudagraph-capture-sizes",),
            {"type": int, "nargs": "+", "default": None},
            "Sizes to capture cudagraph.",
        ),
        (
            "CompilationConfig",
            ("--max-cudagraph-capture-size",),
            {"type": int, "default": None},
            "The maximum cudagraph capture size; default min(max_num_seqs * 2, 512).",
        ),
        (
            "SpeculativeConfig",
            ("--speculative-config", "-sc"),
            {"type": _json, "default": None},
            "Speculative decoding configuration (JSON).",
        ),
        (
            "ObservabilityConfig",
            ("--disable-log-stats",),
            {"action": "store_true", "default": False},
            "Disable logging statistics.",
        ),
        ("ObservabilityConfig", ("--enable-log-requests",), (BOOL, False), "Enable logging requests."),
        (
            "ObservabilityConfig",
            ("--cudagraph-metrics",),
            (BOOL, False),
            "Enable CUDA graph metrics (number of padded/unpadded tokens, runtime cudagraph dispatch modes, "
            "and their observed frequencies at every logging interval).",
        ),
        (
            "ObservabilityConfig",
            ("--shutdown-timeout",),
            {"type": int, "default": 0},
            "Seconds to drain in-flight requests on shutdown (0 aborts them).",
        ),
    ]
    if v34:
        specs += [
            (
                "CacheConfig",
                ("--enable-extensible-kv-cache",),
                (BOOL, True),
                "Size the KV cache after warm-up and graph capture (virtual memory).",
            ),
            (
                "SchedulerConfig",
                ("--max-num-inflight-kv-loads",),
                {"type": int, "default": None},
                "Maximum number of in-flight KV loads.",
            ),
            (
                "SchedulerConfig",
                ("--cache-aware-admission-window",),
                {"type": int, "default": None},
                "Admission window for cache-aware scheduling.",
            ),
        ]
    return specs


class _HiddenFalse(argparse.Action):
    """``--no-enable-x`` on 0.33+: still accepted, not listed."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, False)


class _EnableDisable(argparse.Action):
    """0.33+'s ``--enable-x`` / ``--disable-x`` pair (and the reverse for ``--disable-x`` fields)."""

    def __init__(
        self, option_strings: Sequence[str], dest: str, default: Any = None, help: str | None = None, **kwargs: Any
    ) -> None:
        super().__init__(option_strings, dest, nargs=0, default=default, help=help)

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        primary = self.option_strings[0]
        setattr(namespace, self.dest, option_string == primary)


class _Formatter(argparse.ArgumentDefaultsHelpFormatter):
    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=40, width=110)


def build_parser(version: str, keep: Callable[[str, Sequence[str]], bool] | None = None) -> argparse.ArgumentParser:
    """vLLM's ``serve`` parser for ``version``; ``keep(group, flags)`` filters it for ``--help=``."""
    parser = argparse.ArgumentParser(
        prog="vllm serve",
        usage="vllm serve [model_tag] [options]",
        formatter_class=_Formatter,
        allow_abbrev=True,
        add_help=False,
    )
    parser.add_argument(
        "model_tag", nargs="?", default=None, help="The model tag to serve (optional if specified in config)"
    )
    parser.add_argument(
        "-h",
        "--help",
        nargs="?",
        const="all",
        default=None,
        help="Show help: --help=all, --help=<ConfigGroup> or --help=<keyword>.",
    )
    groups: dict[str, argparse._ArgumentGroup] = {}
    new_bools = version >= "0.33"
    for group, flags, kind, help_text in _specs(version):
        if keep is not None and not keep(group, flags):
            continue
        target = groups.setdefault(group, parser.add_argument_group(group))
        dest = flags[0].lstrip("-").replace("-", "_")
        if isinstance(kind, tuple) and kind[0] == BOOL:
            _add_bool(target, flags[0], dest, kind[1], help_text, new_bools)
        else:
            target.add_argument(*flags, dest=dest, help=help_text, **kind)
    return parser


def _add_bool(group: argparse._ArgumentGroup, flag: str, dest: str, default: Any, help_text: str, new: bool) -> None:
    if not new:
        group.add_argument(flag, dest=dest, action=argparse.BooleanOptionalAction, default=default, help=help_text)
        return
    stem = flag[2:]
    if stem.startswith("enable-"):
        pair = (flag, "--disable-" + stem[len("enable-") :])
    elif stem.startswith("disable-"):
        pair = (flag, "--enable-" + stem[len("disable-") :])
    else:
        group.add_argument(flag, dest=dest, action=argparse.BooleanOptionalAction, default=default, help=help_text)
        return
    group.add_argument(*pair, dest=dest, action=_EnableDisable, default=default, help=help_text)
    group.add_argument("--no-" + stem, dest=dest, action=_HiddenFalse, nargs=0, help=argparse.SUPPRESS)


# ---------------------------------------------------------------------------- preprocessing
def preprocess(argv: Sequence[str]) -> list[str]:
    """FlexibleArgumentParser's rewrites: ``_`` → ``-`` in flag names, dotted JSON keys, --config."""
    out: list[str] = []
    dotted: dict[str, dict[str, Any]] = {}
    args = expand_config(list(argv), negate=True)
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("--") and not arg.startswith("--help"):
            key, eq, value = arg.partition("=")
            arg = key.replace("_", "-") + eq + value
        head = arg.split("=", 1)[0]
        base, dot, path = head.partition(".")
        if dot and base in JSON_FLAGS and path:
            if "=" in arg:
                raw = arg.split("=", 1)[1]
            else:
                i += 1
                raw = args[i] if i < len(args) else ""
            _set_path(dotted.setdefault(JSON_FLAGS[base], {}), path.replace("-", "_"), _json_value(raw))
        else:
            out.append(arg)
        i += 1
    for flag, merged in dotted.items():
        out += [flag, json.dumps(merged)]
    return out


def _json_value(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _set_path(target: dict[str, Any], path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    for part in parents:
        target = target.setdefault(part, {})
    target[leaf] = value


# ------------------------------------------------------------------------------- resolution
@dataclass
class VllmConfig:
    """Resolved engine configuration (what vLLM's config classes hold after post-init)."""

    version: str
    model: ModelPreset
    model_name: str
    served_names: tuple[str, ...]
    host: str | None
    port: int
    api_key: str | None
    dtype: str
    kv_dtype: str
    quantization: str | None
    tp: int
    pp: int
    dp: int
    utilization: float
    kv_cache_memory_bytes: int | None
    num_gpu_blocks_override: int | None
    block_size: int
    max_model_len: int | None  # None = auto-fit
    derived_max_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    chunked_prefill: bool
    prefix_caching: bool
    long_prefill_threshold: int
    priority_policy: bool
    reserve_full_isl: bool
    cudagraph_mode: str
    capture_sizes: list[int]
    compile: bool
    extensible_kv: bool
    log_stats: bool
    cudagraph_metrics: bool
    stream_interval: int
    force_include_usage: bool
    seed: int
    max_queued_reqs: int | None
    load_format: str = "auto"
    loader_extra: dict[str, Any] = field(default_factory=dict)
    #: what vLLM 0.34 hashes into the torch.compile cache directory (``compile_cache.py``)
    compile_factors: dict[str, Any] = field(default_factory=dict)
    enable_expert_parallel: bool = False
    non_default: dict[str, Any] = field(default_factory=dict)

    @property
    def graphs_per_size(self) -> int:
        return {"NONE": 0, "FULL_AND_PIECEWISE": 2}.get(self.cudagraph_mode, 1)

    @property
    def max_capture(self) -> int:
        return max(self.capture_sizes) if self.capture_sizes and self.cudagraph_mode != "NONE" else 0


def non_default_args(ns: argparse.Namespace, version: str) -> dict[str, Any]:
    """What vLLM logs as ``non-default args``: parsed values that differ from the defaults."""
    defaults = vars(build_parser(version).parse_args([]))
    return {k: v for k, v in vars(ns).items() if k != "help" and v != defaults.get(k)}


def resolve(ns: argparse.Namespace, settings: SimSettings, env: dict[str, str]) -> VllmConfig:
    """Check and complete the parsed flags the way vLLM's config post-init does."""
    version = settings.vllm_version
    model_name = ns.model_tag or ns.model
    model = find_model(model_name)
    if model is None:
        known = ", ".join(m.hub_id for m in MODELS)
        raise value_error(
            "ModelConfig",
            f"Invalid repository ID or local directory specified: '{model_name}'.\nPlease verify the following "
            "requirements:\n1. Provide a valid Hugging Face repository ID.\n2. Specify a local directory that "
            f"contains a recognized configuration file.\n(autotune simulator presets: {known})",
        )
    _check_ranges(ns)
    gpu = settings.gpu
    tp, pp, dp = ns.tensor_parallel_size, ns.pipeline_parallel_size, ns.data_parallel_size
    if tp * pp * dp > settings.num_gpus:
        raise ConfigFailure(
            [
                f"ValueError: World size ({tp * pp * dp}) is larger than the number of available "
                f"GPUs ({settings.num_gpus}) in this node."
            ]
        )
    if model.heads % tp:
        raise ConfigFailure(
            [
                f"ValueError: Total number of attention heads ({model.heads}) must be divisible by "
                f"tensor parallel size ({tp})."
            ]
        )
    max_len = _max_model_len(ns, model, env)
    seqs, batched, chunked = _batch_limits(ns, gpu.torch_total_gib, gpu.is_a100, max_len or model.max_position)
    mode, sizes = _graphs(ns, seqs, batched)
    v34 = version >= "0.34"
    extensible = bool(getattr(ns, "enable_extensible_kv_cache", False)) and v34
    util = ns.gpu_memory_utilization
    if util is None:
        util = 1.0 if extensible else 0.92
    served = tuple(ns.served_model_name or [model_name])
    return VllmConfig(
        version=version,
        model=model,
        model_name=model_name,
        served_names=served,
        host=ns.host,
        port=ns.port,
        api_key=(ns.api_key or [None])[0],
        dtype=ns.dtype,
        kv_dtype=ns.kv_cache_dtype,
        quantization=ns.quantization,
        tp=tp,
        pp=pp,
        dp=dp,
        utilization=util,
        kv_cache_memory_bytes=ns.kv_cache_memory_bytes,
        num_gpu_blocks_override=ns.num_gpu_blocks_override,
        block_size=ns.block_size or (64 if v34 else 16),
        max_model_len=max_len,
        derived_max_len=model.max_position,
        max_num_seqs=seqs,
        max_num_batched_tokens=batched,
        chunked_prefill=chunked,
        prefix_caching=ns.enable_prefix_caching is not False,
        long_prefill_threshold=ns.long_prefill_token_threshold,
        priority_policy=ns.scheduling_policy == "priority",
        reserve_full_isl=ns.scheduler_reserve_full_isl is not False,
        cudagraph_mode=mode,
        capture_sizes=sizes,
        compile=not ns.enforce_eager and ns.optimization_level > 0,
        extensible_kv=extensible,
        log_stats=not ns.disable_log_stats,
        cudagraph_metrics=bool(ns.cudagraph_metrics),
        stream_interval=ns.stream_interval,
        force_include_usage=bool(ns.enable_force_include_usage),
        seed=ns.seed,
        max_queued_reqs=ns.max_num_queued_reqs,
        load_format=ns.load_format,
        loader_extra=dict(ns.model_loader_extra_config or {}),
        compile_factors=_compile_factors(ns, version, model_name, max_len, seqs, batched, mode, sizes),
        enable_expert_parallel=bool(ns.enable_expert_parallel),
        non_default=non_default_args(ns, version),
    )


def _compile_factors(
    ns: argparse.Namespace,
    version: str,
    model_name: str,
    max_len: int | None,
    seqs: int,
    batched: int,
    mode: str,
    sizes: list[int],
) -> dict[str, Any]:
    """The flags vLLM 0.34's ``compile_factors`` keep (see ``compile_cache.py`` for the ignored ones)."""
    return {
        "vllm_version": version,  # the traced code differs between releases
        "model": model_name,
        "revision": ns.revision,
        "dtype": ns.dtype,
        "quantization": ns.quantization,
        "max_model_len": max_len,
        "hf_overrides": ns.hf_overrides,
        "kv_cache_dtype": ns.kv_cache_dtype,
        "block_size": ns.block_size,
        "tensor_parallel_size": ns.tensor_parallel_size,
        "pipeline_parallel_size": ns.pipeline_parallel_size,
        "data_parallel_size": ns.data_parallel_size,
        "enable_expert_parallel": bool(ns.enable_expert_parallel),
        "max_num_seqs": seqs,
        "max_num_batched_tokens": batched,
        "optimization_level": ns.optimization_level,
        "compilation_config": ns.compilation_config,
        "cudagraph_mode": mode,
        "cudagraph_capture_sizes": sizes,
        "speculative_config": ns.speculative_config,
    }


def _check_ranges(ns: argparse.Namespace) -> None:
    util = ns.gpu_memory_utilization
    if util is not None and util > 1:
        raise validation_error(
            "CacheConfig", "gpu_memory_utilization", "Input should be less than or equal to 1", util, "less_than_equal"
        )
    if util is not None and util <= 0:
        raise validation_error(
            "CacheConfig", "gpu_memory_utilization", "Input should be greater than 0", util, "greater_than"
        )
    for name, cls in (
        ("tensor_parallel_size", "ParallelConfig"),
        ("pipeline_parallel_size", "ParallelConfig"),
        ("data_parallel_size", "ParallelConfig"),
        ("stream_interval", "SchedulerConfig"),
    ):
        if getattr(ns, name) < 1:
            raise validation_error(
                cls, name, "Input should be greater than or equal to 1", getattr(ns, name), "greater_than_equal"
            )
    for name in ("max_num_seqs", "max_num_batched_tokens", "block_size"):
        value = getattr(ns, name)
        if value is not None and value < 1:
            raise validation_error(
                "SchedulerConfig" if name != "block_size" else "CacheConfig",
                name,
                "Input should be greater than 0",
                value,
                "greater_than",
            )
    if ns.kv_cache_memory_bytes is not None and ns.kv_cache_memory_bytes < 0:
        raise validation_error(
            "CacheConfig",
            "kv_cache_memory_bytes",
            "Input should be greater than or equal to 0",
            ns.kv_cache_memory_bytes,
            "greater_than_equal",
        )


def _max_model_len(ns: argparse.Namespace, model: ModelPreset, env: dict[str, str]) -> int | None:
    value = ns.max_model_len
    if value == -1:
        return None
    if value is None:
        return model.max_position
    if value < 1:
        raise validation_error("ModelConfig", "max_model_len", "Input should be greater than 0", value, "greater_than")
    if value > model.max_position and env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN") != "1":
        raise value_error(
            "ModelConfig",
            f"User-specified max_model_len ({value}) is greater than the derived max_model_len "
            f"(max_position_embeddings={model.max_position} or model_max_length=None in model's config.json). "
            "To allow overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. "
            "VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used with extreme caution.",
        )
    return int(value)


def _batch_limits(ns: argparse.Namespace, gpu_gib: float, is_a100: bool, max_len: int) -> tuple[int, int, bool]:
    """``get_batch_defaults``: 1024 seqs / 8192 tokens on ≥70 GiB non-A100 GPUs, else 256 / 2048."""
    big = gpu_gib >= 70 and not is_a100
    seqs_default = 1024 if big else 256
    tokens_default = 16384 if gpu_gib >= 160 else 8192 if big else 2048
    if ns.performance_mode == "throughput":
        seqs_default, tokens_default = seqs_default * 2, tokens_default * 2
    chunked = ns.enable_chunked_prefill is not False
    tokens_set = ns.max_num_batched_tokens is not None
    tokens = ns.max_num_batched_tokens if tokens_set else tokens_default
    if not chunked and not tokens_set:
        tokens = max(max_len, tokens_default)
    seqs = ns.max_num_seqs if ns.max_num_seqs is not None else min(seqs_default, tokens)
    if tokens < seqs:
        raise value_error(
            "SchedulerConfig",
            f"max_num_batched_tokens ({tokens}) must be greater than or equal to max_num_seqs ({seqs}).",
        )
    if not chunked and tokens < max_len:
        raise value_error(
            "SchedulerConfig",
            f"max_num_batched_tokens ({tokens}) is smaller than max_model_len ({max_len}). This effectively limits "
            "the maximum sequence length to max_num_batched_tokens and makes vLLM reject longer sequences. Please "
            "increase max_num_batched_tokens or decrease max_model_len.",
        )
    return seqs, tokens, chunked


def _graphs(ns: argparse.Namespace, seqs: int, batched: int) -> tuple[str, list[int]]:
    """CUDA-graph mode and capture sizes from -O, --enforce-eager, -cc and the size flags."""
    cc = ns.compilation_config or {}
    level = ns.optimization_level
    mode = "NONE" if level == 0 else "PIECEWISE" if level == 1 else "FULL_AND_PIECEWISE"
    if "cudagraph_mode" in cc:
        mode = str(cc["cudagraph_mode"]).upper()
        if mode not in CUDAGRAPH_MODES:
            raise validation_error(
                "CompilationConfig",
                "cudagraph_mode",
                f"Input should be {', '.join(CUDAGRAPH_MODES)}",
                cc["cudagraph_mode"],
                "enum",
            )
    if ns.enforce_eager:
        mode = "NONE"
    if ns.max_cudagraph_capture_size is not None and "max_cudagraph_capture_size" in cc:
        raise value_error(
            "CompilationConfig",
            "max_cudagraph_capture_size is set both in compilation_config "
            "and with --max-cudagraph-capture-size; set it once.",
        )
    explicit = ns.cudagraph_capture_sizes or cc.get("cudagraph_capture_sizes")
    if explicit:
        return mode, sorted({int(s) for s in explicit if int(s) <= batched})
    largest = ns.max_cudagraph_capture_size or cc.get("max_cudagraph_capture_size") or min(2 * seqs, 512)
    largest = min(int(largest), batched)
    steps = [(1, 2, 1), (2, 3, 1), (4, 5, 1), (8, 256, 8), (256, largest + 1, 16)]
    return mode, capture_sizes(largest, steps)
