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

import logging
from typing import Any

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from modelcall.plugins.scale.ranking import PrefixTable, RouteKey, rank

__all__ = ["PrefixAwareRouter", "RouteKey"]
log = logging.getLogger("modelcall.scale")


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
