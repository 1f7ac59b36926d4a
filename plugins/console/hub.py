"""The console's fan-out of bus events to its live viewers, each seeing only its own caller's requests.

Inline in the engine loop, so cheap: with no viewer connected an event costs one truth test
(the owner book-keeping runs only on admission and end). A viewer's queue is bounded; when a
viewer lags, events are dropped and counted for it, never held up for the engine.
"""
from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from typing import Any

from modelcall.events import (
    Finished, PrefillDone, RequestAdmitted, RequestFailed, RequestRejected, RequestScheduled, StepDone,
)

ANYONE = object()  # a viewer that sees every request (a server without API keys)
# where a live request is (the page counts output and tool-loop stages itself, from the events)
_STAGE_OF = {RequestAdmitted: "queue", RequestScheduled: "prefill", PrefillDone: "decode"}


class Viewer:
    """One connected `/-/events` stream: whose requests it sees, and which event types."""

    def __init__(self, caller: Any, types: frozenset[str] | None, capacity: int = 4096) -> None:
        self.caller = caller          # a caller name, None (unauthenticated requests) or ANYONE
        self.types = types            # None: every type
        self.queue: deque = deque()
        self.capacity = capacity
        self.dropped = 0
        self.wake = asyncio.Event()

    def offer(self, ev: Any) -> None:
        if self.types is not None and type(ev).__name__ not in self.types:
            return
        if len(self.queue) >= self.capacity:
            self.dropped += 1
            return
        self.queue.append(ev)
        self.wake.set()


class ConsoleHub:
    """Keeps who owns each live request and its stage; hands events to the viewers allowed to see them."""

    def __init__(self, step_interval_s: float = 0.2, keep_finished: int = 4096) -> None:
        self.viewers: list[Viewer] = []
        self.owner: OrderedDict[str, str | None] = OrderedDict()   # request id -> caller name
        self.stage: dict[str, str] = {}                             # live request id -> stage
        self.admitted: dict[str, RequestAdmitted] = {}
        self.keep_finished = keep_finished
        self.step_interval_s = step_interval_s
        self._last_step = 0.0
        self.closed = False  # set at kernel shutdown: open feeds end

    # ---- inline observers -----------------------------------------------------------------------

    def on_lifecycle(self, ev: Any) -> None:
        """Admission, stage changes and ends: who owns the request, where it is now."""
        kind = type(ev)
        rid = ev.request_id
        if kind is RequestAdmitted:
            self.owner[rid] = ev.caller
            self.admitted[rid] = ev
        elif kind is RequestRejected:
            self.owner[rid] = ev.caller
        stage = _STAGE_OF.get(kind)
        if kind is Finished or kind is RequestFailed or kind is RequestRejected:
            self.stage.pop(rid, None)
            self.admitted.pop(rid, None)
            while len(self.owner) > self.keep_finished + len(self.stage):
                self.owner.popitem(last=False)
        elif stage is not None and (rid in self.stage or kind is RequestAdmitted):
            self.stage[rid] = stage

    def forward(self, ev: Any) -> None:
        if not self.viewers:
            return
        owner = self.owner.get(ev.request_id)
        for v in self.viewers:
            if v.caller is ANYONE or v.caller == owner:
                v.offer(ev)

    def on_step(self, ev: StepDone) -> None:
        # NOTE: engine-wide figures (KV pool use, queue lengths), no request ids and no text; at most
        # a few a second, since a console redraws no faster.
        if not self.viewers or ev.ts - self._last_step < self.step_interval_s:
            return
        self._last_step = ev.ts
        for v in self.viewers:
            v.offer(ev)

    # ---- viewers --------------------------------------------------------------------------------

    def connect(self, viewer: Viewer) -> None:
        self.viewers = [*self.viewers, viewer]  # NOTE: a new list, so forward() never sees it change mid-loop

    def disconnect(self, viewer: Viewer) -> None:
        self.viewers = [v for v in self.viewers if v is not viewer]

    def snapshot(self, caller: Any) -> dict[str, Any]:
        """The live requests this viewer may see, with their stage, for a page that connects mid-flight."""
        live = []
        for rid, stage in self.stage.items():
            if caller is ANYONE or self.owner.get(rid) == caller:
                adm = self.admitted.get(rid)
                live.append({"request_id": rid, "stage": stage, "task_id": adm.task_id if adm else None,
                             "admitted": adm.ts if adm else None, "prompt_tokens": adm.prompt_tokens if adm else None})
        return {"live": live}
