"""The ledger: one row per model request, usage equal to what the responses said, timestamps in stage order.

Rows are written by an observer through a bounded queue and a worker thread (batched
transactions); `modelcall usage` sums them by key, model or day.
"""
from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx2 as httpx
import pytest
from http_server import ServerThread
from keys_util import write_keys

from modelcall.events import (
    EventBus, Finished, OffloadedObserver, RequestAdmitted, RequestRejected, ResponseSent, Timings, Usage, now,
)
from modelcall.plugins.ledger.plugin import ledger_of
from modelcall.plugins.ledger.recorder import Recorder
from modelcall.plugins.ledger.store import open_readonly
from modelcall.plugins.ledger.usage import summarize

KEY_A, KEY_B = "mc-ledger-a", "mc-ledger-b"
MODELCALL = str(Path(sys.executable).parent / "modelcall")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    d = tmp_path_factory.mktemp("ledger")
    keys = write_keys(d / "keys.toml", {KEY_A: {"name": "alice"}, KEY_B: {"name": "bob"}})
    db = d / "ledger.sqlite3"
    with ServerThread(plugin_config={"ledger": {"path": str(db)}, "auth": {"api_keys": str(keys)}}) as s:
        yield s, db


def _wait_rows(server, db, n: int, timeout: float = 20.0) -> list[dict]:
    observer, _ = ledger_of(server.kernel)
    deadline = time.monotonic() + timeout
    while True:
        observer.flush()
        with open_readonly(db) as conn:
            rows = [dict(r) for r in conn.execute("SELECT * FROM requests ORDER BY received")]
        if len(rows) >= n and all(r["response_sent"] for r in rows if r["status"] == 200) or time.monotonic() > deadline:
            return rows
        time.sleep(0.05)


