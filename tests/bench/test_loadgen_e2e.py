"""End to end over real sockets: a tiny HTTP/1.1 streaming server on 127.0.0.1, in-process."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from fake_openai import MergingTokenizer

from autotune.bench.loadgen import BenchResult, run_workload
from autotune.bench.prometheus import delta, scrape_async
from autotune.config import Arrival, Dataset, Workload

pytestmark = pytest.mark.sim

METRICS = """# TYPE fake:requests counter
fake:requests_total{{model_name="tiny"}} {n}.0
"""


class TinyServer:
    """HTTP/1.1 with keep-alive and chunked SSE, enough for the load generator's routes."""

    def __init__(self, token_delay_s: float = 0.001) -> None:
        self.tok = MergingTokenizer()
        self.delay = token_delay_s
        self.connections = 0
        self.completions = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while request := await self._read_request(reader):
                method, path, body = request
                await self._route(writer, method, path, body)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

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

    async def _route(self, writer: asyncio.StreamWriter, method: str, path: str, raw: bytes) -> None:
        body: dict[str, Any] = json.loads(raw) if raw else {}
        if path == "/v1/models":
            self._json(writer, {"data": [{"id": "tiny"}]})
        elif path == "/metrics":
            self._respond(writer, b"text/plain", METRICS.format(n=self.completions).encode())
        elif path == "/tokenize":
            tokens = self.tok.encode(body["prompt"], body.get("add_special_tokens", True))
            self._json(writer, {"tokens": tokens, "count": len(tokens), "max_model_len": 2048})
        elif path == "/detokenize":
            self._json(writer, {"prompt": self.tok.decode(body["tokens"])})
        elif path == "/v1/completions":
            await self._stream(writer, body)
        else:
            writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()

    def _json(self, writer: asyncio.StreamWriter, obj: dict[str, Any]) -> None:
        self._respond(writer, b"application/json", json.dumps(obj).encode())

    def _respond(self, writer: asyncio.StreamWriter, content_type: bytes, data: bytes) -> None:
        head = b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n" % (content_type, len(data))
        writer.write(head + data)

    async def _stream(self, writer: asyncio.StreamWriter, body: dict[str, Any]) -> None:
        self.completions += 1
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        n = body["max_tokens"]
        for _ in range(n):
            await asyncio.sleep(self.delay)
            self._chunk(writer, {"choices": [{"index": 0, "text": " x"}]})
            await writer.drain()
        usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": n}
        self._chunk(writer, {"choices": [], "usage": usage})
        event = b"data: [DONE]\n\n"
        writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(event), event))

    def _chunk(self, writer: asyncio.StreamWriter, obj: dict[str, Any]) -> None:
        event = b"data: " + json.dumps(obj).encode() + b"\n\n"
        writer.write(b"%x\r\n%s\r\n" % (len(event), event))


def test_real_sockets_keep_alive_and_metrics_delta() -> None:
    server = TinyServer()
    w = Workload(
        num_prompts=24,
        warmup_requests=4,
        dataset=Dataset(input_len=48, output_len=8, range_ratio=0.5),
        arrival=Arrival(concurrency=4, request_rate=400.0),
    )

    async def go() -> tuple[BenchResult, float]:
        srv = await asyncio.start_server(server.handle, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        base = f"http://127.0.0.1:{port}"
        async with srv:
            before = await scrape_async(base)
            result = await run_workload(base, w)
            after = await scrape_async(base)
        return result, delta(before, after, "fake:requests")

    result, served = asyncio.run(go())
    m = result.metrics
    assert m["completed"] == 24 and m["failed"] == 0
    assert served == 28.0  # 4 warm-up + 24 measured completions between the two scrapes
    assert m["total_output_tokens"] == sum(r.expected_output_len for r in result.records)
    assert all(len(r.itl) == r.expected_output_len - 1 for r in result.records)
    assert all(r.prompt_len == r.expected_prompt_len for r in result.records)
    assert result.clamped_requests == 0 and result.prompt_len_mismatches == 0
    # Keep-alive: tokenizer calls, 4 warm-up and 24 measured requests over a handful of sockets.
    assert server.connections <= 8
