"""A bounded in-memory batch for the tracer: the engine appends, a worker drains it a few times a second.

NOTE: not `queue.Queue`: its put notifies a condition, waking the worker for every event, and each
wake-up makes the engine's thread hand over the GIL mid-step. Spans are not urgent; a deque append
(atomic under the GIL) and a worker that sleeps between drains cost the engine next to nothing.
"""
from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

log = logging.getLogger("modelcall.otel")


class Batcher:
    """`batcher(item)` enqueues (dropped and counted past `maxsize`); `handle_batch(items)` runs on the worker."""

    def __init__(self, handle_batch: Callable[[list[Any]], None], *, maxsize: int = 10_000,
                 interval_s: float = 0.2, name: str = "otel") -> None:
        self._items: deque = deque()
        self._handle_batch = handle_batch
        self.maxsize = maxsize
        self.interval_s = interval_s
        self.dropped = 0
        self.errors = 0
        self._lock = threading.Lock()   # one drain at a time: the worker's, or a flush's
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"modelcall-{name}", daemon=True)
        self._thread.start()

    def __call__(self, item: Any) -> None:
        if len(self._items) >= self.maxsize:
            self.dropped += 1
            return
        self._items.append(item)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.drain()
        self.drain()

    def drain(self) -> None:
        """Hand everything queued so far to `handle_batch` (in order)."""
        with self._lock:
            items, pop = [], self._items.popleft
            for _ in range(len(self._items)):
                items.append(pop())
            if not items:
                return
            try:
                self._handle_batch(items)
            except Exception:
                self.errors += 1
                log.exception("building spans failed on a batch of %d events", len(items))

    def flush(self) -> None:
        self.drain()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
