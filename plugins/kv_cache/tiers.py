"""The KV tiers behind the paged pool: host RAM, then disk, keyed by the prefix cache's block keys.

    pool (runner tensors) ──evicted──▶ host RAM (LRU, exclusive) ──dropped──▶ (gone, or on disk)
          │ committed (write-through, behind the step)                          ▲
          └────────────────────────────────────────────────────────▶ disk ─────┘ read back before the prefill

A block enters the disk tier when it is committed (full and computed), so a crash loses only what the
writer had not reached; it enters the host tier when the pool reuses its block. Both copies are taken
in the engine loop between forwards (a memcpy of one block, timed in `copy_s`); the disk write happens
in the disk tier's writer thread.
"""
from __future__ import annotations

import time
from typing import Any

from modelcall.plugins.kv_cache.disk_tier import DiskTier
from modelcall.plugins.kv_cache.host_tier import HostTier

HOST, DISK = "host", "disk"


class KVTiers:
    """What the paged KV policy asks of the tiers: is a key there, fetch it, restore it into a block."""

    def __init__(self, io: Any, host: HostTier | None, disk: DiskTier | None) -> None:
        self.io = io
        self.host = host
        self.disk = disk
        self.copy_s = 0.0      # engine-loop time spent copying blocks out of the pool
        self.restore_s = 0.0   # engine-loop time spent copying blocks back into it
        self.hits = {HOST: 0, DISK: 0}   # blocks restored from each tier

    def has(self, key: bytes) -> bool:
        return (self.host is not None and key in self.host) or (self.disk is not None and self.disk.has(key))

    def evicted(self, block: int, key: bytes) -> None:
        """The pool is about to reuse `block`, the only holder of `key`: keep its bytes in host RAM."""
        if self.host is not None and self.host.capacity_blocks > 0:
            t0 = time.perf_counter()
            self.host.put(key, self.io.read(block))
            self.copy_s += time.perf_counter() - t0

    def committed(self, block: int, key: bytes) -> None:
        """`block` was just filled and keyed: queue it for the disk (once per key)."""
        disk = self.disk
        if disk is not None and not disk.has(key) and key not in disk.queued:
            t0 = time.perf_counter()
            disk.put(key, self.io.read(block))
            self.copy_s += time.perf_counter() - t0

    def prefetch(self, keys: list[bytes]) -> None:
        if self.disk is not None:
            host = self.host
            self.disk.prefetch([k for k in keys if host is None or k not in host])

    def fetch(self, key: bytes) -> tuple[Any, str | None]:
        """(the block's bytes, the tier that had them), or (None, None). A host hit leaves the host tier."""
        if self.host is not None:
            payload = self.host.take(key)
            if payload is not None:
                return payload, HOST
        if self.disk is not None and self.disk.has(key):
            payload = self.disk.get(key)
            if payload is not None:
                return payload, DISK
        return None, None

    def give_back(self, key: bytes, payload: Any, tier: str) -> None:
        """A fetched block that was not used after all: a host one goes back (a disk one is still on disk)."""
        if tier == HOST and self.host is not None:
            self.host.put(key, payload)

    def restore(self, block: int, payload: Any, tier: str) -> None:
        t0 = time.perf_counter()
        self.io.write(block, payload)
        self.restore_s += time.perf_counter() - t0
        self.hits[tier] += 1

    def clear(self) -> None:
        if self.host is not None:
            self.host.clear()
        if self.disk is not None:
            self.disk.drop_prefetched()
            self.disk.clear()

    def close(self) -> None:
        if self.disk is not None:
            self.disk.close()

    def stats(self) -> dict[str, float]:
        out = {"tier_copy_s": self.copy_s, "tier_restore_s": self.restore_s,
               "host_hit_blocks": float(self.hits[HOST]), "disk_hit_blocks": float(self.hits[DISK])}
        if self.host is not None:
            out.update(host_blocks=float(len(self.host)), host_dropped=float(self.host.num_dropped))
        if self.disk is not None:
            out.update(self.disk.stats())
        return out
