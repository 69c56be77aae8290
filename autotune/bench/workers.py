"""Shard a run over worker processes, each with its own event loop, and merge what they measured.

One Python process with httpx spends about 2 ms of CPU per request and 100–150 µs per streamed
chunk in httpx/httpcore/h11 (see ``benchmarks/README.md``), so past a few thousand chunks/s a
single event loop, not the engine, sets the numbers. Like guidellm, aiperf and inference-perf,
the load generator then splits the sessions over worker processes:

* sessions go round-robin to the workers, each with its own schedule offsets, so every worker
  sees the same arrival process thinned by the worker count;
* a concurrency cap ``C`` is split into per-worker caps that sum to ``C`` (as guidellm does);
  near the cap a request may wait in one worker while another has a free slot;
* each worker builds its own requests, opens its own connections and runs its share of the
  warm-up, then reports ready; the parent picks a start time a little ahead and sends it to all,
  so every worker sleeps to the same absolute targets;
* timestamps are ``time.monotonic()`` (``CLOCK_MONOTONIC``), one clock for the whole machine, so
  the parent merges the records as if one loop had taken them; the run lasts from the common
  start to the last worker's end.

Workers are fresh interpreters (never forks: the parent may hold an event loop and threads, and
a caller's unguarded script must not be re-imported); they read their job from stdin, report
progress every 0.25 s as length-prefixed pickles on stdout, and are killed when the run fails or
is cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import struct
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from time import monotonic
from typing import Any, BinaryIO

from autotune.bench.bodies import RequestFactory, RequestShape
from autotune.bench.dispatch import Dispatcher, Shard, ShardOutcome
from autotune.bench.metrics import RequestRecord
from autotune.bench.plan import Session
from autotune.bench.stream import LiveCounters
from autotune.bench.transport import KEEPALIVE_EXPIRY_S, ClientLanes
from autotune.errors import BenchmarkError

__all__ = ["PoolWatch", "WorkerJob", "WorkerPool", "available_cpus", "make_shards", "split_concurrency"]

WORKER_COMMAND = "from autotune.bench.workers import main; main()"
START_AHEAD_S = 0.1  # the common start lies this far ahead of the "go", so every worker is asleep by then
REPORT_INTERVAL_S = 0.25
POLL_INTERVAL_S = 0.05
READY_TIMEOUT_S = 120.0  # spawning imports numpy and httpx; warm-up requests may queue on a busy engine


@dataclass(frozen=True)
class WorkerJob:
    """Everything one worker needs (picklable)."""

    shape: RequestShape
    tls: bool
    collect_text: bool
    warm_sessions: list[Session]
    warm_concurrency: int | None
    shard: Shard
    deadline_s: float
    keepalive_s: float = KEEPALIVE_EXPIRY_S  # idle-connection expiry of its clients (transport.keepalive_expiry)
    # Send finished requests with each progress report and obey a "stop" from the parent (early stop).
    report_records: bool = False


@dataclass(frozen=True)
class PoolWatch:
    """How the parent's early stop follows a sharded run: told the common start, fed every
    finished request, and asked with the live chunk count whether to stop every worker."""

    begin: Callable[[float], None]
    observe: Callable[[RequestRecord], None]
    sample: Callable[[float, int, int], None]  # (when, chunks streamed, worker index)
    should_stop: Callable[[], bool]


def split_concurrency(total: int | None, workers: int) -> list[int | None]:
    """Per-worker caps that sum to ``total`` (None stays None)."""
    if total is None:
        return [None] * workers
    return [total // workers + (i < total % workers) for i in range(workers)]


def make_shards(
    sessions: Sequence[Session],
    offsets: Sequence[float],
    workers: int,
    concurrency: int | None,
    due: Sequence[tuple[float, float | None]] | None = None,
) -> list[Shard]:
    """Deal sessions round-robin to ``workers`` shards, each with its share of the cap (and of
    the modelled due times a simulator gates, ``Shard.due``)."""
    caps = split_concurrency(concurrency, workers)
    shards = []
    for w in range(workers):
        ids = list(range(w, len(sessions), workers))
        mine = [due[i] for i in ids] if due is not None else None
        shards.append(Shard([sessions[i] for i in ids], ids, [offsets[i] for i in ids], caps[w], mine))
    return shards


def available_cpus() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


# ------------------------------------------------------------------------------------ framing
# Messages are pickled tuples, each preceded by its length: (kind, *payload).
_LEN = struct.Struct("!Q")


def _frame(message: tuple[Any, ...]) -> bytes:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _LEN.pack(len(data)) + data


def _read_frame(stream: BinaryIO) -> tuple[Any, ...]:
    head = stream.read(_LEN.size)
    if len(head) < _LEN.size:
        raise EOFError("the parent closed the pipe")
    message: tuple[Any, ...] = pickle.loads(stream.read(_LEN.unpack(head)[0]))
    return message


# --------------------------------------------------------------------------- the worker process
class _Counts:
    """Finished and failed requests of one phase, sent to the parent as progress (with the
    finished requests themselves when ``keep``)."""

    def __init__(self, keep: bool = False) -> None:
        self.done = self.failed = 0
        self.keep = keep
        self.fresh: list[RequestRecord] = []

    def add(self, record: RequestRecord) -> None:
        self.done += 1
        self.failed += not record.success
        if self.keep:
            self.fresh.append(record)

    def take(self) -> list[RequestRecord]:
        fresh, self.fresh = self.fresh, []
        return fresh


class _Channel:
    """The worker's end: frames to the parent on a private copy of stdout, from it on stdin."""

    def __init__(self) -> None:
        self._out = os.fdopen(os.dup(1), "wb")
        os.dup2(2, 1)  # anything printed by a library lands on stderr, not in the frame stream

    def send(self, *message: Any) -> None:
        self._out.write(_frame(message))
        self._out.flush()

    async def receive(self) -> tuple[Any, ...]:
        return await asyncio.to_thread(_read_frame, sys.stdin.buffer)


