"""A small HTTP/1.1 OpenAI-style server on 127.0.0.1, in its own thread, that can misbehave on purpose.

It runs its own event loop in a thread, so it keeps serving (and closing idle keep-alive
connections, as uvicorn does) while a test blocks the client's event loop. Modes of
``/v1/completions``:

* ``ok``: a chunked SSE stream of ``max_tokens`` token events, usage and ``[DONE]``;
* ``status_500``: an HTTP 500 with an OpenAI error body (the connection stays open);
* ``close_after_first_chunk``: the headers and one token event, then the connection is closed;
* ``partial_head``: the first bytes of a status line, then the connection is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from typing import Any, Literal

from fake_openai import MergingTokenizer

Mode = Literal["ok", "status_500", "close_after_first_chunk", "partial_head"]


class FlakyServer:
    """Use as a context manager; ``base`` is its URL. Counters are guarded by ``cond``."""

    def __init__(self, *, idle_timeout_s: float | None = None, mode: Mode = "ok") -> None:
        self.idle_timeout_s = idle_timeout_s
        self.mode: Mode = mode
        self.tok = MergingTokenizer()
        self.cond = threading.Condition()
        self.connections = 0  # accepted connections
        self.completions = 0  # completion requests the server read (each attempt that reached it)
        self.idle_closes = 0  # keep-alive connections closed for idling
        self.open_completion_connections = 0  # connections that carried a completion and are still open
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._ready = threading.Event()
        self._stop: asyncio.Future[None] | None = None
        self._handlers: set[asyncio.Task[Any]] = set()
        self.port = 0

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> FlakyServer:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the test server did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        stop = self._stop
        if stop is not None:
            self._loop.call_soon_threadsafe(lambda: stop.done() or stop.set_result(None))
        self._thread.join(10)

    def wait_completion_connections_closed(self, timeout_s: float = 10.0) -> bool:
        """Block (the caller's thread) until every connection that carried a completion is closed."""
        with self.cond:
            return self.cond.wait_for(lambda: self.open_completion_connections == 0, timeout_s)

    # ------------------------------------------------------------------------ the server thread
    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve())
        self._loop.close()

    async def _serve(self) -> None:
        self._stop = self._loop.create_future()
        server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stop
            for task in list(self._handlers):  # connections still open at the end
                task.cancel()
            await asyncio.gather(*self._handlers, return_exceptions=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        task.add_done_callback(self._handlers.discard)
        with self.cond:
            self.connections += 1
        carried = False
        try:
            while True:
                try:
                    async with asyncio.timeout(self.idle_timeout_s):
                        request = await self._read_request(reader)
                except TimeoutError:
                    with self.cond:
                        self.idle_closes += 1
                    break
                if request is None:
                    break
                _method, path, body = request
                if path == "/v1/completions" and not carried:
                    carried = True
                    with self.cond:
                        self.open_completion_connections += 1
                if not await self._route(writer, path, body):
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
            if carried:
                with self.cond:
                    self.open_completion_connections -= 1
                    self.cond.notify_all()

    async def _read_request(self, reader: asyncio.StreamReader) -> tuple[str, str, bytes] | None:
        line = await reader.readline()
        if not line:
            return None
        method, path, _ = line.decode().split(" ", 2)
        length = 0
        while (header := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = header.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
        return method, path, await reader.readexactly(length)

    async def _route(self, writer: asyncio.StreamWriter, path: str, raw: bytes) -> bool:
        """Answer one request; False when the connection is to be closed."""
        body: dict[str, Any] = json.loads(raw) if raw else {}
        if path == "/v1/models":
            self._json(writer, 200, {"data": [{"id": "flaky"}]})
        elif path == "/tokenize":
            tokens = self.tok.encode(body["prompt"], body.get("add_special_tokens", True))
            self._json(writer, 200, {"tokens": tokens, "count": len(tokens), "max_model_len": 2048})
        elif path == "/detokenize":
            self._json(writer, 200, {"prompt": self.tok.decode(body["tokens"])})
        elif path == "/v1/completions":
            with self.cond:
                self.completions += 1
            return await self._complete(writer, body)
        else:
            writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        return True

    async def _complete(self, writer: asyncio.StreamWriter, body: dict[str, Any]) -> bool:
        if self.mode == "status_500":
            self._json(writer, 500, {"object": "error", "message": "injected failure", "code": 500})
            await writer.drain()
            return True
        if self.mode == "partial_head":
            writer.write(b"HTTP/1.1 2")
            await writer.drain()
            return False
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        n = body["max_tokens"]
        for _ in range(n):
            self._chunk(writer, {"choices": [{"index": 0, "text": " x"}]})
            await writer.drain()
            if self.mode == "close_after_first_chunk":
                return False
        self._chunk(writer, {"choices": [], "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": n}})
        event = b"data: [DONE]\n\n"
        writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(event), event))
        await writer.drain()
        return True

    def _json(self, writer: asyncio.StreamWriter, status: int, obj: dict[str, Any]) -> None:
        data = json.dumps(obj).encode()
        reason = b"OK" if status == 200 else b"Internal Server Error"
        head = b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
        writer.write(head % (status, reason, len(data)) + data)

    def _chunk(self, writer: asyncio.StreamWriter, obj: dict[str, Any]) -> None:
        event = b"data: " + json.dumps(obj).encode() + b"\n\n"
        writer.write(b"%x\r\n%s\r\n" % (len(event), event))
