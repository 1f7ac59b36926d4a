"""Per-caller quotas — requests and tokens per minute, tokens per UTC day — as a reserve-then-settle meter.

At admission a request reserves its worst case (prompt + max_tokens) and counts as one request;
if that would break a limit it is refused with `Overloaded` and the seconds until it would fit.
At its end the reservation becomes the real usage. Reservations and checks happen under one
lock in one call, so any interleaving of concurrent admissions and settlements keeps every
limit.
"""
from __future__ import annotations

import datetime as dt
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from modelcall.core.errors import Overloaded
from modelcall.core.metering import Admission
from modelcall.events import Finished

WINDOW_S = 60.0


def utc_day(ts: float | None = None) -> str:
    return dt.datetime.fromtimestamp(time.time() if ts is None else ts, dt.UTC).date().isoformat()


def seconds_to_utc_midnight(ts: float | None = None) -> float:
    t = time.time() if ts is None else ts
    return 86400.0 - (t % 86400.0)


class _Entry:
    __slots__ = ("t", "tokens", "live")

    def __init__(self, t: float, tokens: int) -> None:
        self.t, self.tokens, self.live = t, tokens, True


class _Account:
    __slots__ = ("minute", "minute_tokens", "day", "day_tokens")

    def __init__(self) -> None:
        self.minute: deque[_Entry] = deque()
        self.minute_tokens = 0
        self.day = ""
        self.day_tokens = 0


class QuotaBook:
    """A meter: `reserve(admission)` at admission, `observe(terminal event)` to settle."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        self.clock, self.wall = clock, wall
        self._lock = threading.Lock()
        self._accounts: dict[str, _Account] = {}
        self._open: dict[str, tuple[_Account, _Entry, str]] = {}  # request id -> (account, entry, day)
        self.refused = 0

    def _account(self, name: str, now: float, day: str) -> _Account:
        acc = self._accounts.get(name)
        if acc is None:
            acc = self._accounts[name] = _Account()
        q = acc.minute
        while q and q[0].t <= now - WINDOW_S:
            e = q.popleft()
            e.live = False
            acc.minute_tokens -= e.tokens
        if acc.day != day:
            acc.day, acc.day_tokens = day, 0
        return acc

    def reserve(self, adm: Admission) -> None:
        caller = adm.caller
        if caller is None:
            return
        lim = caller.limits
        if lim is None:
            return
        # NOTE: a token count (count_tokens) is a request for rpm and costs no tokens; nothing settles it.
        need = 0 if adm.count_only else adm.reserved_tokens
        with self._lock:
            now, wall = self.clock(), self.wall()
            day = utc_day(wall)
            acc = self._account(caller.name, now, day)
            q = acc.minute
            if lim.tpm is not None and need > lim.tpm:  # could never fit: say so first
                self._refuse(f"this request may use {need} tokens (prompt {adm.prompt_tokens} + max_tokens "
                             f"{adm.max_tokens}) but {caller.name!r} may use {lim.tpm} per minute; lower max_tokens",
                             WINDOW_S)
            if lim.rpm is not None and len(q) + 1 > lim.rpm:
                self._refuse(f"{caller.name!r} is over its limit of {lim.rpm} requests per minute",
                             q[len(q) - lim.rpm].t + WINDOW_S - now)
            if lim.tpm is not None:
                if acc.minute_tokens + need > lim.tpm:
                    self._refuse(f"{caller.name!r} would use {acc.minute_tokens + need} tokens this minute "
                                 f"(limit {lim.tpm}, this request reserves {need})",
                                 self._tokens_free_in(acc, need, lim.tpm, now))
            if lim.daily_tokens is not None and acc.day_tokens + need > lim.daily_tokens:
                self._refuse(f"{caller.name!r} would use {acc.day_tokens + need} tokens today (UTC; limit "
                             f"{lim.daily_tokens})", seconds_to_utc_midnight(wall))
            entry = _Entry(now, need)
            q.append(entry)
            acc.minute_tokens += need
            acc.day_tokens += need
            if not adm.count_only:
                self._open[adm.request_id] = (acc, entry, day)

    def _refuse(self, message: str, retry_after: float) -> None:
        self.refused += 1
        raise Overloaded(message, retry_after=max(1.0, retry_after))

    @staticmethod
    def _tokens_free_in(acc: _Account, need: int, limit: int, now: float) -> float:
        used = acc.minute_tokens
        for e in acc.minute:
            used -= e.tokens
            if used + need <= limit:
                return e.t + WINDOW_S - now
        return WINDOW_S

    def observe(self, event: Any) -> None:
        """Settle: a finished request is charged its real usage; a refused one is forgotten; a failed one costs 0 tokens."""
        if event.request_id not in self._open:
            return
        with self._lock:
            acc, entry, day = self._open.pop(event.request_id)
            if isinstance(event, Finished):
                actual = event.usage.prompt_tokens + event.usage.completion_tokens
            else:
                actual = 0
            delta = actual - entry.tokens
            if entry.live:
                acc.minute_tokens += delta
                if type(event).__name__ == "RequestRejected":  # never admitted: not a request either
                    acc.minute.remove(entry)
                    entry.live = False
                    acc.minute_tokens -= actual
            if acc.day == day:
                acc.day_tokens += delta
            entry.tokens = actual

    def usage(self, name: str) -> dict[str, int]:
        """What `name` has used now: requests and tokens in the last minute, tokens today (for tests and /metrics)."""
        with self._lock:
            acc = self._account(name, self.clock(), utc_day(self.wall()))
            return {"requests_minute": len(acc.minute), "tokens_minute": acc.minute_tokens,
                    "tokens_day": acc.day_tokens, "open": sum(1 for a, _, _ in self._open.values() if a is acc)}
