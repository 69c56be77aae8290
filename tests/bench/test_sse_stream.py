"""SSE parsing and timing of one request, with canned byte streams and a fake clock."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import pytest

from autotune.bench import stream as stream_mod
from autotune.bench.metrics import RequestRecord, compute_metrics
from autotune.bench.stream import LiveCounters, stream_request

URL = "http://server/v1/completions"


def post() -> httpx.Request:
    return httpx.Request("POST", URL, content=b"{}")


def sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def text(t: str) -> bytes:
    return sse({"choices": [{"index": 0, "text": t}]})


def usage(prompt: int, completion: int) -> bytes:
    return sse({"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion}})


DONE = b"data: [DONE]\n\n"


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Callable[[list[float]], None]:
    """Replace the stream's monotonic clock: first call = send time, then one call per network read."""

    def set_times(times: list[float]) -> None:
        it: Iterator[float] = itertools.chain(times, itertools.repeat(times[-1]))
        monkeypatch.setattr(stream_mod, "monotonic", lambda: next(it))

    return set_times


def run(
    reads: list[bytes], status: int = 200, chat: bool = False, timeout_s: float = 5.0, collect: bool = False
) -> RequestRecord:
    async def body() -> AsyncIterator[bytes]:
        for chunk in reads:
            yield chunk

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, content=body())

    record = RequestRecord(prompt_len=7, expected_output_len=3)

    async def go() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            texts: list[str] | None = [] if collect else None  # collecting text takes the JSON reading
            await stream_request(
                client, post(), record, timeout_s=timeout_s, chat=chat, live=LiveCounters(), texts=texts
            )

    asyncio.run(go())
    return record


def test_every_chunk_with_choices_is_a_token_event_even_when_empty(clock: Callable[[list[float]], None]) -> None:
    clock([10.0, 10.5, 10.52, 10.55, 10.6, 10.61])
    r = run([text(""), text("a"), text("b"), usage(12, 3), DONE])
    assert r.success and r.error == ""
    assert r.ttft == pytest.approx(0.5)
    assert r.itl == pytest.approx([0.02, 0.03])
    assert r.latency == pytest.approx(0.55)  # last token chunk; usage and [DONE] excluded
    assert (r.start_time, r.first_token_time, r.end_time) == (10.0, 10.5, 10.55)
    assert r.n_chunks == 3 and r.n_empty_chunks == 1


def test_usage_chunk_sets_output_tokens_and_overwrites_prompt_len(clock: Callable[[list[float]], None]) -> None:
    clock([0.0, 1.0, 2.0, 3.0])
    r = run([text("a"), usage(12, 3), DONE])
    assert r.output_tokens == 3 and r.prompt_len == 12 and r.usage_seen


def test_events_split_across_reads_and_sharing_a_read(clock: Callable[[list[float]], None]) -> None:
    clock([0.0, 1.0, 2.0, 3.0, 4.0])
    first, second = text("a"), text("b")
    # Read 1: half an event. Read 2: its rest plus a whole event. Read 3: usage + DONE.
    r = run([first[:9], first[9:] + second, usage(5, 2) + DONE])
    assert r.ttft == 2.0  # the event completes in read 2
    assert r.itl == [0.0]  # both events arrived in read 2
    assert r.n_chunks == 2 and r.output_tokens == 2


def test_comments_crlf_and_event_fields_are_skipped(clock: Callable[[list[float]], None]) -> None:
    clock([0.0, 1.0, 2.0, 3.0])
    ping = b": ping\r\n\r\n"
    named = b'event: message\r\nid: 1\r\ndata: {"choices":[{"index":0,"text":"a"}]}\r\n\r\n'
    r = run([ping, named, usage(3, 1) + DONE])
    assert r.success and r.n_chunks == 1 and r.ttft == 2.0


def test_final_event_without_trailing_newline_counts(clock: Callable[[list[float]], None]) -> None:
    clock([0.0, 1.0, 2.0, 3.0])
    r = run([text("a"), b'data: {"choices":[{"index":0,"text":"b"}]}'])
    assert r.success and r.n_chunks == 2 and r.latency == 3.0


