"""The OpenAI-compatible API both dialects serve: completions, chat, tokenize, models.

Requests become :class:`~autotune_sim.scheduler.SimRequest` s; their tokens come back through an
:class:`Exchange` (the engine's sink), which writes SSE chunks straight to the connection: one
chunk per ``--stream-interval`` tokens, the chat role delta first, the finish reason on the last
token's chunk, then an optional usage chunk and ``data: [DONE]``. Chunk bytes are assembled
from per-request prefixes, so a token costs a few byte joins and one socket write.

Length rules follow each engine: vLLM silently clamps ``max_tokens`` to the context left after
the prompt (400 only when ``max_tokens`` alone exceeds ``max_model_len``); SGLang rejects a
request whose prompt plus ``max_tokens`` exceeds its context length. Without ``ignore_eos`` the
model stops on its own after a deterministic, prompt-dependent length (``natural_length``).

Modelled time on the wire. A client that sends ``x-autotune-clock: modelled`` (no real engine
reads or sends any of this) gets the simulator's clock: ``GET /v1/models`` answers with the
headers ``x-autotune-modelled-now`` (modelled seconds) and ``x-autotune-speedup``, and every
streamed chunk of a generation is preceded by an SSE comment line ``: modelled <arrival> <t>`` —
the request's modelled arrival and the modelled time of the chunk's last token. SSE clients
ignore comments, so the stream stays valid for any client; a client that reads them measures the
run in modelled time, whatever the speed-up and however loaded the host. A request that carries
``x-autotune-successor: 1`` holds the modelled clock when it ends, until the client's next
request (or ``x-autotune-successor: 0`` on ``/v1/models``: none will come; a number there: a run's
first wave of that many requests is on its way). A paced run's requests carry their due time,
``x-autotune-arrival: <offset>`` (modelled seconds after the run's start), and the next one's,
``x-autotune-next-arrival`` (on ``/v1/models``: the first one's, which starts the run): the
request enters the engine at that modelled time, however late the client sent it — see
:mod:`autotune_sim.clock`.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from autotune_sim.clock import ModelClock
from autotune_sim.engine import Engine, Fatal
from autotune_sim.http import Request, Responder
from autotune_sim.scheduler import SimRequest
from autotune_sim.tokenizer import Tokenizer

__all__ = ["ApiError", "Exchange", "OpenAIServer", "ServingConfig", "natural_length"]

DONE = b"data: [DONE]\n\n"
CLOCK_HEADER = "x-autotune-clock"  # value "modelled": the client reads the modelled stamps
SUCCESSOR_HEADER = "x-autotune-successor"  # "1": another request follows the moment this one ends
ARRIVAL_HEADER = "x-autotune-arrival"  # a paced request's due time: modelled seconds after the run's start
NEXT_ARRIVAL_HEADER = "x-autotune-next-arrival"  # the next request's (on /v1/models: the first's)


class ApiError(Exception):
    """A request the server answers with an error status."""

    def __init__(self, status: int, message: str, kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


@dataclass(frozen=True)
class ServingConfig:
    """What the API layer needs to know about the engine it fronts."""

    dialect: str  # "vllm" or "sglang"
    served_names: tuple[str, ...]
    model_path: str
    max_model_len: int
    max_input_len: int
    stream_interval: int = 1
    force_include_usage: bool = False
    api_key: str | None = None
    seed: int = 0
    drop_connections: float = 0.0

    @property
    def name(self) -> str:
        return self.served_names[0]


def natural_length(prompt: Sequence[int], seed: int, max_tokens: int, min_tokens: int) -> tuple[int, str]:
    """Tokens generated without ``ignore_eos``: the model's own stop, or ``max_tokens``."""
    h = hash((seed, len(prompt), tuple(prompt[:64])))
    own = 16 + h % 497  # the modelled answer: 16–512 tokens
    own = max(own, min_tokens)
    return (own, "stop") if own < max_tokens else (max_tokens, "length")


