"""The engine core: steps the scheduler in modelled time and maps it onto the wall clock.

Each step asks the scheduler for a batch, prices it with the performance model, advances the
modelled clock by the step time (× noise), waits until the wall clock reaches that modelled
time ÷ speed-up, then commits the step and hands every sampled token to its request's sink.
Work is per step and per sampled token, never per request per wall tick.

Wall mapping: ``wall = wall0 + (t − t0) ÷ speedup``, one :class:`~autotune_sim.clock.ModelClock` for every
engine of the process (data-parallel ranks share it, so their stamps compare). Steps shorter than a
millisecond of wall time run back to back (the event loop still serves I/O between them), so a
fast-forwarded run keeps its modelled rates. When the host CPU cannot keep up — the engine is
more than ``LAG_LIMIT_S`` of wall time behind — the mapping is re-anchored and the lag is counted
(``EngineStats.wall_lag_s``) and reported: modelled time then advanced slower than the asked
speed-up, which a client that reads the modelled stamps (:mod:`autotune_sim.openai`) sees as
the achieved speed-up of its run.
"""

from __future__ import annotations

import asyncio
import random
from typing import Protocol

from autotune_sim.clock import GATE_LIMIT_S, HOLD_LIMIT_S, ModelClock
from autotune_sim.memory import Footprint, step_bytes
from autotune_sim.perf import GraphMode, PerfModel
from autotune_sim.scheduler import Batch, Scheduler, SimRequest
from autotune_sim.settings import FaultPlan
from autotune_sim.stats import EngineStats

__all__ = ["Engine", "EngineObserver", "Fatal", "TokenSink"]

LAG_LIMIT_S = 0.05
SLEEP_MIN_S = 0.001  # the event loop cannot sleep shorter than its clock resolution
YIELD_EVERY_S = 0.002  # back-to-back steps still let the server read and write this often


class TokenSink(Protocol):
    """Where a request's tokens go (an HTTP stream, a buffered response, a warm-up)."""

    def emit(self, req: SimRequest, finished: bool) -> None:
        """One more token (``req.generated`` counts it); ``finished`` on the last one."""

    def fail(self, req: SimRequest, message: str) -> None:
        """The request ends in an error (engine death, OOM abort)."""


class Fatal(Exception):
    """The engine died. ``kind`` is ``oom``, ``crash`` or ``worker`` (its worker process was killed);
    ``need``/``free`` are bytes for OOMs."""

    def __init__(self, kind: str, *, need: float = 0.0, free: float = 0.0) -> None:
        super().__init__(kind)
        self.kind, self.need, self.free = kind, need, free


class EngineObserver(Protocol):
    """The dialect's view of the engine: log lines and death."""

    def on_step(self, batch: Batch, now: float) -> None:
        """After each committed step (``now`` in modelled seconds)."""

    def on_fatal(self, fatal: Fatal) -> None:
        """The engine just died; in-flight requests are still registered."""

    def on_lag(self, lag_s: float) -> None:
        """The host CPU fell behind modelled time by ``lag_s`` wall seconds in total."""


