"""Killing the server (SIGKILL) in the middle of a load loses no committed ledger row and leaves a readable database."""
from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx2 as httpx
import pytest

# slow tier (`-m slow`, CI's second step): a load loop of ~25 s against a server it then kills
pytestmark = pytest.mark.slow
MODELCALL = str(Path(sys.executable).parent / "modelcall")


def _start(db: Path) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    proc = subprocess.Popen([MODELCALL, "serve", "--port", "0", "--ledger", str(db), "--dtype", "float32",
                             "--threads", "1", "--num-kv-blocks", "256", "--max-model-len", "256"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        m = re.search(r"on (http://\S+)", line or "")
        if m:
            return proc, m.group(1)
        if proc.poll() is not None:
            break
    proc.kill()
    raise RuntimeError("modelcall serve did not start")


def _committed(db: Path) -> set[str]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        return {r[0] for r in conn.execute("SELECT request_id FROM requests")}
    except sqlite3.OperationalError:  # the schema is not there yet
        return set()
    finally:
        conn.close()


def test_sigkill_mid_load_loses_no_committed_row(tmp_path):
    db = tmp_path / "ledger.sqlite3"
    proc, base = _start(db)
    stop = threading.Event()
    ok = []

    model = httpx.get(base + "/v1/models").json()["data"][0]["id"]

    def load() -> None:
        with httpx.Client(base_url=base, timeout=30) as c:
            while not stop.is_set():
                try:
                    r = c.post("/v1/completions", json={"model": model, "prompt": "def f(x):", "max_tokens": 8})
                    if r.status_code == 200:
                        ok.append(r.json()["id"])
                except httpx.HTTPError:
                    return

    threads = [threading.Thread(target=load, daemon=True) for _ in range(4)]
    try:
        for t in threads:
            t.start()
        seen: set[str] = set()
        deadline = time.monotonic() + 60
        while len(seen) < 12 and time.monotonic() < deadline:
            time.sleep(0.05)
            seen = _committed(db)
        assert len(seen) >= 12, "the ledger committed too few rows under load"
        time.sleep(0.2)
        seen = _committed(db)  # the last look before the kill: every row here was committed
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        stop.set()
        proc.kill()
        for t in threads:
            t.join(10)
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    after = {r[0] for r in conn.execute("SELECT request_id FROM requests")}
    assert seen <= after
    assert len(after) <= len(ok) + 4 + 1  # no invented rows: at most the responses plus those in flight
    assert conn.execute("SELECT COUNT(*) FROM requests WHERE completion_tokens IS NULL OR prompt_tokens <= 0"
                        ).fetchone() == (0,)
