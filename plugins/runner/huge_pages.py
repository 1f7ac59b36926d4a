"""Weights on 2 MiB pages: a decode step streams every weight once, and on 4 KiB pages that stream misses the TLB.

A batch-1 decode step reads all the weights (270 MB for SmolLM2-135M at F16) once per token. On 4 KiB pages that is
66,000 pages a token, far beyond the L2 TLB's 3,072 entries, so every page costs a table walk in the middle of the
stream. The same F16 matvec over a 57 MB weight read 23.8 GB/s on 4 KiB pages and 29.5 GB/s on 2 MiB ones (one
Zen 4 thread, loaded machine, issue 38).

Why a move and not madvise on the weights where they lie: they are hundreds of allocations (a 576x576 F16 weight is
663 KB), most smaller than one huge page, and the loader leaves freed copies between them (the weights before
fusion or repacking), so few whole 2 MiB pages hold only weights. `rehome` copies the storages behind the given
tensors into one arena mapped with MADV_HUGEPAGE (its pages fault in as 2 MiB pages where THP is `madvise` or
`always`) and points every given tensor at its copy (Tensor.set_: same offsets, sizes and strides). It must run
before anything takes raw pointers into the weights (the decode stack's arguments). A tensor it is not given keeps
the old storage alive: correct, but that copy stays resident too, so callers hand it every tensor that shares one.
Nothing here is a condition of serving: where the platform has no madvise, the weights stay where they are.
"""
from __future__ import annotations

import ctypes
import logging
import mmap
import sys
from dataclasses import dataclass
from typing import Iterable

import torch

log = logging.getLogger("modelcall.huge_pages")

HUGE = 2 << 20
MADV_HUGEPAGE = 14
ALIGN = 64   # each storage's copy starts on a cache line (and on every dtype's element size)


@dataclass(frozen=True)
class Rehomed:
    """What one `rehome` did: storages moved, bytes in the arena, and how many of them are on huge pages."""
    storages: int
    arena_bytes: int
    huge_bytes: int


def _madvise():
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def _by_storage(tensors: Iterable[torch.Tensor]) -> dict[int, tuple[torch.UntypedStorage, list[torch.Tensor]]]:
    """The plain CPU tensors among `tensors`, grouped by the storage they view (keyed by its address)."""
    groups: dict[int, tuple[torch.UntypedStorage, list[torch.Tensor]]] = {}
    seen: set[int] = set()
    for t in _with_bases(tensors):
        if (not isinstance(t, torch.Tensor) or id(t) in seen or t.device.type != "cpu" or t.layout != torch.strided
                or t.is_meta):
            continue
        seen.add(id(t))
        try:
            s = t.untyped_storage()
        except (RuntimeError, NotImplementedError):   # opaque tensors (mkldnn) have no plain storage
            continue
        if s.nbytes() and s.data_ptr():
            groups.setdefault(s.data_ptr(), (s, []))[1].append(t)
    return groups


def _with_bases(tensors: Iterable[torch.Tensor]) -> Iterable[torch.Tensor]:
    """`tensors` and the bases of the views among them: a view holds its base (which holds the storage) alive."""
    for t in tensors:
        while isinstance(t, torch.Tensor):
            yield t
            t = t._base


def rehome(tensors: Iterable[torch.Tensor], min_bytes: int = 16 * HUGE) -> Rehomed | None:
    """Move the storages behind `tensors` into one huge-page arena, in place for every given tensor; None (nothing
    moved) where the storages total less than `min_bytes` (a small model gains nothing a TLB does not already
    hold) or the platform has no madvise."""
    madvise = _madvise()
    groups = _by_storage(tensors)
    total = sum(-(-s.nbytes() // ALIGN) * ALIGN for s, _ in groups.values())
    if madvise is None or not groups or total < min_bytes:
        return None
    size = -(-total // HUGE) * HUGE
    region = mmap.mmap(-1, size + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    whole = torch.frombuffer(region, dtype=torch.uint8)   # keeps `region` alive as long as any tensor uses it
    skip = (-whole.data_ptr()) % HUGE                      # the arena starts on a 2 MiB boundary
    if madvise(whole.data_ptr() + skip, size, MADV_HUGEPAGE) != 0:
        log.info("weights left on small pages: madvise(MADV_HUGEPAGE) refused (errno %d)", ctypes.get_errno())
        return None
    arena = whole.untyped_storage()
    at = skip
    with torch.no_grad():
        for s, ts in groups.values():
            n = s.nbytes()
            whole[at:at + n].copy_(torch.empty(0, dtype=torch.uint8).set_(s, 0, (n,), (1,)))
            base = s.data_ptr()
            for t in ts:
                size_el = t.element_size()
                off_bytes = at + (t.data_ptr() - base)
                t.set_(arena, off_bytes // size_el, t.size(), t.stride())
            at += -(-n // ALIGN) * ALIGN
    huge = huge_bytes_in(whole.data_ptr() + skip, size)
    log.info("weights on huge pages: %d storages, %.1f MB moved, %.1f MB on 2 MiB pages", len(groups), total / 1e6,
             huge / 1e6)
    return Rehomed(len(groups), total, huge)


def advise(t: torch.Tensor) -> bool:
    """Ask for 2 MiB pages under the whole 2 MiB pages of `t`'s memory before it is first written (a large CPU
    tensor from torch.empty: fresh pages, which then fault in huge; memory the heap had handed out before keeps the
    small pages it was written on). False where the platform refuses or `t` is too small."""
    madvise = _madvise()
    if madvise is None or t.device.type != "cpu":
        return False
    start = t.data_ptr()
    lo, hi = -(-start // HUGE) * HUGE, (start + t.numel() * t.element_size()) // HUGE * HUGE
    return hi > lo and madvise(lo, hi - lo, MADV_HUGEPAGE) == 0


def huge_bytes_in(start: int, nbytes: int) -> int:
    """Bytes of [start, start + nbytes) on transparent huge pages (the AnonHugePages of the mappings it overlaps in
    /proc/self/smaps); 0 where that file does not exist."""
    total, cur = 0, None
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                head = line.split(None, 1)[0]
                if "-" in head and not head.endswith(":"):
                    lo, hi = (int(v, 16) for v in head.split("-"))
                    cur = (lo, hi) if lo < start + nbytes and hi > start else None
                elif cur is not None and head == "AnonHugePages:":
                    total += int(line.split()[1]) * 1024
    except OSError:
        return 0
    return min(total, nbytes)


def module_tensors(*modules: torch.nn.Module) -> list[torch.Tensor]:
    """Every tensor the modules hold: parameters, buffers, plain tensor attributes, and the bytes of attributes that
    carry a `data` tensor (quantized weights: plugins/runner/quant.QWeight) — what a forward reads."""
    out: list[torch.Tensor] = []
    for model in modules:
        out += [*model.parameters(), *model.buffers()]
        for m in model.modules():
            for v in vars(m).values():
                if isinstance(v, torch.Tensor):
                    out.append(v)
                elif isinstance(getattr(v, "data", None), torch.Tensor):
                    out.append(v.data)
    return out
