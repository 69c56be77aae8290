"""The load generator: drive a :class:`~autotune.config.Workload` against an OpenAI-compatible server.

A run mirrors ``vllm bench serve``: the engine's prefix cache is reset where it allows it, warm-up
requests go first (excluded), then sessions (single requests, for single-turn datasets) are
released on the precomputed arrival schedule and every request is gated by a semaphore when the
workload caps concurrency; the duration runs from the first planned dispatch to after the last
request. Each run draws fresh prompt content with the same lengths (a per-run *salt*, random, so
that runs in different processes differ too; recorded in the result), so repeats against one
engine do not hit each other's prefix cache; shared prefixes stay shared within a run. A reset of
the prefix cache that was asked for and failed is a warning in the result.

Modules: what to send in :mod:`~autotune.bench.plan` (lengths in :mod:`~autotune.bench.lengths`,
exact-length prompts in :mod:`~autotune.bench.prompts`), request bodies and histories in
:mod:`~autotune.bench.bodies`, arrivals in :mod:`~autotune.bench.arrivals`, the event-loop run in
:mod:`~autotune.bench.dispatch`, sharding over processes in :mod:`~autotune.bench.workers`,
per-request timing in :mod:`~autotune.bench.stream`, metrics in :mod:`~autotune.bench.metrics`,
the client self-check in :mod:`~autotune.bench.selfcheck`, results in :mod:`~autotune.bench.result`.

The client must not be the bottleneck, so it keeps connections alive without a cap (httpx's
default of 100 silently caps concurrency) through :class:`~autotune.bench.transport.ClientLanes`,
builds every request before the run, keeps tokenizers off the hot path, freezes the GC heap
during the run (as vLLM does), and above a few dozen concurrent streams or ~150 requests/s
shards the run over worker processes (:func:`auto_workers`). It then checks itself: a run whose
event loop lagged, whose sends fell behind the schedule, or whose loop thread was CPU-bound is
flagged ``client_limited`` with the reason and its kind (``starved``, ``cpu_bound``,
``schedule_behind``).

Against the simulator (it answers the clock probe of :mod:`autotune.bench.simclock`) the run is
measured in modelled time: the schedule is compressed by the speed-up for pacing, every time
comes from the simulator's stamps, and the result keeps the wall-clock duration and the speed-up
the simulator achieved (``BenchResult.sim_clock``).

Failures are data, each with its side (``engine``: the server answered with a failure;
``client``: the client or the transport failed), and only engine-side failures count in
``error_rate``. Idle connections are dropped before the server's keep-alive runs out, and a
request whose connection failed before any answer byte is resent once on a fresh connection
(:mod:`autotune.bench.stream`); what still fails on the client side is counted
(``failed_client``) so a caller can discard the run instead of blaming the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import resource
import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from time import monotonic

import httpx
import numpy as np

from autotune.bench.arrivals import schedule
from autotune.bench.bodies import RequestFactory, RequestShape
from autotune.bench.cache import reset_prefix_cache
from autotune.bench.dispatch import Dispatcher, Shard, ShardOutcome
from autotune.bench.earlystop import STOPPED_ERROR, EarlyStop
from autotune.bench.metrics import CLIENT, RequestRecord, compute_metrics, request_slos, workload_percentiles
from autotune.bench.plan import Plan, Session, build_plan
from autotune.bench.prompts import PromptFormat, ServerTokenizer
from autotune.bench.result import BenchProgress, BenchResult
from autotune.bench.selfcheck import ClientCheck, SimTiming, assess_client, assess_modelled_client, lag_tolerance
from autotune.bench.simclock import SimClock, due_times, probe_sim_clock
from autotune.bench.stream import LiveCounters
from autotune.bench.transport import ClientLanes, keepalive_expiry, make_client
from autotune.bench.workers import (
    START_AHEAD_S,
    PoolWatch,
    WorkerJob,
    WorkerPool,
    available_cpus,
    make_shards,
    split_concurrency,
)
from autotune.config import Workload
from autotune.errors import BenchmarkError

__all__ = [
    "BenchProgress",
    "BenchResult",
    "ClientCheck",
    "auto_workers",
    "new_salt",
    "run_workload",
    "run_workload_sync",
]

PROGRESS_INTERVAL_S = 0.25
EARLY_STOP_TICK_S = 0.1  # how often an in-process run asks its early stop whether to end
DEADLINE_GRACE_S = 30.0
WARMUP_STREAM = 1  # prompt stream of the warm-up requests: same shapes, different content
ARRIVAL_STREAM = 2  # random stream of the arrival schedule, independent of the prompts
# One worker process per this many concurrent streams or requests/s (benchmarks/README.md: one
# httpx event loop keeps its timestamps right up to a few dozen streams and ~200 requests/s).
STREAMS_PER_WORKER = 48
REQUEST_RATE_PER_WORKER = 150.0
MAX_AUTO_WORKERS = 8
EXPONENTIAL_THINK_BOUND = 10.0  # an exponential think time is bounded by this many means (deadline only)

SALT_BITS = 32


def new_salt() -> int:
    """A fresh prompt-content salt: random (from the OS), never 0 (0 is the seed's own content).

    Not a per-process counter: two runs in two processes (two ``autotune bench`` calls, a trial
    and its re-run) must not send the same texts, or the second finds them in the engine's
    prefix cache.
    """
    return 1 + secrets.randbelow(2**SALT_BITS - 1)


# ------------------------------------------------------------------------------------- helpers
def _raise_open_files_limit() -> None:
    """Each in-flight stream holds a socket; lift the soft fd limit to the hard one (as SGLang)."""
    with contextlib.suppress(ValueError, OSError):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = hard if hard != resource.RLIM_INFINITY else 65535
        if soft != resource.RLIM_INFINITY and soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def _normalize_base(base_url: str) -> str:
    base = base_url.rstrip("/")
    return base.removesuffix("/v1")


def _headers(api_key: str | None) -> dict[str, str]:
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


async def _served_model(client: httpx.AsyncClient, base: str, headers: dict[str, str]) -> str:
    url = f"{base}/v1/models"
    try:
        resp = await client.get(url, headers=headers)
    except httpx.HTTPError as err:
        raise BenchmarkError(f"cannot reach {url}: {type(err).__name__}: {err}") from None
    if resp.status_code != 200:
        raise BenchmarkError(f"{url} answered {resp.status_code}; is this an OpenAI-compatible server?")
    try:
        return str(resp.json()["data"][0]["id"])
    except (ValueError, KeyError, IndexError, TypeError):
        raise BenchmarkError(f"{url} listed no model; pass the model id explicitly") from None


def _resolve_format(w: Workload, fmt: PromptFormat | None) -> PromptFormat:
    text_only = "chat requests" if w.endpoint == "chat" else None
    if w.dataset.kind != "random":
        text_only = f"{w.dataset.kind} datasets"
    if text_only is None:
        return fmt or "ids"
    if fmt == "ids":
        raise BenchmarkError(f"{text_only} need text prompts; use prompt_format='text' or omit it")
    return "text"


def _route(w: Workload) -> str:
    return "/v1/chat/completions" if w.endpoint == "chat" else "/v1/completions"


def _peak_rate(w: Workload) -> float:
    ramp = w.arrival.ramp_up
    return max(ramp.start_rps, ramp.end_rps) if ramp is not None else w.arrival.request_rate


def _first_wave(w: Workload) -> int:
    """Requests a closed-loop run sends at once when it starts (0 for a paced run)."""
    if w.arrival.ramp_up is not None or not math.isinf(w.arrival.request_rate):
        return 0
    return min(w.arrival.concurrency or w.num_prompts, w.num_prompts)


def _gated(w: Workload) -> bool:
    """Whether a simulator admits this run's requests at their modelled due times: a paced run
    without a concurrency cap (under a cap a request also waits for a slot, which only the
    server's own progress frees)."""
    return _first_wave(w) == 0 and w.arrival.concurrency is None


def auto_workers(w: Workload, cpus: int) -> int:
    """Worker processes for a run: one per ``STREAMS_PER_WORKER`` concurrent streams (the cap, or
    every session when all start at once) or per ``REQUEST_RATE_PER_WORKER`` requests/s, at most
    one per CPU and ``MAX_AUTO_WORKERS``."""
    rate = _peak_rate(w)
    in_flight = w.arrival.concurrency or (w.num_prompts if math.isinf(rate) else 0)
    need = math.ceil(in_flight / STREAMS_PER_WORKER)
    if not math.isinf(rate):
        need = max(need, math.ceil(rate / REQUEST_RATE_PER_WORKER))
    return max(1, min(cpus, MAX_AUTO_WORKERS, need))


def _default_deadline(w: Workload, span_s: float, turns: int) -> float:
    """An outer bound no legitimate run reaches: the arrival span plus, per wave of
    ``concurrency`` sessions, one request timeout and one think time per turn. It catches a stuck
    client, not a slow server."""
    waves = math.ceil(w.num_prompts / (w.arrival.concurrency or w.num_prompts))
    d = w.dataset
    think = d.think_time_s * (EXPONENTIAL_THINK_BOUND if d.think_time == "exponential" else 1.0)
    return span_s + waves * turns * (w.request_timeout_s + think) + DEADLINE_GRACE_S


class _Progress:
    """Counts finished requests of one phase and calls the user's callback, throttled."""

    def __init__(self, phase: str, total: int, callback: Callable[[BenchProgress], None] | None):
        self.phase, self.total, self.callback = phase, total, callback
        self.completed = self.failed = self.chunks = 0
        self.start = self.last_call = monotonic()

    def done(self, record: RequestRecord) -> None:
        self.completed += 1
        self.failed += not record.success
        self.chunks += record.n_chunks
        self._maybe_call()

    def set(self, completed: int, failed: int, chunks: int) -> None:
        self.completed, self.failed, self.chunks = completed, failed, chunks
        self._maybe_call()

    def _maybe_call(self) -> None:
        now = monotonic()
        if self.callback is not None and now - self.last_call >= PROGRESS_INTERVAL_S:
            self.last_call = now
            self.callback(self.snapshot(now))

    def snapshot(self, now: float | None = None) -> BenchProgress:
        elapsed = (now or monotonic()) - self.start
        rate = self.chunks / elapsed if elapsed > 0 else 0.0
        return BenchProgress(self.phase, self.completed, self.failed, self.total, elapsed, rate)

    def finish(self) -> None:
        if self.callback is not None:
            self.callback(self.snapshot())


# ------------------------------------------------------------------------------------- the run
@dataclass
class _Measured:
    records: list[RequestRecord]
    duration_s: float
    deadline_hit: bool
    client: ClientCheck
    warmup_failed: int
    workers: int
    cpu_s: float
    stopped: bool = False
    sim_clock: dict[str, float] | None = None


@dataclass
class _RunSpec:
    """Everything the measured phase needs, whoever runs it."""

    workload: Workload
    shape: RequestShape
    tls: bool
    keepalive_s: float
    plan: Plan
    warm: Plan | None
    offsets: list[float]
    deadline_s: float
    on_progress: Callable[[BenchProgress], None] | None
    early_stop: EarlyStop | None = None
    sim: SimClock | None = None  # the server is the simulator: times are modelled
    probe_clock: Callable[[], Awaitable[SimClock | None]] | None = None
    due: list[tuple[float, float | None]] | None = None  # a paced simulated run's gated arrivals

    async def anchor_clock(self) -> None:
        """Re-read the simulator's clock right before the measured phase (it may have re-anchored
        during the warm-up)."""
        if self.probe_clock is not None:
            self.sim = await self.probe_clock() or self.sim

    def run_time(self, wall: float) -> float:
        """The run's time of monotonic instant ``wall``: modelled against the simulator."""
        return self.sim.modelled(wall) if self.sim is not None else wall

    @property
    def collect_text(self) -> bool:
        return any(len(s.turns) > 1 for s in self.plan.sessions)

    @property
    def warm_sessions(self) -> list[Session]:
        return self.warm.sessions if self.warm is not None else []

    def begin_watch(self, t0: float) -> None:
        if self.early_stop is not None:
            self.early_stop.begin(self.run_time(t0), [t.output_len for s in self.plan.sessions for t in s.turns])


def _observed(done: Callable[[RequestRecord], None], watch: EarlyStop | None) -> Callable[[RequestRecord], None]:
    """``done``, and the early stop told of every finished request."""
    if watch is None:
        return done

    def both(record: RequestRecord) -> None:
        done(record)
        watch.observe(record)

    return both


async def _watch_run(watch: EarlyStop, live: LiveCounters, stop: asyncio.Event) -> None:
    """Ask the early stop, every tick, whether the run may end; set ``stop`` when it may."""
    while watch.tick(live.now(), live.token_chunks) is None:
        await asyncio.sleep(EARLY_STOP_TICK_S)
    stop.set()


def _merge(outcomes: Sequence[ShardOutcome], plan: Plan) -> list[RequestRecord]:
    """All records in (session, turn) order."""
    first = np.cumsum([0] + [len(s.turns) for s in plan.sessions]).tolist()
    merged: list[RequestRecord | None] = [None] * plan.num_requests
    for outcome in outcomes:
        for r in outcome.records:
            merged[first[r.session] + r.turn] = r
    assert all(r is not None for r in merged)
    return [r for r in merged if r is not None]


def _durations(
    spec: _RunSpec, t0: float, records: Sequence[RequestRecord], outcomes: Sequence[ShardOutcome]
) -> tuple[float, dict[str, float] | None]:
    """The run's duration (modelled against the simulator) and, for a simulated run, its clock:
    asked and achieved speed-up (modelled time to the last token over the wall time to its
    arrival), wall-clock duration."""
    wall = max((o.end for o in outcomes), default=t0) - t0
    if spec.sim is None:
        return wall, None
    last = max((o.model_end for o in outcomes), default=0.0)
    start = spec.sim.modelled(t0)
    # Without a single stamp (nothing was served) the clock mapping is the only estimate.
    modelled = last - start if last > start else wall * spec.sim.speedup
    to_last = max((r.wall_end_time for r in records), default=0.0) - t0
    achieved = (last - start) / to_last if last > start and to_last > 0 else spec.sim.speedup
    return modelled, {"speedup": spec.sim.speedup, "achieved_speedup": achieved, "wall_duration_s": wall}


def _check(
    spec: _RunSpec,
    t0: float,
    records: Sequence[RequestRecord],
    outcomes: Sequence[ShardOutcome],
    duration: tuple[float, dict[str, float] | None],
) -> ClientCheck:
    # Each worker runs its own loop: the busiest one decides whether the client kept up.
    cpu_share = max(o.cpu_s / max(o.end - t0, 1e-9) for o in outcomes)
    lags = [r.schedule_lag for r in records if r.sent_time]
    loop_lags = [lag for o in outcomes for lag in o.loop_lags]
    w = spec.workload
    paced = not math.isinf(w.arrival.request_rate) or w.arrival.ramp_up is not None
    seconds, clock = duration
    tolerance = lag_tolerance(w.slos, latency_judged=w.judges_latency, duration_s=seconds)
    if clock is None:
        return assess_client(cpu_share, lags, loop_lags, paced, tolerance)
    held = w.arrival.concurrency is not None
    sim = SimTiming(clock["speedup"], clock["achieved_speedup"], held=held, gated=spec.due is not None)
    return assess_modelled_client(cpu_share, lags, loop_lags, paced, tolerance, sim)


async def _measure_inline(spec: _RunSpec, lanes: ClientLanes) -> _Measured:
    """The whole run in this event loop."""
    w, live = spec.workload, LiveCounters()
    measure = _Progress("measure", spec.plan.num_requests, spec.on_progress)
    on_done = _observed(measure.done, spec.early_stop)
    dispatcher = Dispatcher(RequestFactory(spec.shape), lanes, live, on_done, spec.collect_text)
    warm_failed = 0
    if spec.warm is not None:
        warm = _Progress("warmup", spec.warm.num_requests, spec.on_progress)
        warm_failed = await dispatcher.warmup(spec.warm.sessions, w.arrival.concurrency, warm.done)
        warm.finish()
    n = len(spec.plan.sessions)
    shard = Shard(spec.plan.sessions, list(range(n)), spec.offsets, w.arrival.concurrency, spec.due)
    prepared = dispatcher.prepare(shard)
    await spec.anchor_clock()
    # The start lies a little ahead, as a sharded run's does: the GC freeze and the set-up of the
    # run's loop happen before it, not as a late first send.
    measure.start = t0 = monotonic() + START_AHEAD_S
    spec.begin_watch(t0)
    stop = asyncio.Event() if spec.early_stop is not None else None
    watcher = asyncio.create_task(_watch_run(spec.early_stop, live, stop)) if spec.early_stop and stop else None
    try:
        outcome = await dispatcher.run(prepared, t0, spec.deadline_s, stop)
    finally:
        if watcher is not None:
            watcher.cancel()
    measure.finish()
    records = _merge([outcome], spec.plan)
    duration = _durations(spec, t0, records, [outcome])
    check = _check(spec, t0, records, [outcome], duration)
    m = _Measured(records, duration[0], outcome.deadline_hit, check, warm_failed, 1, outcome.cpu_s)
    m.stopped, m.sim_clock = outcome.stopped, duration[1]
    return m


async def _measure_sharded(spec: _RunSpec, workers: int) -> _Measured:
    """The run split over ``workers`` processes (see :mod:`autotune.bench.workers`)."""
    w = spec.workload
    shards = make_shards(spec.plan.sessions, spec.offsets, workers, w.arrival.concurrency, spec.due)
    warm = spec.warm_sessions
    warm_caps = split_concurrency(w.arrival.concurrency, workers)
    jobs = [
        WorkerJob(
            spec.shape,
            spec.tls,
            spec.collect_text,
            warm[i::workers],
            warm_caps[i],
            shard,
            spec.deadline_s,
            spec.keepalive_s,
            report_records=spec.early_stop is not None,
        )
        for i, shard in enumerate(shards)
    ]
    async with WorkerPool(jobs) as pool:
        warm_progress = _Progress("warmup", len(warm), spec.on_progress)
        warm_failed = await pool.start()
        warm_progress.set(len(warm), warm_failed, 0)
        warm_progress.finish()
        measure = _Progress("measure", spec.plan.num_requests, spec.on_progress)
        await spec.anchor_clock()
        t0, outcomes = await pool.run(measure.set, _pool_watch(spec))
        measure.set(spec.plan.num_requests, sum(not r.success for o in outcomes for r in o.records), measure.chunks)
        measure.finish()
    records = _merge(outcomes, spec.plan)
    duration = _durations(spec, t0, records, outcomes)
    check = _check(spec, t0, records, outcomes, duration)
    hit = any(o.deadline_hit for o in outcomes)
    cpu = sum(o.cpu_s for o in outcomes)
    stopped = any(o.stopped for o in outcomes)
    return _Measured(records, duration[0], hit, check, warm_failed, workers, cpu, stopped, duration[1])


def _pool_watch(spec: _RunSpec) -> PoolWatch | None:
    """The early stop as the worker pool consults it: the measured start, finished requests, ticks."""
    watch = spec.early_stop
    if watch is None:
        return None
    return PoolWatch(
        begin=spec.begin_watch,
        observe=watch.observe,
        sample=watch.sample,
        should_stop=lambda: watch.tick(monotonic()) is not None,
    )


async def run_workload(
    base_url: str,
    workload: Workload,
    *,
    model: str | None = None,
    api_key: str | None = None,
    on_progress: Callable[[BenchProgress], None] | None = None,
    client: httpx.AsyncClient | None = None,
    deadline_s: float | None = None,
    prompt_format: PromptFormat | None = None,
    workers: int | None = None,
    salt: int | None = None,
    server_keep_alive_s: float | None = None,
    early_stop: EarlyStop | None = None,
) -> BenchResult:
    """Run ``workload`` against the server at ``base_url`` and measure it.

    Args:
        base_url: Server root, e.g. ``http://127.0.0.1:8000`` (a trailing ``/v1`` is accepted).
        workload: Request shapes, arrival process, seed, timeouts, SLOs.
        model: Model id for the requests; default: the first one ``GET /v1/models`` lists.
        api_key: Sent as ``Authorization: Bearer``.
        on_progress: Called with a :class:`BenchProgress` at most every 0.25 s.
        client: Send everything through this client (e.g. one with an ``httpx.MockTransport``),
            in this process; by default requests go through
            :class:`~autotune.bench.transport.ClientLanes`.
        deadline_s: Wall-clock bound for the measured phase; unfinished requests then fail.
            Default: an outer bound derived from the arrival span and the request timeout.
        prompt_format: ``ids`` or ``text``; default ``ids`` for single-turn completions, else
            ``text`` (see :mod:`autotune.bench.prompts` for the trade-off).
        workers: Event loops (processes) to spread the run over; default :func:`auto_workers`.
        salt: Prompt-content salt; default a fresh random one per run (:func:`new_salt`) when
            the workload asks for fresh prompts, else 0 (the seed's own content, the same in
            every run). Pass one to repeat a run's exact prompts.
        server_keep_alive_s: The server's keep-alive timeout, when known (vLLM's
            ``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``); the client drops idle connections a second before
            it (:func:`~autotune.bench.transport.keepalive_expiry`). Default: the engines' 5 s.
        early_stop: Ends the measured phase once it decides the run cannot matter
            (:mod:`autotune.bench.earlystop`); the result then holds the requests finished by
            then and says why it stopped (``early_stop``).

    Returns:
        The measured result; failed requests are data in it, not exceptions.

    Each in-flight request holds a socket, so the process's soft open-files limit is raised to
    its hard limit first (SGLang's benchmark does the same).

    Raises:
        BenchmarkError: The server is unreachable, lists no model, has no ``/tokenize`` (needed
            for synthetic prompts), or a worker process failed.
    """
    fmt = _resolve_format(workload, prompt_format)
    base = _normalize_base(base_url)
    headers = _headers(api_key)
    _raise_open_files_limit()
    tls = base.startswith("https://")
    keepalive_s = keepalive_expiry(server_keep_alive_s)
    http = client or make_client(workload.request_timeout_s, verify=tls, keepalive_expiry_s=keepalive_s)
    lanes = ClientLanes(workload.request_timeout_s, shared=client, tls=tls, keepalive_expiry_s=keepalive_s)
    if salt is None:
        salt = new_salt() if workload.fresh_prompts_per_run else 0
    try:
        served = model or await _served_model(http, base, headers)
        sim = await probe_sim_clock(http, base, headers)
        reset = await reset_prefix_cache(http, base, headers) if workload.reset_prefix_cache else None
        spec = await _spec(
            http, base, served, headers, workload, fmt, salt, (tls, keepalive_s), deadline_s, on_progress, sim
        )
        spec.early_stop = early_stop
        if sim is not None:
            first_due = spec.due[0][0] if spec.due else None
            spec.probe_clock = functools.partial(
                probe_sim_clock, http, base, headers, hold=_first_wave(workload), first_due=first_due
            )
        n = 1 if client is not None else (workers or auto_workers(workload, available_cpus()))
        measured = await (_measure_inline(spec, lanes) if n == 1 else _measure_sharded(spec, n))
    finally:
        await lanes.aclose()
        if client is None:
            await http.aclose()
    return _result(workload, served, spec.plan, measured, salt, reset, early_stop)


async def _spec(
    http: httpx.AsyncClient,
    base: str,
    model: str,
    headers: dict[str, str],
    w: Workload,
    fmt: PromptFormat,
    salt: int,
    connection: tuple[bool, float],
    deadline_s: float | None,
    on_progress: Callable[[BenchProgress], None] | None,
    sim: SimClock | None,
) -> _RunSpec:
    """Build the plan, the warm-up, the schedule (in wall seconds: a simulator's is compressed by
    its speed-up) and the deadline of one run."""
    tok = ServerTokenizer(http, base, model, headers)
    plan = await build_plan(tok, w, w.num_prompts, fmt=fmt, salt=salt)
    warm = None
    if w.warmup_requests:
        warm = await build_plan(tok, w, w.warmup_requests, fmt=fmt, stream=WARMUP_STREAM, salt=salt)
    offsets = schedule(len(plan.sessions), w.arrival, np.random.default_rng([w.seed, ARRIVAL_STREAM]))
    turns = max(len(s.turns) for s in plan.sessions)
    deadline = deadline_s if deadline_s is not None else _default_deadline(w, float(offsets[-1]), turns)
    speedup = sim.speedup if sim is not None else None
    shape = RequestShape(base + _route(w), model, w.endpoint == "chat", headers, w.request_timeout_s, speedup)
    tls, keepalive_s = connection
    wall_offsets = (offsets / speedup if speedup else offsets).tolist()
    due = due_times(offsets.tolist()) if speedup and _gated(w) else None
    return _RunSpec(w, shape, tls, keepalive_s, plan, warm, wall_offsets, deadline, on_progress, sim=sim, due=due)


def _count_clamped(records: Sequence[RequestRecord]) -> int:
    return sum(r.success and r.usage_seen and r.output_tokens != r.expected_output_len for r in records)


def _count_prompt_mismatches(records: Sequence[RequestRecord]) -> int:
    return sum(
        r.success and r.usage_seen and r.expected_prompt_len > 0 and r.prompt_len != r.expected_prompt_len
        for r in records
    )


def _warnings(w: Workload, reset: str | None, records: Sequence[RequestRecord]) -> list[str]:
    """What a caller should print with the result: a prefix cache that could not be reset when the
    workload asked for it, and requests the client lost."""
    out = []
    if reset is not None and reset.startswith("failed"):
        out.append(f"prefix cache could not be reset: {reset.removeprefix('failed: ')}")
    elif reset == "unsupported" and not w.fresh_prompts_per_run:
        out.append(
            "prefix cache could not be reset (no reset route: vLLM needs VLLM_SERVER_DEV_MODE=1) and the "
            "prompts repeat across runs (fresh_prompts_per_run: false): this run may hit an earlier run's cache"
        )
    lost = [r.error for r in records if not r.success and r.failure_side == CLIENT]
    if lost:
        common = max(set(lost), key=lost.count)
        out.append(
            f"{len(lost)} request(s) failed on the client side (not counted in error_rate; the run is not "
            f"a clean measurement), e.g. {common}"
        )
    return out


def _stopped_part(m: _Measured) -> tuple[list[RequestRecord], list[RequestRecord]]:
    """(the requests that finished, those the early stop cut) of a run."""
    if not m.stopped:
        return m.records, []
    cut = [r for r in m.records if r.error == STOPPED_ERROR]
    return [r for r in m.records if r.error != STOPPED_ERROR], cut


def _count_cut_tokens(metrics: dict[str, float | int], cut: Sequence[RequestRecord], duration_s: float) -> None:
    """A stopped run's throughput counts the tokens the engine had already streamed to the cut
    requests: leaving them out would under-state the window's rate by what was in flight."""
    if not cut:
        return
    chunks = sum(r.n_chunks for r in cut)
    prompts = sum(r.prompt_len for r in cut if r.n_chunks)
    metrics["output_throughput"] = float(metrics["output_throughput"]) + chunks / duration_s
    metrics["total_token_throughput"] = float(metrics["total_token_throughput"]) + (chunks + prompts) / duration_s
    metrics["stopped_in_flight"] = len(cut)


def _result(
    w: Workload, model: str, plan: Plan, m: _Measured, salt: int, reset: str | None, watch: EarlyStop | None = None
) -> BenchResult:
    slos = request_slos(w.slos)
    kept, cut = _stopped_part(m)
    metrics = compute_metrics(kept, m.duration_s, percentiles=workload_percentiles(w.slos), goodput_slos=slos or None)
    _count_cut_tokens(metrics, cut, m.duration_s)
    decision = watch.decision if watch is not None and m.stopped else None
    # Chat prompts carry the template's tokens, later turns the history: no exact target there.
    single_completions = w.endpoint == "completions" and w.dataset.kind == "random"
    return BenchResult(
        metrics=metrics,
        records=kept,
        duration_s=m.duration_s,
        model=model,
        workload=w,
        prompt_format=plan.format,
        client=m.client,
        clamped_requests=_count_clamped(kept),
        prompt_len_mismatches=_count_prompt_mismatches(kept) if single_completions else 0,
        prompts_off_target=plan.off_target,
        deadline_hit=m.deadline_hit,
        warmup_failed=m.warmup_failed,
        max_model_len=plan.max_model_len,
        num_sessions=len(plan.sessions),
        salt=salt,
        prefix_cache_reset=reset,
        warnings=_warnings(w, reset, kept),
        client_workers=m.workers,
        client_cpu_s=m.cpu_s,
        early_stop=decision.to_json() if decision is not None else None,
        sim_clock=m.sim_clock,
    )


def run_workload_sync(
    base_url: str,
    workload: Workload,
    *,
    model: str | None = None,
    api_key: str | None = None,
    on_progress: Callable[[BenchProgress], None] | None = None,
    deadline_s: float | None = None,
    prompt_format: PromptFormat | None = None,
    workers: int | None = None,
    salt: int | None = None,
    early_stop: EarlyStop | None = None,
) -> BenchResult:
    """:func:`run_workload` for synchronous callers (runs its own event loop).

    Raises:
        RuntimeError: Called from inside a running event loop (await ``run_workload`` there).
        BenchmarkError: As :func:`run_workload`.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise RuntimeError("run_workload_sync was called inside an event loop; await run_workload instead")
    return asyncio.run(
        run_workload(
            base_url,
            workload,
            model=model,
            api_key=api_key,
            on_progress=on_progress,
            deadline_s=deadline_s,
            prompt_format=prompt_format,
            workers=workers,
            salt=salt,
            early_stop=early_stop,
        )
    )
