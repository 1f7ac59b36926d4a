"""Turns a request's events into its ledger row; runs on the ledger's worker thread, a batch per transaction.

The inline part is only `OffloadedObserver.__call__` (a bounded queue put); everything here
runs on the worker. A row is written when the request ends (Finished, RequestFailed,
RequestRejected); the response-sent time and tool outcomes arrive later and update it.
"""
from __future__ import annotations

import json
import logging
import sqlite3
import time
from pathlib import Path
from typing import Any

from modelcall.events import (
    Finished, Preempted, PrefillDone, RequestAdmitted, RequestFailed, RequestRejected, RequestScheduled,
    ResponseSent, ToolExecuted, ToolFailed, ToolRequested,
)
from modelcall.plugins.ledger.store import REQUEST_COLUMNS, connect

log = logging.getLogger("modelcall.ledger")
EVENT_TYPES = (RequestAdmitted, RequestScheduled, PrefillDone, Preempted, ToolRequested, ToolExecuted, ToolFailed,
               Finished, RequestFailed, RequestRejected, ResponseSent)
_INSERT = (f"INSERT OR REPLACE INTO requests ({', '.join(REQUEST_COLUMNS)}) "
           f"VALUES ({', '.join('?' * len(REQUEST_COLUMNS))})")


class Recorder:
    """Holds the rows of requests still running; writes finished ones in one transaction per batch."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.conn: sqlite3.Connection = connect(self.path)
        # NOTE: events carry monotonic time; one offset taken here turns them into wall time, so
        # differences between stored timestamps are exactly the measured spans.
        self.offset = time.time() - time.monotonic()
        self.open: dict[str, dict[str, Any]] = {}
        self.rows_written = 0

    def wall(self, t: float | None) -> float | None:
        return None if t is None else t + self.offset

    def handle_batch(self, events: list[Any]) -> None:
        rows: list[tuple] = []
        updates: list[tuple[str, tuple]] = []
        for ev in events:
            self._apply(ev, rows, updates)
        if not rows and not updates:
            return
        conn = self.conn
        conn.execute("BEGIN")
        try:
            if rows:
                conn.executemany(_INSERT, rows)
            for sql, args in updates:
                conn.execute(sql, args)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        self.rows_written += len(rows)

    def _apply(self, ev: Any, rows: list[tuple], updates: list[tuple[str, tuple]]) -> None:
        kind = type(ev)
        rid = ev.request_id
        if kind is RequestAdmitted:
            self.open[rid] = {
                "request_id": rid, "task_id": ev.task_id, "key_name": ev.caller, "model": ev.model, "status": 200,
                "admitted": self.wall(ev.ts), "max_tokens": ev.max_tokens, "priority": ev.priority,
                "retries": ev.retries, "prompt_tokens": ev.prompt_tokens, "dropped_messages": ev.dropped_messages,
                "prompt_parts": json.dumps(ev.prompt_parts) if ev.prompt_parts else None,
                "preemptions": 0, "tool_calls": 0, "kind": ev.kind, "lora": ev.lora,
            }
            if ev.tool_results:  # the client ran these calls and sent their results back
                marks = ", ".join("?" * len(ev.tool_results))
                updates.append((f"UPDATE tool_calls SET outcome = 'returned', done = COALESCE(done, ?) "
                                f"WHERE outcome = 'requested' AND call_id IN ({marks})",
                                (self.wall(ev.ts), *ev.tool_results)))
            return
        row = self.open.get(rid)
        if kind is RequestScheduled:
            if row is not None:
                row["scheduled"] = self.wall(ev.ts)
        elif kind is PrefillDone:
            if row is not None:
                row["first_token"] = self.wall(ev.ts)
        elif kind is Preempted:
            if row is not None:
                row["preemptions"] += 1
        elif kind is Finished:
            row = self.open.pop(rid, None) or {"request_id": rid, "task_id": ev.task_id, "status": 200}
            t, u = ev.timings, ev.usage
            row.update(finish_reason=ev.reason, received=self.wall(t.received), admitted=self.wall(t.admitted),
                       scheduled=self.wall(t.scheduled), first_token=self.wall(t.first_token),
                       last_token=self.wall(t.last_token), finished=self.wall(t.finished),
                       prompt_tokens=u.prompt_tokens, cached_tokens=u.cached_tokens,
                       cached_disk_tokens=u.cached_disk_tokens,
                       completion_tokens=u.completion_tokens, reasoning_tokens=u.reasoning_tokens,
                       spec_draft_tokens=ev.spec_draft_tokens, spec_accepted_tokens=ev.spec_accepted_tokens)
            rows.append(_as_row(row))
        elif kind is RequestFailed:
            row = self.open.pop(rid, None) or {"request_id": rid, "task_id": ev.task_id}
            row.update(status=500, finish_reason="error", error=f"{ev.error_type}: {ev.message}",
                       finished=self.wall(ev.ts))
            rows.append(_as_row(row))
        elif kind is RequestRejected:
            rows.append(_as_row({"request_id": rid, "task_id": ev.task_id, "status": ev.status, "key_name": ev.caller,
                                 "finish_reason": "rejected", "error": f"{ev.error_type}: {ev.message}",
                                 "received": self.wall(ev.ts), "finished": self.wall(ev.ts)}))
        elif kind is ResponseSent:
            if ev.usage is not None:
                u = ev.usage
                updates.append(("UPDATE requests SET response_sent = ?, reasoning_tokens = ? WHERE request_id = ?",
                                (self.wall(ev.ts), u.reasoning_tokens, rid)))
            else:
                updates.append(("UPDATE requests SET response_sent = ? WHERE request_id = ?", (self.wall(ev.ts), rid)))
        elif kind is ToolRequested:
            if row is not None:
                row["tool_calls"] += 1
            else:
                updates.append(("UPDATE requests SET tool_calls = tool_calls + 1 WHERE request_id = ?", (rid,)))
            updates.append(("INSERT OR IGNORE INTO tool_calls (request_id, call_id, task_id, name, outcome, requested) "
                            "VALUES (?, ?, ?, ?, 'requested', ?)", (rid, ev.call_id, ev.task_id, ev.name, self.wall(ev.ts))))
        elif kind is ToolExecuted or kind is ToolFailed:
            ok = kind is ToolExecuted
            updates.append((
                "INSERT INTO tool_calls (request_id, call_id, task_id, name, outcome, error, duration_s, done) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (request_id, call_id) DO UPDATE SET "
                "outcome = excluded.outcome, error = excluded.error, duration_s = excluded.duration_s, "
                "done = excluded.done",
                (rid, ev.call_id, ev.task_id, ev.name, "ok" if ok else "failed", None if ok else ev.error,
                 ev.duration_s, self.wall(ev.ts))))

    def close(self) -> None:
        self.conn.close()


def _as_row(row: dict[str, Any]) -> tuple:
    defaults = {"status": 200, "prompt_tokens": 0, "cached_tokens": 0, "completion_tokens": 0,
                "reasoning_tokens": 0, "retries": 0, "preemptions": 0, "tool_calls": 0, "dropped_messages": 0,
                "spec_draft_tokens": 0, "spec_accepted_tokens": 0, "cached_disk_tokens": 0}
    return tuple(row.get(c, defaults.get(c)) for c in REQUEST_COLUMNS)
