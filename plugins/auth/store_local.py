"""`LocalQuotaStore`: the `QuotaStore` of one process, in memory (the counters a fail-open meter
falls back on while the shared store is unreachable). The same buckets as the Redis scripts."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

from modelcall.core.quota_store import QuotaLimits, Refusal

WINDOW_S = 60.0


class _Bucket:
    __slots__ = ("level", "ts")

    def __init__(self, level: float, ts: float) -> None:
        self.level, self.ts = level, ts

    def refill(self, capacity: int, now: float) -> float:
        """The level now: refilled at capacity per minute since the last change, never past capacity."""
        self.level = min(float(capacity), self.level + (now - self.ts) * capacity / WINDOW_S)
        self.ts = now
        return self.level


class LocalQuotaStore:
    """Token buckets (requests and tokens per minute) and a daily token count per key, under one lock."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[tuple[str, str], _Bucket] = {}
        self._days: dict[tuple[str, str], int] = {}

    def _bucket(self, key: str, kind: str, capacity: int, now: float) -> _Bucket:
        b = self._buckets.get((key, kind))
        if b is None:
            b = self._buckets[(key, kind)] = _Bucket(float(capacity), now)
        b.refill(capacity, now)
        return b

    def reserve(self, key: str, limits: QuotaLimits, tokens: int, day: str) -> Refusal | None:
        with self._lock:
            now = self.clock()
            rb = self._bucket(key, "rpm", limits.rpm, now) if limits.rpm is not None else None
            if rb is not None and limits.rpm is not None and rb.level < 1:
                return Refusal(limit="rpm", available=rb.level, retry_after=(1 - rb.level) * WINDOW_S / limits.rpm)
            tb = self._bucket(key, "tpm", limits.tpm, now) if limits.tpm is not None else None
            if tb is not None and limits.tpm is not None and tb.level < tokens:
                return Refusal(limit="tpm", available=tb.level,
                               retry_after=(tokens - tb.level) * WINDOW_S / limits.tpm)
            used = self._days.get((key, day), 0)
            if limits.daily_tokens is not None and used + tokens > limits.daily_tokens:
                return Refusal(limit="daily_tokens", available=float(limits.daily_tokens - used), retry_after=0.0)
            if rb is not None:
                rb.level -= 1
            if tb is not None:
                tb.level -= tokens
            if limits.daily_tokens is not None:
                self._days[(key, day)] = used + tokens
            return None

    def settle(self, key: str, limits: QuotaLimits, refund_tokens: int, day: str, refund_request: bool) -> None:
        with self._lock:
            now = self.clock()
            if limits.tpm is not None and refund_tokens > 0:
                b = self._bucket(key, "tpm", limits.tpm, now)
                b.level = min(float(limits.tpm), b.level + refund_tokens)
            if limits.daily_tokens is not None and refund_tokens > 0 and (key, day) in self._days:
                self._days[(key, day)] = max(0, self._days[(key, day)] - refund_tokens)
            if limits.rpm is not None and refund_request:
                b = self._bucket(key, "rpm", limits.rpm, now)
                b.level = min(float(limits.rpm), b.level + 1)

    def usage(self, key: str, limits: QuotaLimits, day: str) -> dict[str, float]:
        with self._lock:
            now = self.clock()
            return {"requests_left": self._bucket(key, "rpm", limits.rpm, now).level if limits.rpm else -1.0,
                    "tokens_left": self._bucket(key, "tpm", limits.tpm, now).level if limits.tpm else -1.0,
                    "tokens_today": float(self._days.get((key, day), 0))}
