"""modelcall-lfu: a paged KV cache whose prefix cache evicts the least *frequently* used blocks.

The built-in cache evicts the least recently used free block. Under a stream of one-off prompts,
LRU throws out a system prompt that every third request shares, just because it was not used in
the last few requests. LFU keeps blocks that were hit often and evicts one-off blocks first
(ties: least recently freed). Blocks that hold no reusable prefix are always taken first.

Select it with `kv_cache = "lfu"` (or leave `auto`: an installed plugin is asked first).
"""
from __future__ import annotations

import hashlib
import heapq
import itertools
from array import array
from typing import Any

from modelcall.core import Request, hookimpl

__version__ = "0.1.0"


@hookimpl
def provide_kv_cache(config: Any, spec: Any, num_blocks: int) -> LFUKVCache | None:
    if not config.wants("kv_cache", "lfu"):
        return None
    return LFUKVCache(num_blocks, config.block_size, identity=spec.identity or spec.name,
                      enable_prefix_caching=config.enable_prefix_caching)


class LFUKVCache:
    """A `modelcall.core.stages.KVCachePolicy` with least-frequently-used eviction.

    Free blocks wait in a heap keyed (holds a cached prefix?, hit count, when freed); an entry is
    stale when the block was taken or re-freed since (its version moved on).
    """

    def __init__(self, num_blocks: int, block_size: int, *, identity: str = "", enable_prefix_caching: bool = True) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.identity = identity.encode()
        self.enable_prefix_caching = enable_prefix_caching
        self.ref = [0] * num_blocks
        self.key: list[bytes | None] = [None] * num_blocks  # the prefix a block holds, once full and computed
        self.freq = [0] * num_blocks                         # prefix hits on the block since it was filled
        self.version = [0] * num_blocks
        self.cached: dict[bytes, int] = {}
        self._tick = itertools.count()
        self._free_heap = [(0, 0, next(self._tick), 0, b) for b in range(num_blocks)]
        self._num_free = num_blocks
        self.queries = self.hits = self.evictions = 0

    # ---- the KVCachePolicy protocol ---------------------------------------------------------

    def match_prefix(self, request: Request) -> int:
        if request.block_table:
            raise ValueError(f"match_prefix needs a request holding no blocks; {request.request_id} holds some")
        self.queries += request.num_tokens
        if not self.enable_prefix_caching:
            return 0
        # NOTE: never the last known token: its forward pass must run to give the next token.
        keys = self._keys(request, (request.num_tokens - 1) // self.block_size)
        for k in keys:
            block = self.cached.get(k)
            if block is None:
                break
            if self.ref[block] == 0:
                self._take_free(block)
            self.ref[block] += 1
            self.freq[block] += 1
            request.block_table.append(block)
        request.extra["lfu.committed"] = len(request.block_table)
        hit = len(request.block_table) * self.block_size
        self.hits += hit
        return hit

    def allocate(self, request: Request, num_new_tokens: int) -> bool:
        needed = -(-(request.num_computed_tokens + num_new_tokens) // self.block_size) - len(request.block_table)
        if needed <= 0:
            return True
        if needed > self._num_free:
            return False
        for _ in range(needed):
            request.block_table.append(self._pop_free())
        return True

    def commit(self, request: Request) -> None:
        if not self.enable_prefix_caching:
            return
        num_full = request.num_computed_tokens // self.block_size
        done = request.extra.get("lfu.committed", 0)
        if num_full <= done:
            return
        keys = self._keys(request, num_full)
        for i in range(done, num_full):
            block = request.block_table[i]
            if keys[i] not in self.cached and self.key[block] is None:
                self.cached[keys[i]] = block
                self.key[block] = keys[i]
        request.extra["lfu.committed"] = num_full

    def free(self, request: Request) -> None:
        for block in reversed(request.block_table):
            self.ref[block] -= 1
            if self.ref[block] == 0:
                self._num_free += 1
                self._push_free(block)
        request.block_table = []
        request.extra["lfu.committed"] = 0

    def num_free_blocks(self) -> int:
        return self._num_free

    def stats(self) -> dict[str, float]:
        return {"usage": 1.0 - self._num_free / self.num_blocks, "queries": float(self.queries),
                "hits": float(self.hits), "hit_rate": self.hits / self.queries if self.queries else 0.0,
                "num_free_blocks": float(self._num_free), "num_blocks": float(self.num_blocks),
                "num_cached_blocks": float(len(self.cached)), "evictions": float(self.evictions)}

    def reset_prefix_cache(self) -> None:
        for block in self.cached.values():
            self.key[block] = None
            self.freq[block] = 0
            if self.ref[block] == 0:
                self._push_free(block)  # re-key it as an empty block
        self.cached.clear()

    # ---- the free heap ----------------------------------------------------------------------

    def _push_free(self, block: int) -> None:
        """(Re)queue a free block under its current key; any older entry of it goes stale."""
        self.version[block] += 1
        holds_prefix = 1 if self.key[block] is not None else 0
        heapq.heappush(self._free_heap, (holds_prefix, self.freq[block], next(self._tick), self.version[block], block))
        if len(self._free_heap) > 4 * self.num_blocks:  # drop stale entries now and then
            self._free_heap = [e for e in self._free_heap if e[3] == self.version[e[4]] and self.ref[e[4]] == 0]
            heapq.heapify(self._free_heap)

    def _take_free(self, block: int) -> None:
        """A free block is reused by a prefix hit: its heap entry goes stale."""
        self.version[block] += 1
        self._num_free -= 1

    def _pop_free(self) -> int:
        while True:
            _, _, _, version, block = heapq.heappop(self._free_heap)
            if version == self.version[block] and self.ref[block] == 0:
                break
        self.version[block] += 1
        self._num_free -= 1
        if self.key[block] is not None:  # evict the prefix it held
            del self.cached[self.key[block]]
            self.key[block] = None
            self.evictions += 1
        self.freq[block] = 0
        self.ref[block] = 1
        return block

    # ---- prefix keys ------------------------------------------------------------------------

    def _keys(self, request: Request, num_blocks: int) -> list[bytes]:
        """Chained keys of the first `num_blocks` full blocks: (parent key, token ids, model, salt)."""
        keys, bs, tokens = request.block_hashes, self.block_size, request.all_token_ids
        while len(keys) < num_blocks:
            i = len(keys)
            parent = keys[-1] if keys else self.identity + b"|" + (request.cache_salt or "").encode()
            block_tokens = array("q", tokens[i * bs:(i + 1) * bs]).tobytes()
            keys.append(hashlib.blake2b(parent + block_tokens, digest_size=16).digest())
        return keys[:num_blocks]
