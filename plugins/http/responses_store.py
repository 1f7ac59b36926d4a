"""Stored responses (`store: true`, OpenAI's default): SQLite, bounded by count and age, owned by a key.

    plugin_config = {"responses": {"path": "/var/lib/modelcall/responses.sqlite3",
                                   "max_responses": 10000, "max_age_s": 2592000}}

Every write evicts what is past the bounds (older than `max_age_s`, then the oldest beyond
`max_responses`), so the store never grows without limit. A response belongs to the caller
(the API key's name) that made it: any other caller gets "not found", as if it did not exist.
Without a path the store lives in memory (lost on restart, still bounded).
"""
from __future__ import annotations

import sqlite3
import threading
import time
from typing import Any

import msgspec

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, created REAL NOT NULL, status TEXT NOT NULL,
    response TEXT NOT NULL, input TEXT NOT NULL, history TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS responses_created ON responses (created);
"""


class Stored(msgspec.Struct, kw_only=True):
    id: str
    owner: str
    status: str
    response: dict[str, Any]
    input: list[dict[str, Any]]     # this response's own input items
    history: list[dict[str, Any]]   # the conversation before them (from previous_response_id)

    @property
    def conversation(self) -> list[dict[str, Any]]:
        """What a response continuing this one sees before its own input."""
        return [*self.history, *self.input, *self.response.get("output", [])]


class ResponseStore:
    def __init__(self, path: str = ":memory:", *, max_responses: int = 10_000, max_age_s: float = 30 * 86400) -> None:
        if max_responses < 1 or max_age_s <= 0:
            raise ValueError("the responses store needs max_responses >= 1 and max_age_s > 0")
        self.max_responses = max_responses
        self.max_age_s = max_age_s
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.executescript(_SCHEMA)
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, plugin_config: dict[str, Any] | None) -> ResponseStore:
        cfg = dict((plugin_config or {}).get("responses") or {})
        return cls(cfg.get("path") or ":memory:", max_responses=int(cfg.get("max_responses", 10_000)),
                   max_age_s=float(cfg.get("max_age_s", 30 * 86400)))

    def put(self, owner: str, response: dict[str, Any], input_items: list[dict[str, Any]],
            history: list[dict[str, Any]]) -> None:
        enc = msgspec.json.encode
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?, ?, ?)",
                             (response["id"], owner, time.time(), response["status"], enc(response).decode(),
                              enc(input_items).decode(), enc(history).decode()))
            self._evict()

    def update(self, owner: str, response: dict[str, Any]) -> None:
        """Replace the response body (a background response moving on), keeping its input."""
        with self._lock:
            self._db.execute("UPDATE responses SET status = ?, response = ? WHERE id = ? AND owner = ?",
                             (response["status"], msgspec.json.encode(response).decode(), response["id"], owner))

    def get(self, response_id: str, owner: str) -> Stored | None:
        with self._lock:
            row = self._db.execute("SELECT id, owner, status, response, input, history FROM responses "
                                   "WHERE id = ? AND owner = ? AND created >= ?",
                                   (response_id, owner, time.time() - self.max_age_s)).fetchone()
        if row is None:
            return None
        dec = msgspec.json.decode
        return Stored(id=row[0], owner=row[1], status=row[2], response=dec(row[3]), input=dec(row[4]),
                      history=dec(row[5]))

    def delete(self, response_id: str, owner: str) -> bool:
        with self._lock:
            return self._db.execute("DELETE FROM responses WHERE id = ? AND owner = ?",
                                    (response_id, owner)).rowcount == 1

    def fail_unfinished(self, message: str) -> int:
        """Mark responses a previous process left queued or in progress as failed (nothing resumes
        them); returns how many. Their hosted calls' claims stay, so nothing reruns under their ids."""
        with self._lock:
            rows = self._db.execute("SELECT id, response FROM responses WHERE status IN ('queued', 'in_progress')"
                                    ).fetchall()
            for rid, body in rows:
                response = {**msgspec.json.decode(body), "status": "failed",
                            "error": {"code": "server_error", "message": message}}
                self._db.execute("UPDATE responses SET status = 'failed', response = ? WHERE id = ?",
                                 (msgspec.json.encode(response).decode(), rid))
        return len(rows)

    def __len__(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM responses").fetchone()[0]

    def _evict(self) -> None:
        self._db.execute("DELETE FROM responses WHERE created < ?", (time.time() - self.max_age_s,))
        self._db.execute("DELETE FROM responses WHERE id IN (SELECT id FROM responses ORDER BY created DESC, rowid DESC "
                         "LIMIT -1 OFFSET ?)", (self.max_responses,))

    def close(self) -> None:
        self._db.close()
