"""The process's OpenMP thread teams, as libgomp (torch's OpenMP runtime on Linux) keeps them.

libgomp keeps one team of worker threads per thread that ever ran a parallel region, and counts every
worker of every team as "managed". When that count exceeds the CPUs the process may use, it stops
spinning between parallel regions (GOMP_SPINCOUNT falls to its "throttled" value, 0 under
OMP_WAIT_POLICY=PASSIVE and 100 otherwise) and each small GEMM of a decode step pays a futex wake-up
of its worker instead. The runner loads the model in one thread (the kernel's assembly thread) and runs
steps in another (the engine's worker), so without a release there are two teams on two threads' CPUs.
Measured on the W1 shape, batch 32, two threads, GOMP_SPINCOUNT=30000: the eight layers' GEMMs took 9.3-11.2 ms
per step in a step thread beside a loading thread's team, 5.9-6.1 ms with one team (2026-12-01; docs/benchmarks.md).
"""
from __future__ import annotations

import ctypes
import logging

log = logging.getLogger(__name__)

_OMP_PAUSE_SOFT = 1


def _libgomp() -> ctypes.CDLL | None:
    try:
        # NOTE: by soname: the dynamic loader hands back the libgomp torch already loaded, not a second copy
        return ctypes.CDLL("libgomp.so.1")
    except OSError:
        return None


def release_thread_team() -> bool:
    """Free the OpenMP team of the calling thread: its worker threads exit. Call it from a thread that has
    done its parallel work (loading a model) and hands the steps to another; should it run a parallel
    region again, libgomp builds it a new team. False where libgomp is not the runtime or the call is
    refused (inside a parallel region)."""
    lib = _libgomp()
    if lib is None or not hasattr(lib, "omp_pause_resource_all"):
        return False
    lib.omp_pause_resource_all.argtypes = [ctypes.c_int]
    return lib.omp_pause_resource_all(_OMP_PAUSE_SOFT) == 0
