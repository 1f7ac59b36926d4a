"""Slow observers (databases, networks) behind a bounded queue and their own worker thread.

The engine calls the wrapper inline; it only enqueues. When the queue is full the event is
dropped and counted, so a stuck database never slows a token down.
"""
from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

log = logging.getLogger("modelcall.events")
_STOP = object()


class OffloadedObserver:
    """Wraps `handle(event)` so it runs on a worker thread fed by a bounded queue.

    With `handle_batch(events)` instead, the worker takes every event waiting (up to
    `max_batch`) at once, e.g. to write them in one database transaction.
    """

    def __init__(self, handle: Callable[[object], None] | None = None, maxsize: int = 10_000,
                 name: str = "observer", *, handle_batch: Callable[[list], None] | None = None,
                 max_batch: int = 512) -> None:
        if (handle is None) == (handle_batch is None):
            raise ValueError("give exactly one of handle and handle_batch")
        self._handle = handle
        self._handle_batch = handle_batch
        self.max_batch = max_batch
        self._queue: queue.Queue = queue.Queue(maxsize)
        self.name = name
        self.dropped = 0
        self.errors = 0
        self._thread = threading.Thread(target=self._run, name=f"modelcall-{name}", daemon=True)
        self._thread.start()

    def __call__(self, event: object) -> None:
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            self.dropped += 1

    def _run(self) -> None:
        if self._handle_batch is not None:
            return self._run_batches()
        while (ev := self._queue.get()) is not _STOP:
            try:
                self._handle(ev)
            except Exception:
                self.errors += 1
                log.exception("offloaded observer %s failed", self.name)
            finally:
                self._queue.task_done()
        self._queue.task_done()

    def _run_batches(self) -> None:
        q, stop = self._queue, False
        while not stop:
            batch = [q.get()]
            while len(batch) < self.max_batch:
                try:
                    batch.append(q.get_nowait())
                except queue.Empty:
                    break
            if batch[-1] is _STOP or _STOP in batch:
                stop = True
                batch = [e for e in batch if e is not _STOP]
            try:
                if batch:
                    self._handle_batch(batch)
            except Exception:
                self.errors += 1
                log.exception("offloaded observer %s failed on a batch of %d", self.name, len(batch))
            finally:
                for _ in range(len(batch) + stop):
                    q.task_done()

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every queued event has been handled."""
        self._queue.join()

    def close(self) -> None:
        self._queue.put(_STOP)
        self._thread.join(timeout=10)
