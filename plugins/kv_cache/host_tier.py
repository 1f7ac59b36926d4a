"""The host-RAM tier: blocks evicted from the pool, kept by key in a size-bounded LRU.

Exclusive of the pool: a block read back into the pool leaves this tier (it comes back here, copied
again, when the pool evicts it a second time), so the two together hold more distinct prefixes.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any


class HostTier:
    """key -> a block's bytes (numpy uint8), least recently used dropped first past `capacity_bytes`."""

    def __init__(self, capacity_bytes: int, block_bytes: int) -> None:
        self.capacity_blocks = capacity_bytes // block_bytes if block_bytes else 0
        self.blocks: OrderedDict[bytes, Any] = OrderedDict()
        self.num_stored = 0
        self.num_dropped = 0   # left this tier for room (still on disk when a disk tier wrote them)

    def __contains__(self, key: bytes) -> bool:
        return key in self.blocks

    def __len__(self) -> int:
        return len(self.blocks)

    def put(self, key: bytes, payload: Any) -> None:
        if self.capacity_blocks <= 0:
            return
        self.blocks[key] = payload
        self.blocks.move_to_end(key)
        self.num_stored += 1
        while len(self.blocks) > self.capacity_blocks:
            self.blocks.popitem(last=False)
            self.num_dropped += 1

    def take(self, key: bytes) -> Any:
        """The block's bytes, leaving the tier (they go back into the pool), or None."""
        return self.blocks.pop(key, None)

    def clear(self) -> None:
        self.blocks.clear()