def test_chat_role_chunk_is_the_first_token_event(clock: Callable[[list[float]], None]) -> None:
    clock([0.0, 0.2, 0.3, 0.4])
    role = sse({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
    tok = sse({"choices": [{"index": 0, "delta": {"content": "hi"}}]})
    r = run([role, tok, usage(9, 1) + DONE], chat=True)
    assert r.success and r.ttft == 0.2 and r.itl == pytest.approx([0.1])
    assert r.n_empty_chunks == 1


def test_error_event_inside_200_stream_fails_the_request(clock: Callable[[list[float]], None]) -> None:
    clock([0.0, 1.0, 2.0])
    err = sse({"error": {"message": "Request aborted: out of memory", "code": 500}})
    r = run([text("a"), err, DONE])
    assert not r.success
    assert r.error == "error event in stream: Request aborted: out of memory"


def test_vllm_error_object_without_error_key_fails(clock: Callable[[list[float]], None]) -> None:
    clock([0.0, 1.0])
    r = run([sse({"object": "error", "message": "EngineCore died"}), DONE])
    assert not r.success and "EngineCore died" in r.error


def test_http_500_fails_with_status_and_body() -> None:
    r = run([b'{"error": "engine\\ndead"}'], status=500)
    assert not r.success
    assert r.error.startswith("HTTP 500: ")
    assert "\n" not in r.error


def test_stream_without_token_chunks_fails() -> None:
    r = run([usage(5, 0), DONE])
    assert not r.success and r.error == "stream ended without a token chunk"
    assert r.usage_seen  # the usage was still read


def test_non_json_payload_fails() -> None:
    r = run([b"data: {not json\n\n"])
    assert not r.success and r.error.startswith("SSE payload is not JSON")


def test_connection_error_becomes_a_failed_record() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    record = RequestRecord()

    async def go() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            await stream_request(client, post(), record, timeout_s=5, chat=False, live=LiveCounters())

    asyncio.run(go())
    assert not record.success and record.error == "ConnectError: connection refused"


def test_request_deadline_fails_a_stalled_stream() -> None:
    async def stalled() -> AsyncIterator[bytes]:
        yield text("a")
        await asyncio.sleep(60)

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=stalled())

    record = RequestRecord()
    live = LiveCounters()

    async def go() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            await stream_request(client, post(), record, timeout_s=0.05, chat=False, live=live)

    asyncio.run(go())
    assert not record.success and record.error == "timed out after 0.05 s"
    assert live.token_chunks == 1


def test_parsed_records_feed_vllm_formulas(clock: Callable[[list[float]], None]) -> None:
    """Golden stream: TTFT 100 ms, gaps 40 ms, 5 tokens in 3 chunks -> ITL 40 ms, TPOT 20 ms."""
    clock([0.0, 0.1, 0.14, 0.18, 0.19])
    r = run([text("a"), text("bcd"), text("e"), usage(4, 5), DONE])
    m = compute_metrics([r], 1.0)
    assert m["mean_ttft_ms"] == pytest.approx(100.0, abs=1e-9)
    assert m["mean_itl_ms"] == pytest.approx(40.0, abs=1e-9)
    assert m["mean_tpot_ms"] == pytest.approx(20.0, abs=1e-9)
    assert m["mean_e2el_ms"] == pytest.approx(180.0, abs=1e-9)


def test_byte_pattern_token_chunks_match_the_json_reading(clock: Callable[[list[float]], None]) -> None:
    compact = b'data: {"choices":[{"index":0,"text":"a"}]}\n\n'
    spaced = b'data: {"choices": [ {"index": 0, "text": ""} ]}\n\n'
    # A quote inside a JSON string is escaped, so this text cannot pass for a choices list.
    trap = b'data: {"choices":[],"note":"\\"choices\\":[{","usage":{"prompt_tokens":7,"completion_tokens":2}}\n\n'
    clock([1.0, 1.1, 1.2, 1.3])
    fast = run([compact, spaced, trap, DONE])
    clock([1.0, 1.1, 1.2, 1.3])
    parsed = run([compact, spaced, trap, DONE], chat=False, collect=True)
    for r in (fast, parsed):
        assert r.success and r.n_chunks == 2 and r.n_empty_chunks == 1 and r.output_tokens == 2
        assert r.ttft == pytest.approx(0.1) and r.itl == pytest.approx([0.1])
