"""Prefix matching over the pool and the tiers behind it: the longest prefix found anywhere, its missing
blocks read back into fresh pool blocks before the request's first chunk is planned.

    hashes    h0  h1  h2  h3  h4          (the request's chained block keys)
    pool      b7  --  b2  --  --          (touched: the request holds them)
    tiers         H       D   --          (H: host RAM, D: disk; restored into taken blocks)
    hit       ===============             4 blocks, 1 of them from disk
"""
from __future__ import annotations

from typing import Any

from modelcall.core.request import Request
from modelcall.plugins.kv_cache.tiers import DISK, KVTiers


def match_with_tiers(kv: Any, tiers: KVTiers, request: Request, hashes: list[bytes],
                     max_blocks: int) -> tuple[int, int]:
    """Give `request` (holding no blocks) the longest prefix held by the pool or a tier; returns (blocks hit,
    block positions read back from disk). A block a tier cannot give back (refused, evicted meanwhile) ends
    the hit there; without enough free blocks for the read-backs, only the pool's part is taken."""
    pool = kv.pool
    lookup = pool.lookup
    bad: set[bytes] = set()
    fetched: dict[bytes, tuple[Any, str]] = {}

    def found(key: bytes) -> bool:
        return key not in bad and (lookup(key) is not None or key in fetched or tiers.has(key))

    while True:   # each pass either succeeds or adds a key to `bad`: it ends
        k = kv.longest_match(hashes, max_blocks, found)
        needed = kv.needed_keys(hashes, k)
        missing = [(g, i, key) for g, i, key in needed if lookup(key) is None]
        failed = False
        for _, _, key in missing:
            if key not in fetched:
                payload, tier = tiers.fetch(key)
                if payload is None:
                    bad.add(key)
                    failed = True
                    break
                fetched[key] = (payload, tier)
        if not failed:
            break
    hits = {lookup(key) for _, _, key in needed if lookup(key) is not None}
    free_after = pool.num_free() - sum(1 for b in hits if pool.ref_cnt[b] == 0)
    if len(missing) > free_after:   # NOTE: read-backs take free blocks; without enough, the pool's own hit only
        bad.update(key for _, _, key in missing)
        k = kv.longest_match(hashes, max_blocks, found)
        needed, missing = kv.needed_keys(hashes, k), []
    used = {key for _, _, key in missing}
    for key, (payload, tier) in fetched.items():
        if key not in used:
            tiers.give_back(key, payload, tier)
    tables = kv.tables(request)
    for table, w in zip(tables, kv.group_windows):
        first = kv._first_seen(k, w) if w else 0
        table[:] = [-1] * k   # -1 (RELEASED) left before `first`; the rest filled below, pool hits first (no read-back evicts one)
    for g, i, key in needed:
        b = lookup(key)
        if b is not None:
            pool.touch((b,))
            tables[g][i] = b
    disk_positions: set[int] = set()
    for g, i, key in missing:
        payload, tier = fetched[key]
        (b,) = pool.take(1)
        tiers.restore(b, payload, tier)
        pool.cache(b, key)
        tables[g][i] = b
        if tier == DISK:
            disk_positions.add(i)
    return k, len(disk_positions)
