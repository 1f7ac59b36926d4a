"""At-most-once records for hosted tools that change the world, keyed by (response, call position).

A key is claimed *before* the tool runs. A second claim of the same key (a retried request, a
resumed background response) gets what is known instead: the recorded outcome when the first
run finished, else "started" (outcome unknown), and the tool is never run again under that key.
"""
from __future__ import annotations

import sqlite3
import threading
from typing import Any


class Claims:
    def __init__(self, path: str | None = None) -> None:
        self._db = sqlite3.connect(path or ":memory:", isolation_level=None, check_same_thread=False)
        self._db.execute("CREATE TABLE IF NOT EXISTS claims (key TEXT PRIMARY KEY, name TEXT, arguments TEXT, "
                         "state TEXT, output TEXT, error TEXT)")
        self._lock = threading.Lock()

    def claim(self, key: str, name: str, arguments: str) -> dict[str, Any] | None:
        """None when `key` is new (run it now), else the record {name, arguments, state, output, error}."""
        with self._lock:
            cur = self._db.execute("INSERT OR IGNORE INTO claims VALUES (?, ?, ?, 'started', NULL, NULL)",
                                   (key, name, arguments))
            if cur.rowcount == 1:
                return None
            row = self._db.execute("SELECT name, arguments, state, output, error FROM claims WHERE key = ?",
                                   (key,)).fetchone()
        return dict(zip(("name", "arguments", "state", "output", "error"), row, strict=True))

    def settle(self, key: str, ok: bool, output: str, error: str | None) -> None:
        with self._lock:
            self._db.execute("UPDATE claims SET state = ?, output = ?, error = ? WHERE key = ?",
                             ("done" if ok else "failed", output, error, key))

    def close(self) -> None:
        self._db.close()
