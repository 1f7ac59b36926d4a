"""The prefix-aware request router, on Ray Serve's public request-router API.

Each call carries `route=RouteKey(keys, pin)`: the keys of its first prompt blocks (core.prefix_keys,
the chain the KV cache keys its blocks by). Ranking, per request:

1. `pin` (the forks of an n > 1 request share the first one's K/V): that replica only.
2. Load spread (most minus least in-flight requests over the candidates) above `imbalance_threshold`:
   least loaded first.
3. The replica(s) holding the longest run of the request's leading blocks, when that run is at least
   `match_rate_threshold` of its keys; then everyone else by load.
4. A new prefix: rendezvous hashing of its first block over the replicas, so every request sharing a
   system prompt picks the same replica without any shared state, and a replica leaving moves only
   its own prefixes.

"Holding" is what this router sent there (a bounded LRU table per router): Ray Serve LLM's
PrefixCacheAffinityRouter keeps the same kind of table. It forgets a replica when its actor dies.
"""
from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict
from typing import Any

import msgspec
from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

log = logging.getLogger("modelcall.scale")


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


class PrefixAwareRouter(RequestRouter):
    """Ray Serve request router (configure with RequestRouterConfig, see deploy.py)."""

    def initialize_state(self, imbalance_threshold: int = 4, match_rate_threshold: float = 0.1,
                         table_capacity: int = 200_000) -> None:
        self.imbalance_threshold = imbalance_threshold
        self.match_rate_threshold = match_rate_threshold
        self.table = PrefixTable(table_capacity)
        self.routed: dict[str, int] = {}  # requests sent per replica (tests and /metrics read it)

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        route = _route_of(pending_request)
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        ranks = rank(route.keys, {i: self._load(r) for i, r in by_id.items()}, self.table, pin=route.pin,
                     imbalance_threshold=self.imbalance_threshold, match_rate_threshold=self.match_rate_threshold)
        return [[by_id[i] for i in group] for group in ranks if group]

    def _load(self, r: RunningReplica) -> int:
        # Ray's own count of requests in flight on the replica (updated as it sends and finishes
        # requests); the replica's reported stats fill in before the first probe.
        q = self.replica_queue_len_cache.get(r.replica_id)
        if q is None:
            q = int((r.routing_stats or {}).get("unfinished", 0))
        return q

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        route = _route_of(pending_request)
        rid = replica_id.unique_id
        self.routed[rid] = self.routed.get(rid, 0) + 1
        if route.keys:
            self.table.add(route.keys, rid)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self.table.forget(replica_id.unique_id)
        log.warning("replica %s died: its prefixes are forgotten, new requests go elsewhere", replica_id.unique_id)


def _route_of(pending_request: PendingRequest | None) -> RouteKey:
    if pending_request is None:
        return RouteKey()
    route = pending_request.kwargs.get("route")
    return route if isinstance(route, RouteKey) else RouteKey()
