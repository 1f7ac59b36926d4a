"""modelcall-spf: a shortest-prompt-first scheduler for modelcall.

Waiting requests are admitted shortest prompt first (ties: arrival order), so a burst of short
questions is not stuck behind one long document. Running requests keep going (continuous
batching, chunked prefill); when KV blocks run out the most recently admitted request is
preempted and recomputed later, ahead of every request that never ran.

Select it with `scheduler = "spf"` (or leave `auto`: an installed plugin is asked before the
built-in).
"""
from __future__ import annotations

import heapq
import itertools
from typing import Any

from modelcall.core import Request, ScheduledChunk, SchedulePlan, Status, hookimpl

__version__ = "0.1.0"


@hookimpl
def provide_scheduler(config: Any, kv_cache: Any) -> ShortestPromptFirst | None:
    if not config.wants("scheduler", "spf"):
        return None
    return ShortestPromptFirst(kv_cache, max_num_seqs=config.max_num_seqs,
                               max_num_batched_tokens=config.max_num_batched_tokens)


class ShortestPromptFirst:
    """A `modelcall.core.stages.Scheduler`: continuous batching, waiting queue ordered by prompt length."""

    def __init__(self, kv: Any, *, max_num_seqs: int = 256, max_num_batched_tokens: int = 2048) -> None:
        self.kv = kv
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.running: dict[str, Request] = {}        # in admission order: the last one is preempted first
        self._heap: list[tuple[int, int, int, str]] = []
        self._waiting: dict[str, tuple[int, Request]] = {}  # request id -> (heap entry seq, request)
        self._seq = itertools.count()

    # ---- the waiting queue: a heap with lazy deletion ---------------------------------------

    def _push(self, request: Request, preempted: bool = False) -> None:
        seq = next(self._seq)
        self._waiting[request.request_id] = (seq, request)
        # NOTE: a preempted request has done work already: it goes ahead of everyone who never ran.
        heapq.heappush(self._heap, (0 if preempted else 1, request.num_prompt_tokens, seq, request.request_id))

    def _peek(self) -> Request | None:
        while self._heap:
            *_, seq, rid = self._heap[0]
            live = self._waiting.get(rid)
            if live is not None and live[0] == seq:
                return live[1]
            heapq.heappop(self._heap)  # finished (aborted) while waiting
        return None

    def _pop(self) -> Request:
        request = self._peek()
        assert request is not None
        heapq.heappop(self._heap)
        del self._waiting[request.request_id]
        return request

    # ---- the Scheduler protocol -------------------------------------------------------------

    def add(self, request: Request) -> None:
        request.status = Status.WAITING
        self._push(request)

    def schedule(self) -> SchedulePlan:
        plan = SchedulePlan()
        chunks: dict[str, ScheduledChunk] = {}
        budget = self.max_num_batched_tokens
        for request in list(self.running.values()):  # decodes and unfinished prompt chunks first
            if budget <= 0 or request.request_id not in self.running:
                continue
            num_new = min(request.num_uncomputed_tokens, budget)
            while num_new > 0 and not self.kv.allocate(request, num_new):
                victim = self.running[next(reversed(self.running))]
                budget += self._preempt(victim, chunks, plan)
                if victim is request:
                    num_new = 0
            if num_new > 0:
                chunks[request.request_id] = self._chunk(request, num_new)
                budget -= num_new
        while not plan.preempted and budget > 0 and len(self.running) < self.max_num_seqs:
            request = self._peek()
            if request is None or not self._admit(request, budget, plan):
                break
            num_new = min(request.num_uncomputed_tokens, budget)
            chunks[request.request_id] = self._chunk(request, num_new)
            budget -= num_new
        plan.chunks = list(chunks.values())
        return plan

    def finish(self, request: Request) -> None:
        if self.running.pop(request.request_id, None) is None:
            self._waiting.pop(request.request_id, None)
        self.kv.free(request)

    def get(self, request_id: str) -> Request | None:
        live = self._waiting.get(request_id)
        return self.running.get(request_id) or (live[1] if live else None)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def has_work(self) -> bool:
        return bool(self.running or self._waiting)

    # ---- helpers ----------------------------------------------------------------------------

    @staticmethod
    def _chunk(request: Request, num_new: int) -> ScheduledChunk:
        return ScheduledChunk(request, num_new, request.num_computed_tokens + num_new == request.num_tokens)

    def _admit(self, request: Request, budget: int, plan: SchedulePlan) -> bool:
        """Give the head of the queue its cached prefix and blocks for its first chunk."""
        num_hit = self.kv.match_prefix(request)
        request.num_computed_tokens = num_hit
        if not self.kv.allocate(request, min(request.num_uncomputed_tokens, budget)):
            self.kv.free(request)
            request.num_computed_tokens = 0
            return False
        self._pop()
        self.running[request.request_id] = request
        request.status = Status.RUNNING
        if not request.scheduled_once:
            request.scheduled_once = True
            request.num_cached_tokens = num_hit
            plan.newly_scheduled.append(request)
        return True

    def _preempt(self, request: Request, chunks: dict[str, ScheduledChunk], plan: SchedulePlan) -> int:
        """Free `request`'s blocks and requeue it for recompute; returns the budget given back."""
        chunk = chunks.pop(request.request_id, None)
        self.kv.free(request)
        request.num_computed_tokens = 0
        request.status = Status.PREEMPTED
        request.num_preemptions += 1
        del self.running[request.request_id]
        self._push(request, preempted=True)
        plan.preempted.append(request)
        return chunk.num_new_tokens if chunk else 0
