"""The CPU KV pool as fresh anonymous memory: zero by the kernel's promise, faulted in as blocks are first written.

`torch.zeros` writes every byte of the pool at load, and under THP_MEM_ALLOC_ENABLE=1 (the command line's default,
plugins/cli/main.py) each 2 MB huge page is zeroed by the kernel at its fault and then again by torch: measured
here, a 1 GB pool took 0.40 s plain and 1.98 s on huge pages, most of `modelcall serve`'s start after the imports
(7.35/5.92 s to "serving" with the default 1 GB against 4.02/4.51 s with 0.05 GB). A private anonymous mapping
reads as zeros without being written (untouched pages are the shared zero page), so the pool costs nothing until
a block is used, and a pool larger than the requests need never takes its unused memory. The zeros matter:
padded attention reads unused slots (masked), and NaN garbage there would still poison masked SDPA rows
through 0 * NaN.

The trade: the pool's memory is taken as blocks are first used, not at load, so a pool sized past what the
machine can back fails (the kernel's OOM killer) under load instead of at start; size `kv_cache_memory_gb` to
the memory there is.

Huge pages as torch gives them (`THP_MEM_ALLOC_ENABLE=1`: madvise(MADV_HUGEPAGE) on the mapping); otherwise
the kernel's default for the mapping.
"""
from __future__ import annotations

import math
import mmap
import os

import torch


def zeroed_pool(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A CPU tensor of zeros of `shape`, backed by its own anonymous mapping (released with the tensor)."""
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes == 0:
        return torch.zeros(shape, dtype=dtype)
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if os.environ.get("THP_MEM_ALLOC_ENABLE") == "1" and hasattr(mmap, "MADV_HUGEPAGE"):
        buf.madvise(mmap.MADV_HUGEPAGE)
    # NOTE: the tensor holds the buffer (frombuffer keeps it exported), so the mapping lives as long as the pool
    return torch.frombuffer(buf, dtype=dtype).view(shape)
