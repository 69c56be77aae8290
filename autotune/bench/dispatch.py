"""The measured run inside one event loop: sessions released on the arrival schedule, turns streamed.

A :class:`Dispatcher` serves an in-process run and each worker process of a sharded one
(:mod:`autotune.bench.workers`) alike. It mirrors ``vllm bench serve``: it sleeps to each
session's absolute start time, creates one task per session, and a semaphore (when the shard has
a concurrency cap) gates every request; ``client_queue_time`` is the wait for it. A later turn
leaves its think time after the previous answer's last token and carries the history; when a
turn fails, the rest of its session is not sent (and counts as failed, on the side of the turn
that failed: those requests were not served). Records are pre-built before the start, one per
turn, so a result is complete even when the deadline cuts the run short.

Against the simulator the schedule is in modelled seconds: the caller compresses the offsets by
the speed-up and a think time is compressed here (``RequestShape.sim_speedup``), so the modelled
server sees the workload's arrival process; pacing itself always follows the wall clock, and a
paced run's first turns carry their modelled due time, so the simulator admits each at its time
however late it left (``Shard.due``).

The loop's health is measured at the same time (CPU share of the loop thread, wake-up lag of a
10 ms timer, send lag against the schedule) for the client self-check.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from time import monotonic

import httpx

from autotune.bench.bodies import History, RequestFactory
from autotune.bench.earlystop import STOPPED_ERROR
from autotune.bench.metrics import CLIENT, RequestRecord
from autotune.bench.plan import Session
from autotune.bench.selfcheck import probe_loop
from autotune.bench.simclock import SUCCESSOR_HEADER, arrival_headers
from autotune.bench.stream import LiveCounters, stream_request
from autotune.bench.transport import ClientLanes

__all__ = ["Dispatcher", "Prepared", "Shard", "ShardOutcome"]


@dataclass
class Shard:
    """The part of a run one event loop serves (picklable).

    Attributes:
        sessions: Its sessions.
        session_ids: Index of each session in the whole run.
        offsets: Planned start of each session, seconds after the run's start.
        concurrency: Cap on this shard's requests in flight (None: no cap).
        due: Against the simulator, a paced run's modelled due time of each session's first
            request and of the run's next one (offsets from the run's start; None: not gated,
            see :mod:`autotune.bench.simclock`).
    """

    sessions: list[Session]
    session_ids: list[int]
    offsets: list[float]
    concurrency: int | None
    due: list[tuple[float, float | None]] | None = None


@dataclass
class ShardOutcome:
    """What one event loop measured (picklable).

    Attributes:
        records: One per turn, ordered by session then turn.
        end: Monotonic time when the last request of the shard ended (or was cut).
        model_end: The latest modelled stamp the shard saw (runs against the simulator; else 0).
        cpu_s: CPU seconds of the loop thread during the run.
        loop_lags: Wake-up lags of the 10 ms probe timer (seconds).
        deadline_hit: The run deadline cut this shard short.
        dispatched: Sessions started before the end.
        stopped: The run was stopped early (unfinished records carry ``STOPPED_ERROR``).
    """

    records: list[RequestRecord]
    end: float
    cpu_s: float
    loop_lags: list[float]
    deadline_hit: bool
    dispatched: int
    stopped: bool = False
    model_end: float = 0.0


@dataclass
class Prepared:
    """A shard with its first requests built and its records allocated, ready to start."""

    shard: Shard
    firsts: list[httpx.Request]
    records: list[list[RequestRecord]]


@contextlib.contextmanager
def _frozen_gc() -> Iterator[None]:
    """vLLM freezes the GC heap before the run so collections do not stall the event loop."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


async def _sleep_until(due: float) -> None:
    delay = due - monotonic()
    if delay > 0:
        await asyncio.sleep(delay)


def _records(session: Session, session_id: int) -> list[RequestRecord]:
    return [
        RequestRecord(
            prompt_len=t.prompt_len,
            expected_prompt_len=t.prompt_len,
            expected_output_len=t.output_len,
            session=session_id,
            turn=i,
        )
        for i, t in enumerate(session.turns)
    ]


