"""What `scheduling_policy` changes: the order of the waiting queue and which running request is preempted."""
from __future__ import annotations

from collections.abc import Mapping

from modelcall.core.request import Request
from modelcall.plugins.scheduler.queues import FCFSQueue, PriorityQueue, WaitingQueue


def make_waiting_queue(policy: str) -> WaitingQueue:
    if policy == "fcfs":
        return FCFSQueue()
    if policy == "priority":
        return PriorityQueue()
    if policy == "fair":
        raise ValueError("scheduling_policy fair takes its waiting queue from the fair_share plugin, which did not "
                         "answer: is it blocked (-p no:fair_share) or is another waiting_queue named?")
    raise ValueError(f"scheduling_policy must be fcfs, priority or fair, got {policy!r}")


def pick_victim(policy: str, running: Mapping[str, Request]) -> Request:
    """The running request to preempt: the latest scheduled (fcfs), or the least urgent, latest
    arrival first (priority; fair too, whose queue usually chooses itself). O(n) over running, but only
    when blocks run out."""
    if policy in ("priority", "fair"):
        return max(reversed(list(running.values())), key=lambda r: (r.priority, r.arrival))  # ties: latest
    return running[next(reversed(running))]
