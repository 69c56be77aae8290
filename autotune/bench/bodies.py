"""How a turn becomes an HTTP request: ``vllm bench serve``'s request bodies, and the history of a session.

Every body streams with ``stream_options.include_usage`` (SGLang sends no usage otherwise), forces
the output length with ``ignore_eos`` + ``max_tokens`` (chat: ``max_completion_tokens``) and sets
``temperature: 0`` (SGLang's chat defaults come from the model's generation config). Requests ask
for ``Accept-Encoding: identity`` so the streamed bytes can be read raw.

A later turn of a session carries the history: for chat, the earlier user messages and the
answers the server streamed, as alternating messages; for completions, the earlier prompt, its
answer and the new message joined as text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx

from autotune.bench.plan import Turn
from autotune.bench.simclock import CLOCK_HEADER, CLOCK_VALUE
from autotune.bench.transport import stream_timeout

__all__ = ["History", "RequestFactory", "RequestShape"]

TURN_SEPARATOR = "\n\n"  # between turns of a completions history

History = list[dict[str, str]] | str


@dataclass(frozen=True)
class RequestShape:
    """Where and how a run's requests go (picklable: worker processes rebuild requests from it).

    Attributes:
        url: The completions or chat-completions URL.
        model: Served model id.
        chat: Chat completions (messages) rather than completions (prompt).
        headers: Headers of every request (``Authorization``, content type).
        timeout_s: Per-request timeout.
        sim_speedup: The simulator's speed-up when the server is one: requests ask for its
            modelled-time stamps (:mod:`autotune.bench.simclock`); None for a real engine.
    """

    url: str
    model: str
    chat: bool
    headers: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 300.0
    sim_speedup: float | None = None


class RequestFactory:
    """Builds the run's requests; URL and header handling happen once per request, before sending."""

    def __init__(self, shape: RequestShape) -> None:
        self.shape = shape
        self._headers = {**shape.headers, "Accept-Encoding": "identity"}
        if shape.sim_speedup is not None:
            self._headers[CLOCK_HEADER] = CLOCK_VALUE
        self._extensions = {"timeout": stream_timeout().as_dict()}

    def body(self, content: list[int] | str | list[dict[str, str]], output_len: int) -> bytes:
        """The JSON body: for completions ``content`` is the prompt (ids or text); for chat it is
        the user's text or the whole message list."""
        common: dict[str, Any] = {
            "model": self.shape.model,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
            "temperature": 0.0,
        }
        if self.shape.chat:
            messages = content if isinstance(content, list) else [{"role": "user", "content": content}]
            body = {"messages": messages, "max_completion_tokens": output_len, **common}
        else:
            body = {"prompt": content, "max_tokens": output_len, **common}
        return json.dumps(body, separators=(",", ":")).encode()

    def request(self, body: bytes) -> httpx.Request:
        return httpx.Request("POST", self.shape.url, content=body, headers=self._headers, extensions=self._extensions)

    def first(self, turn: Turn) -> httpx.Request:
        """The request of a session's first turn (built before the run)."""
        return self.request(self.body(turn.prompt, turn.output_len))

    def follow_up(self, history: History, turn: Turn) -> httpx.Request:
        """The request of a later turn: the history plus the new message."""
        if isinstance(history, str):
            return self.request(self.body(history + TURN_SEPARATOR + str(turn.prompt), turn.output_len))
        messages = [*history, {"role": "user", "content": str(turn.prompt)}]
        return self.request(self.body(messages, turn.output_len))

    def extend(self, history: History | None, turn: Turn, answer: str) -> History:
        """The history after ``turn`` was answered with ``answer``."""
        if not self.shape.chat:
            before = "" if history is None else str(history) + TURN_SEPARATOR
            return before + str(turn.prompt) + answer
        messages = list(history) if isinstance(history, list) else []
        return [*messages, {"role": "user", "content": str(turn.prompt)}, {"role": "assistant", "content": answer}]
