"""The order in which free blocks are reused: the eviction policy of the prefix cache.

A free block may still hold a cached prefix (lazy eviction); taking it from the queue for a new
owner is what evicts that prefix. The default reuses the least recently freed block first.
A plugin changes the eviction order by implementing `modelcall.core.EvictionPolicy` and
`provide_eviction_policy`; `PagedKVCache(free_queue=...)` takes it. `LRUFreeQueue` is the default.
"""
from __future__ import annotations

from collections import OrderedDict

from modelcall.core.policies import EvictionPolicy

FreeQueue = EvictionPolicy  # the contract lives in core, so a plugin can implement it without importing this


class LRUFreeQueue:
    """The default `EvictionPolicy`: least recently freed first.

    An OrderedDict is a hashed doubly linked list: O(1) everywhere. No `hit` method: LRU needs no
    hit counts, and the pool skips the call."""

    __slots__ = ("_order",)

    def __init__(self, block_ids: range | list[int] = ()) -> None:
        self._order: OrderedDict[int, None] = OrderedDict.fromkeys(block_ids)

    def push(self, block_id: int) -> None:
        self._order[block_id] = None

    def remove(self, block_id: int) -> None:
        del self._order[block_id]

    def pop(self) -> int:
        return self._order.popitem(last=False)[0]

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._order

    def __len__(self) -> int:
        return len(self._order)

    def __iter__(self):
        return iter(self._order)
