"""One streamed request, timed exactly as ``vllm bench serve`` times it (the load generator's hot path).

Timing follows ``async_request_openai_completions`` / ``..._chat_completions`` in vLLM's
``benchmarks/lib/endpoint_request_func.py``:

* ``start_time`` is taken right before the request is sent (after the concurrency semaphore);
* every SSE event whose ``choices`` is non-empty is a token event, even with empty text (the chat
  role chunk, partial UTF-8): the first sets TTFT, each later one appends a gap to ITL;
* a usage-only event sets ``output_tokens`` and overwrites ``prompt_len`` with the server's count;
* latency is the last token event minus ``start_time`` (usage and ``[DONE]`` excluded);
* failure is an HTTP status other than 200, an exception, or no token event.

Differences, each on purpose:

* An error event inside a 200 stream (``data: {"error": ...}``, how SGLang reports aborts and how
  vLLM reports a dead engine) fails the request; vLLM's client ignores it and may count a
  truncated answer as a success.
* Timestamps are taken once per network read, when the bytes arrive, not after each JSON parse;
  events that arrived in the same read share a timestamp (vLLM's differ by parse time only).
  They are ``time.monotonic()`` (``CLOCK_MONOTONIC``, one clock for the whole machine), so records
  taken in different worker processes can be merged.
* The request also has a total deadline (``asyncio.timeout``); vLLM has only a 6-hour session
  timeout.
* A failure says which side failed (``RequestRecord.failure_side``): ``engine`` when the server
  answered (a status other than 200, an error event, a malformed or token-less stream, or a
  stream that broke after its first byte: the server was serving it), ``client`` when the client
  or the transport failed before any answer (a write into a closed keep-alive connection, a
  connection lost or reset before the first byte, a local timeout). A refused connection counts
  as ``engine``: nothing listens, the server is down.
* An attempt that never reached the server is sent once more, on a fresh connection, before it
  counts: the connection failed (``Server disconnected without sending a response``, a read or
  write error such as a broken pipe or a reset, a connect error) before *any* byte of an answer
  arrived. That is what a keep-alive connection the server closed while the client was stalled
  looks like (see :mod:`autotune.bench.transport`). The request's timings are the retry's (TTFT
  and E2EL from the retry's send); the record says it was retried, after how long and why. A
  request is never resent once a byte of the answer arrived (the server was serving it: a resend
  would count its work twice) nor when the server answered with a failure. Bytes are counted by
  the load generator's network backend (:func:`~autotune.bench.netbackend.count_reads`); through
  another transport an error raised before the response headers is taken as "no byte".

Against the simulator (``LiveCounters.modelled``) every time of the record is modelled, read from
the stamp the simulator puts before each chunk (:mod:`autotune.bench.simclock`): the start is the
request's modelled arrival, and a token chunk without a stamp fails the request. ``sent_time``
and ``wall_end_time`` keep the wall clock for pacing the next turn.

The body is read with ``aiter_raw`` (requests ask for ``Accept-Encoding: identity``, so raw bytes
are the payload) and split into lines here: one layer less per chunk than ``aiter_bytes``, and
the hot path is the per-chunk cost. For the same reason a completions token chunk is recognised
by a byte pattern (a non-empty ``choices`` list) instead of a JSON parse; chat chunks, usage,
errors and anything unusual are parsed.
"""

from __future__ import annotations

import asyncio
import errno
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from time import monotonic
from typing import Any

import httpx

from autotune.bench.metrics import CLIENT, ENGINE, FailureSide, RequestRecord
from autotune.bench.netbackend import count_reads
from autotune.bench.simclock import STAMP_PREFIX, parse_stamp

__all__ = ["LiveCounters", "stream_request"]


@dataclass(slots=True)
class LiveCounters:
    """State shared by all in-flight requests of one event loop, read by the progress callback.

    Attributes:
        token_chunks: Token chunks streamed so far.
        modelled: The server is the simulator: times are its modelled stamps.
        model_time: The latest modelled stamp seen (modelled runs).
    """

    token_chunks: int = 0
    modelled: bool = False
    model_time: float = 0.0

    def now(self) -> float:
        """The run's clock: the latest modelled stamp against the simulator, else monotonic time."""
        return self.model_time if self.modelled else monotonic()


# A completions chunk whose top-level "choices" list holds an object is a token event. Inside a
# JSON string a quote is escaped, so this cannot match text; usage-only chunks ("choices":[]),
# errors and anything else take the full JSON parse.
_TOKEN_CHUNK = re.compile(rb'"choices":\s*\[\s*\{')
_EMPTY_TEXT = re.compile(rb'"text":\s*""')


