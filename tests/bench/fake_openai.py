"""A fake OpenAI-compatible server (for ``httpx.MockTransport``) with a tokenizer that merges.

The tokenizer is greedy longest-match over single characters plus a few bigrams, so decoding ids
and re-encoding the text can give a different count (``["t", "h"]`` comes back as ``["th"]``),
which is what the prompt builder's text alignment has to cope with on real BPE tokenizers.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from autotune.bench.prompts import CORPUS

BOS = 0
BIGRAMS = ["th", "he", "in", "er", "an", "re", " t", " a", "e ", "s ", "d "]


class MergingTokenizer:
    """Greedy longest-match over characters and BIGRAMS; id 0 is BOS."""

    def __init__(self) -> None:
        chars = sorted(set(CORPUS) | set("abcdefghijklmnopqrstuvwxyz "))
        self.vocab = ["<s>", *chars, *BIGRAMS]
        self.ids = {tok: i for i, tok in enumerate(self.vocab)}

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        out = [BOS] if add_special_tokens else []
        i = 0
        while i < len(text):
            pair = text[i : i + 2]
            if pair in self.ids and len(pair) == 2:
                out.append(self.ids[pair])
                i += 2
            else:
                out.append(self.ids[text[i]])
                i += 1
        return out

    def decode(self, ids: list[int]) -> str:
        return "".join(self.vocab[i] for i in ids if i != BOS)


@dataclass
class FakeOpenAI:
    """Serves /v1/models, /tokenize, /detokenize and streaming (chat) completions."""

    model: str = "fake-model"
    dialect: str = "vllm"  # "sglang": /detokenize answers {"text"}
    clamp: int | None = None  # emit at most this many tokens (vLLM's silent clamp)
    token_delay_s: float = 0.0
    fail_every: int = 0  # every n-th completion answers HTTP 500
    has_tokenize: bool = True
    reset_route: str | None = None  # "/reset_prefix_cache" (vLLM dev mode) or "/flush_cache" (SGLang)
    resets: int = 0
    reset_ok: bool = True  # False: the reset route answers {"success": false} (vLLM: blocks still in use)
    hang: bool = False
    tok: MergingTokenizer = field(default_factory=MergingTokenizer)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    headers: list[httpx.Headers] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=self.transport())

    async def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": self.model}]})
        body = json.loads(request.content) if request.content else {}
        if path in ("/tokenize", "/detokenize") and not self.has_tokenize:
            return httpx.Response(404, json={"detail": "Not Found"})
        if path == "/tokenize":
            tokens = self.tok.encode(body["prompt"], body.get("add_special_tokens", True))
            return httpx.Response(200, json={"tokens": tokens, "count": len(tokens), "max_model_len": 4096})
        if path == "/detokenize":
            key = "text" if self.dialect == "sglang" else "prompt"
            return httpx.Response(200, json={key: self.tok.decode(body["tokens"])})
        if path == self.reset_route:
            self.resets += 1
            return httpx.Response(200, json={"success": self.reset_ok})
        if path in ("/v1/completions", "/v1/chat/completions"):
            return self._complete(request, body, chat=path.endswith("chat/completions"))
        return httpx.Response(404, json={"detail": "Not Found"})

    def _prompt_tokens(self, body: dict[str, Any], chat: bool) -> int:
        if chat:  # BOS, then each message's content plus a 3-token template
            return 1 + sum(len(self.tok.encode(m["content"])) + 3 for m in body["messages"])
        prompt = body["prompt"]
        return len(prompt) if isinstance(prompt, list) else len(self.tok.encode(prompt, True))

    def _complete(self, request: httpx.Request, body: dict[str, Any], chat: bool) -> httpx.Response:
        self.bodies.append(body)
        self.headers.append(request.headers)
        if self.fail_every and len(self.bodies) % self.fail_every == 0:
            return httpx.Response(500, json={"error": {"message": "injected failure"}})
        n = body["max_completion_tokens" if chat else "max_tokens"]
        n = min(n, self.clamp) if self.clamp else n
        return httpx.Response(
            200,
            headers={"content-type": "text/event-stream"},
            content=self._events(n, self._prompt_tokens(body, chat), chat),
        )

    async def _events(self, n: int, prompt_tokens: int, chat: bool) -> AsyncIterator[bytes]:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.hang:
                await asyncio.sleep(3600)
            if chat:
                yield sse({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
            for _ in range(n):
                await asyncio.sleep(self.token_delay_s)
                choice = {"index": 0, "delta": {"content": "x"}} if chat else {"index": 0, "text": "x"}
                yield sse({"choices": [choice]})
            usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n}
            yield sse({"choices": [], "usage": usage})
            yield b"data: [DONE]\n\n"
        finally:
            self.in_flight -= 1


def sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"
