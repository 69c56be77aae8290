"""Paged KV blocks with prefix caching: block reuse addressed by a hash chain of token ids.

Like vLLM's ``BlockPool``: a block that fills up is registered under the hash of (parent hash,
its token ids); a new request reuses the longest chain of registered blocks that starts its
prompt. A freed block keeps its registration and waits, least recently used first, until it is
evicted for a new allocation. Free capacity therefore counts evictable cached blocks (vLLM's
``kv_cache_usage_perc`` and SGLang's ``token usage`` both exclude them from "used").

Blocks a request holds are ids: ``-1`` for a block that is not (yet) registered, otherwise the
registered block's id. Only counts are kept for unregistered blocks, which keeps the hot path
(one decode token per request per step) to integer arithmetic.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

__all__ = ["ANON", "BlockPool"]

ANON = -1


class BlockPool:
    """A fixed pool of KV blocks.

    Args:
        num_blocks: Blocks in the pool (vLLM reserves one as the null block; pass the usable count).
        block_size: Tokens per block.
        caching: Whether full blocks are registered for reuse.
    """

    def __init__(self, num_blocks: int, block_size: int, caching: bool) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.caching = caching
        self._fresh = num_blocks  # unregistered free blocks (a count is enough)
        self._ref: dict[int, int] = {}  # registered block id → holders
        self._hash_of: dict[int, int] = {}  # registered block id → hash
        self._by_hash: dict[int, int] = {}  # hash → registered block id
        self._evictable: OrderedDict[int, None] = OrderedDict()  # registered, unheld: LRU first
        self._next_id = 0

    @property
    def free_blocks(self) -> int:
        """Blocks an allocation can take now (evicting cached ones if it must)."""
        return self._fresh + len(self._evictable)

    @property
    def used_blocks(self) -> int:
        """Blocks held by requests."""
        return self.num_blocks - self.free_blocks

    @property
    def evictable_blocks(self) -> int:
        """Cached blocks nobody holds (reusable by a prefix hit, evicted on demand)."""
        return len(self._evictable)

    def usage(self) -> float:
        """Share of the pool held by requests (0–1)."""
        return self.used_blocks / self.num_blocks if self.num_blocks else 0.0

    def match(self, hashes: Sequence[int]) -> list[int]:
        """Ids of the registered blocks matching the longest prefix of ``hashes``."""
        out: list[int] = []
        if not self.caching:
            return out
        for h in hashes:
            block = self._by_hash.get(h)
            if block is None:
                break
            out.append(block)
        return out

    def evictable_among(self, blocks: Sequence[int]) -> int:
        """How many of these registered blocks currently sit in the evictable queue."""
        return sum(1 for b in blocks if b in self._evictable)

    def acquire(self, blocks: Sequence[int]) -> None:
        """Hold registered blocks found by :meth:`match`."""
        for b in blocks:
            self._ref[b] += 1
            self._evictable.pop(b, None)

    def allocate(self, n: int) -> None:
        """Take ``n`` unregistered blocks; the caller checked :attr:`free_blocks` first."""
        take = min(n, self._fresh)
        self._fresh -= take
        for _ in range(n - take):
            self._evict_one()

    def _evict_one(self) -> None:
        block, _ = self._evictable.popitem(last=False)
        del self._by_hash[self._hash_of.pop(block)]
        del self._ref[block]

    def register(self, h: int) -> int:
        """Register a just-filled block (held by its request) under ``h``; ANON if not cached.

        When the same content is already registered (computed concurrently by another request),
        the block stays private, as in vLLM.
        """
        if not self.caching or h in self._by_hash:
            return ANON
        block = self._next_id
        self._next_id += 1
        self._by_hash[h] = block
        self._hash_of[block] = h
        self._ref[block] = 1
        return block

    def release(self, blocks: Sequence[int]) -> None:
        """Give back a request's blocks, tail first so its last blocks are evicted first."""
        for b in reversed(blocks):
            if b == ANON:
                self._fresh += 1
                continue
            left = self._ref[b] - 1
            self._ref[b] = left
            if left == 0:
                self._evictable[b] = None

    def reset_cache(self) -> bool:
        """Drop every cached block nobody holds (``/reset_prefix_cache``, ``/flush_cache``)."""
        while self._evictable:
            self._evict_one()
            self._fresh += 1
        return True
