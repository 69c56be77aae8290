"""The load generator: drive a :class:`~autotune.config.Workload` against an OpenAI-compatible server.

A run mirrors ``vllm bench serve``: warm-up requests first (excluded), then one task per request
released on the precomputed arrival schedule and gated by a semaphore when the workload caps
concurrency; the duration runs from just before the first dispatch to after the last request.
Metric definitions live in :mod:`autotune.bench.metrics`, per-request timing in
:mod:`autotune.bench.stream`, prompt construction in :mod:`autotune.bench.prompts`, the client
self-check in :mod:`autotune.bench.selfcheck` and the result types in :mod:`autotune.bench.result`.

The client must not be the bottleneck, so it keeps connections alive without a cap (httpx's
default of 100 silently caps concurrency) through :class:`~autotune.bench.transport.ClientLanes`,
builds every request before the run, keeps tokenizers off the hot path, and freezes the GC heap
during the run (as vLLM does). It then checks itself: a run whose event loop lagged, whose sends
fell behind the schedule, or whose loop thread was CPU-bound is flagged ``client_limited`` with
the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import math
import resource
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from time import perf_counter

import httpx
import numpy as np

from autotune.bench.arrivals import arrival_offsets
from autotune.bench.metrics import RequestRecord, compute_metrics, request_slos, workload_percentiles
from autotune.bench.prompts import Prompt, PromptFormat, PromptSet, ServerTokenizer, build_prompts
from autotune.bench.result import BenchProgress, BenchResult
from autotune.bench.selfcheck import ClientCheck, assess_client, probe_loop
from autotune.bench.stream import LiveCounters, stream_request
from autotune.bench.transport import ClientLanes, make_client, request_timeout
from autotune.config import Workload
from autotune.errors import BenchmarkError

__all__ = [
    "BenchProgress",
    "BenchResult",
    "ClientCheck",
    "run_workload",
    "run_workload_sync",
]

PROGRESS_INTERVAL_S = 0.25
DEADLINE_GRACE_S = 30.0
WARMUP_STREAM = 1  # prompt stream of the warm-up requests: same shapes, different content
ARRIVAL_STREAM = 2  # random stream of the arrival schedule, independent of the prompts


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
    if w.endpoint == "chat":
        if fmt == "ids":
            raise BenchmarkError("chat requests need text prompts; use prompt_format='text' or omit it")
        return "text"
    return fmt or "ids"


def _body(w: Workload, model: str, prompt: Prompt) -> bytes:
    """The request body, serialized once before the run."""
    common = {
        "model": model,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
        "temperature": 0.0,  # SGLang's chat defaults come from the model's generation_config
    }
    if w.endpoint == "chat":
        body = {
            "messages": [{"role": "user", "content": prompt.prompt}],
            "max_completion_tokens": prompt.output_len,
            **common,
        }
    else:
        body = {"prompt": prompt.prompt, "max_tokens": prompt.output_len, **common}
    return json.dumps(body, separators=(",", ":")).encode()


def _route(w: Workload) -> str:
    return "/v1/chat/completions" if w.endpoint == "chat" else "/v1/completions"


def _requests(
    w: Workload, url: str, model: str, prompts: Sequence[Prompt], headers: dict[str, str]
) -> list[httpx.Request]:
    """Every request of a phase, built before it starts (URL and header handling cost CPU)."""
    timeout = {"timeout": request_timeout(w.request_timeout_s).as_dict()}
    return [
        httpx.Request("POST", url, content=_body(w, model, p), headers=headers, extensions=timeout) for p in prompts
    ]


@contextlib.contextmanager
def _frozen_gc() -> Iterator[None]:
    """vLLM freezes the GC heap before the run so collections do not stall the event loop."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


class _Progress:
    """Counts finished requests and calls the user's callback, throttled."""

    def __init__(self, phase: str, total: int, live: LiveCounters, callback: Callable[[BenchProgress], None] | None):
        self.phase, self.total, self.live, self.callback = phase, total, live, callback
        self.completed = self.failed = 0
        self.start = self.last_call = perf_counter()
        self.chunks0 = live.token_chunks

    def done(self, record: RequestRecord) -> None:
        self.completed += 1
        self.failed += not record.success
        now = perf_counter()
        if self.callback is not None and now - self.last_call >= PROGRESS_INTERVAL_S:
            self.last_call = now
            self.callback(self.snapshot(now))

    def snapshot(self, now: float | None = None) -> BenchProgress:
        elapsed = (now or perf_counter()) - self.start
        rate = (self.live.token_chunks - self.chunks0) / elapsed if elapsed > 0 else 0.0
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