def test_ledger_rows_equal_the_requests_made_with_the_responses_usage(served):
    server, db = served
    base = server.base_url
    model = httpx.get(base + "/v1/models", headers={"x-api-key": KEY_A}).json()["data"][0]["id"]
    made: dict[str, dict] = {}  # request id -> (key name, usage tuple, finish)
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name three rivers."}]
    for i in range(3):
        r = httpx.post(base + "/v1/chat/completions", headers={"Authorization": f"Bearer {KEY_A}",
                                                                "x-modelcall-task-id": "task-1"},
                       json={"model": model, "messages": msgs, "max_tokens": 5 + i, "temperature": 0})
        b = r.json()
        u = b["usage"]
        made[b["id"].removeprefix("chatcmpl-")] = {
            "key": "alice", "task": "task-1", "finish": b["choices"][0]["finish_reason"],
            "usage": (u["prompt_tokens"], u["prompt_tokens_details"]["cached_tokens"] if u.get("prompt_tokens_details") else 0,
                      u["completion_tokens"],
                      (u.get("completion_tokens_details") or {}).get("reasoning_tokens", 0))}
    # A streamed request: usage from the final chunk.
    with httpx.stream("POST", base + "/v1/chat/completions", headers={"x-api-key": KEY_B},
                      json={"model": model, "messages": msgs, "max_tokens": 6, "stream": True,
                            "stream_options": {"include_usage": True}}) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    u = chunks[-1]["usage"]
    made[chunks[0]["id"].removeprefix("chatcmpl-")] = {
        "key": "bob", "task": None, "finish": [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1],
        "usage": (u["prompt_tokens"], (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
                  u["completion_tokens"], (u.get("completion_tokens_details") or {}).get("reasoning_tokens", 0))}
    # Anthropic.
    r = httpx.post(base + "/v1/messages", headers={"x-api-key": KEY_B, "x-modelcall-task-id": "task-2"},
                   json={"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": "hello"}]})
    b = r.json()
    u = b["usage"]
    made[b["id"].removeprefix("msg_")] = {
        "key": "bob", "task": "task-2", "finish": {"max_tokens": "length", "end_turn": "stop"}[b["stop_reason"]],
        "usage": (u["input_tokens"] + u.get("cache_read_input_tokens", 0), u.get("cache_read_input_tokens", 0),
                  u["output_tokens"], None)}

    rows = {r["request_id"]: r for r in _wait_rows(server, db, len(made))}
    assert set(rows) == set(made)
    for rid, m in made.items():
        row = rows[rid]
        got = (row["prompt_tokens"], row["cached_tokens"], row["completion_tokens"], row["reasoning_tokens"])
        want = m["usage"]
        assert got[:3] == want[:3], rid
        if want[3] is not None:
            assert got[3] == want[3]
        assert (row["key_name"], row["task_id"], row["finish_reason"], row["status"]) == (m["key"], m["task"], m["finish"], 200)
        assert row["model"] == model
        marks = [row[k] for k in ("received", "admitted", "scheduled", "first_token", "last_token", "finished",
                                  "response_sent")]
        assert all(m is not None for m in marks) and marks == sorted(marks), rid
        parts = json.loads(row["prompt_parts"])
        assert sum(parts.values()) == row["prompt_tokens"]

    # `modelcall usage` sums the same rows.
    with open_readonly(db) as conn:
        by_key = {r["key"]: r for r in summarize(conn, "key")}
    assert by_key["alice"]["requests"] == 3 and by_key["bob"]["requests"] == 2
    assert by_key["alice"]["completion_tokens"] == sum(m["usage"][2] for m in made.values() if m["key"] == "alice")
    out = subprocess.run([MODELCALL, "usage", "--ledger", str(db), "--by", "model", "--json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    [row] = [r for r in json.loads(out.stdout) if r["model"] == model]
    assert row["served"] == 5
    assert row["total_tokens"] == sum(m["usage"][0] + m["usage"][2] for m in made.values())
    text = subprocess.run([MODELCALL, "usage", "--ledger", str(db)], capture_output=True, text=True, timeout=60).stdout
    assert "alice" in text and "bob" in text and "cached_tokens are part of prompt_tokens" in text


def test_refused_requests_are_rows_too_with_their_status(served):
    server, db = served
    model = httpx.get(server.base_url + "/v1/models", headers={"x-api-key": KEY_A}).json()["data"][0]["id"]
    r = httpx.post(server.base_url + "/v1/chat/completions", headers={"x-api-key": KEY_A, "x-modelcall-task-id": "big"},
                   json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100000})
    assert r.status_code == 400
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        rows = [r for r in _wait_rows(server, db, 1) if r["task_id"] == "big"]
        if rows:
            break
    [row] = rows
    assert (row["status"], row["finish_reason"], row["completion_tokens"]) == (400, "rejected", 0)
    assert "context window" in row["error"]


def test_the_recorder_batches_rows_and_updates_response_sent(tmp_path):
    rec = Recorder(tmp_path / "l.db")
    obs = OffloadedObserver(handle_batch=rec.handle_batch, name="ledger", max_batch=64)
    events = []
    t0 = now() - 1.0  # NOTE: real monotonic times, so every row falls on today's UTC date
    for i in range(200):
        rid = f"r{i}"
        events += [RequestAdmitted(request_id=rid, task_id="t", model="m", prompt_tokens=3, max_tokens=2, caller="k"),
                   Finished(request_id=rid, task_id="t", reason="stop", usage=Usage(prompt_tokens=3, completion_tokens=2),
                            timings=Timings(received=t0, admitted=t0 + .1, scheduled=t0 + .2, first_token=t0 + .3,
                                            last_token=t0 + .4, finished=t0 + .5)),
                   ResponseSent(request_id=rid, task_id="t")]
    events.append(RequestRejected(request_id="x", status=429, error_type="rate_limit_error", message="over"))
    for ev in events:
        obs(ev)
    obs.flush()
    obs.close()
    conn = sqlite3.connect(tmp_path / "l.db")
    assert conn.execute("SELECT COUNT(*), SUM(completion_tokens), COUNT(response_sent) FROM requests WHERE status = 200"
                        ).fetchone() == (200, 400, 200)
    assert conn.execute("SELECT status, finish_reason FROM requests WHERE request_id = 'x'").fetchone() == (429, "rejected")
    conn.row_factory = sqlite3.Row
    [day] = summarize(conn, "day")
    assert (day["requests"], day["served"], day["refused"], day["completion_tokens"]) == (201, 200, 1, 400)
    assert day["finish_reasons"] == {"rejected": 1, "stop": 200}
    with pytest.raises(ValueError, match="--by"):
        summarize(conn, "week")
    assert obs.dropped == 0 and obs.errors == 0


def test_a_full_ledger_queue_drops_and_counts_never_blocks(tmp_path):
    import threading

    gate = threading.Event()
    obs = OffloadedObserver(handle_batch=lambda batch: gate.wait(), maxsize=4, name="ledger")
    bus = EventBus()
    bus.subscribe(RequestRejected, obs, name="ledger")
    bus.freeze()
    published = threading.Event()

    def publish() -> None:
        bus.publish([RequestRejected(request_id=f"r{i}", status=400, error_type="x", message="") for i in range(100)])
        published.set()

    # event order, not a stopwatch: publishing returns while the worker still waits on the gate (a publish
    # that blocked on the full queue could only return after gate.set(); 10 s is past any loaded machine)
    threading.Thread(target=publish, daemon=True).start()
    assert published.wait(10), "publish blocked on the ledger's full queue"
    assert not gate.is_set()
    assert obs.dropped >= 90 and bus.observer_stats()["ledger"]["dropped"] == obs.dropped
    gate.set()
    obs.close()


def test_reasoning_tokens_in_the_ledger_equal_the_responses(tmp_path):
    from modelcall.testing import ScriptedSampler

    sampler = ScriptedSampler()
    db = tmp_path / "ledger.sqlite3"
    with ServerThread(plugins=(sampler,), plugin_config={"ledger": {"path": str(db)}}) as server:
        tok = server.kernel.tokenizer
        if not getattr(tok, "think_token_ids", None):
            pytest.skip("the demo tokenizer has no think tokens")
        start, end = tok.think_token_ids
        script = [start, *tok.encode(" let me think about it "), end, *tok.encode("The answer is 4.")]
        server.call(lambda: sampler.say(script))
        base = server.base_url
        model = httpx.get(base + "/v1/models").json()["data"][0]["id"]
        b = httpx.post(base + "/v1/chat/completions", json={"model": model, "max_tokens": 64,
                                                             "messages": [{"role": "user", "content": "2+2?"}]}).json()
        want = b["usage"]["completion_tokens_details"]["reasoning_tokens"]
        assert want > 0
        rows = _wait_rows(server, db, 1)
    [row] = [r for r in rows if r["request_id"] == b["id"].removeprefix("chatcmpl-")]
    assert row["reasoning_tokens"] == want and row["completion_tokens"] == b["usage"]["completion_tokens"]
