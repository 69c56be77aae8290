"""Client-side failures: told apart from the engine's, retried when the request never reached the server,
made rare by a keep-alive shorter than the server's; fresh prompts per run; the starved-client check."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import types
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from time import monotonic
from typing import Any

import httpcore
import httpx
import pytest
from fake_openai import FakeOpenAI
from flaky_server import FlakyServer, Mode

from autotune.bench import netbackend, transport
from autotune.bench.loadgen import BenchResult, new_salt, run_workload
from autotune.bench.metrics import RequestRecord, compute_metrics
from autotune.bench.selfcheck import LOOP_LAG_FLOOR_S, assess_client, lag_tolerance
from autotune.bench.summary import result_rows
from autotune.bench.transport import KEEPALIVE_EXPIRY_S, ClientLanes, keepalive_expiry, make_client
from autotune.config import Arrival, Dataset, Workload

BASE = "http://server:8000"
NO_RESPONSE = "Server disconnected without sending a response."


def workload(**kw: Any) -> Workload:
    base: dict[str, Any] = {
        "num_prompts": 4,
        "warmup_requests": 0,
        "dataset": Dataset(input_len=16, output_len=3),
        "arrival": Arrival(concurrency=1),
        "seed": 1,
    }
    return Workload(**{**base, **kw})


def run_fake(
    fake: FakeOpenAI, w: Workload, transport_: httpx.AsyncBaseTransport | None = None, **kw: Any
) -> BenchResult:
    async def go() -> BenchResult:
        async with httpx.AsyncClient(transport=transport_ or fake.transport()) as client:
            return await run_workload(BASE, w, client=client, **kw)

    return asyncio.run(go())


def run_real(server: FlakyServer, w: Workload, **kw: Any) -> BenchResult:
    return asyncio.run(run_workload(server.base, w, **kw))


class BeforeCompletion(httpx.AsyncBaseTransport):
    """Calls ``hook`` (synchronously, in the event loop) before each completion attempt is sent."""

    def __init__(self, inner: httpx.AsyncBaseTransport, hook: Callable[[httpx.Request], None]) -> None:
        self.inner, self.hook = inner, hook

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/completions"):
            self.hook(request)
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


# --------------------------------------------------------------------- (a) stale keep-alive retry
@pytest.mark.sim
def test_stalled_client_on_a_connection_the_server_closed_loses_no_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server closes idle connections after 1 s; before each request the client's event loop is
    blocked until the server has closed the previous request's connection (the loop cannot see the
    close: it is not running), so the pool reuses a dead connection. Every such request is resent
    once on a fresh connection, recorded as retried, and none fails."""
    with FlakyServer(idle_timeout_s=1.0) as server:

        def stall(request: httpx.Request) -> None:
            # A blocking wait inside the event loop: the client is stalled, the server's thread runs on.
            assert server.wait_completion_connections_closed(timeout_s=30.0)

        real = transport.asyncio_transport
        monkeypatch.setattr(transport, "asyncio_transport", lambda *a, **k: BeforeCompletion(real(*a, **k), stall))
        res = run_real(server, workload())

    m = res.metrics
    assert m["completed"] == 4 and m["failed"] == 0 and m["error_rate"] == 0.0
    # The first request sent found no connection to reuse; every later one found a dead one.
    by_send = sorted(res.records, key=lambda r: r.start_time)
    assert [r.retried for r in by_send] == [False, True, True, True]
    for r in by_send[1:]:
        assert r.success and r.failure_side == ""
        assert r.retry_error.startswith(("RemoteProtocolError: Server disconnected", "ReadError", "WriteError"))
        assert r.retry_delay_s >= 0.0
        assert r.client_queue_time >= 0.0  # the retry's delay is not queueing
        assert r.ttft > 0.0 and r.start_time > 0.0
    # The dead connections never delivered a request: the server read each completion once, and
    # each retry came on a connection of its own.
    assert server.completions == 4
    assert server.idle_closes >= 3
    out = res.to_json()
    assert out["retried_requests"] == 3 and out["failed_client"] == 0 and out["client_failures"] == 0
    assert sum(out["retry_samples"].values()) == 3
    assert res.warnings == []


