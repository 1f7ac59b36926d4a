"""Prefix-cache keys: a chain of digests, one per full block of a request's known tokens.

    key(block i) = sha256(key(block i-1) ‖ token ids of block i)
    key(block -1) = sha256(model identity ‖ adapter ‖ cache salt)      (the request's root)

NOTE: the extra keys enter through the root, so every block key depends on them: two models,
adapters or tenants never share a block. sha256 (not Python's `hash`) because int hashing is
predictable, and a crafted collision would let one tenant read another's cached prefix.
"""
from __future__ import annotations

from modelcall.core.prefix_keys import block_key, root_key
from modelcall.core.request import Request

__all__ = ["block_key", "extend_block_hashes", "root_key"]


def extend_block_hashes(request: Request, num_blocks: int, block_size: int, identity: str) -> list[bytes]:
    """Make `request.block_hashes` cover its first `num_blocks` full blocks; returns it.

    Known tokens never change once appended, so keys computed earlier stay valid (also across
    preemption) and each block is hashed once per request.
    """
    hashes = request.block_hashes
    tokens = request.all_token_ids
    adapter = request.lora.key if request.lora is not None else None   # the load key: core.lora.LoraRef
    parent = hashes[-1] if hashes else root_key(identity, adapter, request.cache_salt)
    for i in range(len(hashes), num_blocks):
        parent = block_key(parent, tokens[i * block_size:(i + 1) * block_size])
        hashes.append(parent)
    return hashes
