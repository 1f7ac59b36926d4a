"""glibc's malloc told to keep freed step tensors for the next step instead of handing them back to the kernel.

torch's CPU allocator has no cache: every tensor is a posix_memalign and every free a free(). glibc serves
blocks above its mmap threshold (128 KB, rising with use to at most 32 MB) with a fresh mmap and unmaps them on
free, and trims heap tops above 128 KB. A prefill step's activations are megabytes each (2,048 tokens x 2,816
bf16 gate/up columns: 11.5 MB), so each step faulted its working set in again, zeroed by the kernel: W3's
2,048-token prefill steps on two threads took ~5,000 page faults and ~50 ms of system time each (with
THP_MEM_ALLOC_ENABLE=1 many are 2 MB huge-page faults). With the two thresholds raised, ~800 faults and
~9-17 ms (W3 through the kernel 1.08-1.12x in alternating pairs, 2026-12-02: docs/benchmarks.md). vLLM's
CPU backend gets the same effect by asking for tcmalloc in LD_PRELOAD.

The cost: memory a step freed stays in the process (up to the trim threshold at a heap's top) until a later
step reuses it, so the resident size holds the largest step's working set. The setting is process-wide,
like an LD_PRELOAD'ed allocator; runner `keep_freed_memory: false` leaves malloc as it was.
"""
from __future__ import annotations

import ctypes
import logging

log = logging.getLogger(__name__)

# mallopt parameter numbers (glibc's malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

# NOTE: 64 MB: a thread's own arena grows in 64 MB heaps and serves nothing larger from them anyway, so bigger
# blocks (the KV pool, the packed weights) are mapped as before. Setting either value turns off glibc's own
# sliding mmap threshold, so both are set.
MMAP_THRESHOLD = 64 << 20
TRIM_THRESHOLD = 256 << 20

_done = False


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds once per process; True when they are set (now or before),
    False where the C library is not glibc (no `mallopt`) or refuses."""
    global _done
    if _done:
        return True
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    if mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) != 1 or mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) != 1:
        log.info("malloc thresholds left as they were (mallopt refused)")
        return False
    _done = True
    log.info("malloc keeps freed blocks up to %d MB for reuse (runner keep_freed_memory)", MMAP_THRESHOLD >> 20)
    return True


def release_free_memory() -> bool:
    """Hand the pages of every free block in every malloc arena back to the kernel now (glibc's malloc_trim(0)): after
    load-time work that freed many blocks (quant_repack.py replaces each quantized weight by a new tensor), which the
    raised thresholds above would otherwise keep resident. True where it ran."""
    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim(0)
    return True
