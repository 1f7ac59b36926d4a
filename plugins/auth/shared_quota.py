"""`SharedQuotaBook`: the quota meter over a `QuotaStore` (`--quota-store redis://...`), so that
every replica and front end charges the same counters.

Reserve at admission (one request, prompt + max_tokens), settle at the end (charge the real
count, give back the rest), release when the request was refused later or failed. The
reservation is one atomic store call on the event loop (a loopback Redis answers in well under
a millisecond; every call has a timeout); settlements go through a worker thread, because a
meter's `observe` runs inline after an engine step and must take microseconds.

When the store cannot be reached (`fail`):
- "closed": refuse with 503 and a message that says so, until the store answers again;
- "open": reserve on this process's own counters (`LocalQuotaStore`: each process then allows up
  to the key's limits by itself) and show `modelcall:quota_store_fail_open 1` on /metrics.
After a failure the store is not asked again for `retry_s`, so an outage costs one timeout per
`retry_s`, not one per request.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any

from modelcall.core.errors import Overloaded, Unavailable
from modelcall.core.metering import Admission
from modelcall.core.quota_store import QuotaLimits, QuotaStore, Refusal, StoreUnavailable
from modelcall.events import Finished
from modelcall.plugins.auth.quota import seconds_to_utc_midnight, utc_day
from modelcall.plugins.auth.store_local import LocalQuotaStore

log = logging.getLogger("modelcall.auth")
FAIL_MODES = ("open", "closed")


class SharedQuotaBook:
    """A meter: `reserve(admission)` at admission, `observe(terminal event)` to settle."""

    def __init__(self, store: QuotaStore, *, fail: str = "closed", retry_s: float = 1.0,
                 name: str = "the quota store") -> None:
        if fail not in FAIL_MODES:
            raise ValueError(f"quota_store_fail must be open or closed, got {fail!r}")
        self.store, self.fail, self.retry_s, self.name = store, fail, retry_s, name
        self.local = LocalQuotaStore()
        self._open: dict[str, tuple[QuotaStore, str, QuotaLimits, int, str]] = {}
        self._down_until = 0.0
        self.up = True
        self.errors = 0          # calls the store failed
        self.refused = 0         # 429s
        self.local_reservations = 0
        self._settlements: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._worker: threading.Thread | None = None

    # ---- admission ------------------------------------------------------------------------

    def reserve(self, adm: Admission) -> None:
        caller = adm.caller
        lim = getattr(caller, "limits", None) if caller is not None else None
        if lim is None:
            return
        limits = QuotaLimits(rpm=lim.rpm, tpm=lim.tpm, daily_tokens=lim.daily_tokens)
        if not limits.any:
            return
        # NOTE: a token count (count_tokens) is a request for rpm and costs no tokens; nothing settles it.
        need = 0 if adm.count_only else adm.reserved_tokens
        if limits.tpm is not None and need > limits.tpm:  # could never fit: say so first
            self._refuse(f"this request may use {need} tokens (prompt {adm.prompt_tokens} + max_tokens "
                         f"{adm.max_tokens}) but {caller.name!r} may use {limits.tpm} per minute; lower max_tokens", 60.0)
        day = utc_day()
        store = self._reserve_somewhere(caller.name, limits, need, day)
        if not adm.count_only:
            self._open[adm.request_id] = (store, caller.name, limits, need, day)

    def _reserve_somewhere(self, name: str, limits: QuotaLimits, need: int, day: str) -> QuotaStore:
        store: QuotaStore = self.store
        refusal: Refusal | None
        try:
            if time.monotonic() < self._down_until:
                raise StoreUnavailable("it failed less than a second ago")
            refusal = store.reserve(name, limits, need, day)
            self._mark_up()
        except StoreUnavailable as e:
            self._mark_down(e)
            if self.fail == "closed":
                raise Unavailable(f"{self.name} cannot be reached ({e}), so quotas cannot be checked; requests are "
                                  "refused until it answers (quota_store_fail = closed)", retry_after=self.retry_s) from None
            store = self.local
            refusal = store.reserve(name, limits, need, day)
            self.local_reservations += 1
        if refusal is not None:
            self._refuse_for(name, limits, need, refusal)
        return store

    def _refuse_for(self, name: str, limits: QuotaLimits, need: int, r: Refusal) -> None:
        if r.limit == "rpm":
            self._refuse(f"{name!r} is over its limit of {limits.rpm} requests per minute", r.retry_after)
        if r.limit == "tpm":
            self._refuse(f"{name!r} would use {need} tokens with {int(r.available)} left this minute "
                         f"(limit {limits.tpm} per minute)", r.retry_after)
        self._refuse(f"{name!r} would use {limits.daily_tokens - int(r.available) + need} tokens today (UTC; limit "
                     f"{limits.daily_tokens})", seconds_to_utc_midnight())

    def _refuse(self, message: str, retry_after: float) -> None:
        self.refused += 1
        raise Overloaded(message, retry_after=max(1.0, retry_after))

    def _mark_down(self, e: StoreUnavailable) -> None:
        self._down_until = time.monotonic() + self.retry_s
        self.errors += 1
        if self.up:
            log.warning("%s cannot be reached (%s): %s", self.name, e,
                        "refusing requests with 503" if self.fail == "closed" else "counting quotas in this process only")
        self.up = False

    def _mark_up(self) -> None:
        if not self.up:
            log.warning("%s answers again: quotas are shared again", self.name)
        self.up = True

    # ---- settlement -----------------------------------------------------------------------

    def observe(self, event: Any) -> None:
        """Settle: a finished request is charged its real usage; a refused one is given back whole
        (the request too); a failed one costs 0 tokens."""
        opened = self._open.pop(event.request_id, None)
        if opened is None:
            return
        store, name, limits, need, day = opened
        actual = event.usage.prompt_tokens + event.usage.completion_tokens if isinstance(event, Finished) else 0
        again = type(event).__name__ == "RequestRejected"  # never admitted: not a request either
        job = (store, name, limits, max(0, need - actual), day, again)
        if store is self.local:
            self._settle(job)  # memory only: microseconds
        else:
            self._ensure_worker()
            self._settlements.put(job)

    def _settle(self, job: tuple[Any, ...]) -> None:
        store, name, limits, refund, day, again = job
        try:
            store.settle(name, limits, refund, day, again)
        except StoreUnavailable as e:
            # NOTE: the reservation stays charged: a lost settlement over-counts, never under-counts.
            self.errors += 1
            log.warning("%s: a settlement of %d tokens for %r was lost (%s)", self.name, refund, name, e)

    def _ensure_worker(self) -> None:
        if self._worker is None or not self._worker.is_alive():
            self._worker = threading.Thread(target=self._run, name="quota-settle", daemon=True)
            self._worker.start()

    def _run(self) -> None:
        while True:
            job = self._settlements.get()
            if job is None:
                return
            self._settle(job)

    def close(self) -> None:
        if self._worker is not None and self._worker.is_alive():
            self._settlements.put(None)
            self._worker.join(timeout=5)

    # ---- /metrics -------------------------------------------------------------------------

    def gauges(self) -> list[tuple[str, str, float]]:
        """Series for /metrics (name, help, value): read at scrape time."""
        if not self.up and time.monotonic() >= self._down_until and hasattr(self.store, "ping"):
            self.up = bool(self.store.ping()) or self.up  # a scrape may see the store come back first
        return [
            ("quota_store_up", "1 while the shared quota store answers, 0 while it cannot be reached.",
             1.0 if self.up else 0.0),
            ("quota_store_fail_open", "1 while quotas are counted in this process only because the shared "
             "store cannot be reached (quota_store_fail = open): a warning.",
             1.0 if (not self.up and self.fail == "open") else 0.0),
            ("quota_store_errors", "Calls to the shared quota store that failed (counted since start).",
             float(self.errors)),
        ]