async def _report(channel: _Channel, counts: _Counts, live: LiveCounters) -> None:
    while True:
        await asyncio.sleep(REPORT_INTERVAL_S)
        channel.send("progress", counts.done, counts.failed, live.token_chunks, counts.take(), live.now())


def _listen_for_stop(stop: asyncio.Event) -> None:
    """Set ``stop`` when the parent says "stop". A daemon thread reads stdin, so a worker whose
    run ended on its own exits without waiting for a message that never comes."""
    loop = asyncio.get_running_loop()

    def read() -> None:
        with contextlib.suppress(EOFError, OSError, RuntimeError):  # RuntimeError: the run already ended
            if _read_frame(sys.stdin.buffer)[0] == "stop":
                loop.call_soon_threadsafe(stop.set)

    threading.Thread(target=read, name="stop-listener", daemon=True).start()


async def _work(channel: _Channel, job: WorkerJob) -> None:
    lanes = ClientLanes(job.shape.timeout_s, tls=job.tls, keepalive_expiry_s=job.keepalive_s)
    live, measured = LiveCounters(), _Counts(keep=job.report_records)
    dispatcher = Dispatcher(RequestFactory(job.shape), lanes, live, measured.add, job.collect_text)
    try:
        warm_failed = await dispatcher.warmup(job.warm_sessions, job.warm_concurrency)
        prepared = dispatcher.prepare(job.shard)
        channel.send("ready", warm_failed)
        message = await channel.receive()
        if message[0] != "go":
            return
        stop = asyncio.Event() if job.report_records else None
        if stop is not None:
            _listen_for_stop(stop)
        reporter = asyncio.create_task(_report(channel, measured, live))
        try:
            outcome = await dispatcher.run(prepared, message[1], job.deadline_s, stop)
        finally:
            reporter.cancel()
        channel.send("progress", measured.done, measured.failed, live.token_chunks, measured.take(), live.now())
        channel.send("done", outcome)
    finally:
        await lanes.aclose()


def main() -> None:
    """Entry point of a worker process (``WORKER_COMMAND``): read the job from stdin, report on stdout."""
    channel = _Channel()
    try:
        job = _read_frame(sys.stdin.buffer)[1]
        asyncio.run(_work(channel, job))
    except BaseException as err:  # report anything, then exit: the parent turns it into a BenchmarkError
        with contextlib.suppress(OSError):
            channel.send("error", f"{type(err).__name__}: {err}")
        raise SystemExit(1) from None


# ---------------------------------------------------------------------------------- the parent
@dataclass
class _Worker:
    process: asyncio.subprocess.Process
    messages: asyncio.Queue[tuple[Any, ...]]
    reader: asyncio.Task[None]
    outcome: ShardOutcome | None = None
    progress: tuple[int, int, int] = (0, 0, 0)
    fresh: list[RequestRecord] = field(default_factory=list)  # finished requests not yet passed on
    counted: list[tuple[float, int]] = field(default_factory=list)  # (when, chunks streamed) not yet passed on


ProgressFn = Callable[[int, int, int], None]


