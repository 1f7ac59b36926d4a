"""Invariant checks of the built-in paged KV pool, shared by the KV, scheduler and engine tests."""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from modelcall.core.request import Request


def check_pool(kv, holders: Iterable[Request]) -> None:
    """Refcounts equal the number of block tables holding each block; free + held == total; a free
    block is in no table; every cached key points at a block that records it; a free keyed
    block is findable under its key (lazy eviction)."""
    pool = kv.pool
    held = Counter()
    for req in holders:
        assert len(set(req.block_table)) == len(req.block_table), f"{req} holds a block twice"
        held.update(req.block_table)
    free = set(pool.free)
    assert len(free) == len(pool.free)
    for b in range(pool.num_blocks):
        assert pool.ref_cnt[b] >= 0
        assert pool.ref_cnt[b] == held[b], f"block {b}: ref {pool.ref_cnt[b]}, held by {held[b]} tables"
        assert (b in free) == (pool.ref_cnt[b] == 0), f"block {b} free-list membership disagrees with its ref"
    assert len(free) + sum(1 for c in pool.ref_cnt if c > 0) == pool.num_blocks
    assert kv.num_free_blocks() == len(free)
    for key, b in pool.cached.items():
        assert pool.block_hash[b] == key
    for b in free:
        key = pool.block_hash[b]
        if key is not None:
            assert pool.cached.get(key) == b, f"free block {b} keeps a key nobody can find"


def check_whole(kv) -> None:
    """After every request ended: all blocks free, none referenced."""
    assert kv.num_free_blocks() == kv.num_blocks, f"{kv.num_blocks - kv.num_free_blocks()} blocks leaked"
    assert all(c == 0 for c in kv.pool.ref_cnt)
