"""Block ids, their reference counts, and the index of cached full blocks. No tensors: the runner
owns the K/V memory; this pool only decides which block id holds what.

    ref_cnt[b] > 0   held by ref_cnt[b] requests (shared when a cached prefix was matched)
    ref_cnt[b] == 0  in the free queue; may still be in `cached` (lazy eviction) until reused

NOTE: a free block with a key is always the one `cached` finds under that key, so a freed
prefix stays findable until its block is reused.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable

from modelcall.plugins.kv_cache.free_queue import FreeQueue, LRUFreeQueue

STALE = b""  # the key of a block in use whose prefix was forgotten by `forget_cached`


class BlockPool:
    """Reference-counted blocks over a free queue, plus the key -> block index of the prefix cache."""

    def __init__(self, num_blocks: int, free_queue: FreeQueue | None = None) -> None:
        if num_blocks < 1:
            raise ValueError(f"a KV pool needs at least 1 block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.ref_cnt = [0] * num_blocks
        self.block_hash: list[bytes | None] = [None] * num_blocks  # the key of a full, committed block
        self.cached: dict[bytes, int] = {}  # key -> the block that holds it (one per key)
        self.free = free_queue if free_queue is not None else LRUFreeQueue(range(num_blocks))
        if len(self.free) != num_blocks:
            raise ValueError(f"the free queue must start with all {num_blocks} blocks, has {len(self.free)}")
        self.num_evictions = 0
        self._on_hit = getattr(self.free, "hit", None)  # optional: told of every prefix-cache hit
        # Optional (the KV tiers): on_evict(block, key) just before the pool reuses the block that holds `key`.
        self.on_evict: Callable[[int, bytes], None] | None = None

    def num_free(self) -> int:
        return len(self.free)

    def take(self, n: int) -> list[int]:
        """`n` blocks for a new owner (the caller checked `num_free() >= n`), evicting their old keys."""
        blocks = [self.free.pop() for _ in range(n)]
        for b in blocks:
            self._evict(b)
            self.ref_cnt[b] = 1
        return blocks

    def lookup(self, key: bytes) -> int | None:
        return self.cached.get(key)

    def touch(self, blocks: Iterable[int]) -> None:
        """Add a holder to each of `blocks` (prefix-cache hits), reviving free ones."""
        on_hit = self._on_hit
        for b in blocks:
            if self.ref_cnt[b] == 0:
                self.free.remove(b)
            self.ref_cnt[b] += 1
            if on_hit is not None:
                on_hit(b)

    def share(self, blocks: Iterable[int]) -> None:
        """Add a holder to each of `blocks`, all held already (a fork shares its parent's blocks)."""
        for b in blocks:
            if self.ref_cnt[b] <= 0:
                raise RuntimeError(f"block {b} is free; only held blocks can be shared")
            self.ref_cnt[b] += 1

    def release(self, blocks: Iterable[int]) -> None:
        """Drop a holder from each of `blocks`; the ones nobody holds go to the free queue in this order."""
        for b in blocks:
            if self.ref_cnt[b] <= 0:
                raise RuntimeError(f"block {b} released more often than it was held (ref count {self.ref_cnt[b]})")
            self.ref_cnt[b] -= 1
            if self.ref_cnt[b] == 0:
                self._keep_findable(b)
                self.free.push(b)

    def cache(self, block: int, key: bytes) -> None:
        """`block` is full and its K/V computed: make it findable under `key`.

        NOTE: two requests may compute the same block at once (neither had it cached when it
        started). The first keeps the index entry; the other block still records its key (so
        commit knows it is done) and takes the entry over when freed if the first is gone by then.
        """
        self.block_hash[block] = key
        self.cached.setdefault(key, block)

    def forget_cached(self) -> None:
        """Empty the index. Blocks in use get the STALE key: commit skips them, and freeing them
        does not make the forgotten prefix findable again."""
        self.cached.clear()
        for b in range(self.num_blocks):
            if self.ref_cnt[b] == 0:
                self.block_hash[b] = None
            elif self.block_hash[b] is not None:
                self.block_hash[b] = STALE

    def _keep_findable(self, block: int) -> None:
        """`block` just became free: index its key, or drop the key when another block holds it."""
        key = self.block_hash[block]
        if key is not None and (key == STALE or self.cached.setdefault(key, block) != block):
            self.block_hash[block] = None

    def _evict(self, block: int) -> None:
        key = self.block_hash[block]
        if key is None:
            return
        self.block_hash[block] = None
        if self.cached.get(key) == block:
            if self.on_evict is not None:
                self.on_evict(block, key)
            del self.cached[key]
            self.num_evictions += 1
