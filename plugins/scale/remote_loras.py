"""The LoRA adapters of N replicas, as the front end's one catalog (core.lora.LoraCatalog).

Every replica loads `--lora-modules` itself (the kernel config it is deployed with); the front end learns the
names from one replica's `describe` and answers /v1/models and the routes' `model` check from them. A runtime load
or unload goes to every live replica (each pinned) and counts only when all of them did it: a load that fails on one
is undone on the others, so the replicas never serve different sets. The request itself carries the adapter's name
to whichever replica the router picks; that replica's entry pipeline checks and acquires it as on one kernel.

NOTE: a replica Ray Serve starts again after a failure has the --lora-modules only, not runtime loads.
"""
from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from modelcall.core import InvalidRequest, ModelNotFound
from modelcall.core.lora import LoraInfo, LoraRef
from modelcall.plugins.scale import wire

# (method, replica id, *args) -> the replica's answer, sent pinned to that replica
Pinned = Callable[..., Awaitable[Any]]


class ReplicaLoras:
    """The adapters every replica serves, by name (registration order kept)."""

    def __init__(self, adapters: list[dict[str, Any]], pinned: Pinned, replica_ids: Callable[[], list[str]]) -> None:
        self._infos: dict[str, LoraInfo] = {a["name"]: _info(a) for a in adapters}
        self._pinned, self._replica_ids = pinned, replica_ids
        self._lock = threading.Lock()

    def names(self) -> list[str]:
        with self._lock:
            return list(self._infos)

    def ref(self, name: str) -> LoraRef | None:
        # NOTE: the key here only scopes the router's prefix keys by adapter; each replica keys its own cache
        with self._lock:
            return LoraRef(name, name) if name in self._infos else None

    def info(self, name: str) -> LoraInfo | None:
        with self._lock:
            return self._infos.get(name)

    def acquire(self, name: str) -> LoraRef:
        ref = self.ref(name)
        if ref is None:
            raise ModelNotFound(f"the LoRA adapter {name!r} is not served here")
        return ref   # the replica that runs the request reads the weights

    def load(self, name: str, path: str) -> LoraInfo:
        """Load on every replica (from a worker thread: the calls run on the event loop)."""
        if self.ref(name) is not None:
            raise InvalidRequest(f"the LoRA adapter {name!r} is already loaded; unload it first", field="lora_name")
        # NOTE: an absolute path: a replica's worker process runs in a directory of Ray's
        info = anyio.from_thread.run(self._load_all, name, os.path.abspath(path))
        with self._lock:
            self._infos[name] = info
        return info

    def unload(self, name: str) -> None:
        """Unload on every replica (from a worker thread); requests running on it finish on it."""
        with self._lock:
            if name not in self._infos:
                raise ModelNotFound(f"the LoRA adapter {name!r} is not loaded")
            del self._infos[name]   # NOTE: no new request is routed to it from here on
        anyio.from_thread.run(self._on_all, "unload_lora", name)

    async def _load_all(self, name: str, path: str) -> LoraInfo:
        replies = await self._on_all("load_lora", name, path)
        failed = [r for r in replies.values() if not isinstance(r, wire.Adapter)]
        if failed:
            done = [rid for rid, r in replies.items() if isinstance(r, wire.Adapter)]
            await asyncio.gather(*(self._pinned("unload_lora", rid, name) for rid in done), return_exceptions=True)
            first = failed[0]
            raise wire.rebuild(first) if isinstance(first, wire.Refused) else first
        if not replies:
            raise InvalidRequest("no replica is running to load the adapter on", field="lora_name")
        a = next(iter(replies.values()))
        return LoraInfo(name=a.name, path=a.path, rank=a.rank, targets=tuple(a.targets))

    async def _on_all(self, method: str, *args: Any) -> dict[str, Any]:
        """Each live replica's reply (wire.Adapter or wire.Refused) or the exception its call raised, by id.
        NOTE: for an unload they are not looked at: a replica that lacks the name, or died, changes nothing."""
        ids = await anyio.to_thread.run_sync(self._replica_ids)
        got = await asyncio.gather(*(self._pinned(method, rid, *args) for rid in ids), return_exceptions=True)
        return {rid: wire.decode_reply(r) if isinstance(r, bytes) else r for rid, r in zip(ids, got)}


def _info(a: dict[str, Any]) -> LoraInfo:
    return LoraInfo(name=a["name"], path=a["path"], rank=a.get("rank"), targets=tuple(a.get("targets") or ()))
