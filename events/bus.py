"""The event bus: observers called inline after each engine step, and per-request streams.

Observers are registered per event type before start and frozen into tuples: publishing is
a dict lookup and a loop, no pluggy call and no task per event.
"""
from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable

from modelcall.events.stream import RequestStream
from modelcall.events.types import REQUEST_EVENTS, TERMINAL_EVENTS, Event, StepDone

log = logging.getLogger("modelcall.events")

Observer = Callable[[object], None]
_ALL_TYPES = (*REQUEST_EVENTS, StepDone)


class EventBus:
    """Routes every published event to the observers of its type and to its request's stream."""

    def __init__(self) -> None:
        self._registered: list[tuple[type, Observer, str]] = []
        self._observers: dict[type, tuple[tuple[Observer, str], ...]] = {}
        self._streams: dict[str, RequestStream] = {}
        self._frozen = False
        self.observer_errors: Counter[str] = Counter()

    def subscribe(self, event_type: type | tuple[type, ...], observer: Observer, name: str | None = None) -> None:
        """Call `observer(event)` for every event of `event_type` (subclasses included).

        Observers run inline in the engine loop and must take microseconds; slow work goes
        through `modelcall.events.OffloadedObserver`.
        """
        if self._frozen:
            raise RuntimeError("observers are frozen once the kernel has started")
        types = event_type if isinstance(event_type, tuple) else (event_type,)
        label = name or getattr(observer, "__qualname__", repr(observer))
        for t in types:
            self._registered.append((t, observer, label))

    def freeze(self) -> None:
        table: dict[type, list[tuple[Observer, str]]] = {t: [] for t in _ALL_TYPES}
        for wanted, fn, label in self._registered:
            for t in _ALL_TYPES:
                if issubclass(t, wanted):
                    table[t].append((fn, label))
        self._observers = {t: tuple(v) for t, v in table.items() if v}
        self._frozen = True

    def open_stream(self, request_id: str, capacity: int = 64) -> RequestStream:
        stream = RequestStream(request_id, capacity)
        self._streams[request_id] = stream
        return stream

    def stream(self, request_id: str) -> RequestStream | None:
        return self._streams.get(request_id)

    def publish(self, events: Iterable[Event | StepDone]) -> None:
        observers = self._observers
        streams = self._streams
        for ev in events:
            for fn, label in observers.get(type(ev), ()):
                try:
                    fn(ev)
                except Exception:  # an observer never stops the engine
                    n = self.observer_errors[label] = self.observer_errors[label] + 1
                    # NOTE: an observer failing on every token would flood the log: the first
                    # failure with its traceback, then one line per 1,000.
                    if n == 1:
                        log.exception("observer %s raised on %s", label, type(ev).__name__)
                    elif n % 1000 == 0:
                        log.error("observer %s has raised %d times", label, n)
            rid = getattr(ev, "request_id", None)
            if rid is not None:
                stream = streams.get(rid)
                if stream is not None:
                    stream.put(ev)
                    if isinstance(ev, TERMINAL_EVENTS):
                        del streams[rid]

    def observer_stats(self) -> dict[str, dict[str, int]]:
        """Per observer that counts them (e.g. an OffloadedObserver): events dropped and failed."""
        out: dict[str, dict[str, int]] = {}
        for _t, fn, label in self._registered:
            dropped = getattr(fn, "dropped", None)
            if isinstance(dropped, int) and label not in out:
                out[label] = {"dropped": dropped, "errors": int(getattr(fn, "errors", 0))}
        return out

    def stale_streams(self, now: float, timeout_s: float) -> list[str]:
        """Requests whose consumer has been gone, or lagging, for longer than `timeout_s`."""
        return [rid for rid, s in self._streams.items()
                if s.consumer_gone or (s.lagging_since is not None and now - s.lagging_since > timeout_s)]