def test_never_reached_retry_keeps_the_schedule_and_times_from_the_resend(fake: FakeOpenAI) -> None:
    """Through a mock transport: the first attempt of request 1 fails before any byte; the resend is
    timed from its own send, and the engine saw the request once."""
    attempts: list[float] = []

    async def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/completions":
            attempts.append(monotonic())
            if len(attempts) == 2:
                raise httpx.RemoteProtocolError(NO_RESPONSE)
        return await fake.handle(request)

    res = run_fake(fake, workload(), httpx.MockTransport(handle))
    assert len(attempts) == 5 and len(fake.bodies) == 4  # one resend, four answers
    (r,) = [x for x in res.records if x.retried]
    assert r.success and r.retry_error == f"RemoteProtocolError: {NO_RESPONSE}"
    # Ordered by the clock, not measured against it: the first send, the failure, the resend.
    first_send = r.start_time - r.retry_delay_s
    assert first_send <= attempts[1] <= r.start_time <= attempts[2] < r.first_token_time
    assert r.client_queue_time >= 0.0  # the failed attempt is not counted as queueing
    assert res.retried_requests == 1


def test_a_request_that_fails_twice_before_any_byte_is_a_client_failure(fake: FakeOpenAI) -> None:
    doomed: list[Any] = []  # the prompt of the first completion: every attempt of it breaks

    async def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/completions":
            prompt = json.loads(request.content)["prompt"]
            doomed[:] = doomed or [prompt]
            if prompt == doomed[0]:
                raise httpx.ReadError("[Errno 32] Broken pipe")
        return await fake.handle(request)

    res = run_fake(fake, workload(), httpx.MockTransport(handle))
    (bad,) = [r for r in res.records if not r.success]
    assert bad.retried and bad.failure_side == "client"
    assert bad.error == bad.retry_error == "ReadError: [Errno 32] Broken pipe"
    assert len(fake.bodies) == 3  # the failing request never reached the (fake) engine
    m = res.metrics
    assert m["failed"] == 1 and m["failed_client"] == 1 and m["failed_engine"] == 0
    assert m["error_rate"] == 0.0  # a request the client lost says nothing about the engine
    out = res.to_json()
    assert out["client_failures"] == 1 == res.client_failures
    assert out["client_error_samples"] == {"ReadError: [Errno 32] Broken pipe": 1}
    assert any("failed on the client side" in w for w in res.warnings)
    assert ("requests", "3 ok, 1 failed (0 engine, 1 client), 1 retried (4 sessions)") in result_rows(res)


# ------------------------------------------------------------------------ (b) engine answers
def test_http_500_is_an_engine_failure_and_is_not_retried(fake: FakeOpenAI) -> None:
    fake.fail_every = 4
    res = run_fake(fake, workload(num_prompts=12, arrival=Arrival()))
    assert len(fake.bodies) == 12  # nothing was sent twice
    failed = [r for r in res.records if not r.success]
    assert len(failed) == 3
    assert all(r.failure_side == "engine" and not r.retried and r.error.startswith("HTTP 500") for r in failed)
    m = res.metrics
    assert m["failed"] == 3 and m["failed_engine"] == 3 and m["failed_client"] == 0
    assert m["error_rate"] == 0.25 and res.client_failures == 0 and res.retried_requests == 0


@pytest.mark.sim
def test_http_500_over_real_sockets_is_an_engine_failure() -> None:
    with FlakyServer(mode="status_500") as server:
        res = run_real(server, workload())
    assert server.completions == 4
    assert all(r.failure_side == "engine" and not r.retried for r in res.records)
    assert res.metrics["failed_engine"] == 4 and res.metrics["error_rate"] == 1.0
    assert res.to_json()["client_failures"] == 0


