"""Prompts of exact token length, built with the server's own tokenizer (no tokenizer download).

A fixed built-in English text is tokenized once through the server's ``POST /tokenize``
(``add_special_tokens: false``; vLLM and SGLang both answer ``{tokens, count, max_model_len}``).
Its ids are cut into segments; each prompt starts at a random position of the text and continues
with randomly chosen segments, so prompts are natural-ish token sequences without special ids,
and two prompts share at most a few leading tokens unless ``prefix_len`` asks for a common
prefix (which is drawn once per seed and prepended to every prompt, warm-up included).

Lengths are drawn as vLLM's random dataset does (``datasets/utils.py get_sampling_params``):
integers uniform in ``[floor(L(1−r)), ceil(L(1+r))]`` from ``np.random.default_rng(seed)``,
input first, then output, with at least one output token.

Two prompt formats:

``ids`` (default for ``/v1/completions``)
    The prompt is sent as ``list[int]``; both engines accept it and add no special tokens, so
    the server counts exactly ``prefix_len + input_len`` tokens by construction, with no extra
    round trip per prompt and no tokenizer drift. What it skips is the server's own
    tokenization work, which real text traffic pays in the API server process.
``text`` (required for chat; optional for completions)
    Ids are decoded with ``/detokenize`` (vLLM answers ``{prompt}``, SGLang ``{text}``) and the
    text is re-tokenized until its count is on target, truncating or extending the tail (vLLM's
    ``gen_prompt_decode_to_target_len``, up to 10 tries, against the server instead of a local
    tokenizer). As in vLLM, the special tokens the server adds to a text prompt (BOS) are
    subtracted from the sampled input length so the server's count lands on the target. Chat
    prompts additionally get the chat template's tokens; vLLM's benchmark does not correct for
    those either, and the server's ``usage.prompt_tokens`` reports the true count.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx
import numpy as np

from autotune.config import Dataset
from autotune.errors import BenchmarkError

__all__ = [
    "CORPUS",
    "Prompt",
    "PromptFormat",
    "PromptSet",
    "ServerTokenizer",
    "build_prompts",
    "sample_lengths",
]

PromptFormat = Literal["ids", "text"]

SEGMENT_TOKENS = 32  # granularity of the shuffle: small enough for variety, large enough to read
MAX_ALIGN_TRIES = 10  # vLLM's gen_prompt_decode_to_target_len max_retry
RESERVE_TOKENS = 64  # spare ids per text prompt for extending a tail that re-tokenized short
PREFIX_STREAM = 0x5EED  # the shared prefix is drawn from its own stream: warm-up shares it

CORPUS = """\
The harbour town wakes before the sun. Fishing boats leave in a line, their engines loud in the
cold air, and the gulls follow them past the breakwater. On the hill above the port, the baker
opens the shutters at half past five and sets the first trays of bread on the counter. By seven
the market square is full of carts: apples from the valley, cheese from the farms in the north,
and crates of fish packed in ice. Children walk to school along the sea wall, counting the ships
at anchor and arguing about which one came from the farthest port.
The lighthouse keeper writes the weather in a notebook every three hours. Wind from the
south-west, force four, visibility good, pressure falling slowly. She has kept the record for
eleven years, and the old volumes fill two shelves in the kitchen. When a storm is coming she
can tell from the colour of the water long before the radio says so. Her brother repairs nets
in a shed by the slipway and listens to music on a radio that only finds one station.
In the workshop behind the station, an engineer measures the latency of a small web service. She
sends a thousand requests, records when each one leaves and when the first byte of the answer
arrives, and plots the numbers on a chart. Most answers come back in twelve milliseconds, but a
few take almost a second, and those are the ones users remember. The fix, it turns out, is not
a faster machine but a shorter queue: the service was accepting more work than it could finish.
Rivers carry sand to the coast, and the tide moves it along the beach in long slow waves. Over a
century the shoreline can move by the width of a street. Surveyors mark the dunes with wooden
posts and return every spring to see how far the sea has reached. The map in the town hall
shows three different coastlines, drawn in blue, green and red, one for every fifty years.
A good recipe for soup needs patience more than skill. Onions are cooked slowly until they turn
golden, then carrots, celery and a little garlic join them. Water or stock goes in next, with
beans that soaked overnight, and the pot stays on a low flame for two hours. Salt is added at
the end, tasting as you go, because the broth reduces and grows stronger while it simmers.
The library opens at ten and closes at six, except on Thursdays, when it stays open until nine
for the chess club. Twelve players meet in the reading room, six boards on two long tables, and
the games are slow and quiet. The youngest member is nine years old and has not lost a game
since the winter. The oldest taught mathematics at the school for forty years and still
explains every move he makes, whether or not anyone has asked.
Trains to the city leave every hour from the station at the end of the valley. The journey takes
ninety minutes and passes through four tunnels, two bridges and a long stretch of farmland where
horses stand at the fences and watch. Commuters read, sleep or work on laptops; students play
cards; a man with a bicycle stands by the door and talks to the conductor about the football.
At night the harbour is quiet again. The boats are tied up, their lamps swinging gently, and the
only sound is the water against the stones. The lighthouse turns its beam across the bay every
ten seconds, and far out at sea a cargo ship answers with a single blast of its horn.
"""


@dataclass(frozen=True, slots=True)
class Prompt:
    """One request's prompt.

    Attributes:
        prompt: Token ids (``ids`` format) or text (``text`` format).
        prompt_len: Prompt tokens the server should count (for chat: content tokens only).
        output_len: ``max_tokens`` for this request.
        on_target: Whether the prompt reached its planned length (always true for ids).
    """

    prompt: list[int] | str
    prompt_len: int
    output_len: int
    on_target: bool = True


@dataclass(frozen=True)
class PromptSet:
    """Prompts for one run plus what building them learned about the server's tokenizer."""

    prompts: list[Prompt]
    format: PromptFormat
    num_special_tokens: int = 0
    max_model_len: int | None = None
    off_target: int = field(default=0)


