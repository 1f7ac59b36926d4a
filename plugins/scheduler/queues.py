"""The waiting queue (`modelcall.core.WaitingQueue`) in the two orders the scheduler knows.
Every operation is O(1) or O(log n).

`push_front` is for a preempted request: it goes back ahead of requests that never ran (FCFS),
or back into its place by priority (priority).
"""
from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from collections.abc import Iterator

from modelcall.core.policies import WaitingQueue
from modelcall.core.request import Request

__all__ = ["FCFSQueue", "PriorityQueue", "WaitingQueue"]


class FCFSQueue:
    """Arrival order; an OrderedDict so that removing an aborted request is O(1)."""

    def __init__(self) -> None:
        self._queue: OrderedDict[str, Request] = OrderedDict()

    def push(self, request: Request) -> None:
        self._queue[request.request_id] = request

    def push_front(self, request: Request) -> None:
        self._queue[request.request_id] = request
        self._queue.move_to_end(request.request_id, last=False)

    def peek(self) -> Request:
        return next(iter(self._queue.values()))

    def pop(self) -> Request:
        return self._queue.popitem(last=False)[1]

    def remove(self, request: Request) -> bool:
        return self._queue.pop(request.request_id, None) is not None

    def get(self, request_id: str) -> Request | None:
        return self._queue.get(request_id)

    def __len__(self) -> int:
        return len(self._queue)

    def __iter__(self) -> Iterator[Request]:
        return iter(list(self._queue.values()))


class PriorityQueue:
    """Lowest `priority` value first, ties by arrival then admission order.

    A heap with lazy deletion: `remove` forgets the request, and the stale heap entry is dropped
    when it reaches the top.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[int, float, int, str]] = []
        self._live: dict[str, tuple[int, Request]] = {}  # request id -> (entry seq, request)
        self._seq = itertools.count()

    def push(self, request: Request) -> None:
        seq = next(self._seq)
        self._live[request.request_id] = (seq, request)
        heapq.heappush(self._heap, (request.priority, request.arrival, seq, request.request_id))

    push_front = push  # a preempted request keeps its priority and arrival: its place is its key

    def peek(self) -> Request:
        heap = self._heap
        while True:
            _prio, _arr, seq, rid = heap[0]
            live = self._live.get(rid)
            if live is not None and live[0] == seq:
                return live[1]
            heapq.heappop(heap)

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
        return iter(sorted((r for _, r in self._live.values()), key=lambda r: (r.priority, r.arrival)))
