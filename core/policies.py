"""Seams smaller than a stage: the order the built-in KV policy evicts in, and the order the built-in
scheduler admits waiting requests in. A plugin that only wants another order implements one of these
(through `provide_eviction_policy` / `provide_waiting_queue`) and keeps the rest of the built-in stage.

Both run in the engine loop once per block or per request each step: every method must be O(1)
or O(log n), plain Python, no I/O.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol, runtime_checkable

from modelcall.core.request import Request


@runtime_checkable
class EvictionPolicy(Protocol):
    """The free KV block ids, in the order they are reused: the eviction order of the prefix cache.

    A freed block keeps its cached prefix until it is reused (lazy eviction), so `pop` choosing the
    next block to reuse is what evicts. The built-in is least recently freed first (LRU).

    It starts holding every block id `0 .. num_blocks-1` (the KV policy checks `len`). The KV policy
    never pushes a block that is already in, nor removes or pops one that is not.

    Optional: a policy with a method `hit(block_id)` is told of every prefix-cache hit on a block
    (free or held, after `remove` for a free one), so it can keep counts (LFU). A policy keeps its
    own per-block state; it is told nothing else (forget a block's counts when `pop` hands it out).
    """

    def push(self, block_id: int) -> None:
        """`block_id` just became free (its last holder released it): it joins the queue, as the
        most recent. Blocks of one request are pushed last block first."""
        ...

    def remove(self, block_id: int) -> None:
        """A prefix-cache hit revives free `block_id`: take it out of the queue without reusing it
        (its cached prefix stays; it is pushed again when freed)."""
        ...

    def pop(self) -> int:
        """Take out and return the next block to reuse: the victim whose cached prefix, if any, is
        evicted. Only called when `len(self) > 0`."""
        ...

    def __len__(self) -> int:
        """The number of free blocks."""
        ...


@runtime_checkable
class WaitingQueue(Protocol):
    """The requests waiting to be admitted, in the order the scheduler admits them.

    The built-in scheduler admits the head (`peek`) while it fits, then `pop`s it; a head that does
    not fit blocks the ones behind it until blocks free up. The built-ins: arrival order (FCFS) and
    lowest `priority` first (priority), as `scheduling_policy` says.
    """

    def push(self, request: Request) -> None:
        """Queue a newly admitted request."""
        ...

    def push_front(self, request: Request) -> None:
        """Requeue a preempted request (its blocks were freed; it will be recomputed). It has run
        already: put it where it resumes soonest that the order allows (FCFS: ahead of everyone)."""
        ...

    def peek(self) -> Request:
        """The next request to admit, left in the queue. Only called when `len(self) > 0`."""
        ...

    def pop(self) -> Request:
        """Take out and return the request `peek` gives."""
        ...

    def remove(self, request: Request) -> bool:
        """Take out `request` (found by its `request_id`; aborted while waiting). False when it was
        not queued."""
        ...

    def get(self, request_id: str) -> Request | None:
        """The queued request with this id, or None."""
        ...

    def __len__(self) -> int:
        ...

    def __iter__(self) -> Iterator[Request]:
        """The queued requests in admission order (a snapshot: the queue may change meanwhile)."""
        ...