# httpcore's words when the connection ended before a single byte of the answer (h11 still waits
# for the status line).
NO_RESPONSE = "Server disconnected without sending a response"
# Transport errors that, raised before any answer byte, mean the request may never have reached
# the server (a WriteError is swallowed by httpcore, which then reads the broken connection and
# raises one of the others; a ConnectError means the request was never written).
_RESENDABLE = (httpx.ReadError, httpx.WriteError, httpx.ConnectError)
_REFUSED = f"[Errno {errno.ECONNREFUSED}]"


class _StreamFailed(Exception):
    """The stream said the request failed (an error event or a payload that is not JSON)."""


class _NeverReached(Exception):
    """An attempt's connection failed before any byte of an answer arrived (safe to resend)."""

    def __init__(self, err: httpx.HTTPError) -> None:
        super().__init__(_describe(err))
        self.side = _transport_side(err)


def _one_line(text: str, limit: int = 300) -> str:
    return " ".join(text.split())[:limit]


def _describe(err: BaseException) -> str:
    return _one_line(f"{type(err).__name__}: {err}")


def _never_answered(err: httpx.HTTPError, received: int) -> bool:
    """Whether ``err`` (raised while sending, before the response headers) left the request
    unanswered: no answer byte arrived and the connection, not the server's answer, failed."""
    if received:
        return False
    if isinstance(err, httpx.RemoteProtocolError):
        return str(err).startswith(NO_RESPONSE)
    return isinstance(err, _RESENDABLE)


def _refused(err: BaseException) -> bool:
    """A connection refused: nothing listens on the server's port."""
    seen: BaseException | None = err
    for _ in range(8):  # the cause chain: httpx error <- httpcore error <- OSError
        if seen is None:
            break
        if isinstance(seen, ConnectionRefusedError) or _REFUSED in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return "connection refused" in str(err).lower()


def _transport_side(err: httpx.HTTPError) -> FailureSide:
    """A transport failure is the client's, except a refused connection: the server is down."""
    return ENGINE if isinstance(err, httpx.ConnectError) and _refused(err) else CLIENT


def _error_text(data: Mapping[str, Any]) -> str:
    err = data.get("error", data)
    if isinstance(err, Mapping):
        err = err.get("message", err)
    return _one_line(str(err))


class _SseTimer:
    """Feeds SSE lines into a record; one instance per request."""

    __slots__ = ("chat", "fast", "first", "last", "live", "record", "stamp", "start", "texts")

    def __init__(
        self, record: RequestRecord, start: float, chat: bool, live: LiveCounters, texts: list[str] | None
    ) -> None:
        self.record = record
        self.start = start
        self.last = start
        self.first = True
        self.chat = chat
        self.live = live
        self.texts = texts
        # Completions token chunks are recognised without a JSON parse (see _TOKEN_CHUNK).
        self.fast = not chat and texts is None
        self.stamp: tuple[float, float] | None = None  # (arrival, t) of the next chunks, modelled

    def line(self, raw: bytes, ts: float) -> None:
        line = raw.strip()
        # Blank lines end an event; ':' lines are pings (or the simulator's modelled stamps);
        # event:/id: lines carry no payload here.
        if not line.startswith(b"data:"):
            if self.live.modelled and line.startswith(STAMP_PREFIX):
                self._stamp(line)
            return
        payload = line[5:].strip()
        if payload == b"[DONE]":
            return
        if self.fast and payload.endswith(b"}") and _TOKEN_CHUNK.search(payload):
            self.token(ts, empty=_EMPTY_TEXT.search(payload) is not None)
            return
        try:
            data = json.loads(payload)
        except ValueError:
            raise _StreamFailed(f"SSE payload is not JSON: {_one_line(payload.decode(errors='replace'))}") from None
        if not isinstance(data, dict):
            raise _StreamFailed(f"SSE payload is not an object: {_one_line(str(data))}")
        self.event(data, ts)

    def _stamp(self, line: bytes) -> None:
        try:
            self.stamp = parse_stamp(line)
        except ValueError:
            raise _StreamFailed(f"malformed modelled-time stamp: {_one_line(line.decode(errors='replace'))}") from None

    def token(self, ts: float, empty: bool) -> None:
        """A chunk with choices: the first sets TTFT, each later one adds an ITL gap."""
        rec = self.record
        rec.wall_end_time = ts
        if self.live.modelled:
            ts = self._modelled()
        if self.first:
            self.first = False
            rec.ttft = ts - self.start
            rec.first_token_time = ts
        else:
            rec.itl.append(ts - self.last)
        self.last = ts
        rec.n_chunks += 1
        rec.n_empty_chunks += empty
        self.live.token_chunks += 1

    def _modelled(self) -> float:
        """The modelled time of this chunk; the first one moves the start to the modelled arrival."""
        if self.stamp is None:
            raise _StreamFailed("a token chunk came without the simulator's modelled-time stamp")
        arrival, t = self.stamp
        if self.first:
            self.start = self.record.start_time = arrival
        if t > self.live.model_time:
            self.live.model_time = t
        return t

    def event(self, data: dict[str, Any], ts: float) -> None:
        rec = self.record
        if choices := data.get("choices"):
            text = self._text(choices[0])
            self.token(ts, empty=not text)
            if text and self.texts is not None and isinstance(text, str):
                self.texts.append(text)
        elif usage := data.get("usage"):
            rec.usage_seen = True
            rec.output_tokens = usage.get("completion_tokens") or 0
            if (prompt_tokens := usage.get("prompt_tokens")) is not None:
                rec.prompt_len = prompt_tokens
        elif "error" in data or data.get("object") == "error":
            raise _StreamFailed(f"error event in stream: {_error_text(data)}")

    def _text(self, choice: Any) -> Any:
        if not isinstance(choice, Mapping):
            return None
        if self.chat:
            delta = choice.get("delta")
            return delta.get("content") if isinstance(delta, Mapping) else None
        return choice.get("text")

    def finish(self) -> None:
        rec = self.record
        if self.first:
            rec.error = "stream ended without a token chunk"
            rec.failure_side = ENGINE
            return
        rec.latency = self.last - self.start
        rec.end_time = self.last
        rec.success = True


