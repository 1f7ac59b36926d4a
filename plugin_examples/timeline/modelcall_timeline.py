"""modelcall-timeline: a live per-request timeline in the terminal.

    req-3f2a  |qqPPPP====================| length  prompt 41 (cached 32) → 24 tok  queue 0.4ms  ttft 9.1ms  e2e 88ms

`q` is time waiting for the scheduler, `P` prefill up to the first token, `=` decode. On a
terminal the requests in flight are redrawn in place (at most every `interval_s`); finished ones
scroll up as permanent lines. Elsewhere (a pipe, a log file) only finished lines are written.

Enable it with `plugin_config = {"timeline": {"enabled": true}}` or `MODELCALL_TIMELINE=1`;
installed, it stays quiet until asked.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, TextIO

from modelcall.core import hookimpl
from modelcall.events import (
    Event, Finished, OffloadedObserver, Preempted, PrefillDone, RequestAdmitted, RequestFailed, RequestRejected,
    RequestScheduled, TokensEmitted, now,
)

__version__ = "0.1.0"


@hookimpl
def register_observers(register: Any, config: Any) -> None:
    options = config.plugin_config.get("timeline", {})
    if not (options.get("enabled") or os.environ.get("MODELCALL_TIMELINE")):
        return
    timeline = Timeline(width=int(options.get("width", 30)))
    register(Event, timeline.observer, name="timeline")


class _Row:
    __slots__ = ("admitted", "prompt", "scheduled", "cached", "first", "tokens", "preempted")

    def __init__(self, admitted: float, prompt: int) -> None:
        self.admitted, self.prompt = admitted, prompt
        self.scheduled: float | None = None
        self.first: float | None = None
        self.cached = self.tokens = self.preempted = 0


class Timeline:
    """Draws one line per request. Also a plugin object: `Kernel(plugins=[Timeline(stream)])`.

    The engine only enqueues events (`OffloadedObserver`); drawing happens on its worker thread,
    so a slow terminal never slows a token down.
    """

    def __init__(self, stream: TextIO | None = None, *, live: bool | None = None, width: int = 30,
                 interval_s: float = 0.1) -> None:
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty() if live is None else live
        self.width = width
        self.interval_s = interval_s
        self.rows: dict[str, _Row] = {}
        self._drawn_live = 0  # live lines on screen below the permanent ones
        self._last_draw = 0.0
        self._lock = threading.Lock()
        self.observer = OffloadedObserver(self.handle, name="timeline")

    @hookimpl
    def register_observers(self, register: Any) -> None:
        register(Event, self.observer, name="timeline")

    def flush(self) -> None:
        """Wait until every event so far is drawn (tests, shutdown)."""
        self.observer.flush()

    # ---- the worker thread ------------------------------------------------------------------

    def handle(self, ev: Any) -> None:
        kind = type(ev)
        if kind is RequestAdmitted:
            self.rows[ev.request_id] = _Row(ev.ts, ev.prompt_tokens)
        elif (row := self.rows.get(ev.request_id)) is None:
            if kind is RequestRejected:
                self._write([f"{ev.request_id:<16} rejected {ev.status} {ev.error_type}: {ev.message}"])
            return
        elif kind is RequestScheduled:
            row.scheduled, row.cached = ev.ts, ev.cached_tokens
        elif kind is PrefillDone:
            row.first = ev.ts
        elif kind is TokensEmitted:
            row.tokens += len(ev.token_ids)
        elif kind is Preempted:
            row.preempted += 1
        elif kind is Finished:
            del self.rows[ev.request_id]
            self._write([self.finished_line(ev, row)])
            return
        elif kind is RequestFailed:
            del self.rows[ev.request_id]
            self._write([f"{ev.request_id:<16} failed {ev.error_type}: {ev.message}"])
            return
        if self.live and time.monotonic() - self._last_draw >= self.interval_s:
            self._write([])

    def finished_line(self, ev: Finished, row: _Row) -> str:
        t, u = ev.timings, ev.usage
        end = t.finished or ev.ts
        bar = self._bar(t.received, t.scheduled, t.first_token, end)
        extra = f"  preempted {row.preempted}x" if row.preempted else ""
        return (f"{ev.request_id:<16} |{bar}| {ev.reason:<8} prompt {u.prompt_tokens} (cached {u.cached_tokens})"
                f" → {u.completion_tokens} tok  queue {_ms(t.queue_s)}  ttft {_ms(t.ttft_s)}  e2e {_ms(end - t.received)}"
                + extra)

    def live_line(self, rid: str, row: _Row, at: float) -> str:
        bar = self._bar(row.admitted, row.scheduled, row.first, at)
        return f"{rid:<16} |{bar}| running  prompt {row.prompt} (cached {row.cached}) → {row.tokens} tok"

    def _bar(self, start: float, scheduled: float | None, first: float | None, end: float) -> str:
        """`q` queue, `P` prefill, `=` decode, scaled to `width` characters."""
        total = max(end - start, 1e-9)
        marks = [(end if scheduled is None else scheduled, "q"), (end if first is None else first, "P"), (end, "=")]
        out, pos, prev = [], 0, start
        for t, ch in marks:
            upto = round((min(t, end) - start) / total * self.width)
            if t > prev and upto == pos and pos < self.width:  # a phase that happened shows at least once
                upto = pos + 1
            out.append(ch * max(0, upto - pos))
            pos, prev = max(pos, upto), t
        return "".join(out)[:self.width].ljust(self.width)

    def _write(self, permanent: list[str]) -> None:
        with self._lock:
            parts = []
            if self.live and self._drawn_live:
                parts.append(f"\x1b[{self._drawn_live}F\x1b[J")  # back to the first live line, clear below
            parts.extend(line + "\n" for line in permanent)
            self._drawn_live = 0
            if self.live:
                at = now()
                lines = [self.live_line(rid, row, at) for rid, row in self.rows.items()]
                parts.extend(line + "\n" for line in lines)
                self._drawn_live = len(lines)
                self._last_draw = time.monotonic()
            self.stream.write("".join(parts))
            self.stream.flush()


def _ms(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s * 1000:.1f}ms" if s < 10 else f"{s:.1f}s"
