"""Idempotency keys for tools that change the world: a key (task id + call id) runs at most once.

A key is claimed *before* the tool runs. If the process dies or the call times out, the key stays
claimed with no result: the outcome is unknown, and the runtime never runs it again under that key
(it tells the model so instead).
"""
from __future__ import annotations

import json
import sqlite3
import threading
from typing import Any, Protocol


class IdempotencyStore(Protocol):
    def claim(self, key: str, name: str, arguments: str) -> tuple[bool, dict[str, Any] | None]:
        """Claim `key` for this call. Returns (True, None) when it is new (run it now), else
        (False, record) with what is known: {"name", "arguments", "state": "started"|"done"|
        "failed", "result"}."""
        ...

    def settle(self, key: str, state: str, result: str) -> None:
        """Record the outcome of a claimed key: state "done" or "failed"."""
        ...


class MemoryStore:
    """In-process store (one agent process; lost on exit)."""

    def __init__(self) -> None:
        self._rows: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def claim(self, key: str, name: str, arguments: str) -> tuple[bool, dict[str, Any] | None]:
        with self._lock:
            row = self._rows.get(key)
            if row is not None:
                return False, dict(row)
            self._rows[key] = {"name": name, "arguments": arguments, "state": "started", "result": None}
            return True, None

    def settle(self, key: str, state: str, result: str) -> None:
        with self._lock:
            self._rows[key].update(state=state, result=result)


class SQLiteStore:
    """A file-backed store that survives restarts (a retried task after a crash sees its claims)."""

    def __init__(self, path: str) -> None:
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("CREATE TABLE IF NOT EXISTS calls (key TEXT PRIMARY KEY, name TEXT, arguments TEXT, "
                         "state TEXT, result TEXT)")
        self._lock = threading.Lock()

    def claim(self, key: str, name: str, arguments: str) -> tuple[bool, dict[str, Any] | None]:
        with self._lock:
            cur = self._db.execute("INSERT OR IGNORE INTO calls VALUES (?, ?, ?, 'started', NULL)",
                                   (key, name, arguments))
            if cur.rowcount == 1:
                return True, None
            name_, args_, state, result = self._db.execute(
                "SELECT name, arguments, state, result FROM calls WHERE key = ?", (key,)).fetchone()
            return False, {"name": name_, "arguments": args_, "state": state, "result": result}

    def settle(self, key: str, state: str, result: str) -> None:
        with self._lock:
            self._db.execute("UPDATE calls SET state = ?, result = ? WHERE key = ?", (state, result, key))


def same_call(record: dict[str, Any], name: str, arguments: str) -> bool:
    try:
        return record["name"] == name and json.loads(record["arguments"]) == json.loads(arguments)
    except ValueError:
        return False
