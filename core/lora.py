"""LoRA adapters as the kernel sees them: a request names one (`GenerateRequest.lora`), the runner holds them.

A runner that serves adapters offers a `LoraCatalog` as its `loras` attribute (None or absent: no LoRA). The
kernel asks it whether a name is served and under which key (the key goes into the request's prefix-cache root,
so no block is shared across adapters, nor across two loads of one name), and hands it runtime loads and
unloads. Which caller may use, load or unload an adapter is core/permissions.py's, never the runner's.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import msgspec


class LoraRef(msgspec.Struct, frozen=True, gc=False):
    """The adapter one request runs with: its served `name` and the `key` of the load it runs on."""

    name: str
    key: str


class LoraInfo(msgspec.Struct, frozen=True, kw_only=True):
    """What a catalog says of one adapter (for /v1/models and the load route's answer)."""

    name: str
    path: str
    rank: int | None = None       # None: registered, not loaded yet
    targets: tuple[str, ...] = ()


@runtime_checkable
class LoraCatalog(Protocol):
    """The adapters a runner serves on its base model (implemented by plugins/runner/lora_registry.py).

    Methods may be called from any thread (the event loop, a worker thread, the engine's step thread); an
    implementation guards its own state. Loading reads files (and a replicated front end's catalog calls every
    replica, plugins/scale/remote_loras.py): call `load`, `unload` and `acquire` off the event loop.
    """

    def names(self) -> list[str]:
        """Every adapter served now, in registration order."""
        ...

    def ref(self, name: str) -> LoraRef | None:
        """The adapter `name` as a request refers to it, or None when it is not served."""
        ...

    def acquire(self, name: str) -> LoraRef:
        """Make sure `name`'s weights are loaded (reading them again if they were evicted); raises
        ModelNotFound when `name` is not served, InvalidRequest when its files no longer load."""
        ...

    def load(self, name: str, path: str) -> LoraInfo:
        """Register and load a PEFT adapter directory under `name`; raises InvalidRequest for a directory
        that is not a usable adapter of this model (with the reason) or when `name` is taken."""
        ...

    def unload(self, name: str) -> None:
        """Stop serving `name` (requests already running on it finish on it); ModelNotFound if unknown."""
        ...

    def info(self, name: str) -> LoraInfo | None:
        ...