async def _read_messages(stdout: asyncio.StreamReader, queue: asyncio.Queue[tuple[Any, ...]]) -> None:
    try:
        while True:
            head = await stdout.readexactly(_LEN.size)
            await queue.put(pickle.loads(await stdout.readexactly(_LEN.unpack(head)[0])))
    except asyncio.IncompleteReadError:
        await queue.put(("exit",))


def _child_env() -> dict[str, str]:
    """The parent's environment, with this checkout importable (it may run from a source tree)."""
    root = str(Path(__file__).resolve().parents[2])
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else "")}


class WorkerPool:
    """Worker processes for one run: start (spawn, warm up), then run from a common start time.

    Workers are fresh interpreters (``python -c WORKER_COMMAND``), never forks: the parent
    may hold an event loop and threads, and a caller's script is never re-imported. Use as an
    async context manager; leaving it kills any worker still alive.
    """

    def __init__(self, jobs: Sequence[WorkerJob]) -> None:
        self._jobs = list(jobs)
        self._workers: list[_Worker] = []

    async def __aenter__(self) -> WorkerPool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        for w in self._workers:
            if w.process.returncode is None:
                w.process.kill()
            await w.process.wait()
            w.reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await w.reader
        self._workers.clear()

    async def start(self) -> int:
        """Spawn the workers and wait until each warmed up; return the failed warm-up requests."""
        for job in self._jobs:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                WORKER_COMMAND,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                env=_child_env(),
            )
            assert process.stdin is not None and process.stdout is not None
            queue: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()
            reader = asyncio.create_task(_read_messages(process.stdout, queue))
            self._workers.append(_Worker(process, queue, reader))
            process.stdin.write(_frame(("job", job)))
        for w in self._workers:
            assert w.process.stdin is not None
            await w.process.stdin.drain()
        ready = await asyncio.gather(*(self._expect(w, "ready", READY_TIMEOUT_S) for w in self._workers))
        return sum(int(m[1]) for m in ready)

    async def _expect(self, w: _Worker, kind: str, timeout_s: float) -> tuple[Any, ...]:
        try:
            async with asyncio.timeout(timeout_s):
                while True:
                    message = self._handle(w, await w.messages.get())
                    if message[0] == kind:
                        return message
        except TimeoutError:
            raise BenchmarkError(f"a load-generator worker did not report {kind} within {timeout_s:g} s") from None

    def _handle(self, w: _Worker, message: tuple[Any, ...]) -> tuple[Any, ...]:
        """Record progress and outcomes; a failing or vanished worker is a BenchmarkError."""
        if message[0] == "error":
            raise BenchmarkError(f"a load-generator worker failed: {message[1]}")
        if message[0] == "exit" and w.outcome is None:
            raise BenchmarkError("a load-generator worker exited without a result; see its stderr above")
        if message[0] == "progress":
            w.progress = (message[1], message[2], message[3])
            w.fresh.extend(message[4])
            w.counted.append((message[5], message[3]))
        elif message[0] == "done":
            w.outcome = message[1]
        return message

    async def run(
        self, on_progress: ProgressFn | None = None, watch: PoolWatch | None = None
    ) -> tuple[float, list[ShardOutcome]]:
        """Start every worker's run at one monotonic time; return it and each worker's outcome.
        ``watch`` (jobs with ``report_records``) may stop every worker early."""
        t0 = monotonic() + START_AHEAD_S
        await self._send_all(("go", t0))
        if watch is not None:
            watch.begin(t0)
        stopping = False
        while any(w.outcome is None for w in self._workers):
            for w in self._workers:
                while not w.messages.empty():
                    self._handle(w, w.messages.get_nowait())
            totals = [sum(col) for col in zip(*(w.progress for w in self._workers), strict=True)]
            if on_progress is not None:
                on_progress(*totals)
            if watch is not None and not stopping:
                stopping = self._pass_on(watch)
                if stopping:
                    await self._send_all(("stop",))
            await asyncio.sleep(POLL_INTERVAL_S)
        return t0, [w.outcome for w in self._workers if w.outcome is not None]

    def _pass_on(self, watch: PoolWatch) -> bool:
        """Feed the finished requests and each worker's chunk counts to ``watch``; whether it says stop."""
        for i, w in enumerate(self._workers):
            for record in w.fresh:
                watch.observe(record)
            for at, chunks in w.counted:
                watch.sample(at, chunks, i)
            w.fresh.clear()
            w.counted.clear()
        return watch.should_stop()

    async def _send_all(self, message: tuple[Any, ...]) -> None:
        for w in self._workers:
            assert w.process.stdin is not None
            if w.outcome is None:  # a worker that is done reads nothing more
                w.process.stdin.write(_frame(message))
                with contextlib.suppress(ConnectionError):
                    await w.process.stdin.drain()
