"""What one run sends: sessions of user turns, built before the run starts.

A single-turn request is a session of one turn, so one dispatcher serves every dataset kind:

``random``
    One turn per session, exact token lengths (:func:`~autotune.bench.prompts.build_prompts`),
    optionally with ``num_prefixes`` shared prefixes.
``multi_turn``
    ``turns`` user messages per session (drawn per session), each of exact length as text; the
    shared prefix, if any, opens the first message. The dispatcher sends turn ``k`` only after
    turn ``k − 1`` answered plus the think time, carrying the history, so its prompt grows.
``custom``
    Lines of a JSONL file, taken in file order and repeated when the run needs more; warm-up
    takes lines from the end of the file, so with more lines than warm-up plus measured
    sessions the warm-up does not cache measured prompts. Prompt token counts come from the
    server's ``usage``.

Lengths and think times come from the seed; content also from the run's salt (see
:func:`~autotune.bench.prompts.content_rngs`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from autotune.bench.lengths import draw, sample_lengths
from autotune.bench.prompts import (
    PromptFormat,
    ServerTokenizer,
    build_prompts,
    content_rngs,
    load_source,
    prefix_assignment,
    realize,
    shared_prefixes,
)
from autotune.config import Dataset, Workload, read_custom_file

__all__ = ["Plan", "Session", "Turn", "build_plan"]

THINK_STREAM = 0x7417  # think times: independent of lengths and content


@dataclass(frozen=True, slots=True)
class Turn:
    """One user message and the output it asks for.

    Attributes:
        prompt: Token ids (single-turn completions) or text.
        prompt_len: Tokens the server should count for this message alone; 0 when only the
            server knows (custom text).
        output_len: ``max_tokens`` of the request.
        on_target: Whether a text message re-tokenized to its planned length.
    """

    prompt: list[int] | str
    prompt_len: int
    output_len: int
    on_target: bool = True


@dataclass(frozen=True, slots=True)
class Session:
    """A conversation: its turns, and the pause before each turn after the first."""

    turns: tuple[Turn, ...]
    think_s: tuple[float, ...] = ()


@dataclass(frozen=True)
class Plan:
    """The sessions of one run (or of its warm-up) plus what building them learned."""

    sessions: list[Session]
    format: PromptFormat
    num_special_tokens: int = 0
    max_model_len: int | None = None

    @property
    def num_requests(self) -> int:
        return sum(len(s.turns) for s in self.sessions)

    @property
    def off_target(self) -> int:
        return sum(not t.on_target for s in self.sessions for t in s.turns)


def _think_times(d: Dataset, n: int, rng: np.random.Generator) -> np.ndarray:
    if d.think_time == "exponential" and d.think_time_s > 0:
        out: np.ndarray = rng.exponential(d.think_time_s, size=n)
        return out
    return np.full(n, d.think_time_s)


def _group(turns: Sequence[Turn], counts: Sequence[int], thinks: Sequence[float]) -> list[Session]:
    """Cut flat turn and think-time lists into sessions of ``counts`` turns."""
    sessions, at = [], 0
    for k in counts:
        sessions.append(Session(tuple(turns[at : at + k]), tuple(thinks[at + 1 : at + k])))
        at += k
    return sessions


async def _random(tok: ServerTokenizer, w: Workload, n: int, fmt: PromptFormat, stream: int, salt: int) -> Plan:
    ps = await build_prompts(tok, w.dataset, n, seed=w.seed, fmt=fmt, stream=stream, salt=salt)
    sessions = [Session((Turn(p.prompt, p.prompt_len, p.output_len, p.on_target),)) for p in ps.prompts]
    return Plan(sessions, fmt, ps.num_special_tokens, ps.max_model_len)


async def _multi_turn(tok: ServerTokenizer, w: Workload, n: int, stream: int, salt: int) -> Plan:
    d = w.dataset
    assert d.turns is not None  # validated for kind multi_turn
    source, _ = await load_source(tok, "text")
    lengths_rng, rng = content_rngs(w.seed, stream, salt)
    counts = draw(d.turns, n, lengths_rng, at_least=1).tolist()
    total = sum(counts)
    input_lens, output_lens = sample_lengths(d, total, lengths_rng)
    prefixes = shared_prefixes(source, d, w.seed, salt)
    which = iter(prefix_assignment(n, d.num_prefixes, rng if stream == 0 else None))
    firsts = {int(i) for i in np.cumsum([0, *counts[:-1]])}
    planned = [
        (prefixes[next(which)] if i in firsts else []) + source.draw(rng, int(k)) for i, k in enumerate(input_lens)
    ]
    prompts = await realize(tok, source, planned, output_lens.tolist(), rng, fmt="text")
    turns = [Turn(p.prompt, p.prompt_len, p.output_len, p.on_target) for p in prompts]
    thinks = _think_times(d, total, np.random.default_rng([w.seed, stream, THINK_STREAM])).tolist()
    return Plan(_group(turns, counts, thinks), "text", 0, tok.max_model_len)


def _custom(w: Workload, n: int, stream: int) -> Plan:
    d = w.dataset
    assert d.path is not None  # validated for kind custom
    lines = read_custom_file(d.path)
    order = range(n) if stream == 0 else range(-1, -n - 1, -1)
    chosen = [lines[i % len(lines)] for i in order]
    rng = np.random.default_rng(w.seed if stream == 0 else [w.seed, stream])
    total = sum(len(s.turns) for s in chosen)
    drawn = iter(draw(d.output_dist, total, rng, at_least=1).tolist())
    thinks = iter(_think_times(d, total, np.random.default_rng([w.seed, stream, THINK_STREAM])).tolist())
    sessions = []
    for s in chosen:
        turns = tuple(Turn(t.prompt, 0, t.output_tokens or next(drawn)) for t in s.turns)
        pauses = [next(thinks) for _ in s.turns][1:]
        if s.think_time_s is not None:
            pauses = [s.think_time_s] * len(pauses)
        sessions.append(Session(turns, tuple(pauses)))
    return Plan(sessions, "text")


async def build_plan(
    tokenizer: ServerTokenizer, workload: Workload, n: int, *, fmt: PromptFormat, stream: int = 0, salt: int = 0
) -> Plan:
    """Build ``n`` sessions of ``workload`` (the measured run: stream 0; warm-up: stream 1).

    Args:
        tokenizer: The server's tokenizer endpoints (not used by custom files).
        workload: Dataset kind, lengths, seed.
        n: Sessions (requests, for single-turn datasets).
        fmt: ``ids`` or ``text`` for single-turn random prompts; the other kinds are text.
        stream: Independent content stream for the same seed.
        salt: Other content with the same lengths (see :func:`~autotune.bench.prompts.content_rngs`).

    Raises:
        BenchmarkError: The server's tokenizer endpoints are missing or fail.
    """
    kind = workload.dataset.kind
    if kind == "multi_turn":
        return await _multi_turn(tokenizer, workload, n, stream, salt)
    if kind == "custom":
        return _custom(workload, n, stream)
    return await _random(tokenizer, workload, n, fmt, stream, salt)
