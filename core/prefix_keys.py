"""Prefix-block keys computed outside the KV cache, for routing a request to where its prefix lives.

The chain is the one the paged KV cache keys its full blocks by (plugins/kv_cache/hashing.py
builds its per-request chain from these two functions):

    key(block -1) = sha256(model identity ‖ adapter ‖ cache salt)
    key(block i)  = sha256(key(block i-1) ‖ int64 token ids of block i)

so a router and the cache agree on what "the same prefix" is: same tokens, same block size, same
salt (two tenants never share a key, so they never share a route by prefix either).
"""
from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence


def root_key(identity: str, adapter: object = None, cache_salt: str | None = None) -> bytes:
    parts = (identity, "" if adapter is None else repr(adapter), "" if cache_salt is None else cache_salt)
    return hashlib.sha256("\0".join(parts).encode("utf-8", "surrogatepass")).digest()


def block_key(parent: bytes, token_ids: Sequence[int]) -> bytes:
    h = hashlib.sha256(parent)
    h.update(array("q", token_ids).tobytes())
    return h.digest()


def prefix_block_keys(token_ids: Sequence[int], block_size: int, root: bytes, max_blocks: int) -> list[bytes]:
    """Keys of the first `max_blocks` full blocks of `token_ids` (fewer when the prompt is shorter).

    NOTE: like the cache, a block holding the last prompt token is never a hit, so only blocks
    that end before it count: a prompt of exactly k blocks gives k - 1 keys.
    """
    usable = (len(token_ids) - 1) // block_size
    keys: list[bytes] = []
    parent = root
    for i in range(min(usable, max_blocks)):
        parent = block_key(parent, token_ids[i * block_size:(i + 1) * block_size])
        keys.append(parent)
    return keys
