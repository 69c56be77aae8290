"""The SGLang dialect: flags, version drift, readiness, log events and engine facts.

SGLang is launched as ``<python> -m sglang.launch_server`` (or the configured command). Facts
this module relies on (read from SGLang's source; see the project's SGLang reference notes):

* Flags change between releases (``FLAG_CHANGES``, read from each release's own parser):
  0.5.15 added the per-phase ``--cuda-graph-max-bs-decode`` (the old ``--cuda-graph-max-bs`` a
  deprecated alias until 0.5.20 removed it: an *ambiguous option*, exit 2), 0.5.22 replaced
  ``--enable-dp-attention`` by ``--attn-dp-size``. Each change is detected on its own from the
  installed ``--help``; no one flag stands for a release.
* argparse runs with ``allow_abbrev``, so users copy commands with prefixes such as ``--tp 8``;
  a unique prefix is expanded to the full flag so trial records and exports are unambiguous.
* The port refuses connections until weights, KV pool and CUDA graphs are ready; ``/health`` is
  503 until the warm-up request succeeds and then runs a real one-token generation per call;
  ``/v1/models`` answers before warm-up, so it is never used for readiness. ``/ready`` is the
  cheap readiness probe from 0.5.20; older releases answer it 404 and are polled on ``/health``.
* A scheduler failure makes the parent SIGKILL its own process tree, so a failed start usually
  ends with return code -9: a failure of the engine, not a user interrupt.
"""

from __future__ import annotations

import ast
import logging
import re
import statistics
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar

import httpx

from autotune.config import EngineSettings
from autotune.engines.base import (
    ContainerImage,
    EngineAdapter,
    EventKind,
    FlagSet,
    LaunchSpec,
    LogEvent,
    MemorySemantics,
    WeightDaemon,
    counter_delta,
    metric_max,
    samples_named,
    version_tuple,
)
from autotune.engines.drift import FlagChange
from autotune.engines.rootcause import exception_event
from autotune.errors import EngineError, InvalidFlags
from autotune.outcomes import Outcome

__all__ = [
    "FLAG_CHANGES",
    "LAUNCH_ENV",
    "FlagChange",
    "SglangAdapter",
    "resolved_knobs",
]

log = logging.getLogger(__name__)

# The per-phase CUDA-graph flag (0.5.15+): the spelling the cuda_graph_max_bs knob prefers.
NEW_FLAG_SET_MARKER = "--cuda-graph-max-bs-decode"
TOO_HIGH, TOO_LOW = "too_high", "too_low"

#: Added to every launch (the user's ``engine.env`` wins): unbuffered output, so a fatal line
#: reaches the supervisor when it is written, not when a buffer fills.
LAUNCH_ENV: Mapping[str, str] = MappingProxyType({"PYTHONUNBUFFERED": "1"})

# 0.5.23's standalone weight-cache daemon: the key its weights are valid for (``CacheConfig``:
# checkpoint, revision, parallelism, dtype, quantization), so one daemon serves every trial that
# only moves the fraction, the batch limits or the graph sizes. A launch command the tuner cannot
# turn into the daemon's module has none.
WEIGHT_CACHE_SINCE = (0, 5, 23)
_DAEMON_MODULE = "sglang.srt.weight_cache.daemon"
_WEIGHT_KEY_FLAGS = (
    "--tp-size",
    "--tensor-parallel-size",
    "--tp",
    "--pp-size",
    "--pipeline-parallel-size",
    "--dp-size",
    "--data-parallel-size",
    "--dtype",
    "--quantization",
    "--revision",
    "--trust-remote-code",
)
# Where a daemon binds and marks itself ready, per GPU; autotune points both at a private folder.
_SOCKET_TEMPLATE_ENV = "SGLANG_WEIGHT_CACHE_SOCKET_TEMPLATE"
_READY_TEMPLATE_ENV = "SGLANG_WEIGHT_CACHE_READY_TEMPLATE"

# The tuner chooses these per trial; a user value would start every trial on the same port.
_OWNED_FLAGS = {
    "--host": "the bind address comes from engine.host",
    "--port": "each trial gets a free port",
    "--model-path": "the model comes from engine.model",
    "--model": "the model comes from engine.model",
}


# ------------------------------------------------------------------------------- version drift
GRAPH_FLAGS_0_5_15 = (
    "--cuda-graph-max-bs-decode",
    "--cuda-graph-bs-decode",
    "--cuda-graph-backend-decode",
    "--cuda-graph-backend-prefill",
)
FLAG_CHANGES: tuple[FlagChange, ...] = (
    FlagChange("--cuda-graph-max-bs", "--cuda-graph-max-bs-decode", "0.5.15", "0.5.20", knob="cuda_graph_max_bs"),
    FlagChange("--cuda-graph-bs", "--cuda-graph-bs-decode", "0.5.15", "0.5.20"),
    FlagChange(
        "--disable-cuda-graph",
        "--cuda-graph-backend-decode",
        "0.5.15",
        advice="--cuda-graph-backend-decode disabled and --cuda-graph-backend-prefill disabled",
        knob="enforce_eager",
        replace={"--cuda-graph-backend-decode": "disabled", "--cuda-graph-backend-prefill": "disabled"},
    ),
    # 0.5.15's help: "Deprecated alias for --cuda-graph-backend-prefill=<backend>"; gone in 0.5.20.
    *(
        FlagChange(
            old,
            "--cuda-graph-backend-prefill",
            "0.5.15",
            "0.5.20",
            advice=f"--cuda-graph-backend-prefill {backend}",
            replace={"--cuda-graph-backend-prefill": backend},
        )
        for old, backend in (
            ("--disable-piecewise-cuda-graph", "disabled"),
            ("--enable-breakable-cuda-graph", "breakable"),
        )
    ),
    FlagChange(
        "--enable-dp-attention",
        "--attn-dp-size",
        "0.5.22",
        advice="--attn-dp-size N in place of --dp-size N --enable-dp-attention",
    ),
)


def _drift_problem(flag: str, known: FlagSet) -> str | None:
    """The one-line reason a flag is the wrong spelling for the installed version, if it is."""
    for change in FLAG_CHANGES:
        use = f"use the portable knob {change.knob}" if change.knob else f"write {change.advice or change.new}"
        if flag == change.old and flag not in known and change.new in known:
            removed = f", and the old spelling removed in {change.removed_in}" if change.removed_in else ""
            return f"`{change.old}` was renamed to `{change.new}` in SGLang {change.since}{removed}; {use}"
        if flag == change.new and flag not in known and change.old in known:
            return (
                f"`{change.new}` only exists from SGLang {change.since}; the installed SGLang spells it "
                f"`{change.old}`; " + (use if change.knob else f"write {change.old}")
            )
    return None


