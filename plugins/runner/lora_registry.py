"""The runner's LoRA adapters (core.lora.LoraCatalog): registered by name, loaded on demand, evicted least
recently used past `max_cpu_loras`.

    registered   name -> (path, key)          every adapter served (--lora-modules, runtime loads)
    loaded       key  -> LoraWeights (LRU)    at most max_cpu_loras; an evicted one is read again when asked

NOTE: the key (name#n, n counting loads in this process) goes into the requests' prefix-cache roots: an adapter
unloaded and loaded again under the same name, maybe from other files, never meets the blocks of the first.
A step never waits on a file it can avoid: the entry pipeline `acquire`s a request's adapter (in a worker thread)
before admitting it; the step reads it again only if it was evicted in between.
"""
from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import OrderedDict

import torch

from modelcall.core import InvalidRequest, ModelNotFound
from modelcall.core.lora import LoraInfo, LoraRef
from modelcall.plugins.runner.lora_weights import PART, TARGETS, LoraWeights, read_adapter

log = logging.getLogger("modelcall.runner")


def projection_shapes(base: torch.nn.Module) -> dict[tuple[int, str], tuple[int, int]]:
    """(layer, projection) -> (out, in) of the decoder's LoRA-targetable linears."""
    shapes: dict[tuple[int, str], tuple[int, int]] = {}
    for i, layer in enumerate(base.layers):
        for name in TARGETS:
            lin = getattr(getattr(layer, PART[name], None), name, None)
            if lin is not None and hasattr(lin, "in_features"):
                shapes[(i, name)] = (int(lin.out_features), int(lin.in_features))
    return shapes


class LoraRegistry:
    """Adapters of one base model, for one runner (thread-safe: the event loop registers, the step thread reads)."""

    def __init__(self, shapes: dict[tuple[int, str], tuple[int, int]], dtype: torch.dtype, device: torch.device,
                 max_rank: int, max_loaded: int | None,
                 expert_shapes: dict[tuple[int, str], tuple[int, int, int]] | None = None) -> None:
        self.shapes, self.dtype, self.device = shapes, dtype, device
        self.expert_shapes = expert_shapes or {}   # MoE layers' fused expert tensors: (experts, in, out)
        self.max_rank = max_rank
        self.max_loaded = max_loaded
        self._registered: dict[str, tuple[str, str]] = {}     # name -> (path, key)
        self._loaded: OrderedDict[str, LoraWeights] = OrderedDict()   # key -> weights, least recently used first
        self._counter = itertools.count(1)
        # keys unloaded while requests may still run on them -> their path (read again if evicted meanwhile)
        self._retired: dict[str, str] = {}
        self._lock = threading.RLock()
        self.load_s: dict[str, float] = {}   # name -> seconds its last read took

    # ---- the LoraCatalog protocol ------------------------------------------------------------

    def names(self) -> list[str]:
        with self._lock:
            return list(self._registered)

    def ref(self, name: str) -> LoraRef | None:
        with self._lock:
            reg = self._registered.get(name)
            return LoraRef(name, reg[1]) if reg is not None else None

    def acquire(self, name: str) -> LoraRef:
        ref = self.ref(name)
        if ref is None:
            raise ModelNotFound(f"the LoRA adapter {name!r} is not served here")
        self.weights(ref)
        return ref

    def load(self, name: str, path: str) -> LoraInfo:
        if not name or "#" in name:
            raise InvalidRequest(f"lora_name must be a non-empty name without '#', got {name!r}", field="lora_name")
        with self._lock:
            if name in self._registered:
                raise InvalidRequest(f"the LoRA adapter {name!r} is already loaded; unload it first",
                                     field="lora_name")
        key = f"{name}#{next(self._counter)}"
        w = self._read(name, path)           # outside the lock: steps go on meanwhile
        with self._lock:
            if name in self._registered:
                raise InvalidRequest(f"the LoRA adapter {name!r} is already loaded; unload it first",
                                     field="lora_name")
            self._registered[name] = (path, key)
            self._keep(key, w)
        return self._info(name, w)

    def unload(self, name: str) -> None:
        with self._lock:
            reg = self._registered.pop(name, None)
            if reg is None:
                raise ModelNotFound(f"the LoRA adapter {name!r} is not loaded")
            # NOTE: running requests keep their own reference through the step groups only while a step runs;
            # a later step re-reads by key, so the weights stay until no request of this key is left (`weights`).
            self._retired[reg[1]] = reg[0]

    def info(self, name: str) -> LoraInfo | None:
        with self._lock:
            reg = self._registered.get(name)
            if reg is None:
                return None
            w = self._loaded.get(reg[1])
        return self._info(name, w) if w is not None else LoraInfo(name=name, path=reg[0])

    # ---- for the runner ----------------------------------------------------------------------

    def register(self, name: str, path: str) -> None:
        """An adapter of --lora-modules: served from start-up, read now (a bad one fails the start)."""
        self.load(name, path)

    def weights(self, ref: LoraRef) -> LoraWeights:
        """The weights of a request's adapter, read again from its files if they were evicted."""
        with self._lock:
            w = self._loaded.get(ref.key)
            if w is not None:
                self._loaded.move_to_end(ref.key)
                return w
            reg = self._registered.get(ref.name)
            path = reg[0] if reg is not None and reg[1] == ref.key else self._retired.get(ref.key)
        if path is None:
            raise ModelNotFound(f"the LoRA adapter {ref.name!r} was unloaded")
        w = self._read(ref.name, path)
        with self._lock:
            self._keep(ref.key, w)
        return w

    def _read(self, name: str, path: str) -> LoraWeights:
        t0 = time.perf_counter()
        w = read_adapter(name, path, self.shapes, self.max_rank, self.dtype, self.device, self.expert_shapes)
        self.load_s[name] = time.perf_counter() - t0
        log.info("LoRA adapter %s: rank %d on %s, %.1f MB, read in %.1f ms", name, w.rank, ",".join(w.targets),
                 w.nbytes / 1e6, self.load_s[name] * 1e3)
        return w

    def _keep(self, key: str, w: LoraWeights) -> None:
        self._loaded[key] = w
        self._loaded.move_to_end(key)
        while self.max_loaded is not None and len(self._loaded) > self.max_loaded:
            old, _ = self._loaded.popitem(last=False)
            log.info("LoRA adapter %s evicted (max_cpu_loras %d)", old, self.max_loaded)

    @staticmethod
    def _info(name: str, w: LoraWeights) -> LoraInfo:
        return LoraInfo(name=name, path=w.path, rank=w.rank, targets=w.targets)