def test_an_error_event_in_the_stream_is_an_engine_failure(fake: FakeOpenAI) -> None:
    async def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/completions":

            async def events() -> AsyncIterator[bytes]:
                yield b'data: {"object": "error", "message": "aborted"}\n\n'

            return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=events())
        return await fake.handle(request)

    res = run_fake(fake, workload(), httpx.MockTransport(handle))
    assert all(r.failure_side == "engine" and not r.retried for r in res.records)
    assert res.metrics["failed_engine"] == 4


# --------------------------------------------------------------- (c) lost after the answer began
@pytest.mark.sim
@pytest.mark.parametrize("mode", ["close_after_first_chunk", "partial_head"])
def test_a_connection_lost_after_the_first_byte_is_an_engine_failure_not_retried(mode: Mode) -> None:
    """The server had begun answering, then cut the stream: the server's failure, never resent
    (its work would count twice). ``partial_head`` sends a few bytes of a status line: httpcore
    then raises the same "Server disconnected without sending a response" as for zero bytes, and
    only the byte count tells that the server had started answering."""
    with FlakyServer(mode=mode) as server:
        res = run_real(server, workload())
    assert server.completions == 4  # each request reached the server exactly once
    for r in res.records:
        assert not r.success and r.failure_side == "engine" and not r.retried, r
    assert res.metrics["failed_client"] == 0 and res.metrics["error_rate"] == 1.0
    assert res.client_failures == 0 and res.retried_requests == 0


@pytest.mark.sim
def test_a_refused_connection_means_the_server_is_down() -> None:
    async def go() -> RequestRecord:
        from autotune.bench.stream import LiveCounters, stream_request

        record = RequestRecord()
        async with make_client(5.0, verify=False) as client:
            request = client.build_request("POST", "http://127.0.0.1:9/v1/completions", content=b"{}")
            await stream_request(client, request, record, timeout_s=5.0, chat=False, live=LiveCounters())
        return record

    record = asyncio.run(go())
    assert not record.success and record.retried and record.failure_side == "engine", record


# ---------------------------------------------------------------------------------- keep-alive
def test_keepalive_expiry_is_shorter_than_the_servers() -> None:
    assert KEEPALIVE_EXPIRY_S == 4.0 == keepalive_expiry() == keepalive_expiry(5.0)
    assert keepalive_expiry(75.0) == 4.0  # never longer than the default
    assert keepalive_expiry(3.0) == 2.0
    assert keepalive_expiry(1.0) == 0.5
    with pytest.raises(ValueError):
        keepalive_expiry(0.0)

    async def go() -> None:
        lanes = ClientLanes(5.0, tls=False, keepalive_expiry_s=keepalive_expiry(2.5))
        pool = lanes.acquire()._transport._pool  # type: ignore[attr-defined]
        assert isinstance(pool, httpcore.AsyncConnectionPool) and pool._keepalive_expiry == 1.5
        await lanes.aclose()
        client = make_client(5.0, verify=False)
        assert client._transport._pool._keepalive_expiry == KEEPALIVE_EXPIRY_S  # type: ignore[attr-defined]
        await client.aclose()

    asyncio.run(go())


