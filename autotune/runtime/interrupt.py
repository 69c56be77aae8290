"""A stop signal that cannot be lost.

SIGTERM and SIGHUP (and Ctrl-C's SIGINT, unless the process was started with it ignored) become
``KeyboardInterrupt`` in the main thread: the tuner's one teardown path, which stops the engine and
keeps the study resumable. Python runs a signal handler at the next bytecode boundary of the main
thread, and that may be inside a finalizer or a weakref callback (SQLAlchemy's class-registry
cleanup is one): an exception raised there is printed as "Exception ignored in ..." and dropped,
and the study would run on as if nothing had been asked. So after the first signal a watcher
thread checks that the main thread is handling the interrupt; when it is not (it was swallowed),
the watcher delivers it again, until the command's top level :func:`acknowledge`\\ s it.
"""

from __future__ import annotations

import _thread
import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
from typing import Any

__all__ = ["acknowledge", "install", "requested", "silence_stderr"]

RECHECK_S = 0.5  # how often the watcher looks; twice in a row without the interrupt in hand = lost

_requested = threading.Event()
_acknowledged = threading.Event()


def install() -> None:
    """Route SIGTERM, SIGHUP and (where Python handles it) SIGINT to ``KeyboardInterrupt``."""
    signals = [signal.SIGTERM, signal.SIGHUP]
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # an ignored SIGINT stays ignored
        signals.append(signal.SIGINT)
    for sig in signals:
        signal.signal(sig, _handler)


def requested() -> bool:
    """Whether a stop signal arrived: an error raised while the work unwinds from it is the stop,
    not news (an HTTP stream closed mid-cancel can raise one of its own)."""
    return _requested.is_set()


def acknowledge() -> None:
    """The top level has the interrupt in hand: stop re-delivering it."""
    _acknowledged.set()


def _handler(signum: int, frame: Any) -> None:
    # The stop's one line is the command's to print: event-loop tasks torn down by the interrupt
    # ("Task was destroyed but it is pending!") are its expected consequence, not news.
    logging.getLogger("asyncio").setLevel(logging.CRITICAL + 1)
    if not _requested.is_set():
        _requested.set()
        threading.Thread(target=_redeliver, args=(signum,), name="interrupt-watcher", daemon=True).start()
    raise KeyboardInterrupt


def _redeliver(signum: int) -> None:
    missing = 0
    while not _acknowledged.wait(RECHECK_S):
        missing = 0 if _main_thread_has_it() else missing + 1
        if missing >= 2:  # not being handled for a whole interval: it was swallowed
            _thread.interrupt_main(signal.Signals(signum))
            missing = 0


def _main_thread_has_it() -> bool:
    """Whether the main thread is handling a KeyboardInterrupt (an ``except``, ``finally`` or
    ``__exit__`` on its way out: the teardown is under way)."""
    current: Any = sys._current_exceptions().get(threading.main_thread().ident or 0)
    if isinstance(current, tuple):  # Python < 3.12: (type, value, traceback)
        current = current[1]
    # asyncio.run takes the interrupt by cancelling its main task: a CancelledError on its way
    # out is the same teardown under way.
    return isinstance(current, (KeyboardInterrupt, asyncio.CancelledError))


def silence_stderr() -> None:
    """Nothing more on stderr after an interrupt's one line: the event loop's tasks and client
    workers it tore down would otherwise print their tracebacks. Only the real process's stream
    is closed (not a test runner's captured one)."""
    if sys.stderr is not sys.__stderr__:
        return
    with contextlib.suppress(OSError, ValueError, AttributeError):
        sys.__stderr__.flush()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)
    sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - stays open until the interpreter exits