def _offset(value: str, header: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ApiError(400, f"{header} must be a number of modelled seconds, got {value!r}") from None


def _gate(request: Request) -> tuple[float, float | None] | None:
    """A paced request's due offset and the next one's (None: the request is not gated)."""
    own = request.headers.get(ARRIVAL_HEADER)
    if own is None:
        return None
    after = request.headers.get(NEXT_ARRIVAL_HEADER)
    return _offset(own, ARRIVAL_HEADER), None if after is None else _offset(after, NEXT_ARRIVAL_HEADER)


class EngineGroup:
    """Data-parallel engines behind one API server; a request goes to the least loaded one."""

    def __init__(self, engines: Sequence[Engine]) -> None:
        self.engines = list(engines)

    @property
    def clock(self) -> ModelClock:
        return self.engines[0].clock

    def submit(self, req: SimRequest, at: float | None = None) -> Engine:
        engine = min(self.engines, key=lambda e: len(e.scheduler.running) + len(e.scheduler.waiting))
        engine.submit(req, at=at)
        return engine


class Exchange:
    """One HTTP generation request: its engine requests, its response, its chunk templates."""

    def __init__(
        self,
        api: OpenAIServer,
        responder: Responder,
        *,
        chat: bool,
        stream: bool,
        include_usage: bool,
        continuous_usage: bool,
        stamped: bool = False,
        successor: bool = False,
    ) -> None:
        self.api, self.responder = api, responder
        self.stamped = stamped and stream
        self.successor = successor
        self.chat, self.stream = chat, stream
        self.include_usage, self.continuous_usage = include_usage, continuous_usage
        cfg = api.cfg
        self.rid = api.next_id(chat)
        self.created = int(time.time())
        self.reqs: list[tuple[SimRequest, Engine]] = []
        self.gate: tuple[float, float | None] | None = None  # a paced request's due and next offsets
        self.waiting: asyncio.Task[None] | None = None  # until its due time
        self.texts: list[list[str]] = []
        self.pending: list[list[bytes]] = []
        self._templates: list[tuple[bytes, tuple[bytes, ...], bytes]] = []
        self.open = 0
        self.interval = max(1, cfg.stream_interval)
        self.drop_at = -1
        self.failed = False
        obj = "chat.completion.chunk" if chat else "text_completion"
        head = json.dumps(
            {"id": self.rid, "object": obj, "created": self.created, "model": cfg.name}, separators=(",", ":")
        )
        self._prefix = b"data: " + head[:-1].encode() + b',"choices":[{"index":'
        self._sglang = cfg.dialect == "sglang"
        tok = api.tokenizer
        self._word_index = tok.output_index
        self._json_words, self._text_words = tok.output_json, tok.output_text

    # ---------------------------------------------------------------------- sink (hot path)
    def emit(self, req: SimRequest, finished: bool) -> None:
        index = self._word_index(req.out_seed, req.generated - 1)
        if self.stream:
            pending = self.pending[req.choice]
            pending.append(self._json_words[index])
            if finished or len(pending) >= self.interval:
                if not self.responder.done:
                    text = pending[0] if len(pending) == 1 else b"".join(pending)
                    chunk = self._chunk(req.choice, text, req, finished)
                    if self.stamped:
                        chunk = b": modelled %.6f %.6f\n" % (req.arrival, req.last_token) + chunk
                    self.responder.write(chunk)
                pending.clear()
        else:
            self.texts[req.choice].append(self._text_words[index])
        if finished:
            self._finished_one()
        elif self.drop_at >= 0 and req.generated >= self.drop_at:
            self.drop()

    def fail(self, req: SimRequest, message: str) -> None:
        if self.failed:
            return
        self.failed = True
        for other, engine in self.reqs:
            if other is not req:
                engine.abort(other)
        if self.stream:
            err = {"error": self.api.error_body(500, message, "InternalServerError")}
            self.responder.end(b"data: " + json.dumps(err).encode() + b"\n\n" + DONE)
        else:
            self.responder.json(500, self.api.error_payload(500, message, "InternalServerError"))

    def _chunk(self, index: int, text: bytes, req: SimRequest, finished: bool) -> bytes:
        """One SSE event: the choice's constant head and tail around the new text."""
        head, tails, role = self._templates[index]
        tail = tails[0] if not finished else tails[1] if req.finish_reason == "length" else tails[2]
        if self.continuous_usage:
            usage = b',"usage":' + json.dumps(self._usage_of([req]), separators=(",", ":")).encode() + b"}\n\n"
            tail = tail[: tail.rindex(b"}]") + 2] + usage
        if role:
            self._templates[index] = (head, tails, b"")
            return role + head + text + tail
        return head + text + tail

    def build_templates(self, choices: int) -> None:
        """Per choice: the event head up to the text, the three tails (running, length, stop), the
        chat role event sent once before the first token."""
        sglang = self._sglang
        stop = b',"matched_stop":null' if sglang else b',"stop_reason":null'
        usage = b',"usage":null' if not self.chat or sglang else b""
        self._templates = []
        for index in range(choices):
            start = self._prefix + str(index).encode()
            if self.chat:
                head = start + b',"delta":{"content":"'
                before = b'"},"logprobs":null,"finish_reason":'
                role = (
                    start
                    + b',"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]'
                    + (b',"usage":null' if sglang else b"")
                    + b"}\n\n"
                )
            else:
                head, before, role = start + b',"text":"', b'","logprobs":null,"finish_reason":', b""
            tails = tuple(
                before + reason + stop + b"}]" + usage + b"}\n\n" for reason in (b"null", b'"length"', b'"stop"')
            )
            self._templates.append((head, tails, role))

    # ---------------------------------------------------------------------------- finish
    def _usage_of(self, reqs: Sequence[SimRequest]) -> dict[str, int]:
        prompt = sum(len(r.prompt) for r in reqs)
        completion = sum(r.generated for r in reqs)
        return {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion}

    def _finished_one(self) -> None:
        self.open -= 1
        if self.open > 0 or self.failed:
            return
        reqs = [r for r, _ in self.reqs]
        usage = self._usage_of(reqs)
        if self.stream:
            tail = b""
            if self.include_usage:
                obj = "chat.completion.chunk" if self.chat else "text_completion"
                payload = {
                    "id": self.rid,
                    "object": obj,
                    "created": self.created,
                    "model": self.api.cfg.name,
                    "choices": [],
                    "usage": usage,
                }
                tail = b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"
            self.responder.end(tail + DONE)
            return
        self.responder.json(200, self.api.full_response(self, reqs, usage))

    def cancel(self) -> None:
        """The client went away: stop generating."""
        if self.waiting is not None:
            self.waiting.cancel()
        for req, engine in self.reqs:
            engine.abort(req)

    def drop(self) -> None:
        """Fault injection: cut the connection mid-stream."""
        self.cancel()
        self.failed = True
        self.responder.abort()


class OpenAIServer:
    """Request handling for the OpenAI routes of one dialect."""

    def __init__(
        self,
        cfg: ServingConfig,
        tokenizer: Tokenizer,
        engines: EngineGroup,
        dead_message: Callable[[], str | None],
    ) -> None:
        self.cfg, self.tokenizer, self.engines = cfg, tokenizer, engines
        self._dead_message = dead_message
        self._rng = random.Random(cfg.seed ^ 0x5EED)
        self._ids = 0
        self._rids = 0

    def next_id(self, chat: bool) -> str:
        self._ids += 1
        hexid = f"{self.cfg.seed & 0xFFFF:04x}{self._ids:028x}"
        if self.cfg.dialect == "sglang":
            return hexid
        return ("chatcmpl-" if chat else "cmpl-") + hexid

    # ---------------------------------------------------------------------------- errors
    def error_body(self, status: int, message: str, kind: str) -> dict[str, Any]:
        if self.cfg.dialect == "sglang":
            return {"object": "error", "message": message, "type": kind, "param": None, "code": status}
        return {"message": message, "type": kind, "param": None, "code": status}

    def error_payload(self, status: int, message: str, kind: str) -> dict[str, Any]:
        body = self.error_body(status, message, kind)
        return body if self.cfg.dialect == "sglang" else {"error": body}

    def guard(self, handler: Callable[[Request, Responder], None]) -> Callable[[Request, Responder], None]:
        """Wrap a route: API key check and ApiError → error response."""

        def wrapped(request: Request, resp: Responder) -> None:
            try:
                if self.cfg.api_key and request.headers.get("authorization") != f"Bearer {self.cfg.api_key}":
                    resp.json(401, {"error": "Unauthorized"})
                    return
                handler(request, resp)
            except ApiError as err:
                resp.json(err.status, self.error_payload(err.status, err.message, err.kind))

        return wrapped

    def _body(self, request: Request) -> dict[str, Any]:
        try:
            body = request.json()
        except ValueError:
            raise ApiError(400, "Invalid JSON body") from None
        if not isinstance(body, dict):
            raise ApiError(400, "The request body must be a JSON object")
        model = body.get("model")
        if model is not None and model not in self.cfg.served_names:
            raise ApiError(404, f"The model `{model}` does not exist.", "NotFoundError")
        return body

    # ---------------------------------------------------------------------------- routes
    def clock_headers(self, request: Request) -> list[tuple[str, str]]:
        """The modelled clock, for a client that asked for it (see the module doc)."""
        if request.headers.get(CLOCK_HEADER) != "modelled":
            return []
        clock = self.engines.clock
        return [("x-autotune-modelled-now", f"{clock.now():.6f}"), ("x-autotune-speedup", f"{clock.speedup:g}")]

    def models(self, request: Request, resp: Responder) -> None:
        now = int(time.time())
        data = []
        for name in self.cfg.served_names:
            card: dict[str, Any] = {
                "id": name,
                "object": "model",
                "created": now,
                "owned_by": self.cfg.dialect,
                "root": self.cfg.model_path,
                "parent": None,
                "max_model_len": self.cfg.max_model_len,
            }
            data.append(card)
        clock, promised = self.engines.clock, request.headers.get(SUCCESSOR_HEADER, "")
        first = request.headers.get(NEXT_ARRIVAL_HEADER)
        if promised == "0":
            clock.settle()  # a closed-loop client will send no request for a freed slot
        elif promised.isdigit():  # a closed-loop run starts: its first requests are on their way
            clock.drop_gates()
            for _ in range(int(promised)):
                clock.hold(clock.now())
        elif first is not None:  # a paced run starts: its arrivals are gated (autotune_sim.clock)
            clock.open_gates(_offset(first, NEXT_ARRIVAL_HEADER))
        elif request.headers.get(CLOCK_HEADER) == "modelled":
            clock.drop_gates()  # a client's new run: an earlier run that stopped early gates nothing
        body = json.dumps({"object": "list", "data": data}, separators=(",", ":")).encode()
        resp.send(200, body, headers=self.clock_headers(request))

    def tokenize(self, request: Request, resp: Responder) -> None:
        body = self._body(request)
        tok = self.tokenizer
        if "messages" in body:
            ids = tok.encode_chat(body["messages"], bool(body.get("add_generation_prompt", True)))
        else:
            prompt = body.get("prompt", "")
            special = bool(body.get("add_special_tokens", True))
            if isinstance(prompt, list):
                ids = [t for p in prompt for t in tok.encode(str(p), special)]
            else:
                ids = tok.encode(str(prompt), special)
        out: dict[str, Any] = {"count": len(ids), "max_model_len": self.cfg.max_model_len, "tokens": ids}
        if self.cfg.dialect == "vllm":
            out["token_strs"] = tok.token_strs(ids) if body.get("return_token_strs") else None
        resp.json(200, out)

    def detokenize(self, request: Request, resp: Responder) -> None:
        body = self._body(request)
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise ApiError(400, "tokens must be a list of integers")
        if not self.tokenizer.valid(tokens):
            raise ApiError(400, "Token id out of vocabulary")
        text = self.tokenizer.decode(tokens)
        resp.json(200, {"text": text} if self.cfg.dialect == "sglang" else {"prompt": text})

    def completions(self, request: Request, resp: Responder) -> None:
        body = self._body(request)
        prompts = self._prompts(body.get("prompt"))
        self._generate(body, prompts, resp, request, chat=False, default_max=16)

    def chat(self, request: Request, resp: Responder) -> None:
        body = self._body(request)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "messages must be a non-empty list")
        ids = self.tokenizer.encode_chat(messages, bool(body.get("add_generation_prompt", True)))
        limit = body.get("max_completion_tokens", body.get("max_tokens"))
        self._generate({**body, "max_tokens": limit}, [ids], resp, request, chat=True, default_max=None)

    # ------------------------------------------------------------------------- internals
    def _prompts(self, prompt: Any) -> list[list[int]]:
        tok = self.tokenizer
        if isinstance(prompt, str):
            return [tok.encode(prompt)]
        if isinstance(prompt, list) and prompt:
            if all(isinstance(t, int) for t in prompt):
                return [self._checked(prompt)]
            if all(isinstance(p, str) for p in prompt):
                return [tok.encode(p) for p in prompt]
            if all(isinstance(p, list) and p and all(isinstance(t, int) for t in p) for p in prompt):
                return [self._checked(p) for p in prompt]
        raise ApiError(400, "prompt must be a string, a list of strings, or a list of token ids")

    def _checked(self, ids: list[int]) -> list[int]:
        if not self.tokenizer.valid(ids):
            raise ApiError(400, f"Token id out of vocabulary (vocab size {self.tokenizer.vocab_size})")
        return ids

    def _limit(self, prompt_len: int, requested: Any, default_max: int | None) -> int:
        cfg = self.cfg
        if requested is not None and (not isinstance(requested, int) or requested < 1):
            raise ApiError(400, f"max_tokens must be at least 1, got {requested}.")
        if prompt_len > cfg.max_input_len:
            raise ApiError(
                400,
                f"This model's maximum context length is {cfg.max_model_len} tokens. However, your request has "
                f"{prompt_len} input tokens. Please reduce the length of the input messages.",
            )
        left = cfg.max_model_len - prompt_len
        wanted = requested if requested is not None else default_max
        if wanted is None:
            return left
        if cfg.dialect == "vllm":
            if wanted > cfg.max_model_len:
                raise ApiError(
                    400,
                    f"'max_tokens' or 'max_completion_tokens' is too large: {wanted}. This model's maximum "
                    f"context length is {cfg.max_model_len} tokens and your request has {prompt_len} input "
                    f"tokens ({wanted} > {cfg.max_model_len} - {prompt_len}).",
                )
            return min(wanted, left)  # vLLM clamps silently
        if wanted > left:
            raise ApiError(
                400,
                f"Requested token count exceeds the model's maximum context length of {cfg.max_model_len} "
                f"tokens. You requested a total of {prompt_len + wanted} tokens: {prompt_len} tokens from the "
                f"input messages and {wanted} tokens for the completion. Please reduce the number of tokens "
                "in the input messages or the completion to fit within the limit.",
            )
        return int(wanted)

    def _generate(
        self,
        body: dict[str, Any],
        prompts: list[list[int]],
        resp: Responder,
        request: Request,
        *,
        chat: bool,
        default_max: int | None,
    ) -> None:
        dead = self._dead_message()
        if dead is not None:
            raise ApiError(500, dead, "InternalServerError")
        n = body.get("n", 1)
        if not isinstance(n, int) or n < 1:
            raise ApiError(400, "n must be at least 1.")
        options = body.get("stream_options") or {}
        stream = bool(body.get("stream", False))
        if options and not stream:
            raise ApiError(400, "Stream options can only be defined when `stream=True`.")
        exchange = Exchange(
            self,
            resp,
            chat=chat,
            stream=stream,
            include_usage=bool(options.get("include_usage")) or self.cfg.force_include_usage,
            continuous_usage=bool(options.get("continuous_usage_stats")),
            stamped=request.headers.get(CLOCK_HEADER) == "modelled",
            successor=request.headers.get(SUCCESSOR_HEADER) == "1",
        )
        exchange.gate = _gate(request)
        ignore_eos = bool(body.get("ignore_eos", False))
        min_tokens = int(body.get("min_tokens") or 0)
        planned: list[SimRequest] = []
        for prompt in prompts:
            limit = self._limit(len(prompt), body.get("max_tokens"), default_max)
            if min_tokens > limit:
                raise ApiError(400, f"min_tokens must be less than or equal to max_tokens={limit}, got {min_tokens}.")
            for _ in range(n):
                planned.append(self._plan(prompt, limit, ignore_eos, min_tokens, body, exchange, len(planned)))
        self._start(exchange, planned, resp, stream)

    def _plan(
        self,
        prompt: list[int],
        limit: int,
        ignore_eos: bool,
        min_tokens: int,
        body: dict[str, Any],
        exchange: Exchange,
        index: int,
    ) -> SimRequest:
        self._rids += 1
        seed = hash((self.cfg.seed, self._rids)) & 0x7FFFFFFF
        length, reason = (limit, "length") if ignore_eos else natural_length(prompt, self.cfg.seed, limit, min_tokens)
        priority = body.get("priority", 0)
        return SimRequest(
            self._rids,
            prompt,
            length,
            reason,
            limit,
            seed,
            priority=priority if isinstance(priority, int) else 0,
            sink=exchange,
            choice=index,
            successor=exchange.stamped and exchange.successor,
        )

    def _start(self, exchange: Exchange, reqs: list[SimRequest], resp: Responder, stream: bool) -> None:
        exchange.open = len(reqs)
        exchange.texts = [[] for _ in reqs]
        exchange.pending = [[] for _ in reqs]
        exchange.build_templates(len(reqs))
        if self.cfg.drop_connections and stream and self._rng.random() < self.cfg.drop_connections:
            # Cut before the last token, so a dropped stream never looks complete.
            exchange.drop_at = self._rng.randint(1, max(1, reqs[0].output_len - 1))
        if stream:
            resp.start_stream()
        resp.on_close = exchange.cancel
        if exchange.gate is None:
            self._submit(exchange, reqs)
        else:
            exchange.waiting = asyncio.get_running_loop().create_task(self._submit_when_due(exchange, reqs))

    def _submit(self, exchange: Exchange, reqs: list[SimRequest], at: float | None = None) -> None:
        try:
            for req in reqs:
                exchange.reqs.append((req, self.engines.submit(req, at=at)))
        except Fatal:
            exchange.fail(reqs[0], self._dead_message() or "EngineCore encountered an issue.")

    async def _submit_when_due(self, exchange: Exchange, reqs: list[SimRequest]) -> None:
        """A paced request enters at its due modelled time, whenever the client sent it."""
        assert exchange.gate is not None
        clock = self.engines.clock
        at, next_at = (None if o is None else clock.arrival_time(o) for o in exchange.gate)
        assert at is not None
        try:
            on_time = await clock.until_due(at)
        finally:  # a request the client gave up on still came: the schedule goes on without it
            clock.pass_gate(at, next_at)
        self._submit(exchange, reqs, at if on_time else None)

    def full_response(self, exchange: Exchange, reqs: list[SimRequest], usage: dict[str, int]) -> dict[str, Any]:
        """The non-streaming response body once every choice finished."""
        choices: list[dict[str, Any]] = []
        for i, req in enumerate(reqs):
            text = "".join(exchange.texts[i])
            stop_key = "matched_stop" if self.cfg.dialect == "sglang" else "stop_reason"
            if exchange.chat:
                choices.append(
                    {
                        "index": i,
                        "message": {"role": "assistant", "content": text},
                        "logprobs": None,
                        "finish_reason": req.finish_reason,
                        stop_key: None,
                    }
                )
            else:
                choices.append(
                    {"index": i, "text": text, "logprobs": None, "finish_reason": req.finish_reason, stop_key: None}
                )
        return {
            "id": exchange.rid,
            "object": "chat.completion" if exchange.chat else "text_completion",
            "created": exchange.created,
            "model": self.cfg.name,
            "choices": choices,
            "usage": usage,
        }