@pytest.mark.sim
@pytest.mark.parametrize(("idle_s", "connections"), [(KEEPALIVE_EXPIRY_S - 0.5, 1), (KEEPALIVE_EXPIRY_S + 0.5, 2)])
def test_httpcore_checks_the_expiry_when_it_hands_out_a_connection(
    monkeypatch: pytest.MonkeyPatch, idle_s: float, connections: int
) -> None:
    """What the keep-alive margin relies on: a client that wakes after more than the expiry (the
    clock moved on, no timer ran) gets a fresh connection, not the stale one."""
    from httpcore._async import http11

    offset = [0.0]
    clock = types.SimpleNamespace(monotonic=lambda: http11_time.monotonic() + offset[0])
    http11_time = http11.time
    monkeypatch.setattr(http11, "time", clock)

    async def go(base: str) -> None:
        async with make_client(5.0, verify=False) as client:
            assert (await client.get(base + "/v1/models")).status_code == 200
            offset[0] = idle_s  # the loop "slept" this long between the two requests
            assert (await client.get(base + "/v1/models")).status_code == 200

    with FlakyServer() as server:
        asyncio.run(go(server.base))
    assert server.connections == connections


@pytest.mark.sim
def test_reads_are_tallied_inside_the_block_only() -> None:
    async def go(base: str) -> tuple[int, int]:
        async with make_client(5.0, verify=False) as client:
            with netbackend.count_reads() as tally:
                await client.get(base + "/v1/models")
            inside = tally.bytes
            await client.get(base + "/v1/models")
        return inside, tally.bytes

    with FlakyServer() as server:
        inside, after = asyncio.run(go(server.base))
    assert inside > 0 and after == inside


# ------------------------------------------------------------------------- (d) fresh prompts
_ONE_RUN = """
import asyncio, json
from fake_openai import FakeOpenAI
from autotune.bench.loadgen import run_workload
from autotune.config import Dataset, Workload

fake = FakeOpenAI()
w = Workload(num_prompts=3, warmup_requests=0, dataset=Dataset(input_len=16, output_len=2), seed=1)

async def go():
    async with fake.client() as client:
        return await run_workload("http://server:8000", w, client=client)

res = asyncio.run(go())
print(json.dumps({"salt": res.salt, "json_salt": res.to_json()["salt"], "prompts": [b["prompt"] for b in fake.bodies]}))
"""


@pytest.mark.sim
def test_runs_in_fresh_processes_get_different_salts_and_prompts() -> None:
    here = Path(__file__).resolve().parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(here.parents[1]), str(here)])}
    outs = [
        json.loads(
            subprocess.run([sys.executable, "-c", _ONE_RUN], env=env, capture_output=True, check=True, text=True).stdout
        )
        for _ in range(2)
    ]
    assert outs[0]["salt"] == outs[0]["json_salt"] and outs[0]["salt"] != 0
    assert outs[0]["salt"] != outs[1]["salt"]
    assert not {json.dumps(p) for p in outs[0]["prompts"]} & {json.dumps(p) for p in outs[1]["prompts"]}


def test_default_salts_differ_and_an_explicit_salt_repeats(fake: FakeOpenAI) -> None:
    assert len({new_salt() for _ in range(50)}) == 50 and 0 not in {new_salt() for _ in range(50)}
    assert run_fake(fake, workload()).salt != run_fake(fake, workload()).salt  # each run draws its own
    # Two salts' prompts (fixed salts: the random pair above is not this test's input).
    fake.bodies.clear()
    a = run_fake(fake, workload(), salt=1_234_567)
    first = sorted(json.dumps(b["prompt"]) for b in fake.bodies)
    fake.bodies.clear()
    run_fake(fake, workload(), salt=7_654_321)
    assert not set(first) & {json.dumps(x["prompt"]) for x in fake.bodies}
    fake.bodies.clear()
    run_fake(fake, workload(), salt=a.salt)
    assert sorted(json.dumps(x["prompt"]) for x in fake.bodies) == first
    assert run_fake(fake, workload(fresh_prompts_per_run=False)).salt == 0  # repeats by design


