"""Continuous-batching schedulers: which tokens of which requests the next step computes.

Both engines batch continuously under a running-request cap and a per-step token budget, page
the KV cache in blocks, reuse cached prefixes, and evict running requests when the KV pool runs
out. They differ where the real ones differ:

* **vLLM** (``v1/core/sched/scheduler.py``): one mixed batch per step. Running requests go first
  (a decode token each, or the next chunk of an unfinished prefill), then waiting requests are
  admitted while the token budget (``--max-num-batched-tokens``), ``--max-num-seqs`` and free
  blocks allow, their prompts chunked to fit (chunked prefill; without it a prompt must fit the
  budget whole). With ``--scheduler-reserve-full-isl`` a request is admitted only if its whole
  prompt fits in free blocks. When a running request cannot get a block, the *last* running
  request (lowest priority under ``priority``) is preempted: its blocks are freed, its progress
  reset (recompute), and it goes back to the front of the queue. No admissions happen in a step
  that preempted.
* **SGLang** (``managers/scheduler.py``, ``schedule_policy.py``): a step is a prefill batch
  when new requests can be admitted, otherwise a decode batch of every running request
  (``--enable-mixed-chunk`` adds the decodes to prefill batches). Admission reserves KV for the
  future output of running and admitted requests, scaled by ``new_token_ratio``: it starts at
  min(0.7 × ``--schedule-conservativeness``, 1), decays to 0.14 × that over 600 decode steps,
  and jumps back up on retraction. Prefill batches are capped by ``--chunked-prefill-size``
  (chunking the last prompt) and ``--max-prefill-tokens``. When a decode step cannot get its
  KV, requests with the fewest outputs (then the longest prompts) are *retracted* until 20
  decode steps of room are free, and the ratio becomes (decoded + 20 × running) ÷ max new tokens.
  SGLang's token-granular pool is modelled in 16-token pages (≤ 15 tokens of rounding per request).
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from autotune_sim.kvcache import ANON, BlockPool
from autotune_sim.perf import GraphMode, StepShape
from autotune_sim.stats import EngineStats

__all__ = ["Batch", "Retraction", "SglangScheduler", "SimRequest", "VllmScheduler"]

RETRACT_DECODE_STEPS = 20
CLIP_MAX_NEW_TOKENS = 4096


@dataclass(eq=False, slots=True)
class SimRequest:
    """One generation request as the engine core sees it.

    Attributes:
        rid: Engine-wide request number.
        prompt: Prompt token ids.
        output_len: Tokens this request generates before it finishes.
        finish_reason: ``length`` (max_tokens reached) or ``stop`` (the model's own end).
        max_new: The requested maximum (SGLang's admission reserves for it).
        out_seed: Seed of the generated token ids.
        priority: Smaller is more urgent (``--scheduling-policy priority``).
        sink: Receives the generated tokens (the HTTP stream); None for internal requests.
        choice: Index of this request among the choices of its HTTP request.
        successor: The client promised another request the moment this one ends (a closed-loop
            client with requests still waiting): the modelled clock holds for it.
    """

    rid: int
    prompt: Sequence[int]
    output_len: int
    finish_reason: str
    max_new: int
    out_seed: int
    priority: int = 0
    sink: Any = None
    choice: int = 0
    successor: bool = False
    arrival: float = 0.0
    generated: int = 0
    computed: int = 0
    blocks: list[int] = field(default_factory=list)
    hashes: list[int] = field(default_factory=list)
    registered: int = 0
    cached: int = -1
    preemptions: int = 0
    first_scheduled: float = -1.0
    first_token: float = -1.0
    last_token: float = -1.0
    done: bool = False

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens."""
        return len(self.prompt) + self.generated


@dataclass(frozen=True, slots=True)
class Retraction:
    """An SGLang retraction, for its warning line."""

    requests: int
    tokens_gained: int
    ratio_before: float
    ratio_after: float


@dataclass(slots=True)
class Batch:
    """The work of one step."""

    items: list[tuple[SimRequest, int]]
    shape: StepShape
    kind: str  # "prefill", "decode" or "mixed"
    new_seqs: int = 0
    cached_tokens: int = 0
    retraction: Retraction | None = None
    aborted: list[SimRequest] = field(default_factory=list)


class Scheduler(ABC):
    """Queues, KV blocks and prefix lookup shared by both policies."""

    def __init__(
        self,
        pool: BlockPool,
        stats: EngineStats,
        output_token: Callable[[int, int], int],
        max_running: int,
    ) -> None:
        self.pool = pool
        self.stats = stats
        self.output_token = output_token
        self.max_running = max_running
        self.bs = pool.block_size
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []

    # ---------------------------------------------------------------------------- queue
    def add(self, req: SimRequest) -> None:
        """Queue a new request."""
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def held(self) -> list[SimRequest]:
        """Every request this scheduler holds: running, then queued."""
        return [*self.running, *self.waiting]

    def abort(self, req: SimRequest) -> None:
        """Drop a request (client gone): free its blocks wherever it is."""
        if req.done:
            return
        req.done = True
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self._free(req)

    def finish(self, req: SimRequest) -> None:
        """A request produced its last token: free its blocks (cached ones stay reusable)."""
        req.done = True
        self._free(req)

    def prune(self) -> None:
        """Forget finished requests in the running list (after a step's tokens went out)."""
        self.running = [r for r in self.running if not r.done]

    @abstractmethod
    def schedule(self, now: float) -> Batch | None:
        """The next step's batch, or None when nothing can run."""

    # ----------------------------------------------------------------------------- step
    def commit(self, batch: Batch) -> list[SimRequest]:
        """Apply a finished step; return the requests that sampled a token, in batch order."""
        sampled: list[SimRequest] = []
        caching, bs = self.pool.caching, self.bs
        for req, n in batch.items:
            if req.done:
                continue
            computed = req.computed + n
            req.computed = computed
            if caching and computed // bs > req.registered:
                self._register(req)
            if computed == len(req.prompt) + req.generated:
                req.generated += 1
                sampled.append(req)
        return sampled

    # ---------------------------------------------------------------------------- blocks
    def _blocks_for(self, req: SimRequest, n: int) -> int:
        """New blocks ``req`` needs to hold ``n`` more computed tokens."""
        return -(-(req.computed + n) // self.bs) - len(req.blocks)

    def _grow(self, req: SimRequest, n_blocks: int) -> None:
        if n_blocks > 0:
            self.pool.allocate(n_blocks)
            req.blocks.extend([ANON] * n_blocks)

    def _free(self, req: SimRequest) -> None:
        if req.blocks:
            self.pool.release(req.blocks)
            req.blocks = []
        req.computed = 0
        req.registered = 0

    def _token(self, req: SimRequest, i: int) -> int:
        n = len(req.prompt)
        return req.prompt[i] if i < n else self.output_token(req.out_seed, i - n)

    def _extend_hashes(self, req: SimRequest, count: int) -> None:
        """Make sure the first ``count`` full-block hashes of ``req`` are known."""
        bs, hashes = self.bs, req.hashes
        parent = hashes[-1] if hashes else 0
        n = len(req.prompt)
        for b in range(len(hashes), count):
            lo, hi = b * bs, (b + 1) * bs
            prompt_only = hi <= n
            block = tuple(req.prompt[lo:hi]) if prompt_only else tuple(self._token(req, i) for i in range(lo, hi))
            parent = hash((parent, block))
            hashes.append(parent)

    def _register(self, req: SimRequest) -> None:
        full = req.computed // self.bs
        self._extend_hashes(req, full)
        for b in range(req.registered, full):
            if req.blocks[b] == ANON:
                req.blocks[b] = self.pool.register(req.hashes[b])
        req.registered = full

    def _lookup(self, req: SimRequest) -> list[int]:
        """Cached blocks that start this request (never its last token: it must be computed)."""
        if not self.pool.caching:
            return []
        limit = (req.num_tokens - 1) // self.bs
        self._extend_hashes(req, limit)
        return self.pool.match(req.hashes[:limit])

    def _admit(self, req: SimRequest, matched: list[int], n: int, now: float) -> None:
        """Give a waiting request its cached blocks and the blocks for its first chunk."""
        self.pool.acquire(matched)
        req.blocks = list(matched)
        req.registered = len(matched)
        req.computed = len(matched) * self.bs
        self._grow(req, self._blocks_for(req, n))
        self.stats.prefix_queries += req.num_tokens
        self.stats.prefix_hits += req.computed
        if req.cached < 0:
            req.cached = req.computed
            self.stats.prompt_tokens_cached += min(req.computed, len(req.prompt))
        if req.first_scheduled < 0:
            req.first_scheduled = now

    def _evict_to_waiting(self, req: SimRequest) -> None:
        """Preempt/retract: free the request's KV (recompute later) and queue it first."""
        self._free(req)
        req.preemptions += 1
        self.waiting.appendleft(req)

    @classmethod
    def _shape(cls, items: list[tuple[SimRequest, int]], graph: GraphMode) -> StepShape:
        return StepShape(*cls._counts(items), graph)

    @staticmethod
    def _counts(items: list[tuple[SimRequest, int]]) -> tuple[int, int, int, float, int, int]:
        """A step's ``StepShape`` fields but its launch mode."""
        tokens = decode_seqs = decode_ctx = prefill_ctx = sampled = 0
        attn = 0.0
        for req, n in items:
            computed = req.computed
            tokens += n
            if n == 1 and req.generated:
                decode_seqs += 1
                decode_ctx += computed
                sampled += 1
                continue
            attn += n * (computed + n / 2.0)
            prefill_ctx += computed
            if computed + n == len(req.prompt) + req.generated:
                sampled += 1
        return tokens, decode_seqs, decode_ctx, attn, prefill_ctx, sampled


# ------------------------------------------------------------------------------------ vLLM
class VllmScheduler(Scheduler):
    """vLLM V1's scheduler (see the module docstring)."""

    def __init__(
        self,
        pool: BlockPool,
        stats: EngineStats,
        output_token: Callable[[int, int], int],
        *,
        max_num_seqs: int,
        max_batched_tokens: int,
        chunked_prefill: bool,
        long_prefill_threshold: int,
        priority_policy: bool,
        reserve_full_isl: bool,
        graph_mode: str,
        max_capture: int,
    ) -> None:
        super().__init__(pool, stats, output_token, max_num_seqs)
        self.budget = max_batched_tokens
        self.chunked = chunked_prefill
        self.threshold = long_prefill_threshold or 0
        self.priority = priority_policy
        self.reserve_full_isl = reserve_full_isl
        self.graph_mode = graph_mode
        self.max_capture = max_capture

    def add(self, req: SimRequest) -> None:
        if self.priority and self.waiting and req.priority < self.waiting[-1].priority:
            # Keep the queue ordered by (priority, arrival).
            items = sorted([*self.waiting, req], key=lambda r: (r.priority, r.arrival))
            self.waiting = deque(items)
        else:
            self.waiting.append(req)

    def schedule(self, now: float) -> Batch | None:
        budget = self.budget
        items: list[tuple[SimRequest, int]] = []
        preempted, budget = self._schedule_running(items, budget)
        if not preempted:
            self._admit_waiting(items, budget, now)
        if not items:
            return None
        counts = self._counts(items)
        decode_only = counts[1] == len(items)  # every item decodes one token
        shape = StepShape(*counts, self._graph(counts[0], decode_only))
        return Batch(items, shape, "decode" if decode_only else "mixed")

    def _cap(self, n: int, budget: int) -> int:
        n = min(n, budget)
        return min(n, self.threshold) if self.threshold else n

    def _schedule_running(self, items: list[tuple[SimRequest, int]], budget: int) -> tuple[bool, int]:
        """Schedule running requests first; preempt from the back when blocks run out. Returns
        whether it preempted, and the token budget left."""
        running, pool, bs, threshold = self.running, self.pool, self.bs, self.threshold
        preempted = False
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            computed = req.computed
            n = len(req.prompt) + req.generated - computed
            if n > budget:
                n = budget
            if threshold and n > threshold:
                n = threshold
            need = -(-(computed + n) // bs) - len(req.blocks)
            if need > 0:
                while need > pool.free_blocks:
                    victim = self._victim(i)
                    running.remove(victim)
                    self._evict_to_waiting(victim)
                    self.stats.preemptions += 1
                    preempted = True
                    if victim is req:
                        return preempted, budget
                pool.allocate(need)
                req.blocks.extend([ANON] * need)
            items.append((req, n))
            budget -= n
            i += 1
        return preempted, budget

    def _victim(self, first_unscheduled: int) -> SimRequest:
        if not self.priority:
            return self.running[-1]
        return max(self.running[first_unscheduled:], key=lambda r: (r.priority, r.arrival))

    def _admit_waiting(self, items: list[tuple[SimRequest, int]], budget: int, now: float) -> None:
        bs = self.bs
        while self.waiting and budget > 0 and len(self.running) < self.max_running:
            req = self.waiting[0]
            matched = self._lookup(req)
            remaining = req.num_tokens - len(matched) * bs
            if not self.chunked and remaining > budget:
                break
            n = self._cap(remaining, budget)
            whole = remaining if self.reserve_full_isl else n
            need = -(-(len(matched) * bs + whole) // bs) - len(matched)
            if need + self.pool.evictable_among(matched) > self.pool.free_blocks:
                break
            self.waiting.popleft()
            self._admit(req, matched, n, now)
            self.running.append(req)
            items.append((req, n))
            budget -= n

    def _graph(self, tokens: int, decode_only: bool) -> GraphMode:
        """How vLLM launches a step: full graph, piecewise graph or eager, by cudagraph mode."""
        mode = self.graph_mode
        if mode == "NONE" or tokens > self.max_capture:
            return GraphMode.EAGER
        if mode in ("FULL", "FULL_AND_PIECEWISE") and (decode_only or mode == "FULL"):
            return GraphMode.FULL
        if mode == "FULL_DECODE_ONLY":
            return GraphMode.FULL if decode_only else GraphMode.EAGER
        return GraphMode.PIECEWISE


# ---------------------------------------------------------------------------------- SGLang
class SglangScheduler(Scheduler):
    """SGLang's scheduler (see the module docstring)."""

    def __init__(
        self,
        pool: BlockPool,
        stats: EngineStats,
        output_token: Callable[[int, int], int],
        *,
        max_running: int,
        chunked_prefill_size: int,
        max_prefill_tokens: int,
        conservativeness: float,
        policy: str,
        mixed_chunk: bool,
        decode_graph_max_bs: int,
        prefill_graph_max_tokens: int,
        seed: int = 0,
    ) -> None:
        super().__init__(pool, stats, output_token, max_running)
        self.chunk_size = chunked_prefill_size if chunked_prefill_size > 0 else 0
        self.max_prefill_tokens = max_prefill_tokens
        self.init_ratio = min(0.7 * conservativeness, 1.0)
        self.min_ratio = self.init_ratio * 0.14
        self.decay = (self.init_ratio - self.min_ratio) / 600
        self.ratio = self.init_ratio
        self.policy = policy
        self.mixed_chunk = mixed_chunk
        self.decode_graph_max_bs = decode_graph_max_bs
        self.prefill_graph_max_tokens = prefill_graph_max_tokens
        self.chunked_req: SimRequest | None = None
        self._rng = random.Random(seed)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.chunked_req)

    def held(self) -> list[SimRequest]:
        chunked = [self.chunked_req] if self.chunked_req is not None else []
        return [*self.running, *chunked, *self.waiting]

    def abort(self, req: SimRequest) -> None:
        if req is self.chunked_req:
            self.chunked_req = None
            req.done = True
            self._free(req)
            return
        super().abort(req)

    def schedule(self, now: float) -> Batch | None:
        items, new_seqs, cached = self._prefill_items(now)
        if items:
            if self.mixed_chunk and self.running and self._room_for_decode():
                items += self._decode_grow()
                kind = "mixed"
            else:
                kind = "prefill"
            tokens = sum(n for _, n in items)
            graph = GraphMode.PIECEWISE if 0 < tokens <= self.prefill_graph_max_tokens else GraphMode.EAGER
            return Batch(items, self._shape(items, graph), kind, new_seqs, cached)
        if not self.running:
            return None
        retraction, aborted = self._ensure_decode_room()
        if not self.running:
            return Batch([], self._shape([], GraphMode.EAGER), "decode", retraction=retraction, aborted=aborted)
        items = self._decode_grow()
        self.ratio = max(self.ratio - self.decay, self.min_ratio)
        bs = len(items)
        graph = GraphMode.FULL if bs <= self.decode_graph_max_bs else GraphMode.EAGER
        return Batch(items, self._shape(items, graph), "decode", retraction=retraction, aborted=aborted)

    # -------------------------------------------------------------------------- prefill
    def _reserved_for_running(self) -> float:
        total = sum(min(r.max_new - r.generated, CLIP_MAX_NEW_TOKENS) for r in self.running)
        return total * self.ratio

    def _order(self) -> list[SimRequest]:
        queue = list(self.waiting)
        if self.policy == "lpm" and len(queue) <= 128:  # SGLang falls back to FCFS on long queues
            queue.sort(key=lambda r: -len(self._lookup(r)))
        elif self.policy == "lof":
            queue.sort(key=lambda r: -r.max_new)
        elif self.policy == "random":
            self._rng.shuffle(queue)
        elif self.policy == "priority":
            queue.sort(key=lambda r: (r.priority, r.arrival))
        return queue

    def _prefill_items(self, now: float) -> tuple[list[tuple[SimRequest, int]], int, int]:
        items: list[tuple[SimRequest, int]] = []
        if not self.waiting and self.chunked_req is None:
            return items, 0, 0
        bs = self.bs
        rem_total = self.pool.free_blocks * bs - self._reserved_for_running()
        rem_input = self.max_prefill_tokens
        rem_chunk = self.chunk_size or 1 << 62
        if self.chunked_req is not None:
            req = self.chunked_req
            n = min(req.num_tokens - req.computed, rem_chunk)
            need = self._blocks_for(req, n)
            if need > self.pool.free_blocks:  # wait for decodes to finish and free blocks
                return items, 0, 0
            self._grow(req, need)
            items.append((req, n))
            if req.computed + n < req.num_tokens:
                return items, 0, 0
            self.chunked_req = None
            rem_chunk -= n
            rem_input -= n
            rem_total -= n
        if len(self.running) >= self.max_running:
            return items, 0, 0
        new_seqs = cached_total = 0
        for req in self._order():
            if len(self.running) + new_seqs >= self.max_running or rem_chunk <= 0:
                break
            matched = self._lookup(req)
            cached = len(matched) * bs
            extend = req.num_tokens - cached
            reserve = min(req.max_new - req.generated, CLIP_MAX_NEW_TOKENS) * self.ratio
            if extend + reserve > rem_total or (extend > rem_input and items):
                break
            n = min(extend, rem_chunk) if self.chunk_size else extend
            need = -(-(cached + n) // bs) - len(matched)
            if need + self.pool.evictable_among(matched) > self.pool.free_blocks:
                break
            self.waiting.remove(req)
            self._admit(req, matched, n, now)
            items.append((req, n))
            new_seqs += 1
            cached_total += cached
            rem_total -= extend + reserve
            rem_input -= n
            rem_chunk -= n
            if n < extend:
                self.chunked_req = req
                break
        return items, new_seqs, cached_total

    def commit(self, batch: Batch) -> list[SimRequest]:
        sampled = super().commit(batch)
        if batch.kind != "decode":
            running = set(self.running)
            self.running += [r for r in sampled if r not in running]
        return sampled

    # --------------------------------------------------------------------------- decode
    def _decode_need(self) -> int:
        bs = self.bs
        return sum(1 for r in self.running if r.computed + 1 > len(r.blocks) * bs)

    def _room_for_decode(self) -> bool:
        return self._decode_need() <= self.pool.free_blocks

    def _decode_grow(self) -> list[tuple[SimRequest, int]]:
        items: list[tuple[SimRequest, int]] = []
        bs = self.bs
        for r in self.running:
            if r.computed + 1 > len(r.blocks) * bs:
                self._grow(r, 1)
            items.append((r, 1))
        return items

    def _ensure_decode_room(self) -> tuple[Retraction | None, list[SimRequest]]:
        """Retract (or, for a lone request, abort) until the next decode step fits."""
        if self._room_for_decode():
            return None, []
        order = sorted(self.running, key=lambda r: (r.generated, -len(r.prompt)), reverse=True)
        gained = 0
        retracted: list[SimRequest] = []
        free_tokens = self.pool.free_blocks * self.bs
        while len(order) > 1 and (
            free_tokens < RETRACT_DECODE_STEPS * len(order) or self._decode_need() > self.pool.free_blocks
        ):
            victim = order.pop()
            gained += victim.computed
            self.running.remove(victim)
            self.stats.retracted_requests += 1
            self.stats.retracted_input_tokens += len(victim.prompt)
            self.stats.retracted_output_tokens += victim.generated
            self._evict_to_waiting(victim)
            retracted.append(victim)
            free_tokens = self.pool.free_blocks * self.bs
        aborted: list[SimRequest] = []
        if self._decode_need() > self.pool.free_blocks:
            aborted = list(self.running)
            for r in aborted:
                self.running.remove(r)
                r.done = True
                self._free(r)
        if not retracted:
            return None, aborted
        before = self.ratio
        decoded = sum(r.generated for r in self.running)
        max_new = sum(r.max_new for r in self.running) or 1
        self.ratio = min(1.0, (decoded + RETRACT_DECODE_STEPS * len(self.running)) / max_new)
        return Retraction(len(retracted), gained, before, self.ratio), aborted
