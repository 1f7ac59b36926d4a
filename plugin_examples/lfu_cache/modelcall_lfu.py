"""modelcall-lfu: the prefix cache evicts the least *frequently* used free blocks.

The built-in order reuses the least recently freed block first. Under a stream of one-off
prompts, LRU throws out a system prompt that every third request shares, just because it was not
used in the last few requests. LFU keeps blocks that were hit often and reuses one-off blocks
first (ties: least recently freed). Only the eviction order changes: the built-in KV policy keeps
block tables, prefix keys and reference counts.

Select it with `eviction_policy = "lfu"` (or leave `auto`: an installed plugin is asked first).
"""
from __future__ import annotations

import heapq
import itertools
from typing import Any

from modelcall.core import hookimpl

__version__ = "0.1.0"


@hookimpl
def provide_eviction_policy(config: Any, num_blocks: int) -> LFUEvictionPolicy | None:
    return LFUEvictionPolicy(num_blocks) if config.wants("eviction_policy", "lfu") else None


class LFUEvictionPolicy:
    """A `modelcall.core.EvictionPolicy`: free blocks in a heap keyed (hits, when freed), lazy deletion."""

    def __init__(self, num_blocks: int) -> None:
        self._hits: dict[int, int] = {}   # prefix hits on a block since it was last handed out
        self._live: dict[int, int] = {}   # free block -> the tick of its live heap entry
        self._heap: list[tuple[int, int, int]] = []
        self._tick = itertools.count()
        for block in range(num_blocks):
            self.push(block)

    def push(self, block_id: int) -> None:
        tick = next(self._tick)
        self._live[block_id] = tick
        heapq.heappush(self._heap, (self._hits.get(block_id, 0), tick, block_id))
        if len(self._heap) > 2 * len(self._live) + 64:  # drop the entries of revived blocks now and then
            self._heap = [e for e in self._heap if self._live.get(e[2]) == e[1]]
            heapq.heapify(self._heap)

    def remove(self, block_id: int) -> None:
        del self._live[block_id]  # its heap entry goes stale

    def hit(self, block_id: int) -> None:
        self._hits[block_id] = self._hits.get(block_id, 0) + 1

    def pop(self) -> int:
        while True:
            _hits, tick, block = heapq.heappop(self._heap)
            if self._live.get(block) == tick:
                break
        del self._live[block]
        self._hits.pop(block, None)  # it gets new contents: its count starts over
        return block

    def __len__(self) -> int:
        return len(self._live)
