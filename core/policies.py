"""Seams smaller than a stage: the order the built-in KV policy evicts in, and the order the built-in
scheduler admits waiting requests in. A plugin that only wants another order implements one of these
(through `provide_eviction_policy` / `provide_waiting_queue`) and keeps the rest of the built-in stage.

Both run in the engine loop once per block or per request each step: every method must be O(1)
or O(log n), plain Python, no I/O. `KeyedWaitingQueue` is a whole waiting queue but for its order:
a plugin gives the key of a request and inherits the rest.
"""
from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from collections.abc import Iterator
from operator import itemgetter
from typing import Any, Protocol, runtime_checkable

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

    Optional: a queue with a method `served(plan)` is handed each step's `SchedulePlan` once it is
    built (a fair-share queue counts the tokens it serves per tenant); one with `victim(running)`
    names the running request to preempt when blocks run out (`running`: request id -> Request).
    Both run once per step or per preemption: keep them O(batch).

    Optional: a queue with an attribute `newcomer_terms` (a `NewcomerTerms`) and a method
    `newcomer(request) -> bool` (O(1)) gives some requests a fast lane: when the head is a newcomer,
    the scheduler admits it before the running requests are scheduled and lets those add at most
    `step_tokens` to that step; and every other request is admitted only while `reserve_tokens` of
    KV room stay free beyond its whole prompt, so a newcomer does not wait for blocks. With
    `chunk_tokens` set, a method `contended() -> bool` (called once per step) says when the batch is
    shared: such steps hold at most `chunk_tokens` of prefill, so a newcomer waits for a short step
    in flight, not a long prefill chunk.
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


@dataclass(frozen=True)
class NewcomerTerms:
    """A waiting queue's fast lane for newcomers (`WaitingQueue.newcomer`), e.g. a tenant's request
    while nothing of that tenant runs, so its first token does not wait behind another's prefill.

    `step_tokens`: the most tokens the requests already running may add to the step that admits a
    newcomer (a decode counts one; 0: the newcomer is computed alone). The step after such a step is
    an ordinary one, so newcomers arriving every step slow the running requests down by half at most.
    `reserve_tokens`: KV room (rounded up to whole blocks) that only a newcomer may take.
    `chunk_tokens`: while the queue is `contended()`, a step's budget is this plus one token per
    running request (their decodes), so no step in flight keeps a newcomer waiting long. None: off.
    """

    step_tokens: int = 0
    reserve_tokens: int = 0
    chunk_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.step_tokens < 0 or self.reserve_tokens < 0 or (self.chunk_tokens is not None and self.chunk_tokens < 1):
            raise ValueError(f"newcomer step_tokens and reserve_tokens must be >= 0 and chunk_tokens >= 1, got "
                             f"{self.step_tokens}, {self.reserve_tokens}, {self.chunk_tokens}")


class KeyedWaitingQueue:
    """A `WaitingQueue` in the order of a key: the lowest `key(request, preempted)` first, ties in push
    order. Subclasses give `key`; everything else is here.

    A heap with lazy deletion: `remove` forgets the request, and its stale heap entry is dropped when it
    reaches the top. Each entry is `(*key, seq, request_id)`, so requests themselves are never compared;
    an entry is live while it is the very tuple its request's record holds.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[Any, ...]] = []
        self._live: dict[str, tuple[tuple[Any, ...], Request]] = {}  # request id -> (its live entry, request)
        self._seq = itertools.count()

    def key(self, request: Request, preempted: bool) -> tuple[Any, ...]:
        """The request's place: lower keys are admitted first. `preempted`: it is being requeued by
        `push_front` (it has run already)."""
        raise NotImplementedError

    def push(self, request: Request) -> None:
        self._push(request, False)

    def push_front(self, request: Request) -> None:
        self._push(request, True)

    def _push(self, request: Request, preempted: bool) -> None:
        entry = (*self.key(request, preempted), next(self._seq), request.request_id)
        self._live[request.request_id] = (entry, request)
        heapq.heappush(self._heap, entry)

    def peek(self) -> Request:
        heap, live_of = self._heap, self._live
        while True:
            entry = heap[0]
            live = live_of.get(entry[-1])
            if live is not None and live[0] is entry:
                return live[1]
            heapq.heappop(heap)  # removed (aborted) or pushed again since

    def pop(self) -> Request:
        request = self.peek()
        heapq.heappop(self._heap)
        del self._live[request.request_id]
        return request

    def remove(self, request: Request) -> bool:
        return self._live.pop(request.request_id, None) is not None

    def get(self, request_id: str) -> Request | None:
        live = self._live.get(request_id)
        return live[1] if live else None

    def __len__(self) -> int:
        return len(self._live)

    def __iter__(self) -> Iterator[Request]:
        return iter([request for _entry, request in sorted(self._live.values(), key=itemgetter(0))])
