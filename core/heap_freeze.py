"""The loaded kernel's objects out of the cyclic garbage collector's sight while it serves.

A started kernel holds hundreds of thousands of long-lived Python objects (the model's modules and parameters,
transformers' config and tokenizer tables, the plugins). Every full collection walks all of them, and the engine
loop allocates enough small objects per step (events, batch tensors' wrappers) to trigger collections all the
time: at one stream on SmolLM2 Q8_0, `gc_collect_main` was 7.6% of the decode's samples (py-spy --native).
`gc.freeze()` after start moves what exists then to the permanent generation, so collections only walk what the
requests allocate; `thaw` at stop gives them back, so a stopped kernel's cycles are collected as before (tests
start many kernels in one process). Process-wide, as the collector is: with two kernels in one process, the
first one stopped thaws both, which only costs the other its saving.
"""
from __future__ import annotations

import gc


def freeze() -> int:
    """Freeze every tracked object; the number frozen. No collection first: it would cost each start (the tests
    start hundreds of kernels) a walk of the whole heap, and what garbage is frozen is collected after `thaw`."""
    gc.freeze()
    return gc.get_freeze_count()


def thaw() -> None:
    """Give the frozen objects back to the collector (at stop)."""
    gc.unfreeze()
