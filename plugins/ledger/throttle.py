"""Unauthenticated refusals reach the ledger at most once per client address per minute.

Inline, before the ledger's queue: a flood of 401s (no key, a wrong key) must neither grow the
database nor fill the queue that the real requests' rows go through. /metrics still counts
every 401 (its observer sees them all); the row the ledger keeps says how many it stood for
in the minute before it (`error` ends with "(+N more from this address)").
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import msgspec

WINDOW_S = 60.0
MAX_ADDRESSES = 10_000  # NOTE: bounds the table under a flood from many addresses


class UnauthenticatedThrottle:
    """Wraps the ledger's observer for RequestRejected: 401s pass once per address per minute."""

    def __init__(self, forward: Callable[[Any], None], clock: Callable[[], float] = time.monotonic) -> None:
        self.forward = forward
        self.clock = clock
        self._last: dict[str | None, list] = {}  # address -> [time of the row written, 401s held back since]
        self.held_back = 0

    def __call__(self, event: Any) -> None:
        if event.status != 401:
            self.forward(event)
            return
        now, key = self.clock(), event.client
        seen = self._last.get(key)
        if seen is not None and now - seen[0] < WINDOW_S:
            seen[1] += 1
            self.held_back += 1
            return
        more = seen[1] if seen is not None else 0
        if len(self._last) >= MAX_ADDRESSES:
            self._forget(now)
        self._last[key] = [now, 0]
        if more:
            event = msgspec.structs.replace(event, message=f"{event.message} (+{more} more from this address)")
        self.forward(event)

    def _forget(self, now: float) -> None:
        for k in [k for k, v in self._last.items() if now - v[0] >= WINDOW_S]:
            del self._last[k]
        if len(self._last) >= MAX_ADDRESSES:  # all recent: drop the oldest half rather than grow
            for k in sorted(self._last, key=lambda k: self._last[k][0])[: MAX_ADDRESSES // 2]:
                del self._last[k]
