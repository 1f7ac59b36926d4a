"""Copies one KV block's bytes out of the runner's paged K/V tensors and back.

A runner offers this either with a `kv_block_io()` method returning an object with `block_bytes`,
`layout`, `read(block) -> numpy uint8 array` and `write(block, payload)`, or by keeping its pool as
`runner.kv`: a list, one (K, V) pair per layer, of tensors whose first dimension is the slot
(block * block_size + offset) — the layout the built-in runner pages attention in. Layers that share a
tensor (KV groups, core.kv_groups) are copied once: a block holds whatever group owns it, and its key says
which group that is.

NOTE: called from the engine loop between forwards (schedule and apply), never while a forward runs, so a
block is read before the step that reuses it overwrites it and written before the step that reads it.
"""
from __future__ import annotations

from typing import Any

from modelcall.core.errors import ConfigError


class TensorBlockIO:
    """Block copies over paged tensors [slots, ...] (one per distinct K or V tensor of the pool)."""

    def __init__(self, tensors: list[Any], block_size: int) -> None:
        import torch
        self.torch = torch
        self.tensors = tensors
        self.block_size = block_size
        self.sizes = [t[:block_size].numel() * t.element_size() for t in tensors]
        self.block_bytes = sum(self.sizes)
        self.layout = [(str(t.dtype).removeprefix("torch."), tuple(t[:block_size].shape)) for t in tensors]

    def _slots(self, t: Any, block: int) -> Any:
        bs = self.block_size
        return t[block * bs:(block + 1) * bs].view(self.torch.uint8).view(-1)   # a view: writes reach the pool

    def read(self, block: int) -> Any:
        """A copy of `block`'s bytes on the host (a numpy uint8 array the disk writer can write as is)."""
        out = self.torch.empty(self.block_bytes, dtype=self.torch.uint8)
        at = 0
        for t, n in zip(self.tensors, self.sizes):
            out[at:at + n].copy_(self._slots(t, block))
            at += n
        return out.numpy()

    def write(self, block: int, payload: Any) -> None:
        """Put `payload` (what `read` gave, possibly from another process) into `block`."""
        src = self.torch.from_numpy(payload) if not isinstance(payload, self.torch.Tensor) else payload
        at = 0
        for t, n in zip(self.tensors, self.sizes):
            self._slots(t, block).copy_(src[at:at + n], non_blocking=False)
            at += n


def block_io_for(runner: Any, block_size: int) -> Any:
    """The runner's block copier, or ConfigError saying why this runner's K/V cannot be tiered."""
    own = getattr(runner, "kv_block_io", None)
    if callable(own):
        return own()
    pairs = getattr(runner, "kv", None)
    if not pairs or not all(isinstance(p, (tuple, list)) and len(p) == 2 for p in pairs):
        raise ConfigError(f"the KV tiers (kv_cache_dir, kv_cache_host_gb) need the runner's paged K/V; "
                          f"{type(runner).__name__} offers neither kv_block_io() nor a paged `kv` list: "
                          "serve without the KV tiers")
    seen: set[tuple[int, tuple[int, ...]]] = set()
    tensors = []
    for pair in pairs:
        for t in pair:
            ident = (t.data_ptr(), tuple(t.shape))
            if ident not in seen:   # NOTE: first-seen order (layer order) is the same in every run; addresses are not
                seen.add(ident)
                tensors.append(t)
    return TensorBlockIO(tensors, block_size)