def _mark_cut(records: Sequence[RequestRecord], deadline_s: float) -> None:
    for r in records:
        if r.success or r.error:
            continue
        sent = "cancelled" if r.sent_time else "not sent"
        r.error = f"{sent} at the run deadline ({deadline_s:g} s)"
        r.failure_side = CLIENT  # the client's own bound cut it, not an answer of the engine


def _mark_stopped(records: Sequence[RequestRecord]) -> None:
    """Requests the early stop cut: no verdict of the engine on them, so no failure of either side."""
    for r in records:
        if not (r.success or r.error):
            r.error = STOPPED_ERROR


async def _until_stopped(work: Awaitable[None], stop: asyncio.Event | None) -> bool:
    """Await ``work`` unless ``stop`` is set first; True when it was stopped (``work`` cancelled)."""
    if stop is None:
        await work
        return False
    main = asyncio.ensure_future(work)
    waiter = asyncio.ensure_future(stop.wait())
    try:
        done, _ = await asyncio.wait({main, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        if not main.done():
            main.cancel()
            await asyncio.gather(main, return_exceptions=True)
    if main in done:
        main.result()
        return False
    return True


class Dispatcher:
    """Runs sessions in the current event loop.

    Args:
        factory: Builds requests (and the history of later turns).
        lanes: Where requests are sent (one client per in-flight request).
        live: Counters shared with the progress reporter.
        on_done: Called with every finished record (successful or not).
        collect_text: Keep the streamed text (needed when sessions have more than one turn).
    """

    def __init__(
        self,
        factory: RequestFactory,
        lanes: ClientLanes,
        live: LiveCounters,
        on_done: Callable[[RequestRecord], None],
        collect_text: bool,
    ) -> None:
        self.factory, self.lanes, self.live, self.on_done = factory, lanes, live, on_done
        self.collect_text = collect_text
        self.chat = factory.shape.chat
        self.timeout_s = factory.shape.timeout_s
        # Wall seconds per modelled second of a think time (1 against a real engine).
        self.time_scale = 1.0 / (factory.shape.sim_speedup or 1.0)
        live.modelled = factory.shape.sim_speedup is not None
        self._queued = 0  # requests waiting for a concurrency slot
        self._models_url = factory.shape.url.rsplit("/v1/", 1)[0] + "/v1/models"

    def prepare(self, shard: Shard) -> Prepared:
        """Build the first request of every session and allocate the records (before the start)."""
        firsts = [self.factory.first(s.turns[0]) for s in shard.sessions]
        for request, due in zip(firsts, shard.due or (), strict=False):
            request.headers.update(arrival_headers(*due))
        records = [_records(s, sid) for s, sid in zip(shard.sessions, shard.session_ids, strict=True)]
        return Prepared(shard, firsts, records)

    async def _stream(self, request: httpx.Request, record: RequestRecord, sem: asyncio.Semaphore | None) -> str:
        texts: list[str] | None = [] if self.collect_text else None
        held = self.live.modelled and sem is not None
        self._queued += sem is not None
        async with sem or contextlib.nullcontext():
            self._queued -= sem is not None
            if held:
                # The simulator holds its clock when this request ends, until the request that
                # takes its slot arrives or the client says none will (autotune_sim.engine).
                request.headers[SUCCESSOR_HEADER] = "1"
            lane = self.lanes.acquire()
            try:
                await stream_request(
                    lane, request, record, timeout_s=self.timeout_s, chat=self.chat, live=self.live, texts=texts
                )
            finally:
                self.lanes.release(lane)
        if held and not self._queued and record.success:
            await self._release_clock()
        return "".join(texts or ())

    async def _release_clock(self) -> None:
        """No request waits for the slot just freed: tell the simulator not to hold for one."""
        lane = self.lanes.acquire()
        try:
            with contextlib.suppress(httpx.HTTPError):
                await lane.get(self._models_url, headers={**self.factory.shape.headers, SUCCESSOR_HEADER: "0"})
        finally:
            self.lanes.release(lane)

    async def _session(
        self,
        session: Session,
        first: httpx.Request,
        recs: list[RequestRecord],
        sem: asyncio.Semaphore | None,
        arrival: float,
    ) -> None:
        """One session: its turns in order, each after the previous answer plus the think time."""
        request = first
        history: History | None = None
        for i, (turn, rec) in enumerate(zip(session.turns, recs, strict=True)):
            if i:
                due = recs[i - 1].wall_end_time + session.think_s[i - 1] * self.time_scale
                await _sleep_until(due)
                arrival = monotonic()
                rec.schedule_lag = arrival - due
                assert history is not None
                request = self.factory.follow_up(history, turn)
            answer = await self._stream(request, rec, sem)
            rec.client_queue_time = rec.sent_time - rec.retry_delay_s - arrival
            self.on_done(rec)
            if not rec.success:
                self._abandon(recs[i + 1 :], rec)
                return
            if i + 1 < len(session.turns):
                history = self.factory.extend(history, turn, answer)

    def _abandon(self, rest: Sequence[RequestRecord], failed: RequestRecord) -> None:
        for r in rest:
            r.error = f"not sent: turn {failed.turn} of its session failed"
            r.failure_side = failed.failure_side
            self.on_done(r)

    def _gate(self, concurrency: int | None) -> asyncio.Semaphore | None:
        """The concurrency cap of a phase (None: no cap)."""
        self._queued = 0
        return asyncio.Semaphore(concurrency) if concurrency else None

    async def warmup(
        self,
        sessions: Sequence[Session],
        concurrency: int | None,
        on_done: Callable[[RequestRecord], None] | None = None,
    ) -> int:
        """Send the first turn of each warm-up session at once (capped); return how many failed."""
        sem = self._gate(concurrency)

        async def one(session: Session) -> bool:
            record = RequestRecord()
            await self._stream(self.factory.first(session.turns[0]), record, sem)
            if on_done is not None:
                on_done(record)
            return record.success

        done = await asyncio.gather(*(one(s) for s in sessions))
        return sum(not ok for ok in done)

    async def _dispatch(self, prep: Prepared, t0: float, tasks: list[asyncio.Task[None]]) -> None:
        sem = self._gate(prep.shard.concurrency)
        for session, offset, first, recs in zip(
            prep.shard.sessions, prep.shard.offsets, prep.firsts, prep.records, strict=True
        ):
            target = t0 + offset
            await _sleep_until(target)
            arrival = monotonic()
            recs[0].schedule_lag = arrival - target
            tasks.append(asyncio.create_task(self._session(session, first, recs, sem, arrival)))
        await asyncio.gather(*tasks)

    async def run(
        self, prep: Prepared, t0: float, deadline_s: float, stop: asyncio.Event | None = None
    ) -> ShardOutcome:
        """Release the sessions from monotonic time ``t0`` on and wait for all of them.

        Args:
            prep: From :meth:`prepare`.
            t0: The run's start (``time.monotonic()``; may lie a little in the future).
            deadline_s: Seconds after ``t0`` when unfinished requests are cancelled.
            stop: Set to end the run early: what is in flight is cancelled and left unfinished.
        """
        tasks: list[asyncio.Task[None]] = []
        hit = stopped = False
        with _frozen_gc():
            async with probe_loop() as probe:
                cpu0 = time.thread_time()
                try:
                    async with asyncio.timeout(max(0.0, t0 + deadline_s - monotonic())):
                        stopped = await _until_stopped(self._dispatch(prep, t0, tasks), stop)
                except TimeoutError:
                    hit = True
                if hit or stopped:
                    await _cancel(tasks)
                end = monotonic()
                cpu = time.thread_time() - cpu0
        flat = [r for recs in prep.records for r in recs]
        if stopped:
            _mark_stopped(flat)
        elif hit:
            _mark_cut(flat, deadline_s)
        return ShardOutcome(flat, end, cpu, list(probe.lags), hit, len(tasks), stopped, self.live.model_time)


async def _cancel(tasks: list[asyncio.Task[None]]) -> None:
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
