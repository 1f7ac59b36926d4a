"""The ledger's SQLite database: schema, connection settings, and reading it back.

WAL journal with synchronous=NORMAL: a committed transaction survives the process being
killed, and readers (`modelcall usage`, `modelcall report`) never block the writer.
All timestamps are wall-clock seconds since the epoch (UTC).
"""
from __future__ import annotations

import sqlite3
from pathlib import Path

import platformdirs

SCHEMA = """
CREATE TABLE IF NOT EXISTS requests (
    request_id        TEXT PRIMARY KEY,
    task_id           TEXT,
    key_name          TEXT,
    model             TEXT,
    status            INTEGER NOT NULL,   -- 200 served; else the HTTP status it was refused or failed with
    finish_reason     TEXT,               -- stop, length, abort, tool_calls, content_filter, error, rejected
    error             TEXT,
    received          REAL,
    admitted          REAL,
    scheduled         REAL,
    first_token       REAL,
    last_token        REAL,
    finished          REAL,
    response_sent     REAL,
    prompt_tokens     INTEGER NOT NULL DEFAULT 0,
    cached_tokens     INTEGER NOT NULL DEFAULT 0,   -- part of prompt_tokens
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    reasoning_tokens  INTEGER NOT NULL DEFAULT 0,   -- part of completion_tokens
    max_tokens        INTEGER,
    priority          INTEGER,
    retries           INTEGER NOT NULL DEFAULT 0,
    preemptions       INTEGER NOT NULL DEFAULT 0,
    tool_calls        INTEGER NOT NULL DEFAULT 0,
    prompt_parts      TEXT,                         -- JSON: prompt tokens by part
    dropped_messages  INTEGER NOT NULL DEFAULT 0,
    spec_draft_tokens    INTEGER NOT NULL DEFAULT 0,   -- speculative decoding: draft tokens verified
    spec_accepted_tokens INTEGER NOT NULL DEFAULT 0,   -- of which accepted
    kind              TEXT,               -- generate, embed or score (a pooling request); NULL: refused before admission
    cached_disk_tokens INTEGER NOT NULL DEFAULT 0,  -- part of cached_tokens: read back from the disk KV tier
    lora              TEXT                -- the LoRA adapter it ran on (served name); NULL: the base model
);
CREATE INDEX IF NOT EXISTS requests_task ON requests(task_id);
CREATE INDEX IF NOT EXISTS requests_received ON requests(received);
CREATE TABLE IF NOT EXISTS tool_calls (
    request_id  TEXT NOT NULL,      -- the model request that proposed the call
    call_id     TEXT NOT NULL,
    task_id     TEXT,
    name        TEXT,
    outcome     TEXT NOT NULL,      -- requested; ok / failed (an app-side runtime said); returned (a later prompt carried its result)
    error       TEXT,
    duration_s  REAL,
    requested   REAL,
    done        REAL,
    PRIMARY KEY (request_id, call_id)
);
CREATE INDEX IF NOT EXISTS tool_calls_task ON tool_calls(task_id);
"""

REQUEST_COLUMNS = (
    "request_id", "task_id", "key_name", "model", "status", "finish_reason", "error", "received", "admitted",
    "scheduled", "first_token", "last_token", "finished", "response_sent", "prompt_tokens", "cached_tokens",
    "completion_tokens", "reasoning_tokens", "max_tokens", "priority", "retries", "preemptions", "tool_calls",
    "prompt_parts", "dropped_messages", "spec_draft_tokens", "spec_accepted_tokens", "kind",
    "cached_disk_tokens", "lora",
)
# Columns added after the first schema: (name, declaration), added to an older ledger when it is opened.
ADDED_COLUMNS = (("spec_draft_tokens", "INTEGER NOT NULL DEFAULT 0"), ("spec_accepted_tokens", "INTEGER NOT NULL DEFAULT 0"),
                 ("kind", "TEXT"), ("cached_disk_tokens", "INTEGER NOT NULL DEFAULT 0"), ("lora", "TEXT"))


def default_path() -> Path:
    return Path(platformdirs.user_data_dir("modelcall")) / "ledger.sqlite3"


def connect(path: str | Path, *, create: bool = True) -> sqlite3.Connection:
    """A connection with the ledger's settings; creates the file and schema when `create`."""
    p = Path(path)
    if not create and not p.exists():
        raise FileNotFoundError(f"no ledger at {p} (start `modelcall serve --ledger {p}` first)")
    if create:
        p.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(str(p), timeout=10.0, check_same_thread=False, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA busy_timeout=10000")
    if create:
        conn.executescript(SCHEMA)
        have = {r[1] for r in conn.execute("PRAGMA table_info(requests)")}
        for name, decl in ADDED_COLUMNS:
            if name not in have:
                conn.execute(f"ALTER TABLE requests ADD COLUMN {name} {decl}")
    conn.row_factory = sqlite3.Row
    return conn


def open_readonly(path: str | Path) -> sqlite3.Connection:
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"no ledger at {p}; give --ledger PATH or run `modelcall serve` with a ledger first")
    conn = sqlite3.connect(f"file:{p}?mode=ro", uri=True, timeout=10.0)
    conn.row_factory = sqlite3.Row
    return conn