class Engine:
    """One engine core (one data-parallel rank)."""

    def __init__(
        self,
        scheduler: Scheduler,
        perf: PerfModel,
        stats: EngineStats,
        *,
        fp: Footprint,
        headroom: float,
        noise: float,
        seed: int,
        faults: FaultPlan,
        observer: EngineObserver,
        clock: ModelClock,
        launch_factor: float = 1.0,
    ) -> None:
        self.scheduler, self.perf, self.stats = scheduler, perf, stats
        self.fp, self.headroom = fp, headroom
        self.noise, self.launch_factor = noise, launch_factor
        self.faults = faults
        self.observer = observer
        self.clock = clock
        self._rng = random.Random(seed)
        self.t = clock.now()  # modelled seconds
        self._wake = asyncio.Event()
        self.dead = False
        self.hung = False
        self._force_oom = False
        self._last_lag_report = 0.0
        self._last_yield = clock.wall()
        self._client_requests = 0

    # ----------------------------------------------------------------------------- clock
    def model_now(self) -> float:
        """The modelled time of this wall instant. While a step runs (``t`` is its end) that is the
        clock's time; an engine behind its clock is at its own time, an idle one at the clock's."""
        now = self.clock.now()
        if self.scheduler.has_work():
            return min(now, self.t)
        return max(self.t, now)

    # --------------------------------------------------------------------------- requests
    def submit(self, req: SimRequest, *, internal: bool = False, at: float | None = None) -> None:
        """Queue a request; a client's (not ``internal``) may trip a fault that counts requests.
        ``at``: its modelled arrival, when a gate held the clock for it (else: now)."""
        if self.dead:
            raise Fatal("crash")
        if not internal:
            self.clock.settle()  # a held clock's successor (a no-op when none is owed)
        idle = not self.scheduler.has_work()
        req.arrival = self.model_now() if at is None else at
        if idle:  # a busy engine takes it at its next step; an idle one wakes at its arrival
            self.t = max(self.t, req.arrival)
        self.stats.requests_total += 1
        self.scheduler.add(req)
        self._wake.set()
        if not internal:
            self._client_requests += 1
            self._count_faults(self._client_requests)

    def abort(self, req: SimRequest) -> None:
        """The client went away: stop generating and free the request's KV."""
        if not req.done:
            self.scheduler.abort(req)
            self.stats.finished["abort"] += 1

    def _count_faults(self, n: int) -> None:
        f = self.faults
        if f.hang_after_requests is not None and n >= f.hang_after_requests:
            self.hung = True
        if f.oom_after_requests is not None and n >= f.oom_after_requests:
            self._force_oom = True
        if f.crash_after_requests is not None and n >= f.crash_after_requests:
            asyncio.get_running_loop().call_soon(self.die, Fatal("crash"))
        if f.worker_dies_after_requests is not None and n >= f.worker_dies_after_requests:
            asyncio.get_running_loop().call_soon(self.die, Fatal("worker"))

    def in_flight(self) -> list[SimRequest]:
        """Every request the engine still holds (running, queued, mid-prefill)."""
        return [r for r in self.scheduler.held() if not r.done]

    def die(self, fatal: Fatal) -> None:
        """Stop the engine for good and let the dialect report it."""
        if self.dead:
            return
        self.dead = True
        self._wake.set()
        self.observer.on_fatal(fatal)

    # ------------------------------------------------------------------------------- loop
    async def run(self) -> None:
        """Step until the engine dies."""
        while not self.dead:
            if self.hung:
                await asyncio.Event().wait()  # a hung engine never steps again
            if not self.scheduler.has_work():
                await self._idle()
                continue
            if self.clock.owed:
                await self._await_successors()
                continue
            if self.clock.gated(self.t):
                await self._await_arrival()
                continue
            batch = self.scheduler.schedule(self.t)
            if batch is None:
                await self._idle()
                continue
            for req in batch.aborted:
                self._finish(req, "error", "Out of memory even after retracting all other requests")
            if not batch.items:
                self.observer.on_step(batch, self.t)
                continue
            try:
                self._check_memory(batch)
            except Fatal as fatal:
                self.die(fatal)
                return
            await self._advance(self.perf.step_time(batch.shape))
            if self.dead:
                return
            self._emit(self.scheduler.commit(batch))
            self._count_step(batch)
            self.observer.on_step(batch, self.t)

    async def _idle(self) -> None:
        self._wake.clear()
        await self._wake.wait()

    async def _await_successors(self) -> None:
        """Step no further while the clock holds for a closed-loop client's next request."""
        try:
            async with asyncio.timeout(HOLD_LIMIT_S):
                await self.clock.settled.wait()
        except TimeoutError:
            self.clock.settle(all_owed=True)  # the client sent none after all (it stopped, it failed)

    async def _await_arrival(self) -> None:
        """Start no step past a paced request that is due and has not come (the clock's gates)."""
        if not await self.clock.gate_moved(GATE_LIMIT_S):
            self.clock.drop_gates()  # the client stopped sending

    def _check_memory(self, batch: Batch) -> None:
        shape = batch.shape
        need = step_bytes(self.fp, shape.tokens, shape.sampled)
        oversized = self.faults.oom_at_batch_tokens is not None and shape.tokens >= self.faults.oom_at_batch_tokens
        if self._force_oom or oversized or need > self.headroom:
            raise Fatal("oom", need=need, free=max(0.0, self.headroom))

    async def _advance(self, dt: float) -> None:
        """Move modelled time by one step and wait for the wall clock to catch up with it.

        Steps shorter than the loop's sleep resolution run back to back; the server still gets
        the loop every ``YIELD_EVERY_S``, and its writes of those steps go out together.
        """
        dt *= self.launch_factor
        if self.noise:
            dt *= max(0.5, 1.0 + self._rng.gauss(0.0, self.noise))
        self.t += dt
        now = self.clock.wall()
        delay = self.clock.due(self.t) - now
        if delay >= SLEEP_MIN_S:
            await asyncio.sleep(delay)
            self._last_yield = self.clock.wall()
            return
        if delay < -LAG_LIMIT_S:
            self.stats.wall_lag_s += -delay
            self.clock.anchor(self.t)
            if now - self._last_lag_report > 10.0:
                self._last_lag_report = now
                self.observer.on_lag(self.stats.wall_lag_s)
        if now - self._last_yield >= YIELD_EVERY_S:
            self._last_yield = now
            await asyncio.sleep(0)

    # ----------------------------------------------------------------------------- tokens
    def _emit(self, sampled: list[SimRequest]) -> None:
        t, stats = self.t, self.stats
        observe_itl = stats.itl.observe
        finished_any = False
        for req in sampled:
            if req.first_token < 0:
                req.first_token = t
                stats.ttft.observe(t - req.arrival)
                stats.queue.observe(max(0.0, req.first_scheduled - req.arrival))
                stats.prefill_time.observe(t - req.first_scheduled)
                stats.prompt_tokens += len(req.prompt)
            else:
                observe_itl(t - req.last_token)
            req.last_token = t
            finished = req.generated >= req.output_len
            if finished:
                finished_any = True
                self._finish(req, req.finish_reason)
            sink = req.sink
            if sink is not None:
                sink.emit(req, finished)
        stats.generation_tokens += len(sampled)
        if finished_any:
            self.scheduler.prune()

    def _finish(self, req: SimRequest, reason: str, error: str | None = None) -> None:
        stats = self.stats
        self.scheduler.finish(req)
        stats.finished[reason] = stats.finished.get(reason, 0) + 1
        stats.request_preemptions.observe(req.preemptions)
        if error is not None:
            if req.sink is not None:
                req.sink.fail(req, error)
            return
        if req.successor:
            self.clock.hold(req.last_token)
        stats.e2e.observe(req.last_token - req.arrival)
        stats.decode_time.observe(req.last_token - req.first_token)
        stats.inference_time.observe(req.last_token - req.first_scheduled)
        if req.generated > 1:
            stats.tpot.observe((req.last_token - req.first_token) / (req.generated - 1))
        stats.request_prompt_tokens.observe(len(req.prompt))
        stats.request_generation_tokens.observe(req.generated)

    def _count_step(self, batch: Batch) -> None:
        shape, stats = batch.shape, self.stats
        stats.steps += 1
        stats.iteration_tokens.observe(shape.tokens)
        stats.prefill_tokens_computed += shape.tokens - shape.decode_seqs
        phase = "decode" if shape.tokens == shape.decode_seqs else "prefill"
        mode = f"{phase}_{'none' if shape.graph is GraphMode.EAGER else 'cuda_graph'}"
        stats.graph_passes[mode] = stats.graph_passes.get(mode, 0) + 1