class ServerTokenizer:
    """The server's ``/tokenize`` and ``/detokenize`` endpoints (vLLM and SGLang dialects).

    Args:
        client: Shared HTTP client.
        base_url: Server root, e.g. ``http://127.0.0.1:8000``.
        model: Served model id (vLLM checks it).
        headers: Extra headers (``Authorization``).
        max_parallel: Concurrent tokenizer calls while building prompts.
    """

    def __init__(
        self,
        client: httpx.AsyncClient,
        base_url: str,
        model: str,
        headers: Mapping[str, str] | None = None,
        max_parallel: int = 64,
    ) -> None:
        self._client = client
        self._base = base_url.rstrip("/")
        self._model = model
        self._headers = dict(headers or {})
        self._sem = asyncio.Semaphore(max_parallel)
        self.max_model_len: int | None = None

    async def _post(self, route: str, body: dict[str, Any]) -> dict[str, Any]:
        url = f"{self._base}{route}"
        async with self._sem:
            try:
                resp = await self._client.post(url, json=body, headers=self._headers)
            except httpx.HTTPError as err:
                raise BenchmarkError(f"cannot reach {url}: {type(err).__name__}: {err}") from None
        if resp.status_code in (404, 405):
            raise BenchmarkError(
                f"{url} answered {resp.status_code}; exact-length prompts need the server's "
                "/tokenize and /detokenize (vLLM and SGLang both serve them)"
            )
        if resp.status_code != 200:
            raise BenchmarkError(f"{url} answered {resp.status_code}: {_one_line(resp.text)}")
        data = resp.json()
        if not isinstance(data, dict):
            raise BenchmarkError(f"{url} answered {type(data).__name__}, expected a JSON object")
        return data

    async def tokenize(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text`` as the server counts them."""
        body = {"model": self._model, "prompt": text, "add_special_tokens": add_special_tokens}
        data = await self._post("/tokenize", body)
        if isinstance(data.get("max_model_len"), int):
            self.max_model_len = data["max_model_len"]
        tokens = data.get("tokens")
        if not isinstance(tokens, list):
            raise BenchmarkError(f"{self._base}/tokenize answered without a 'tokens' list")
        return tokens

    async def detokenize(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` (vLLM answers ``prompt``, SGLang ``text``)."""
        data = await self._post("/detokenize", {"model": self._model, "tokens": list(ids)})
        text = data.get("prompt", data.get("text"))
        if not isinstance(text, str):
            raise BenchmarkError(f"{self._base}/detokenize answered without 'prompt' or 'text'")
        return text


def _one_line(text: str, limit: int = 200) -> str:
    return " ".join(text.split())[:limit]


def sample_lengths(
    dataset: Dataset, n: int, rng: np.random.Generator, num_special_tokens: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Input and output lengths as vLLM's random dataset draws them.

    Args:
        dataset: Lengths and range ratio.
        n: Number of requests.
        rng: Generator; vLLM uses ``np.random.default_rng(seed)`` and draws input lengths first.
        num_special_tokens: Tokens the server adds to a text prompt; subtracted from the input
            length so that the server's count lands on ``input_len`` (vLLM does the same).

    Returns:
        ``(input_lens, output_lens)``; input lengths exclude ``prefix_len`` and the specials.
    """
    r = dataset.range_ratio
    real_input = max(0, dataset.input_len - num_special_tokens)
    in_low, in_high = math.floor(real_input * (1 - r)), math.ceil(real_input * (1 + r))
    out_low = max(math.floor(dataset.output_len * (1 - r)), 1)
    out_high = max(math.ceil(dataset.output_len * (1 + r)), 1)
    if dataset.prefix_len + in_low < 1:
        raise BenchmarkError(
            f"input_len {dataset.input_len} leaves no prompt token after {num_special_tokens} special "
            "token(s) and the range ratio; raise input_len or prefix_len"
        )
    input_lens = rng.integers(in_low, in_high + 1, size=n)
    output_lens = rng.integers(out_low, out_high + 1, size=n)
    return input_lens, output_lens


class _TokenSource:
    """Draws token-id sequences from the tokenized corpus: a random start, then random segments."""

    def __init__(self, corpus_ids: Sequence[int]) -> None:
        ids = np.asarray(corpus_ids, dtype=np.int64)
        n_segments = len(ids) // SEGMENT_TOKENS
        if n_segments < 2:
            raise BenchmarkError(
                f"the server tokenized the built-in corpus into only {len(ids)} tokens; "
                f"need at least {2 * SEGMENT_TOKENS}"
            )
        self._ids = ids
        self._segments = ids[: n_segments * SEGMENT_TOKENS].reshape(n_segments, SEGMENT_TOKENS)

    def draw(self, rng: np.random.Generator, n: int) -> list[int]:
        if n <= 0:
            return []
        start = int(rng.integers(0, len(self._ids)))
        head = np.take(self._ids, np.arange(start, start + SEGMENT_TOKENS), mode="wrap")
        k = math.ceil(max(0, n - SEGMENT_TOKENS) / SEGMENT_TOKENS)
        picks = rng.integers(0, len(self._segments), size=k)
        ids: list[int] = np.concatenate([head, self._segments[picks].ravel()])[:n].tolist()
        return ids


async def _align_text(tokenizer: ServerTokenizer, ids: list[int], reserve: list[int], target: int) -> tuple[str, int]:
    """Decode ``ids`` and fix the tail until the text re-tokenizes to ``target`` tokens.

    Returns:
        The text and its actual token count (``target`` unless the tries ran out).
    """
    text, count = "", -1
    for _ in range(MAX_ALIGN_TRIES):
        text = await tokenizer.detokenize(ids)
        got = await tokenizer.tokenize(text)
        count = len(got)
        if count == target:
            break
        if count > target:
            ids = got[:target]
        else:
            need = target - count
            extra = (reserve * (need // len(reserve) + 1))[:need] if reserve else got[:need]
            reserve = reserve[need:]
            ids = got + extra
    return text, count


async def _text_prompt(
    tokenizer: ServerTokenizer, ids: list[int], reserve: list[int], specials: int, output_len: int
) -> Prompt:
    text, count = await _align_text(tokenizer, ids, reserve, len(ids))
    return Prompt(text, count + specials, output_len, on_target=count == len(ids))


async def _count_special_tokens(tokenizer: ServerTokenizer) -> tuple[list[int], int]:
    plain, with_specials = await asyncio.gather(
        tokenizer.tokenize(CORPUS), tokenizer.tokenize(CORPUS, add_special_tokens=True)
    )
    return plain, max(0, len(with_specials) - len(plain))


async def build_prompts(
    tokenizer: ServerTokenizer,
    dataset: Dataset,
    n: int,
    *,
    seed: int,
    fmt: PromptFormat = "ids",
    stream: int = 0,
) -> PromptSet:
    """Build ``n`` prompts of exact token length for ``dataset``.

    The same ``seed``, ``stream``, dataset and server tokenizer give identical prompts.

    Args:
        tokenizer: The server's tokenizer endpoints.
        dataset: Input/output lengths, range ratio and shared prefix length.
        n: Number of prompts.
        seed: Seed; stream 0 draws lengths exactly as ``np.random.default_rng(seed)`` in vLLM.
        fmt: ``ids`` (token ids, completions only) or ``text``.
        stream: Independent content stream for the same seed (warm-up uses 1).

    Returns:
        The prompts, with the server's special-token count and ``max_model_len``.

    Raises:
        BenchmarkError: The server has no usable tokenizer endpoint.
    """
    if fmt == "text":
        corpus_ids, specials = await _count_special_tokens(tokenizer)
    else:
        corpus_ids, specials = await tokenizer.tokenize(CORPUS), 0
    source = _TokenSource(corpus_ids)
    rng = np.random.default_rng(seed if stream == 0 else [seed, stream])
    input_lens, output_lens = sample_lengths(dataset, n, rng, specials)
    prefix = source.draw(np.random.default_rng([seed, PREFIX_STREAM]), dataset.prefix_len)
    planned = [prefix + source.draw(rng, int(k)) for k in input_lens]
    outs = [int(k) for k in output_lens]
    if fmt == "ids":
        prompts = [Prompt(ids, len(ids), out) for ids, out in zip(planned, outs, strict=True)]
        return PromptSet(prompts, fmt, 0, tokenizer.max_model_len)
    reserves = [source.draw(rng, RESERVE_TOKENS) for _ in planned]
    prompts = list(
        await asyncio.gather(
            *(
                _text_prompt(tokenizer, ids, res, specials, out)
                for ids, res, out in zip(planned, reserves, outs, strict=True)
            )
        )
    )
    off = sum(not p.on_target for p in prompts)
    return PromptSet(prompts, fmt, specials, tokenizer.max_model_len, off)
