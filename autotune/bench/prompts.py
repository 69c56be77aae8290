"""Prompts of exact token length, built with the server's own tokenizer (no tokenizer download).

A fixed built-in English text is tokenized once through the server's ``POST /tokenize``
(``add_special_tokens: false``; vLLM and SGLang both answer ``{tokens, count, max_model_len}``).
Its ids are cut into segments; each prompt starts at a random position of the text and continues
with randomly chosen segments, so prompts are natural-ish token sequences without special ids,
and two prompts share at most a few leading tokens unless ``prefix_len`` asks for shared
prefixes: ``num_prefixes`` of them are drawn once per seed and salt, and each prompt starts with
one (an even share each, shuffled, as vLLM's ``prefix_repetition``; warm-up prompts take them in
turn, so a warm-up of ``num_prefixes`` requests leaves every prefix cached).

Lengths come from :mod:`autotune.bench.lengths` (for the uniform default, exactly vLLM's random
dataset: ``np.random.default_rng(seed)``, input first, then output, at least one output token).
A run's *salt* changes the content (prefixes included) but not the lengths, so repeated runs
against one engine measure the same shapes without hitting each other's prefix cache.

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

from autotune.bench.lengths import sample_lengths
from autotune.config import Dataset
from autotune.errors import BenchmarkError

__all__ = [
    "CORPUS",
    "Prompt",
    "PromptFormat",
    "PromptSet",
    "ServerTokenizer",
    "TokenSource",
    "build_prompts",
    "content_rngs",
    "load_source",
    "prefix_assignment",
    "realize",
    "sample_lengths",
    "shared_prefixes",
]

PromptFormat = Literal["ids", "text"]

SEGMENT_TOKENS = 32  # granularity of the shuffle: small enough for variety, large enough to read
MAX_ALIGN_TRIES = 10  # vLLM's gen_prompt_decode_to_target_len max_retry
RESERVE_TOKENS = 64  # spare ids per text prompt for extending a tail that re-tokenized short
PREFIX_STREAM = 0x5EED  # the shared prefixes are drawn from their own stream: warm-up shares them
SALT_STREAM = 0x5A17  # content of a salted run (same lengths, other tokens)

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


class TokenSource:
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
        """``n`` token ids: a random stretch of the corpus, continued with random segments."""
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


async def load_source(tokenizer: ServerTokenizer, fmt: PromptFormat) -> tuple[TokenSource, int]:
    """Tokenize the corpus once; for text prompts also count the special tokens the server adds.

    Returns:
        The token source and the number of special tokens (0 for ``ids``).
    """
    if fmt == "ids":
        return TokenSource(await tokenizer.tokenize(CORPUS)), 0
    plain, with_specials = await asyncio.gather(
        tokenizer.tokenize(CORPUS), tokenizer.tokenize(CORPUS, add_special_tokens=True)
    )
    return TokenSource(plain), max(0, len(with_specials) - len(plain))


async def realize(
    tokenizer: ServerTokenizer,
    source: TokenSource,
    planned: Sequence[list[int]],
    outputs: Sequence[int],
    rng: np.random.Generator,
    *,
    fmt: PromptFormat,
    specials: int = 0,
) -> list[Prompt]:
    """Turn planned token ids into prompts: as they are (``ids``) or as aligned text.

    Args:
        tokenizer: The server's tokenizer endpoints (text only).
        source: Where spare ids for extending a short text tail come from.
        planned: Token ids of each prompt.
        outputs: ``max_tokens`` of each prompt.
        rng: Generator for the spare ids.
        fmt: ``ids`` or ``text``.
        specials: Special tokens the server adds to each text prompt (counted in ``prompt_len``).
    """
    if fmt == "ids":
        return [Prompt(ids, len(ids), out) for ids, out in zip(planned, outputs, strict=True)]
    reserves = [source.draw(rng, RESERVE_TOKENS) for _ in planned]
    jobs = (
        _text_prompt(tokenizer, ids, res, specials, out)
        for ids, res, out in zip(planned, reserves, outputs, strict=True)
    )
    return list(await asyncio.gather(*jobs))


def content_rngs(seed: int, stream: int, salt: int) -> tuple[np.random.Generator, np.random.Generator]:
    """Generators for (lengths, content) of one prompt stream.

    Lengths always come from ``default_rng(seed)`` (stream 0, vLLM's numbers) or
    ``default_rng([seed, stream])``. Content continues that generator for salt 0; another salt
    gives other content with the same lengths, so repeated runs do not share prompts.
    """
    lengths = np.random.default_rng(seed if stream == 0 else [seed, stream])
    if salt == 0:
        return lengths, lengths
    return lengths, np.random.default_rng([seed, stream, SALT_STREAM, salt])


def shared_prefixes(source: TokenSource, dataset: Dataset, seed: int, salt: int) -> list[list[int]]:
    """The dataset's ``num_prefixes`` shared prefixes, the same for measured and warm-up prompts."""
    rng = np.random.default_rng([seed, PREFIX_STREAM] if salt == 0 else [seed, PREFIX_STREAM, salt])
    return [source.draw(rng, dataset.prefix_len) for _ in range(dataset.num_prefixes)]


def prefix_assignment(n: int, num_prefixes: int, rng: np.random.Generator | None) -> list[int]:
    """Which prefix each of ``n`` prompts gets: an even share each (as vLLM's prefix_repetition),
    shuffled by ``rng``, or in turn when ``rng`` is None (warm-up covers every prefix first)."""
    order = np.arange(n) % num_prefixes
    if rng is not None and num_prefixes > 1:
        order = rng.permutation(order)
    out: list[int] = order.tolist()
    return out


async def build_prompts(
    tokenizer: ServerTokenizer,
    dataset: Dataset,
    n: int,
    *,
    seed: int,
    fmt: PromptFormat = "ids",
    stream: int = 0,
    salt: int = 0,
) -> PromptSet:
    """Build ``n`` single-turn prompts of exact token length for ``dataset``.

    The same ``seed``, ``stream``, ``salt``, dataset and server tokenizer give identical prompts.

    Args:
        tokenizer: The server's tokenizer endpoints.
        dataset: Length distributions, shared prefix length and count.
        n: Number of prompts.
        seed: Seed; stream 0 draws lengths exactly as ``np.random.default_rng(seed)`` in vLLM.
        fmt: ``ids`` (token ids, completions only) or ``text``.
        stream: Independent content stream for the same seed (warm-up uses 1; its prompts take
            the shared prefixes in turn, so a warm-up of ``num_prefixes`` requests warms them all).
        salt: Other content (prefixes included) with the same lengths; 0 is the seed's own.

    Returns:
        The prompts, with the server's special-token count and ``max_model_len``.

    Raises:
        BenchmarkError: The server has no usable tokenizer endpoint.
    """
    source, specials = await load_source(tokenizer, fmt)
    lengths_rng, rng = content_rngs(seed, stream, salt)
    input_lens, output_lens = sample_lengths(dataset, n, lengths_rng, specials)
    prefixes = shared_prefixes(source, dataset, seed, salt)
    which = prefix_assignment(n, dataset.num_prefixes, rng if stream == 0 else None)
    planned = [prefixes[p] + source.draw(rng, int(k)) for p, k in zip(which, input_lens, strict=True)]
    prompts = await realize(tokenizer, source, planned, output_lens.tolist(), rng, fmt=fmt, specials=specials)
    off = sum(not p.on_target for p in prompts)
    return PromptSet(prompts, fmt, specials, tokenizer.max_model_len, off)
