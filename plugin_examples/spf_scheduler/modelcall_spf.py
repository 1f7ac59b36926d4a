"""modelcall-spf: shortest-prompt-first admission for modelcall's scheduler.

Waiting requests are admitted shortest prompt first (ties: arrival order), so a burst of short
questions is not stuck behind one long document. Only the waiting queue changes: the built-in
scheduler still batches, chunks prefills and preempts. A preempted request goes back ahead of
every request that never ran, so nothing starves once started.

Select it with `waiting_queue = "spf"` (or leave `auto`: an installed plugin is asked first).
"""
from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator
from typing import Any

from modelcall.core import Request, hookimpl

__version__ = "0.1.0"


@hookimpl
def provide_waiting_queue(config: Any) -> ShortestPromptFirst | None:
    return ShortestPromptFirst() if config.wants("waiting_queue", "spf") else None


class ShortestPromptFirst:
    """A `modelcall.core.WaitingQueue`: a heap keyed (never ran?, prompt length, seq), lazy deletion."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, int, Request]] = []  # seq is unique: requests are never compared
        self._live: dict[str, tuple[tuple[int, int, int], Request]] = {}  # id -> (its live entry's key, it)
        self._seq = itertools.count()

    def push(self, request: Request, *, preempted: bool = False) -> None:
        # NOTE: a preempted request has done work already: it goes ahead of everyone who never ran.
        key = (0 if preempted else 1, request.num_prompt_tokens, next(self._seq))
        self._live[request.request_id] = (key, request)
        heapq.heappush(self._heap, (*key, request))

    def push_front(self, request: Request) -> None:
        self.push(request, preempted=True)

    def peek(self) -> Request:
        while not self._is_live(self._heap[0]):
            heapq.heappop(self._heap)  # removed (aborted) while waiting
        return self._heap[0][3]

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
        return iter([request for _key, request in sorted(self._live.values(), key=lambda live: live[0])])

    def _is_live(self, entry: tuple[int, int, int, Request]) -> bool:
        live = self._live.get(entry[3].request_id)
        return live is not None and live[0] == entry[:3]