def _deprecation(flag: str, known: FlagSet) -> FlagChange | None:
    """The change that deprecates ``flag`` where the installed SGLang has both spellings."""
    for change in FLAG_CHANGES:
        if flag == change.old and flag in known and change.new in known:
            return change
    return None


# ----------------------------------------------------------------------------------- log lines
_NUM = r"(-?\d+(?:\.\d+)?)"
_SERVER_ARGS = re.compile(r"server_args=(.+)$")
# "KV Cache is allocated." (also with a label: "SWA KV Cache is ...") and, when the pool is sized
# after graph capture (0.5.22+), "Post-capture KV sizing: KV cache allocated." — a draft model's
# pool ("draft KV cache allocated") is not the target's.
_KV_ALLOCATED = re.compile(r"KV Cache is (?:allocated|VA upper bound)\.|(?<!draft )KV cache allocated\.")
_KV_TOKENS = re.compile(r"#tokens: (\d+)")
_KV_SIZES = re.compile(r"\b(K|V|KV) size: (\d+(?:\.\d+)?) GB")
_KV_DTYPE = re.compile(r"dtype: ([\w.]+)")
_KV_SUMMARY = re.compile(r"\bmax_total_num_tokens=\d+")
_KEY_VALUE = re.compile(r"\b(\w+)=" + _NUM)
_KV_BELOW_CONTEXT = re.compile(r"KV pool holds (\d+) tokens, fewer than --context-length (\d+)")
# "Capture cuda graph begin" (0.5.9), "Capture target decode CUDA graph end" (0.5.15+; "CPU graph",
# "NPU graph" ... on other devices), "Capture piecewise CUDA graph begin" (0.5.9's prefill graphs).
_CAPTURE = re.compile(
    r"Capture (?:(?P<model>target|draft) )?(?:(?P<stage>prefill|decode|verify|piecewise) )?(?:\w+ )?graph "
    r"(?P<phase>begin|end)\.",
    re.IGNORECASE,
)
# 0.5.9 logs the decode sizes on a line of their own: "Capture cuda graph bs [1, 2, 4, ...]".
_CAPTURE_SIZES = re.compile(r"Capture cuda graph bs \[([\d, ]*)\]")
_CAPTURE_FAILED = re.compile(r"Capture cuda graph failed", re.IGNORECASE)
_PREFILL_GRAPH_FAILED = re.compile(r"Fail when using backend: (\w+) for prefill runner")
_ELAPSED = re.compile(r"(?:elapsed=|Time elapsed: )(\d+(?:\.\d+)?) ?s")
_MEM_USAGE = re.compile(r"mem usage=(\d+(?:\.\d+)?) GB")
_AVAIL_MEM = re.compile(r"avail mem=(\d+(?:\.\d+)?) GB")
# The free memory --mem-fraction-static is a share of ("Load weight begin. avail mem=X GB") and
# what the process held before it (0.5.23+: "Memory baseline taken. mem usage=X GB").
_WEIGHTS_BEGIN = re.compile(r"Load weight begin\. avail mem=(\d+(?:\.\d+)?) GB")
_BASELINE_USAGE = re.compile(r"Memory baseline taken\. mem usage=(\d+(?:\.\d+)?) GB")
# The decode sizes as 0.5.15-0.5.22 log them on the begin line and 0.5.23 on the end line.
_CAPTURED_BS = re.compile(r"\bbs=\[([\d, ]*)\]")
_READY = re.compile(r"The server is fired up and ready to roll")
# Weights: the loader's end line (0.5.9 has no elapsed), and 0.5.23's weight-cache client mapping them.
_WEIGHTS_LOADED = re.compile(r"Load weight end\. elapsed=(\d+(?:\.\d+)?) s")
_WEIGHTS_MAPPED = re.compile(r"\[IpcModelLoader\] (Zero-copy|Copy)\b.*?time=(\d+(?:\.\d+)?)s")
_DECODE = re.compile(r"Decode batch(?: \[\d+\])?[.,]")  # " [N]": the forward iteration, when logged
_RUNNING = re.compile(r"#running-req: (\d+)")
_USED_TOKENS = re.compile(r"#(?:full )?token: (\d+)")
# Every device pool's usage: plain, or full/swa (hybrid SWA), mamba state, hisparse's GPU tokens.
_POOL_USAGE = re.compile(r"(?:^|[\s,])(?:(full|swa|gpu) )?(token|mamba) usage: (\d+(?:\.\d+)?)")
_REDUCED = re.compile(r"max_running_requests was reduced from the requested (\d+) to (\d+)")
_CUDA_GRAPH = re.compile(r"cuda graph: (True|False)")
_GEN_THROUGHPUT = re.compile(r"gen throughput \(token/s\): (\d+(?:\.\d+)?)")
_QUEUE = re.compile(r"#queue-req: (\d+)")
_ACCEPT_LEN = re.compile(r"accept len: (\d+(?:\.\d+)?)")
_RETRACT = re.compile(r"KV cache pool is full\. Retract requests\.")
_RETRACTED = re.compile(r"#retracted_reqs: (\d+)")
_TOKENS_GAINED = re.compile(r"#new_tokens_gained: (\d+)")
_RATIO = re.compile(r"#new_token_ratio: (\d+(?:\.\d+)?) -> (\d+(?:\.\d+)?)")
_ABORTED = re.compile(r"retract_decode: aborted (?:last )?request (\S+?):?(?:\s|$)")
_WEIGHTS_LEAVE_NO_KV = re.compile(
    r"Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=(\d+(?:\.\d+)?)"
)
_RAISE_ABOVE = re.compile(r"Raise --mem-fraction-static above (\d+(?:\.\d+)?)")
_NOT_ENOUGH = re.compile(r"Not enough memory\. Please try to increase --mem-fraction-static")
_CURRENT_FRACTION = re.compile(r"mem_fraction_static=(\d+(?:\.\d+)?)")
_STATE_CACHE_SMALL = re.compile(r"state cache is too small to serve any requests")
_CUDA_OOM = re.compile(r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory")
_ARGPARSE = re.compile(
    r": error: (?P<msg>(?:unrecognized arguments|ambiguous option|argument |the following arguments"
    r"|invalid choice).*)$"
)
_AMBIGUOUS = re.compile(r"ambiguous option: (--[\w-]+)(?:=\S*)? could match (.+)$")
_PORT_IN_USE = re.compile(r"address already in use|port \d+ is (?:already )?in use", re.IGNORECASE)
_DIED_AT_INIT = re.compile(r"scheduler died during initialization \(exit code: (-?\d+)\)")
_WATCHDOG = re.compile(r"watchdog timeout", re.IGNORECASE)


def _float(pattern: re.Pattern[str], line: str, group: int = 1) -> float | None:
    m = pattern.search(line)
    return float(m.group(group)) if m else None


def _int(pattern: re.Pattern[str], line: str) -> int | None:
    m = pattern.search(line)
    return int(m.group(1)) if m else None


def _parse_server_args(text: str) -> dict[str, Any] | None:
    """The logged ``server_args`` (a dict repr, or ``ServerArgs(...)`` in older versions).

    Values that are not Python literals are kept as their source text rather than evaluated.
    """
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        return None
    if isinstance(node, ast.Dict):
        pairs = [(k.value, v) for k, v in zip(node.keys, node.values, strict=True) if isinstance(k, ast.Constant)]
    elif isinstance(node, ast.Call):
        pairs = [(kw.arg, kw.value) for kw in node.keywords if kw.arg is not None]
    else:
        return None
    out: dict[str, Any] = {}
    for key, value in pairs:
        try:
            out[str(key)] = ast.literal_eval(value)
        except ValueError:
            out[str(key)] = ast.unparse(value)
    return out


def _kv_summary_event(line: str) -> LogEvent:
    """``max_total_num_tokens=..., max_running_requests=..., context_len=..., available_gpu_mem=...``"""
    values = {k: float(v) for k, v in _KEY_VALUE.findall(line)}
    headroom = values.get("available_gpu_mem", values.get("available_cpu_mem"))
    data: dict[str, Any] = {"kv_tokens": int(values["max_total_num_tokens"]), "source": "scheduler"}
    for key, name in (
        ("max_running_requests", "max_concurrency"),
        ("context_len", "context_len"),
        ("chunked_prefill_size", "chunked_prefill_size"),
        ("max_prefill_tokens", "max_prefill_tokens"),
    ):
        if key in values:
            data[name] = int(values[key])
    if headroom is not None:
        data["headroom_gib"] = headroom
    return LogEvent(EventKind.KV_CAPACITY, line, data)


def _kv_allocated_event(line: str) -> LogEvent | None:
    tokens = _int(_KV_TOKENS, line)
    if tokens is None:
        return None
    data: dict[str, Any] = {"kv_tokens": tokens, "source": "kv_pool"}
    sizes = _KV_SIZES.findall(line)
    if sizes:
        data["kv_gib"] = round(sum(float(gib) for _, gib in sizes), 4)
    dtype = _KV_DTYPE.search(line)
    if dtype:
        data["kv_dtype"] = dtype.group(1)
    return LogEvent(EventKind.KV_CAPACITY, line, data)


def _capture_event(line: str, m: re.Match[str]) -> LogEvent:
    stage = (m.group("stage") or "decode").lower()
    data: dict[str, Any] = {"phase": m.group("phase").lower(), "stage": "prefill" if stage == "piecewise" else stage}
    if m.group("model"):
        data["model"] = m.group("model")
    for key, pattern in (("seconds", _ELAPSED), ("gib", _MEM_USAGE), ("avail_gib", _AVAIL_MEM)):
        value = _float(pattern, line)
        if value is not None:
            data[key] = value
    bs = _CAPTURED_BS.search(line)
    if bs:
        data.update(_sizes(bs.group(1)))
    return LogEvent(EventKind.GRAPH_CAPTURE, line, data)


def _sizes(listed: str) -> dict[str, Any]:
    """``"1, 2, 4"`` → the captured batch sizes and their max (nothing for an empty list)."""
    sizes = [int(x) for x in listed.split(",") if x.strip()]
    return {"batch_sizes": sizes, "max_bs": max(sizes)} if sizes else {}


def _decode_event(line: str) -> LogEvent:
    graph = _CUDA_GRAPH.search(line)
    data: dict[str, Any] = {
        "running": _int(_RUNNING, line),
        "tokens": _int(_USED_TOKENS, line),
        "token_usage": _tightest_pool(line),
        "cuda_graph": graph.group(1) == "True" if graph else None,
        "gen_throughput": _float(_GEN_THROUGHPUT, line),
        "queue": _int(_QUEUE, line),
    }
    accept = _float(_ACCEPT_LEN, line)
    if accept is not None:
        data["accept_len"] = accept
    return LogEvent(EventKind.DECODE_BATCH, line, data)


def _tightest_pool(line: str) -> float | None:
    """The fullest device pool's usage: a hybrid model (full + SWA tokens, mamba state) runs out
    where its tightest pool does."""
    usages = [float(m.group(3)) for m in _POOL_USAGE.finditer(line)]
    return max(usages) if usages else None


def _retraction_event(line: str) -> LogEvent:
    data: dict[str, Any] = {"retracted": _int(_RETRACTED, line), "tokens_gained": _int(_TOKENS_GAINED, line)}
    ratio = _RATIO.search(line)
    if ratio:
        data["new_token_ratio_before"], data["new_token_ratio_after"] = float(ratio.group(1)), float(ratio.group(2))
    return LogEvent(EventKind.PREEMPTION, line, data)


def _too_low_event(line: str) -> LogEvent | None:
    """Startup failures that a *larger* --mem-fraction-static fixes: no room left for KV."""
    m = _WEIGHTS_LEAVE_NO_KV.search(line)
    if m:
        data: dict[str, Any] = {"memory_direction": TOO_LOW, "mem_fraction_static": float(m.group(1))}
        above = _float(_RAISE_ABOVE, line)
        if above is not None:
            data["min_fraction"] = above
        return LogEvent(EventKind.KV_INSUFFICIENT, line, data)
    if _NOT_ENOUGH.search(line):
        data = {"memory_direction": TOO_LOW}
        current = _float(_CURRENT_FRACTION, line)
        if current is not None:
            data["mem_fraction_static"] = current
        return LogEvent(EventKind.KV_INSUFFICIENT, line, data)
    if _STATE_CACHE_SMALL.search(line):
        return LogEvent(EventKind.KV_INSUFFICIENT, line, {"memory_direction": TOO_LOW, "cache": "mamba_state"})
    return None


def _too_high_event(line: str) -> LogEvent | None:
    """CUDA OOMs, which a *smaller* --mem-fraction-static (or smaller graphs) avoids.

    Graph capture happens only during startup, so its OOM is ``OOM_STARTUP`` and ends the wait
    at once. A bare CUDA OOM line does not say when it happened; it is reported as
    ``OOM_RUNTIME`` (which does not end a startup wait: SGLang kills itself within seconds) and
    :meth:`SglangAdapter.classify_failure` counts it as a startup OOM when the engine never
    became ready.
    """
    if _CAPTURE_FAILED.search(line):
        if _CUDA_OOM.search(line) or "out of memory" in line.lower():
            return LogEvent(EventKind.OOM_STARTUP, line, {"memory_direction": TOO_HIGH, "stage": "graph_capture"})
        return LogEvent(EventKind.FATAL, line, {"stage": "graph_capture"})
    if _CUDA_OOM.search(line):
        return LogEvent(EventKind.OOM_RUNTIME, line, {"memory_direction": TOO_HIGH, "stage": "unknown"})
    return None


def _invalid_args_event(line: str) -> LogEvent | None:
    m = _ARGPARSE.search(line)
    if not m:
        return None
    data: dict[str, Any] = {"message": m.group("msg").strip()}
    amb = _AMBIGUOUS.search(line)
    if amb:
        data["flag"] = amb.group(1)
        data["candidates"] = [c.strip() for c in amb.group(2).split(",")]
        change = next((c for c in FLAG_CHANGES if c.old == amb.group(1)), None)
        if change is not None:
            data["renamed_to"] = change.new
    return LogEvent(EventKind.INVALID_ARGS, line, data)


def _fatal_event(line: str) -> LogEvent | None:
    """Deaths whose line names the cause. The parent's "Received sigquit from a child process"
    is left out on purpose: it follows the child's own error line, which is the better reason,
    and the parent kills its tree at once anyway."""
    died = _DIED_AT_INIT.search(line)
    if died:
        return LogEvent(EventKind.WORKER_DIED, line, {"worker": "scheduler", "exit_code": int(died.group(1))})
    if _WATCHDOG.search(line):
        return LogEvent(EventKind.FATAL, line, {"reason": "watchdog"})
    return None


def parse_line(line: str) -> LogEvent | None:
    """Turn one SGLang log line into an event (see :meth:`SglangAdapter.parse_log_line`)."""
    # Failures first: their lines can mention graphs or KV in passing.
    for parse in (_too_low_event, _too_high_event, _invalid_args_event):
        event = parse(line)
        if event is not None:
            return event
    if _PORT_IN_USE.search(line):
        return LogEvent(EventKind.PORT_IN_USE, line)
    if _DECODE.search(line):
        return _decode_event(line)
    if _RETRACT.search(line):
        return _retraction_event(line)
    aborted = _ABORTED.search(line)
    if aborted:
        # A single request needs more KV than the pool can free: the pool is too small.
        data = {"memory_direction": TOO_LOW, "stage": "decode", "request": aborted.group(1)}
        return LogEvent(EventKind.OOM_RUNTIME, line, data)
    # Last: the final line of "Scheduler hit an exception: Traceback ..." names the cause.
    return _startup_event(line) or _fatal_event(line) or exception_event(line)


def _startup_event(line: str) -> LogEvent | None:
    server_args = _SERVER_ARGS.search(line)
    if server_args:
        args = _parse_server_args(server_args.group(1))
        return LogEvent(EventKind.NON_DEFAULT_ARGS, line, {"args": args, "resolved": True}) if args else None
    if _KV_ALLOCATED.search(line):
        return _kv_allocated_event(line)
    if _KV_SUMMARY.search(line):
        return _kv_summary_event(line)
    below = _KV_BELOW_CONTEXT.search(line)
    if below:
        data = {"kv_tokens": int(below.group(1)), "context_len": int(below.group(2)), "kv_below_context": True}
        return LogEvent(EventKind.KV_CAPACITY, line, data)
    capture = _CAPTURE.search(line)
    if capture:
        return _capture_event(line, capture)
    sizes = _CAPTURE_SIZES.search(line)
    if sizes:
        return LogEvent(EventKind.GRAPH_CAPTURE, line, {"phase": "sizes", "stage": "decode", **_sizes(sizes.group(1))})
    reduced = _REDUCED.search(line)
    if reduced:
        # SGLang clipped the requested cap to what the KV pool holds: the run used the smaller one.
        data = {"requested": int(reduced.group(1)), "used": int(reduced.group(2))}
        return LogEvent(EventKind.KV_CAPACITY, line, {"max_running_reduced": data, "max_concurrency": data["used"]})
    prefill_graph = _PREFILL_GRAPH_FAILED.search(line)
    if prefill_graph:
        # Logged with the error; whether it is fatal shows in the lines that follow.
        return LogEvent(EventKind.GRAPH_CAPTURE, line, {"phase": "failed", "stage": "prefill"})
    if _READY.search(line):
        return LogEvent(EventKind.READY, line)
    return _memory_budget_event(line) or _weights_event(line)


def _memory_budget_event(line: str) -> LogEvent | None:
    """What the memory stage predicts its edge from (``memory_budget`` "static": the fraction is
    a share of the free memory measured before the weights load)."""
    if m := _WEIGHTS_BEGIN.search(line):
        return LogEvent(EventKind.KV_CAPACITY, line, {"memory_budget": "static", "mem_free_gib": float(m[1])})
    if m := _BASELINE_USAGE.search(line):
        return LogEvent(EventKind.KV_CAPACITY, line, {"baseline_usage_gib": float(m[1])})
    return None


def _weights_event(line: str) -> LogEvent | None:
    if m := _WEIGHTS_LOADED.search(line):
        return LogEvent(EventKind.STARTUP_PHASE, line, {"phase": "weights", "seconds": float(m.group(1))})
    if m := _WEIGHTS_MAPPED.search(line):
        source = "daemon:" + m.group(1).lower().replace("-", "_")
        return LogEvent(
            EventKind.STARTUP_PHASE, line, {"phase": "weights", "seconds": float(m.group(2)), "source": source}
        )
    return None


# ---------------------------------------------------------------------------------- metrics
# ----------------------------------------------------------------------------- server info
def resolved_knobs(info: Mapping[str, Any]) -> dict[str, Any]:
    """Portable knobs as the engine resolved them (``/server_info``), auto values included.

    Args:
        info: The JSON of ``/server_info``.

    Returns:
        The knobs SGLang reported (``memory_fraction``, ``max_running``, ``batched_tokens``,
        ``context_len``, ``cuda_graph_max_bs``), plus ``kv_tokens`` and ``engine_version``.
    """
    states = info.get("internal_states")
    first = states[0] if isinstance(states, list) and states and isinstance(states[0], dict) else {}
    graph = info.get("cuda_graph_config")
    decode = graph.get("decode") if isinstance(graph, dict) else None
    graph_max_bs = decode.get("max_bs") if isinstance(decode, dict) else None
    candidates = {
        "memory_fraction": [info.get("mem_fraction_static")],
        "max_running": [first.get("effective_max_running_requests_per_dp"), info.get("max_running_requests")],
        "batched_tokens": [info.get("chunked_prefill_size")],
        "context_len": [info.get("context_length"), info.get("context_len")],
        "cuda_graph_max_bs": [info.get("cuda_graph_max_bs_decode"), info.get("cuda_graph_max_bs"), graph_max_bs],
        "kv_tokens": [info.get("max_total_num_tokens")],
        "engine_version": [info.get("version")],
    }
    return {k: next((v for v in vs if v is not None), None) for k, vs in candidates.items()}


# ---------------------------------------------------------------------------------- adapter
class SglangAdapter(EngineAdapter):
    """SGLang (``python -m sglang.launch_server``), old and new flag sets alike.

    Portable knobs resolve to the installed version's spelling; ``cuda_graph_max_bs`` becomes
    ``--cuda-graph-max-bs-decode`` from 0.5.15 and ``--cuda-graph-max-bs`` before (a deprecated
    alias from 0.5.15, removed in 0.5.20). A raw flag
    written for the other version is refused before launch with a one-line message naming the
    replacement; a deprecated flag is accepted with a logged warning.
    """

    name: ClassVar[str] = "sglang"
    title: ClassVar[str] = "SGLang"
    package: ClassVar[str] = "sglang"
    flag_changes: ClassVar[tuple[FlagChange, ...]] = FLAG_CHANGES
    env_prefixes: ClassVar[tuple[str, ...]] = ("SGLANG_", "SGL_")
    launch_env: ClassVar[Mapping[str, str]] = LAUNCH_ENV
    # Read from each release's help (tests/engines/data/sglang-releases): the per-phase graph flags
    # arrived in 0.5.15, the attention-DP size in 0.5.22.
    flags_since: ClassVar[Mapping[str, str]] = MappingProxyType(
        dict.fromkeys(GRAPH_FLAGS_0_5_15, "0.5.15") | {"--attn-dp-size": "0.5.22"}
    )
    default_module: ClassVar[str] = "sglang.launch_server"
    # argparse's prefix matching lets users write --tp / --dp; recorded flags are the full ones.
    parallel_flags: ClassVar[Mapping[str, tuple[str, ...]]] = MappingProxyType(
        {
            "tensor_parallel": ("--tp-size", "--tensor-parallel-size", "--tp"),
            "pipeline_parallel": ("--pp-size", "--pipeline-parallel-size", "--pp"),
            "data_parallel": ("--dp-size", "--data-parallel-size", "--dp"),
        }
    )
    #: Portable knob → flag on the newest SGLang; see ``knob_spellings`` for older versions.
    knobs: ClassVar[Mapping[str, str]] = MappingProxyType(
        {
            "memory_fraction": "--mem-fraction-static",
            "max_running": "--max-running-requests",
            "batched_tokens": "--chunked-prefill-size",
            "context_len": "--context-length",
            "cuda_graph_max_bs": NEW_FLAG_SET_MARKER,
            "block_size": "--page-size",
            "kv_cache_dtype": "--kv-cache-dtype",
            "prefix_caching": "--disable-radix-cache",  # inverted: prefix_caching=False disables it
            "enforce_eager": "--disable-decode-cuda-graph",  # with --disable-prefill-cuda-graph
            "tensor_parallel": "--tp-size",
            "pipeline_parallel": "--pp-size",
            "scheduling_policy": "--schedule-policy",
        }
    )
    #: Knobs whose flags differ between versions: alternatives, newest first. Every flag of the
    #: first alternative the installed SGLang has gets the knob's value.
    knob_spellings: ClassVar[Mapping[str, tuple[tuple[str, ...], ...]]] = MappingProxyType(
        {
            "cuda_graph_max_bs": ((NEW_FLAG_SET_MARKER,), ("--cuda-graph-max-bs",)),
            "enforce_eager": (
                ("--disable-decode-cuda-graph", "--disable-prefill-cuda-graph"),
                ("--disable-cuda-graph",),
            ),
        }
    )
    #: Knobs whose SGLang flag means the opposite (SGLang has prefix caching on by default).
    inverted_knobs: ClassVar[frozenset[str]] = frozenset({"prefix_caching"})
    image: ClassVar[ContainerImage | None] = ContainerImage("lmsysorg/sglang", "v{version}", 30000)
    container_command: ClassVar[tuple[str, ...]] = ("python3", "-m", "sglang.launch_server")
    sampled_gauges: ClassVar[Mapping[str, tuple[str, ...]]] = MappingProxyType(
        {
            "token_usage": (
                "sglang:token_usage",
                "sglang:full_token_usage",
                "sglang:swa_token_usage",
                "sglang:mamba_usage",
            ),
            "queue": ("sglang:num_queue_reqs",),
            "running": ("sglang:num_running_reqs",),
        }
    )
    #: Liveness after readiness. /health runs a real one-token generation, so a hung scheduler
    #: shows as 503 (within SGLANG_HEALTH_CHECK_TIMEOUT); it exists in every version.
    health_path: ClassVar[str] = "/health"

    def __init__(self, settings: EngineSettings):
        super().__init__(settings)
        self._warned: set[str] = set()  # deprecated flags already warned about

    def memory_semantics(self, version: str | None) -> MemorySemantics:
        note = (
            "SGLang's --mem-fraction-static is a share of the free memory measured before weights load "
            "(weights + KV pool); graphs and activations live in the rest"
        )
        return MemorySemantics(0.80, None, note)

    def weight_cache_unsupported(self, version: str | None) -> str | None:
        """The standalone daemon and ``--weight-cache-mode client`` arrived in 0.5.23."""
        if not version:
            return "SGLang's version is not known (its server did not report it)"
        if version_tuple(version) < WEIGHT_CACHE_SINCE:
            return f"SGLang {version} has no weight-cache daemon (--weight-cache-mode arrived in 0.5.23)"
        if self._daemon_prefix() is None:
            command = " ".join(self.launch_prefix())
            return f"the launch command {command!r} has no weight-cache daemon module autotune knows"
        return None

    def weight_cache_conflict(self, flags: Mapping[str, Any]) -> str | None:
        """SGLang refuses ``--weight-cache-mode`` with speculative decoding: the daemon exports no
        draft model."""
        merged = {**self.to_flags(self.settings.fixed_flags), **flags}
        if merged.get("--speculative-algorithm") is not None:
            return "SGLang maps no draft model from a weight-cache daemon (--speculative-algorithm)"
        return None

    def weight_daemon(self, flags: Mapping[str, Any], socket_dir: Path, port: int) -> WeightDaemon:
        """``python -m sglang.srt.weight_cache.daemon`` with the engine's key flags, one daemon
        per GPU of the engine, its sockets and ``.ready`` files in ``socket_dir`` (ready when
        every GPU's file is there; it serves no HTTP, so ``port`` is unused). Engines map its
        weights with ``--weight-cache-mode client`` — always mapped, never copied — and SGLang
        adds them back onto the free memory ``--mem-fraction-static`` is a share of, so the
        memory edge means what it meant without the daemon. A missing socket loads from disk."""
        merged = {**self.to_flags(self.settings.fixed_flags), **flags}
        key_flags = {f: merged[f] for f in _WEIGHT_KEY_FLAGS if merged.get(f) is not None}
        prefix = self._daemon_prefix() or []
        argv = [*prefix, "--model-path", self.settings.model, *self.render_flags(key_flags)]
        where = {
            _SOCKET_TEMPLATE_ENV: str(socket_dir / "{device_uuid}.sock"),
            _READY_TEMPLATE_ENV: str(socket_dir / "{device_uuid}.ready"),
        }
        gpus = _flag_int(merged, ("--tp-size", "--tensor-parallel-size", "--tp")) * _flag_int(
            merged, ("--pp-size", "--pipeline-parallel-size")
        )
        key = (("model", self.settings.model), *((f, str(v)) for f, v in sorted(key_flags.items())))
        return WeightDaemon(
            argv,
            {**LAUNCH_ENV, **self.settings.env, **where},
            None,
            key,
            {"--weight-cache-mode": "client"},
            "zero_copy",
            client_env=where,
            ready_check=lambda: len(list(socket_dir.glob("*.ready"))) >= gpus,
        )

    def _daemon_prefix(self) -> list[str] | None:
        """The launch command with the daemon's module: ``-m sglang.launch_server`` → ``-m
        sglang.srt.weight_cache.daemon``; the simulator's ``sglang`` → ``sglang-weight-cache``."""
        prefix = self.launch_prefix()
        if prefix[-1] == self.default_module:
            return [*prefix[:-1], _DAEMON_MODULE]
        if prefix[-2:] == ["autotune_sim", "sglang"]:
            return [*prefix[:-1], "sglang-weight-cache"]
        return None

    def served_facts(self, base_url: str) -> dict[str, Any]:
        """SGLang prints no version line: its version and resolved arguments come from
        ``/server_info`` (every release serves it, or ``/get_server_info``)."""
        try:
            info = self.resolved_args(base_url)
        except EngineError as err:
            log.warning("%s", err)
            return {}
        facts: dict[str, Any] = {}
        if info.get("version"):
            facts["engine_version"] = str(info["version"])
        knobs = {k: v for k, v in resolved_knobs(info).items() if v is not None and k != "engine_version"}
        if knobs:
            facts["resolved_knobs"] = knobs
        return facts

    # ----------------------------------------------------------------------------- flags
    def to_flags(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Portable knobs and raw flags → this version's canonical flags.

        Raises:
            InvalidFlags: a knob SGLang has no flag for, a flag spelled for another SGLang
                version, an ambiguous prefix, or two names for the same flag.
        """
        known = self.discover_flags()
        out: dict[str, Any] = {}
        origin: dict[str, str] = {}
        for key, value in params.items():
            pairs = self._knob_flags(key, value, known) if key in self.knobs else {self._raw_flag(key, known): value}
            for flag, flag_value in pairs.items():
                if flag in out:
                    raise InvalidFlags(f"{origin[flag]!r} and {key!r} both set {flag}; keep one of them")
                out[flag], origin[flag] = flag_value, key
        return out

    def offers(self, name: str, known: FlagSet) -> bool:
        """A portable knob is offered where every flag of one of its spellings is known."""
        alternatives = self.knob_spellings.get(name, ((self.flag_for(name),),))
        return any(all(flag in known for flag in flags) for flags in alternatives)

    def _knob_flags(self, knob: str, value: Any, known: FlagSet) -> dict[str, Any]:
        """The installed version's flag(s) for one knob, with the value in SGLang's sense."""
        if knob in self.inverted_knobs and value is not None:
            value = not value
        alternatives = self.knob_spellings.get(knob, ((self.knobs[knob],),))
        for flags in alternatives:
            if all(flag in known for flag in flags):
                return dict.fromkeys(flags, value)
        looked_for = ", ".join(" + ".join(flags) for flags in alternatives)
        raise InvalidFlags(
            f"the installed SGLang has no flag for knob {knob} (looked for {looked_for}); "
            "check engine.python / engine.command"
        )

    def _raw_flag(self, key: str, known: FlagSet) -> str:
        flag = next(iter(super().to_flags({key: None})))  # base rules: canonical spelling or InvalidFlags
        problem = _drift_problem(flag, known)
        if problem:
            raise InvalidFlags(problem)
        return self._expand_prefix(flag, known)

    def _expand_prefix(self, flag: str, known: FlagSet) -> str:
        """SGLang's argparse accepts unique prefixes (``--tp``); record the full flag instead."""
        if flag in known:
            return flag
        matches = sorted(f for f in known.flags if f.startswith(flag))
        if len(matches) == 1:
            log.info("%s is a prefix SGLang expands to %s; using %s", flag, matches[0], matches[0])
            return matches[0]
        if len(matches) > 1:
            raise InvalidFlags(f"{flag} is ambiguous for SGLang (it could be {', '.join(matches)}); write one of them")
        return flag  # unknown: validate_flags names the closest spelling

    def validate_flags(self, flags: Iterable[str]) -> None:
        """Refuse flags of another SGLang version or unknown ones; warn once about deprecated ones.

        Raises:
            InvalidFlags: with the renamed flag and its replacement, or the closest valid flag.
        """
        known = self.discover_flags()
        flags = list(flags)
        for flag in flags:
            problem = _drift_problem(flag, known)
            if problem:
                raise InvalidFlags(problem)
            change = _deprecation(flag, known)
            if change is not None and flag not in self._warned:
                self._warned.add(flag)
                log.warning(
                    "%s is deprecated since SGLang %s (still accepted); prefer %s",
                    flag,
                    change.since,
                    change.advice or change.new,
                )
        super().validate_flags(flags)

    # ---------------------------------------------------------------------------- launch
    def build_launch(self, flags: Mapping[str, Any], port: int) -> LaunchSpec:
        """argv: launch prefix, model, host, port, ``--enable-metrics`` (SGLang serves /metrics
        only with it), then ``engine.fixed_flags`` and ``flags`` (``flags`` win).

        Readiness is polled on ``/ready`` (cheap, 200 once warm-up succeeded; served from 0.5.20);
        a release that answers it 404 is polled on ``/health`` instead, which is 503 until warm-up.
        The port refuses connections until then, so the first answer decides.

        Raises:
            InvalidFlags: When the flags set the model, host or port (the tuner owns them).
        """
        known = self.discover_flags()
        merged = {**self.to_flags(self.settings.fixed_flags), **flags}
        for flag, why in _OWNED_FLAGS.items():
            if flag in merged:
                raise InvalidFlags(f"{flag} cannot be tuned or fixed ({why}); remove it from the flags")
        host = self.settings.host
        argv = [*self.launch_prefix(), "--model-path", self.settings.model, "--host", host, "--port", str(port)]
        if "--enable-metrics" in known and "--enable-metrics" not in merged:
            argv.append("--enable-metrics")
        argv += self.render_flags(merged)
        env = {**LAUNCH_ENV, **self.settings.env}
        return LaunchSpec(argv=argv, env=env, host=host, port=port, ready_path="/ready", ready_fallback="/health")

    # ------------------------------------------------------------------------- observing
    def parse_log_line(self, line: str) -> LogEvent | None:
        """One SGLang log line → event. Lines may carry a ``[time TPn]`` prefix; it is ignored.

        Memory failures carry ``memory_direction``: ``too_low`` (no room for KV: raise
        ``--mem-fraction-static``) or ``too_high`` (CUDA OOM: lower it).
        """
        return parse_line(line)

    def classify_failure(self, returncode: int | None, events: list[LogEvent]) -> Outcome:
        """Outcome of a start that never became ready.

        The first memory failure decides (it is the cause; later lines are its consequences).
        A return code of -9 is SGLang killing its own tree after a child failed: a crash unless
        the log says why.
        """
        for event in events:
            if event.kind == EventKind.KV_INSUFFICIENT:
                return Outcome.KV_INSUFFICIENT
            if event.kind in (EventKind.OOM_STARTUP, EventKind.OOM_RUNTIME):
                return Outcome.KV_INSUFFICIENT if event.data.get("memory_direction") == TOO_LOW else Outcome.OOM_STARTUP
        if returncode == 2 or any(e.kind == EventKind.INVALID_ARGS for e in events):
            return Outcome.INVALID_FLAGS
        ended = (EventKind.FATAL, EventKind.WORKER_DIED, EventKind.PORT_IN_USE)
        if returncode is None and not any(e.kind in ended for e in events):
            return Outcome.STARTUP_TIMEOUT
        return Outcome.CRASH

    def resolved_args(self, base_url: str, timeout_s: float = 10.0) -> dict[str, Any]:
        """The engine's resolved arguments and scheduler info from ``/server_info``.

        Read after readiness: it holds the auto values SGLang picked (``mem_fraction_static``,
        ``chunked_prefill_size`` ...), ``max_total_num_tokens`` and ``version``. Older versions
        only serve ``/get_server_info``, which is tried second.

        Raises:
            EngineError: the engine did not answer, or has neither endpoint.
        """
        key = self.api_key()
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        base = base_url.rstrip("/")
        with httpx.Client(timeout=timeout_s, headers=headers) as client:
            for path in ("/server_info", "/get_server_info"):
                try:
                    resp = client.get(base + path)
                except httpx.HTTPError as err:
                    raise EngineError(f"GET {base}{path} failed ({type(err).__name__}); is SGLang still up?") from None
                if resp.status_code == 404:
                    continue
                if resp.status_code != 200:
                    raise EngineError(f"GET {base}{path} answered {resp.status_code}; see the engine log")
                data = resp.json()
                if isinstance(data, dict):
                    return data
                raise EngineError(f"GET {base}{path} did not return a JSON object; is this SGLang?")
        raise EngineError(f"{base} has neither /server_info nor /get_server_info; is this SGLang?")

    def engine_facts(
        self, events: list[LogEvent], before: Mapping[str, float], after: Mapping[str, float]
    ) -> dict[str, Any]:
        """Facts of a served trial, named like the vLLM adapter's where they mean the same.

        Keys (absent when unknown): ``kv_tokens``, ``kv_gib``, ``max_concurrency``,
        ``context_len``, ``headroom_gib``, ``cuda_graph_max_bs``, ``graph_capture_s``,
        ``graph_gib``, ``preemptions`` (= ``retractions``: counter delta, else the sum over
        retraction warnings), ``retraction_warnings``, ``token_usage_peak``,
        ``token_usage_mean``, ``cuda_graph_false_share``, ``queue_peak``, ``running_peak``,
        ``gen_throughput_mean``, ``decode_logs``, ``cache_hit_rate``, ``prompt_tokens``,
        ``generation_tokens``, ``cached_tokens``, ``aborted_requests``, ``kv_below_context``,
        ``resolved_knobs`` (what SGLang's auto defaults resolved to; the version: :meth:`served_facts`),
        ``reduced_flags`` (``{flag: {"requested", "used"}}``: a value SGLang lowered at start-up),
        ``retracted_input_tokens`` (prompt tokens recomputed after retractions), ``decode_passes``
        (with ``cuda_graph_false_share`` then exact, from the per-mode pass counter),
        ``memory_budget`` / ``mem_free_gib`` / ``mem_total_gib`` (what the memory stage predicts
        its edge from; SGLang profiles no activation peak, so none is reported).
        """
        facts: dict[str, Any] = {}
        facts.update(_startup_facts(events))
        reduced = facts.pop("max_running_reduced", None)
        if reduced:
            facts["reduced_flags"] = {self.knobs["max_running"]: reduced}
        facts.update(_decode_facts([e.data for e in events if e.kind == EventKind.DECODE_BATCH]))
        facts.update(_retraction_facts(events, before, after))
        facts.update(_counter_facts(before, after))
        if "kv_tokens" not in facts:
            kv = metric_max(after, "sglang:max_total_num_tokens")
            if kv is not None:
                facts["kv_tokens"] = int(kv)
        return facts


def _flag_int(flags: Mapping[str, Any], names: Iterable[str]) -> int:
    """The first of ``names`` set in ``flags`` as an integer (1 when none is)."""
    return next((int(flags[n]) for n in names if flags.get(n) is not None), 1)


def _startup_facts(events: list[LogEvent]) -> dict[str, Any]:
    """KV capacity, real headroom and graph coverage from the startup log (last value wins)."""
    facts: dict[str, Any] = {}
    for event in events:
        data = event.data
        if event.kind == EventKind.KV_CAPACITY:
            facts.update({k: v for k, v in data.items() if k in _KV_FACT_KEYS})
        elif event.kind == EventKind.GRAPH_CAPTURE:
            # Releases log the decode sizes on the begin line, the end line or a line of their own.
            if data.get("stage") == "decode" and "max_bs" in data:
                facts["cuda_graph_max_bs"] = data["max_bs"]
            if data.get("phase") != "end":
                continue
            if "seconds" in data:
                facts["graph_capture_s"] = round(facts.get("graph_capture_s", 0.0) + data["seconds"], 3)
            if "gib" in data:
                facts["graph_gib"] = round(facts.get("graph_gib", 0.0) + data["gib"], 4)
        elif event.kind == EventKind.NON_DEFAULT_ARGS and data.get("resolved") and data.get("args"):
            # What SGLang's auto defaults resolved to: the baseline every gain is measured against.
            knobs = resolved_knobs(data["args"])
            facts["resolved_knobs"] = {k: v for k, v in knobs.items() if v is not None}
    return _with_total(facts)


def _with_total(facts: dict[str, Any]) -> dict[str, Any]:
    """SGLang logs no card size: the free memory before the weights plus the process's own
    baseline is what it could see (releases without the baseline line: the free memory alone)."""
    baseline = facts.pop("baseline_usage_gib", 0.0)
    if "mem_free_gib" in facts:
        facts["mem_total_gib"] = round(facts["mem_free_gib"] + baseline, 4)
    return facts


_KV_FACT_KEYS = frozenset(
    {
        "kv_tokens",
        "kv_gib",
        "max_concurrency",
        "context_len",
        "headroom_gib",
        "kv_below_context",
        "max_running_reduced",
        "memory_budget",
        "mem_free_gib",
        "baseline_usage_gib",
    }
)


def _decode_facts(decodes: list[dict[str, Any]]) -> dict[str, Any]:
    """KV pressure, graph coverage and queueing seen in the periodic decode log lines.

    Only the log gives peaks: the ``sglang:token_usage`` / ``sglang:num_queue_reqs`` gauges read
    after a run show the drained engine, not the load.
    """
    facts: dict[str, Any] = {"decode_logs": len(decodes)}
    usage = [d["token_usage"] for d in decodes if d.get("token_usage") is not None]
    graphs = [d["cuda_graph"] for d in decodes if d.get("cuda_graph") is not None]
    queues = [d["queue"] for d in decodes if d.get("queue") is not None]
    running = [d["running"] for d in decodes if d.get("running") is not None]
    gen = [d["gen_throughput"] for d in decodes if d.get("gen_throughput") is not None]
    if usage:
        facts["token_usage_peak"] = max(usage)
        facts["token_usage_mean"] = round(statistics.fmean(usage), 4)
    if graphs:
        # Batches beyond the captured max run eagerly: the share that missed the graphs.
        facts["cuda_graph_false_share"] = round(graphs.count(False) / len(graphs), 4)
    if queues:
        facts["queue_peak"] = max(queues)
    if running:
        facts["running_peak"] = max(running)
    if gen:
        facts["gen_throughput_mean"] = round(statistics.fmean(gen), 2)
    return facts


def _retraction_facts(
    events: list[LogEvent], before: Mapping[str, float], after: Mapping[str, float]
) -> dict[str, Any]:
    """Retractions are SGLang's preemptions: the counter delta when metrics exist, else the log."""
    warnings = [e for e in events if e.kind == EventKind.PREEMPTION]
    counted = counter_delta(before, after, "sglang:num_retracted_requests_total")
    from_log = sum(e.data.get("retracted") or 1 for e in warnings)
    retractions = int(counted) if counted is not None else from_log
    return {"retractions": retractions, "preemptions": retractions, "retraction_warnings": len(warnings)}


def _graph_pass_facts(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, Any]:
    """Exact CUDA-graph coverage from ``sglang:cuda_graph_passes_total{mode}``: every forward pass
    is counted, where the decode log line comes only every ``decode_log_interval`` steps."""
    passes: dict[str, float] = {}
    for labels, value in samples_named(after, "sglang:cuda_graph_passes_total"):
        start = sum(v for lb, v in samples_named(before, "sglang:cuda_graph_passes_total") if lb == labels)
        mode = labels.get("mode", "")
        passes[mode] = passes.get(mode, 0.0) + (value if value < start else value - start)
    graphed, eager = passes.get("decode_cuda_graph", 0.0), passes.get("decode_none", 0.0)
    if graphed + eager <= 0:
        return {}
    return {"cuda_graph_false_share": round(eager / (graphed + eager), 4), "decode_passes": int(graphed + eager)}


def _counter_facts(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, Any]:
    """Token counts, aborted requests, retracted (recomputed) prompt tokens, the prefix-cache hit
    rate and CUDA-graph coverage over the run."""
    facts: dict[str, Any] = _graph_pass_facts(before, after)
    for fact, name in (
        ("prompt_tokens", "sglang:prompt_tokens_total"),
        ("generation_tokens", "sglang:generation_tokens_total"),
        ("cached_tokens", "sglang:cached_tokens_total"),
        ("aborted_requests", "sglang:num_aborted_requests_total"),
        ("retracted_input_tokens", "sglang:num_retracted_input_tokens_total"),
    ):
        delta = counter_delta(before, after, name)
        if delta is not None:
            facts[fact] = int(delta)
    if facts.get("prompt_tokens") and "cached_tokens" in facts:
        facts["cache_hit_rate"] = round(facts["cached_tokens"] / facts["prompt_tokens"], 4)
    else:
        # SGLang's own gauge (a recent-window rate) when the token counters are missing.
        gauge = metric_max(after, "sglang:cache_hit_rate")
        if gauge is not None:
            facts["cache_hit_rate"] = gauge
    return facts