def test_a_failed_prefix_cache_reset_is_a_warning(fake: FakeOpenAI) -> None:
    fake.reset_route = "/reset_prefix_cache"
    fake.reset_ok = False
    res = run_fake(fake, workload())
    assert res.prefix_cache_reset == "failed: /reset_prefix_cache refused (blocks still in use)"
    assert res.warnings == ["prefix cache could not be reset: /reset_prefix_cache refused (blocks still in use)"]
    assert res.to_json()["warnings"] == res.warnings
    assert ("warning", res.warnings[0]) in result_rows(res)
    fake.reset_ok = True
    assert run_fake(fake, workload()).warnings == []
    # No reset route: harmless with fresh prompts, a warning when the prompts repeat across runs.
    fake.reset_route = None
    assert run_fake(fake, workload()).warnings == []
    repeat = run_fake(fake, workload(fresh_prompts_per_run=False))
    assert len(repeat.warnings) == 1 and "prompts repeat across runs" in repeat.warnings[0]
    assert run_fake(fake, workload(reset_prefix_cache=False)).warnings == []  # not asked


# ------------------------------------------------------------------------------ metrics by side
def test_error_rate_counts_engine_failures_over_the_requests_the_engine_answered() -> None:
    ok = RequestRecord(success=True, start_time=1.0, ttft=0.1, latency=0.2, n_chunks=2, output_tokens=2)
    engine = RequestRecord(error="HTTP 500: x", failure_side="engine")
    client = RequestRecord(error="ReadError: reset", failure_side="client")
    unknown = RequestRecord(error="old record without a side")
    m = compute_metrics([ok, ok, engine, client, unknown], 1.0)
    assert m["failed"] == 3 and m["failed_engine"] == 2 and m["failed_client"] == 1
    assert m["error_rate"] == pytest.approx(2 / 4)
    assert compute_metrics([client], 1.0)["error_rate"] == 0.0


# ---------------------------------------------------------------------------- (e) self-check
def test_an_idle_client_with_a_punctual_loop_is_not_limited() -> None:
    """A slow engine: the client idles (2 % CPU) and its loop wakes on time (11 ms p99)."""
    check = assess_client(0.02, [0.011] * 100, [0.011] * 100, finite_rate=True)
    assert not check.limited and check.kind == "" and check.reason == ""


def test_a_late_loop_with_a_low_cpu_share_is_starved() -> None:
    check = assess_client(0.1, [], [0.004] * 90 + [0.3] * 10, finite_rate=False)
    assert check.limited and check.kind == "starved"
    assert "other processes took its CPU" in check.reason
    busy = assess_client(0.97, [], [0.3] * 100, finite_rate=False)
    assert busy.kind == "cpu_bound" and "other processes" not in busy.reason


def test_lag_tolerance_follows_the_ttft_slo() -> None:
    assert lag_tolerance({}) == LOOP_LAG_FLOOR_S
    assert lag_tolerance({"p95_ttft_ms": 200.0}) == LOOP_LAG_FLOOR_S  # 10 % is below the floor
    assert lag_tolerance({"p95_ttft_ms": 3000.0, "p99_ttft_ms": 5000.0, "std_ttft_ms": 10.0}) == pytest.approx(0.3)
    lags = [0.1] * 100
    assert assess_client(0.1, [], lags, False, lag_tolerance({})).kind == "starved"
    relaxed = assess_client(0.1, [], lags, False, lag_tolerance({"p95_ttft_ms": 3000.0}))
    assert not relaxed.limited and relaxed.lag_tolerance_ms == pytest.approx(300.0)


def test_result_json_carries_the_limit_kind(fake: FakeOpenAI) -> None:
    # The run's own check depends on the host; a starved check (as judged above) is set on it so
    # the test knows the one kind the JSON must carry.
    starved = assess_client(0.1, [], [0.1] * 100, False, lag_tolerance({}))
    out = dataclasses.replace(run_fake(fake, workload()), client=starved).to_json()
    assert out["client_limited_kind"] == "starved" and out["client_limited"] is True
    assert out["client_limited_reason"] == starved.reason != ""
    for key in ("failed", "failed_engine", "failed_client", "client_failures", "retried_requests", "salt", "warnings"):
        assert key in out, key