class _Runner:
    """One run against one server: resolves the model, builds prompts, warms up, measures."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        lanes: ClientLanes,
        base: str,
        workload: Workload,
        headers: dict[str, str],
        on_progress: Callable[[BenchProgress], None] | None,
    ) -> None:
        self.client, self.lanes, self.base, self.w, self.headers = client, lanes, base, workload, headers
        self.on_progress = on_progress
        self.live = LiveCounters()

    async def prompts(self, model: str, fmt: PromptFormat) -> tuple[PromptSet, PromptSet | None]:
        tok = ServerTokenizer(self.client, self.base, model, self.headers)
        w = self.w
        measured = await build_prompts(tok, w.dataset, w.num_prompts, seed=w.seed, fmt=fmt)
        warm = None
        if w.warmup_requests:
            warm = await build_prompts(tok, w.dataset, w.warmup_requests, seed=w.seed, fmt=fmt, stream=WARMUP_STREAM)
        return measured, warm

    async def _send(
        self,
        request: httpx.Request,
        record: RequestRecord,
        sem: asyncio.Semaphore | None,
        arrival: float,
        progress: _Progress,
    ) -> None:
        chat = self.w.endpoint == "chat"
        async with sem or contextlib.nullcontext():
            lane = self.lanes.acquire()
            try:
                await stream_request(
                    lane, request, record, timeout_s=self.w.request_timeout_s, chat=chat, live=self.live
                )
            finally:
                self.lanes.release(lane)
        record.client_queue_time = record.start_time - arrival
        progress.done(record)

    def _semaphore(self) -> asyncio.Semaphore | None:
        c = self.w.arrival.concurrency
        return asyncio.Semaphore(c) if c else None

    async def warmup(self, requests: list[httpx.Request]) -> int:
        """Send the warm-up requests concurrently (same shapes); return how many failed."""
        records = [RequestRecord() for _ in requests]
        progress = _Progress("warmup", len(requests), self.live, self.on_progress)
        sem = self._semaphore()
        now = perf_counter()
        await asyncio.gather(*(self._send(q, r, sem, now, progress) for q, r in zip(requests, records, strict=True)))
        progress.finish()
        return sum(not r.success for r in records)

    async def _dispatch(
        self,
        start: float,
        offsets: np.ndarray,
        requests: list[httpx.Request],
        records: list[RequestRecord],
        tasks: list[asyncio.Task[None]],
        progress: _Progress,
    ) -> None:
        sem = self._semaphore()
        for offset, request, record in zip(offsets.tolist(), requests, records, strict=True):
            target = start + offset
            delay = target - perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            arrival = perf_counter()
            record.schedule_lag = arrival - target
            tasks.append(asyncio.create_task(self._send(request, record, sem, arrival, progress)))
        await asyncio.gather(*tasks)

    async def measure(
        self, requests: list[httpx.Request], records: list[RequestRecord], deadline_s: float | None
    ) -> _Measured:
        """Release the requests on the arrival schedule and wait for all of them (or the deadline)."""
        w = self.w
        rng = np.random.default_rng([w.seed, ARRIVAL_STREAM])
        offsets = arrival_offsets(len(requests), w.arrival.request_rate, w.arrival.burstiness, rng)
        deadline = deadline_s if deadline_s is not None else _default_deadline(w, float(offsets[-1]))
        progress = _Progress("measure", len(requests), self.live, self.on_progress)
        tasks: list[asyncio.Task[None]] = []
        hit = False
        with _frozen_gc():
            async with probe_loop() as probe:
                cpu0, start = time.thread_time(), perf_counter()
                try:
                    async with asyncio.timeout(deadline):
                        await self._dispatch(start, offsets, requests, records, tasks, progress)
                except TimeoutError:
                    hit = True
                    await _cancel(tasks)
                duration = perf_counter() - start
                cpu = time.thread_time() - cpu0
        progress.finish()
        if hit:
            _mark_cut(records, deadline)
        lags = [r.schedule_lag for r in records[: len(tasks)]]  # the dispatched ones
        check = assess_client(cpu / duration, lags, probe.lags, not math.isinf(w.arrival.request_rate))
        return _Measured(records, duration, hit, check)


def _default_deadline(w: Workload, span_s: float) -> float:
    """An outer bound no legitimate run reaches: the arrival span plus one request timeout per
    wave of ``concurrency`` requests. It catches a stuck client, not a slow server."""
    waves = math.ceil(w.num_prompts / (w.arrival.concurrency or w.num_prompts))
    return span_s + waves * w.request_timeout_s + DEADLINE_GRACE_S


async def _cancel(tasks: list[asyncio.Task[None]]) -> None:
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _mark_cut(records: list[RequestRecord], deadline: float) -> None:
    for r in records:
        if r.success or r.error:
            continue
        sent = "cancelled" if r.start_time else "not sent"
        r.error = f"{sent} at the run deadline ({deadline:g} s)"


def _count_clamped(records: Sequence[RequestRecord]) -> int:
    return sum(r.success and r.usage_seen and r.output_tokens != r.expected_output_len for r in records)


def _count_prompt_mismatches(records: Sequence[RequestRecord]) -> int:
    return sum(r.success and r.usage_seen and r.prompt_len != r.expected_prompt_len for r in records)


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
) -> BenchResult:
    """Run ``workload`` against the server at ``base_url`` and measure it.

    Args:
        base_url: Server root, e.g. ``http://127.0.0.1:8000`` (a trailing ``/v1`` is accepted).
        workload: Request shapes, arrival process, seed, timeouts, SLOs.
        model: Model id for the requests; default: the first one ``GET /v1/models`` lists.
        api_key: Sent as ``Authorization: Bearer``.
        on_progress: Called with a :class:`BenchProgress` at most every 0.25 s.
        client: Send everything through this client (e.g. one with an ``httpx.MockTransport``);
            by default requests go through :class:`~autotune.bench.transport.ClientLanes`.
        deadline_s: Wall-clock bound for the measured phase; unfinished requests then fail.
            Default: an outer bound derived from the arrival span and the request timeout.
        prompt_format: ``ids`` or ``text``; default ``ids`` for completions, ``text`` for chat
            (see :mod:`autotune.bench.prompts` for the trade-off).

    Returns:
        The measured result; failed requests are data in it, not exceptions.

    Each in-flight request holds a socket, so the process's soft open-files limit is raised to
    its hard limit first (SGLang's benchmark does the same).

    Raises:
        BenchmarkError: The server is unreachable, lists no model, or has no ``/tokenize``.
    """
    fmt = _resolve_format(workload, prompt_format)
    base = _normalize_base(base_url)
    headers = _headers(api_key)
    _raise_open_files_limit()
    tls = base.startswith("https://")
    http = client or make_client(workload.request_timeout_s, verify=tls)
    lanes = ClientLanes(workload.request_timeout_s, shared=client, tls=tls)
    url = base + _route(workload)
    try:
        served = model or await _served_model(http, base, headers)
        runner = _Runner(http, lanes, base, workload, headers, on_progress)
        measured_set, warm_set = await runner.prompts(served, fmt)
        warm_failed = 0
        if warm_set is not None:
            warm_failed = await runner.warmup(_requests(workload, url, served, warm_set.prompts, headers))
        requests = _requests(workload, url, served, measured_set.prompts, headers)
        records = [
            RequestRecord(prompt_len=p.prompt_len, expected_prompt_len=p.prompt_len, expected_output_len=p.output_len)
            for p in measured_set.prompts
        ]
        m = await runner.measure(requests, records, deadline_s)
    finally:
        await lanes.aclose()
        if client is None:
            await http.aclose()
    return _result(workload, served, fmt, measured_set, m, warm_failed)


def _result(w: Workload, model: str, fmt: PromptFormat, ps: PromptSet, m: _Measured, warm_failed: int) -> BenchResult:
    slos = request_slos(w.slos)
    metrics = compute_metrics(
        m.records, m.duration_s, percentiles=workload_percentiles(w.slos), goodput_slos=slos or None
    )
    # Chat prompts carry the template's tokens on top of the planned content: no exact target.
    mismatches = _count_prompt_mismatches(m.records) if w.endpoint == "completions" else 0
    return BenchResult(
        metrics=metrics,
        records=m.records,
        duration_s=m.duration_s,
        model=model,
        workload=w,
        prompt_format=fmt,
        client=m.client,
        clamped_requests=_count_clamped(m.records),
        prompt_len_mismatches=mismatches,
        prompts_off_target=ps.off_target,
        deadline_hit=m.deadline_hit,
        warmup_failed=warm_failed,
        max_model_len=ps.max_model_len,
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
        )
    )
