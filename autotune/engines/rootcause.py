"""The root cause of a failed trial, read from the engine's log events.

An engine that dies prints many lines, most of them consequences: vLLM's API server says
``Engine core initialization failed. See root cause above`` and ``EngineCore encountered an
issue``; SGLang's launcher says ``It usually means the child failed``. None of those names a
cause or a knob. This module picks the line that does, in a fixed order of specificity
(:data:`_PRIORITY`), and attaches the knob it points to and a one-line hint.

It also gives each cause a *signature* — the cause with pids, timestamps and numbers blanked —
so the study can tell that two trials with different flags died of the same thing.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from autotune.engines.base import EventKind, LogEvent

__all__ = ["UNTUNED_KINDS", "RootCause", "exception_event", "root_cause", "signal_name", "worker_died_text"]

# "(EngineCore pid=4383) ERROR 12-04 17:19:33 [core.py:1512] " (vLLM) or "[2026-06-20 10:00:19 TP0] "
# (SGLang): the part of a line that changes between two runs of the same failure.
_LOG_PREFIX = re.compile(
    r"^(?:\(\w+ pid=\d+\)\s*)?(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+[\d-]+\s+[\d:.]+\s+\[[^\]]*\]\s*)?"
    r"(?:\[[\d-]+ [\d:.]+[^\]]*\]\s*)?"
)
_EXCEPTION = re.compile(r"^(?P<type>(?:[A-Za-z_]\w*\.)*\w*(?:Error|Exception)): (?P<message>.*\S)")
# Exception lines that only say the engine is gone; the cause was printed before them.
_WRAPPERS = re.compile(
    r"Engine core initialization failed|EngineCore encountered an issue|EngineDeadError"
    r"|^RuntimeError: cancelled$|It usually means (?:one|the) child failed|See root cause above"
)
_VARIABLE = re.compile(r"0x[0-9a-f]+|\d+(?:\.\d+)?")

# Most specific first. A worker killed by a signal outranks an exception line: what follows a
# killed worker is the executor's own "cancelled" / broken-pipe errors.
_PRIORITY = (
    EventKind.KV_INSUFFICIENT,
    EventKind.OOM_STARTUP,
    EventKind.OOM_RUNTIME,
    EventKind.INVALID_ARGS,
    EventKind.PORT_IN_USE,
)

# Causes no tuned knob points to: when launches with different flags share one, the engine fails
# whatever the flags are. Memory failures are left out on purpose: the memory stage makes them.
UNTUNED_KINDS = frozenset({"worker_died", "exception", "fatal"})

# (knob, hint) per kind of cause. Knobs are the portable names of autotune's search spaces.
_HINTS: dict[str, tuple[str | None, str]] = {
    "kv_insufficient": (
        "memory_fraction",
        "the KV pool cannot hold one request: raise memory_fraction or lower context_len",
    ),
    "oom_startup": (
        "memory_fraction",
        "lower memory_fraction, or batched_tokens / cuda_graph_max_bs that size the activations",
    ),
    "oom_runtime": ("memory_fraction", "the peak under load did not fit: lower memory_fraction or max_running"),
    "invalid_args": (None, "the engine refused a flag value: fix the flag named in the line"),
    "port_in_use": (None, "another process took the port: transient, the trial is retried on a new port"),
    "worker_killed": (
        "memory_fraction",
        "SIGKILL usually comes from the OS out-of-memory killer: lower memory_fraction or max_running",
    ),
    "worker_died": (
        None,
        "the engine's worker process died: this points at the engine build, the model dtype or the request "
        "shape rather than a tuned knob; try another dtype (--fixed dtype=float32), a different workload "
        "shape or another engine version",
    ),
    "exception": (None, "the engine raised an error: read the line, then engine.log"),
    "fatal": (None, "the engine said it is dead: read engine.log for the line before"),
}


@dataclass(frozen=True)
class RootCause:
    """Why a trial failed, as the engine said it.

    Attributes:
        line: The engine's own line (log prefix removed), or the tuner's reason when the log
            named none.
        kind: What kind of cause (``kv_insufficient``, ``worker_died``, ``exception``, ...).
        knob: The portable knob it points to, when one does.
        hint: One line on what to change.
        signature: ``kind`` and ``line`` with numbers blanked: equal for the same failure in two runs.
        from_log: False when no log line named the cause (then the failure may be transient).
    """

    line: str
    kind: str
    knob: str | None
    hint: str
    signature: str
    from_log: bool

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def signal_name(exit_code: int | None) -> str | None:
    """``-4`` → ``"SIGILL"``: a negative exit code is the signal that killed a process."""
    if exit_code is None or exit_code >= 0:
        return None
    try:
        return signal.Signals(-exit_code).name
    except ValueError:
        return f"signal {-exit_code}"


def worker_died_text(worker: str, exit_code: int | None) -> str:
    """One readable line for a dead worker, e.g. ``worker VllmWorker-0 died: SIGILL (exit code -4)``."""
    sig = signal_name(exit_code)
    if sig is not None:
        what = f"{sig} (exit code {exit_code})"
        if sig == "SIGILL":
            what += ", an illegal instruction: the kernel for this dtype/CPU"
    else:
        what = "exit code unknown" if exit_code is None else f"exit code {exit_code}"
    return f"worker {worker} died: {what}"


def strip_prefix(line: str) -> str:
    return _LOG_PREFIX.sub("", line.strip(), count=1)


def exception_event(line: str) -> LogEvent | None:
    """An exception line (``ValueError: ...``) that is not one of the known wrapper lines."""
    text = strip_prefix(line)
    match = _EXCEPTION.match(text)
    if match is None or _WRAPPERS.search(text):
        return None
    return LogEvent(EventKind.EXCEPTION, line, {"type": match.group("type"), "message": match.group("message")})


def _pick(events: Sequence[LogEvent]) -> tuple[str, LogEvent] | None:
    for kind in _PRIORITY:
        event = next((e for e in events if e.kind == kind), None)  # the first: later ones are consequences
        if event is not None:
            return str(kind), event
    died = [e for e in events if e.kind == EventKind.WORKER_DIED]
    killed = next((e for e in died if signal_name(e.data.get("exit_code")) is not None), None)
    if killed is not None:
        return ("worker_killed" if killed.data.get("exit_code") == -9 else "worker_died"), killed
    exception = next((e for e in events if e.kind == EventKind.EXCEPTION), None)
    if exception is not None:
        return "exception", exception
    if died:
        return "worker_died", died[0]
    fatal = next((e for e in events if e.kind == EventKind.FATAL), None)
    return ("fatal", fatal) if fatal is not None else None


def _line(kind: str, event: LogEvent) -> str:
    if event.kind == EventKind.WORKER_DIED:
        return worker_died_text(str(event.data.get("worker", "?")), event.data.get("exit_code"))
    return strip_prefix(event.line)[:300]


def root_cause(events: Sequence[LogEvent], fallback: str, returncode: int | None = None) -> RootCause:
    """The most specific cause among ``events``; ``fallback`` (the tuner's own error) when none.

    ``returncode`` is the launched process's own exit status. When a signal ended it, a worker
    the log then reports dead with no exit code of its own, or one that exited cleanly (code 0:
    it shut down once its parent was gone), lost its parent: a consequence, so the signal (in
    ``fallback``) is the cause.
    """
    picked = _pick(events)
    orphaned = (
        picked is not None
        and returncode is not None
        and returncode < 0
        and picked[1].kind == EventKind.WORKER_DIED
        and picked[1].data.get("exit_code") in (None, 0)
    )
    if picked is None or orphaned:
        line = fallback.strip()[:300]
        return RootCause(line, "unknown", None, "", "unknown:" + _VARIABLE.sub("#", line), from_log=False)
    kind, event = picked
    line = _line(kind, event)
    knob, hint = _HINTS[kind]
    # A dead worker's exit code is "None" when the executor noticed before the process was reaped,
    # so two deaths of one cause may differ there: the worker's name is the signature.
    same = str(event.data.get("worker")) if event.kind == EventKind.WORKER_DIED else line
    return RootCause(line, kind, knob, hint, f"{kind}:{_VARIABLE.sub('#', same)}", from_log=True)


def in_flight(events: Sequence[LogEvent]) -> dict[str, Any]:
    """What the engine said it was running when it died (merged ``IN_FLIGHT`` events)."""
    out: dict[str, Any] = {}
    for event in events:
        if event.kind == EventKind.IN_FLIGHT:
            out.update(event.data)
    return out