async def _read_stream(resp: httpx.Response, timer: _SseTimer) -> None:
    buf = b""
    async for data in resp.aiter_raw():
        ts = monotonic()
        buf += data
        if b"\n" not in data:
            continue
        *lines, buf = buf.split(b"\n")
        for line in lines:
            if line and line != b"\r":  # the blank line that ends every event
                timer.line(line, ts)
    if buf:  # a last event without its terminating newline
        timer.line(buf, monotonic())


async def _attempt(
    client: httpx.AsyncClient,
    request: httpx.Request,
    record: RequestRecord,
    chat: bool,
    live: LiveCounters,
    texts: list[str] | None,
) -> None:
    """Send once and stream the answer into ``record``.

    Raises:
        _NeverReached: The connection failed before any answer byte (the caller may resend).
        _StreamFailed, httpx.HTTPError, ...: Other failures, classified by the caller.
    """
    start = monotonic()
    record.start_time = record.sent_time = start
    timer = _SseTimer(record, start, chat, live, texts)
    with count_reads() as tally:
        try:
            resp = await client.send(request, stream=True)
        except httpx.HTTPError as err:
            if _never_answered(err, tally.bytes):
                raise _NeverReached(err) from err
            raise
    try:
        if resp.status_code != 200:
            text = (await resp.aread()).decode(errors="replace")
            record.error = f"HTTP {resp.status_code}: {_one_line(text)}"
            record.failure_side = ENGINE
            return
        await _read_stream(resp, timer)
    finally:
        await resp.aclose()
    timer.finish()


def _fail(record: RequestRecord, error: str, side: FailureSide) -> None:
    record.error = error
    record.failure_side = side


async def stream_request(
    client: httpx.AsyncClient,
    request: httpx.Request,
    record: RequestRecord,
    *,
    timeout_s: float,
    chat: bool,
    live: LiveCounters,
    texts: list[str] | None = None,
) -> None:
    """Send one streaming request and fill ``record`` with its timings and outcome.

    Never raises for request failures: they end up in ``record.error`` (with
    ``record.failure_side``) and ``record.success = False``. An attempt whose connection failed
    before any answer byte is sent once more on a fresh connection (see the module docstring).
    Cancellation propagates.

    Args:
        client: The client to send on (a load-generator lane: one connection, so a failed one is
            closed and the retry opens a fresh one).
        request: Built before the run (URL parsing and header handling cost client CPU).
        record: Filled in place; ``start_time`` is set here (to the retry's send when retried).
        timeout_s: Total deadline for the request, a retry included.
        chat: Whether the endpoint is chat completions (text is in ``delta.content``).
        live: Shared counters for live progress.
        texts: Collects the generated text pieces when given (a multi-turn history needs them).
    """
    try:
        async with asyncio.timeout(timeout_s):
            try:
                await _attempt(client, request, record, chat, live, texts)
            except _NeverReached as first:
                sent = record.sent_time
                record.retried = True
                record.retry_error = str(first)
                try:
                    await _attempt(client, request, record, chat, live, texts)
                finally:
                    record.retry_delay_s = record.sent_time - sent
    except _NeverReached as err:  # the retry never reached the server either
        _fail(record, str(err), err.side)
    except _StreamFailed as err:
        _fail(record, str(err), ENGINE)
    except TimeoutError:
        _fail(record, f"timed out after {timeout_s:g} s", CLIENT)
    except httpx.HTTPError as err:
        # Bytes of the answer had arrived (else _NeverReached): the server began serving the
        # request and the stream broke on its side (a cut connection, a dying engine).
        _fail(record, _describe(err), ENGINE)
    except (AttributeError, KeyError, TypeError, ValueError) as err:  # a malformed event shape
        _fail(record, _one_line(f"malformed stream: {type(err).__name__}: {err}"), ENGINE)
