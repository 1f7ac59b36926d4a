"""The waiting queue (`modelcall.core.WaitingQueue`) in the two orders the scheduler knows.
Every operation is O(1) or O(log n).

`push_front` is for a preempted request: it goes back ahead of requests that never ran (FCFS),
or back into its place by priority (priority).
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

from modelcall.core.policies import KeyedWaitingQueue, WaitingQueue
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


class PriorityQueue(KeyedWaitingQueue):
    """Lowest `priority` value first, ties by arrival then admission order."""

    def key(self, request: Request, preempted: bool) -> tuple[int, float]:
        return request.priority, request.arrival  # a preempted request keeps both: its place is its key
