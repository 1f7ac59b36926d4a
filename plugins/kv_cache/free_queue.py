"""The order in which free blocks are reused: the eviction policy of the prefix cache.

A free block may still hold a cached prefix (lazy eviction); taking it from the queue for a new
owner is what evicts that prefix. The default reuses the least recently freed block first.
A plugin changes the eviction order by handing `PagedKVCache` another `FreeQueue`.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Protocol


class FreeQueue(Protocol):
    """The free block ids. Every operation must be O(1) (or O(log n)): it runs per block per step."""

    def push(self, block_id: int) -> None:
        """`block_id` just became free (its last holder released it)."""
        ...

    def remove(self, block_id: int) -> None:
        """A prefix-cache hit revives a free block: take it out without reusing it."""
        ...

    def pop(self) -> int:
        """The next block to reuse (the victim whose cached prefix, if any, is evicted)."""
        ...

    def __contains__(self, block_id: int) -> bool:
        ...

    def __len__(self) -> int:
        ...


class LRUFreeQueue:
    """Least recently freed first. An OrderedDict is a hashed doubly linked list: O(1) everywhere."""

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
