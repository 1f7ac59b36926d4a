"""The ranking the prefix-aware router applies, on plain replica ids (no Ray): the request router
(router.py) and the simulation (benchmarks/routing_sim.py) run this same code."""
from __future__ import annotations

import hashlib
from collections import OrderedDict

import msgspec


class RouteKey(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    keys: tuple[bytes, ...] = ()
    pin: str | None = None  # a replica's unique id


def rendezvous(first_key: bytes, replica_ids: list[str]) -> list[str]:
    """Replica ids by highest random weight for this prefix (the first is its home)."""
    return sorted(replica_ids, key=lambda r: hashlib.blake2b(first_key + r.encode(), digest_size=8).digest(),
                  reverse=True)


class PrefixTable:
    """Which replicas were sent which block keys, most recent last; bounded."""

    def __init__(self, capacity: int = 200_000) -> None:
        self.capacity = capacity
        self._holders: OrderedDict[bytes, set[str]] = OrderedDict()

    def add(self, keys: tuple[bytes, ...], replica: str) -> None:
        for k in keys:
            holders = self._holders.get(k)
            if holders is None:
                holders = self._holders[k] = set()
            else:
                self._holders.move_to_end(k)
            holders.add(replica)
        while len(self._holders) > self.capacity:
            self._holders.popitem(last=False)

    def matched(self, keys: tuple[bytes, ...], replica: str) -> int:
        """How many leading keys `replica` holds."""
        n = 0
        for k in keys:
            if replica not in self._holders.get(k, ()):
                break
            n += 1
        return n

    def forget(self, replica: str) -> None:
        for k in [k for k, h in self._holders.items() if replica in h]:
            h = self._holders[k]
            h.discard(replica)
            if not h:
                del self._holders[k]


def rank(keys: tuple[bytes, ...], loads: dict[str, int], table: PrefixTable, *, pin: str | None = None,
         imbalance_threshold: int = 4, match_rate_threshold: float = 0.1) -> list[list[str]]:
    """The ranking itself, on plain replica ids (the simulation in benchmarks/routing_sim.py runs it too)."""
    ids = list(loads)
    if pin is not None and pin in loads:
        return [[pin]]
    by_load = sorted(ids, key=lambda r: loads[r])
    if not keys or max(loads.values()) - min(loads.values()) > imbalance_threshold:
        return [[r] for r in by_load]
    match = {r: table.matched(keys, r) for r in ids}
    best = max(match.values())
    if best and best / len(keys) >= match_rate_threshold:
        top = sorted((r for r in ids if match[r] == best), key=lambda r: loads[r])
        return [top, [r for r in by_load if match[r] != best]]
    return [[r] for r in rendezvous(keys[0], ids)]
