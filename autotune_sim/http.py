"""A small HTTP/1.1 server on asyncio protocols: keep-alive, chunked streaming, no frameworks.

The simulator must start in well under a second and serve hundreds of concurrent streams on a
couple of cores, so handlers are plain callbacks (no coroutine per request) and a stream is
written straight to its transport by the engine loop. One request is served at a time per
connection (HTTP/1.1 without pipelining concurrency, as uvicorn does); bodies come with
``Content-Length`` or chunked transfer encoding.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import parse_qs

__all__ = ["Handler", "HttpProtocol", "Request", "Responder", "serve"]

MAX_HEAD = 64 * 1024
REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    413: "Payload Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


class Request:
    """One parsed request."""

    __slots__ = ("body", "headers", "method", "path", "query")

    def __init__(self, method: str, path: str, query: str, headers: dict[str, str], body: bytes) -> None:
        self.method, self.path, self.query, self.headers, self.body = method, path, query, headers, body

    def json(self) -> Any:
        """The body as JSON (ValueError when it is not)."""
        return json.loads(self.body or b"null")

    def params(self) -> dict[str, str]:
        """Query-string parameters (last value wins)."""
        return {k: v[-1] for k, v in parse_qs(self.query).items()}


Handler = Callable[[Request, "Responder"], None]


class Responder:
    """Writes one response, whole or streamed, on its connection.

    ``on_close`` is called if the client goes away before the response ended.
    """

    __slots__ = ("_proto", "done", "keep_alive", "on_close", "streaming")

    def __init__(self, proto: HttpProtocol, keep_alive: bool) -> None:
        self._proto = proto
        self.keep_alive = keep_alive
        self.streaming = False
        self.done = False
        self.on_close: Callable[[], None] | None = None

    @property
    def closed(self) -> bool:
        return self.done or self._proto.transport is None

    def _head(self, status: int, content_type: str, extra: Iterable[tuple[str, str]], length: int | None) -> bytes:
        lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'OK')}", f"content-type: {content_type}", "server: uvicorn"]
        lines.append(f"content-length: {length}" if length is not None else "transfer-encoding: chunked")
        if not self.keep_alive:
            lines.append("connection: close")
        lines += [f"{k}: {v}" for k, v in extra]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def send(
        self,
        status: int,
        body: bytes = b"",
        content_type: str = "application/json",
        headers: Iterable[tuple[str, str]] = (),
    ) -> None:
        """A whole response."""
        if self.closed:
            return
        self._proto.queue(self._head(status, content_type, headers, len(body)) + body)
        self._end()

    def json(self, status: int, payload: Any) -> None:
        """A JSON response."""
        self.send(status, json.dumps(payload, separators=(",", ":")).encode())

    def start_stream(self, status: int = 200, content_type: str = "text/event-stream; charset=utf-8") -> None:
        """Send the head of a chunked response; follow with :meth:`write` and :meth:`end`."""
        if self.closed:
            return
        self.streaming = True
        self._proto.queue(self._head(status, content_type, (), None))

    def write(self, data: bytes) -> None:
        """One chunk of a streamed response."""
        if data and not self.done:
            self._proto.queue(b"%x\r\n%b\r\n" % (len(data), data))

    def end(self, last: bytes = b"") -> None:
        """Finish a streamed response, optionally with a last chunk."""
        if self.closed:
            return
        tail = b"%x\r\n%b\r\n" % (len(last), last) if last else b""
        self._proto.queue(tail + b"0\r\n\r\n")
        self._end()

    def abort(self) -> None:
        """Cut the connection without finishing (a dropped connection)."""
        self.done = True
        if self._proto.transport is not None:
            self._proto.transport.abort()

    def _end(self) -> None:
        self.done = True
        self._proto.response_done(self)


class Flusher:
    """Coalesces writes: what a connection is given during one event-loop turn goes out in one send.

    The engine runs several short steps per turn when it fast-forwards; without this each token
    of each stream would cost its own system call on both ends of the connection.
    """

    def __init__(self) -> None:
        self._dirty: list[HttpProtocol] = []

    def mark(self, proto: HttpProtocol) -> None:
        if not self._dirty:
            asyncio.get_running_loop().call_soon(self.flush)
        self._dirty.append(proto)

    def flush(self) -> None:
        dirty, self._dirty = self._dirty, []
        for proto in dirty:
            proto.flush()


class HttpProtocol(asyncio.Protocol):
    """One client connection."""

    def __init__(self, handler: Handler, flusher: Flusher) -> None:
        self.handler = handler
        self.transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._current: Responder | None = None
        self._flusher = flusher
        self._out: list[bytes] = []
        self._close_after_flush = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        current, self._current = self._current, None
        if current is not None and not current.done and current.on_close is not None:
            current.on_close()

    def queue(self, data: bytes) -> None:
        """Write ``data`` at the end of this event-loop turn (in order with everything queued)."""
        if self.transport is None:
            return
        if not self._out:
            self._flusher.mark(self)
        self._out.append(data)

    def flush(self) -> None:
        transport = self.transport
        if transport is not None:
            if self._out:
                transport.write(b"".join(self._out) if len(self._out) > 1 else self._out[0])
            if self._close_after_flush:
                transport.close()
        self._out.clear()

    def data_received(self, data: bytes) -> None:
        self._buf += data
        if self._current is None:
            self._process()

    def response_done(self, responder: Responder) -> None:
        if responder is not self._current:
            return
        self._current = None
        if not responder.keep_alive:
            self._close_after_flush = True
            if not self._out:
                self.queue(b"")
            return
        if self._buf:
            asyncio.get_running_loop().call_soon(self._process)

    def _process(self) -> None:
        while self._current is None and self.transport is not None:
            parsed = self._parse()
            if parsed is None:
                return
            request, keep_alive = parsed
            responder = Responder(self, keep_alive)
            self._current = responder
            try:
                self.handler(request, responder)
            except Exception as exc:  # a handler bug must not take the server down
                if not responder.done:
                    if responder.streaming:
                        responder.abort()
                    else:
                        responder.json(500, {"detail": f"Internal Server Error: {exc}"})

    def _parse(self) -> tuple[Request, bool] | None:
        buf = self._buf
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if len(buf) > MAX_HEAD and self.transport is not None:
                self.transport.close()
            return None
        head = bytes(buf[:end]).decode("latin-1").split("\r\n")
        try:
            method, target, version = head[0].split(" ", 2)
        except ValueError:
            if self.transport is not None:
                self.transport.close()
            return None
        headers: dict[str, str] = {}
        for line in head[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        body_start = end + 4
        if "chunked" in headers.get("transfer-encoding", "").lower():
            decoded = _dechunk(buf, body_start)
            if decoded is None:
                return None
            body, consumed = decoded
        else:
            length = int(headers.get("content-length") or 0)
            if len(buf) < body_start + length:
                return None
            body, consumed = bytes(buf[body_start : body_start + length]), body_start + length
        del buf[:consumed]
        path, _, query = target.partition("?")
        conn = headers.get("connection", "").lower()
        keep_alive = conn != "close" and (version != "HTTP/1.0" or conn == "keep-alive")
        return Request(method.upper(), path, query, headers, body), keep_alive


def _dechunk(buf: bytearray, pos: int) -> tuple[bytes, int] | None:
    """Decode a chunked body starting at ``pos``: (body, bytes consumed) or None if incomplete."""
    out = bytearray()
    while True:
        line_end = buf.find(b"\r\n", pos)
        if line_end < 0:
            return None
        size = int(bytes(buf[pos:line_end]).split(b";")[0] or b"0", 16)
        start = line_end + 2
        if size == 0:
            trailer_end = buf.find(b"\r\n", start)
            return (bytes(out), trailer_end + 2) if trailer_end >= 0 else None
        if len(buf) < start + size + 2:
            return None
        out += buf[start : start + size]
        pos = start + size + 2


async def serve(sock: Any, handler: Handler) -> asyncio.Server:
    """Start serving ``handler`` on an already bound, listening socket."""
    loop = asyncio.get_running_loop()
    flusher = Flusher()
    return await loop.create_server(lambda: HttpProtocol(handler, flusher), sock=sock, backlog=2048)
