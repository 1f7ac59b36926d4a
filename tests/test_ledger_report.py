"""`modelcall report TASK_ID` on a two-request tool task: what the model saw, where the time went,
whether it completed, what it cost — with numbers that add up."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

from modelcall.events import ResponseSent, ToolExecuted, ToolRequested
from modelcall.testing import ScriptedSampler

pytestmark = pytest.mark.anyio
MODELCALL = str(Path(sys.executable).parent / "modelcall")
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
SYSTEM = {"role": "system", "content": "You are a helpful assistant that uses tools when needed."}
USER = {"role": "user", "content": "What is the weather in Paris today?"}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


async def test_report_of_a_two_request_tool_task_answers_four_questions_that_add_up(make_kernel, events, tmp_path):
    db = tmp_path / "ledger.sqlite3"
    sampler = ScriptedSampler()
    async with make_kernel(plugins=[sampler], plugin_config={"ledger": {"path": str(db)}}) as kernel:
        encode = kernel.tokenizer.encode
        h1 = await kernel.submit(messages=[SYSTEM, USER], tools=TOOLS, task_id="trip", max_tokens=64)
        sampler.say(encode(CALL), request_id=h1.request_id)
        first = await h1.result()
        assert first.finish_reason == "tool_calls"
        [call] = [e for e in events.of(ToolRequested) if e.request_id == h1.request_id]
        kernel.bus.publish([ResponseSent(request_id=h1.request_id, task_id="trip")])
        # The app runs the tool (measured where it happened) and reports it.
        t0 = time.monotonic()
        await anyio.sleep(0.05)
        kernel.bus.publish([ToolExecuted(request_id=h1.request_id, task_id="trip", call_id=call.call_id,
                                         name=call.name, duration_s=time.monotonic() - t0, result_preview="18C")])
        await anyio.sleep(0.01)  # app time between the tool result and the next request
        history = [SYSTEM, USER,
                   {"role": "assistant", "content": "", "tool_calls": [
                       {"id": call.call_id, "type": "function",
                        "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                   {"role": "tool", "tool_call_id": call.call_id, "content": "Sunny, 18 degrees Celsius."}]
        h2 = await kernel.submit(messages=history, tools=TOOLS, task_id="trip", max_tokens=32)
        sampler.say(encode("It is sunny and 18 degrees in Paris."), request_id=h2.request_id)
        second = await h2.result()
        assert second.finish_reason == "stop"
        kernel.bus.publish([ResponseSent(request_id=h2.request_id, task_id="trip")])
    # (stopping the kernel flushed and closed the ledger)

    out = subprocess.run([MODELCALL, "report", "trip", "--ledger", str(db), "--json"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    rep = json.loads(out.stdout)
    ids = [h1.request_id, h2.request_id]
    assert rep["requests"] == 2 and [s["request_id"] for s in rep["saw"]] == ids

    # 1. What the model saw: the parts add up to each request's prompt tokens.
    s1, s2 = rep["saw"]
    for s, done in zip((s1, s2), (first, second)):
        assert sum(s["parts"].values()) == s["prompt_tokens"] == done.usage.prompt_tokens
    assert s1["parts"]["system"] > 0 and s1["parts"]["tools"] > 0 and s1["parts"]["user"] > 0
    assert s1["parts"]["tool_results"] == 0 and s2["parts"]["tool_results"] > 0
    assert s2["parts"]["tools"] == s1["parts"]["tools"]

    # 2. Where the time went: each request's spans add up to its wall time; requests and the
    # gap between them (tools + other app time) add up to the task's wall time.
    t = rep["time"]
    r1, r2 = t["requests"]
    for r in (r1, r2):
        spans = [r[k] for k in ("admission", "queue", "prefill", "decode", "streaming")]
        assert all(v >= 0 for v in spans) and sum(spans) == pytest.approx(r["total"], abs=1e-9)
    gap = r1["after"]
    assert gap["tools"] >= 0.05 and gap["other"] >= 0.0
    assert gap["tools"] + gap["other"] == pytest.approx(gap["total"], abs=1e-9)
    assert r1["total"] + gap["total"] + r2["total"] == pytest.approx(t["wall"], abs=1e-6)
    assert sum(t["by_stage"].values()) == pytest.approx(t["wall"], abs=1e-6)
    assert t["by_stage"]["tools"] == pytest.approx(gap["tools"])

    # 3. Whether it completed: every request's finish reason, and the tool's outcome.
    c = rep["completed"]
    assert c["completed"] is True and c["last_finish_reason"] == "stop"
    assert [r["finish_reason"] for r in c["requests"]] == ["tool_calls", "stop"]
    [tc] = c["requests"][0]["tool_calls"]
    assert (tc["name"], tc["outcome"]) == ("get_weather", "ok")

    # 4. What it cost: cached is part of input, reasoning part of output, never added on top.
    k = rep["cost"]
    assert k["input_tokens"] == first.usage.prompt_tokens + second.usage.prompt_tokens
    assert k["output_tokens"] == first.usage.completion_tokens + second.usage.completion_tokens
    assert k["cached_input_tokens"] == first.usage.cached_tokens + second.usage.cached_tokens
    assert k["cached_input_tokens"] + k["uncached_input_tokens"] == k["input_tokens"]
    assert k["reasoning_tokens"] + k["visible_output_tokens"] == k["output_tokens"]
    assert k["total_tokens"] == k["input_tokens"] + k["output_tokens"]
    assert second.usage.cached_tokens > 0  # the second request re-read the first one's prefix

    text = subprocess.run([MODELCALL, "report", "trip", "--ledger", str(db)], capture_output=True, text=True,
                          timeout=60).stdout
    for heading in ("1. What the model saw", "2. Where the time went", "3. Completed: yes", "4. What it cost"):
        assert heading in text
    assert "get_weather→ok" in text
    missing = subprocess.run([MODELCALL, "report", "nope", "--ledger", str(db)], capture_output=True, text=True,
                             timeout=60)
    assert missing.returncode == 2 and "no requests of task 'nope'" in missing.stderr


def test_report_of_a_tool_task_over_http_records_the_returned_tool_result(tmp_path):
    import httpx2 as httpx
    from http_server import ServerThread

    from modelcall.plugins.ledger.plugin import ledger_of

    sampler = ScriptedSampler()
    db = tmp_path / "ledger.sqlite3"
    with ServerThread(plugins=(sampler,), plugin_config={"ledger": {"path": str(db)}}, max_model_len=512) as server:
        encode = server.kernel.tokenizer.encode
        base, h = server.base_url, {"x-modelcall-task-id": "http-trip"}
        model = httpx.get(base + "/v1/models").json()["data"][0]["id"]
        server.call(lambda: sampler.say(encode(CALL)))
        b1 = httpx.post(base + "/v1/chat/completions", headers=h, json={
            "model": model, "messages": [SYSTEM, USER], "tools": TOOLS, "max_tokens": 64}).json()
        assert b1["choices"][0]["finish_reason"] == "tool_calls"
        [call] = b1["choices"][0]["message"]["tool_calls"]
        server.call(lambda: sampler.say(encode("Sunny, 18 degrees.")))
        msgs = [SYSTEM, USER, b1["choices"][0]["message"],
                {"role": "tool", "tool_call_id": call["id"], "content": "Sunny, 18 degrees Celsius."}]
        b2 = httpx.post(base + "/v1/chat/completions", headers=h, json={
            "model": model, "messages": msgs, "tools": TOOLS, "max_tokens": 32}).json()
        assert b2["choices"][0]["finish_reason"] == "stop"
        time.sleep(0.2)
        ledger_of(server.kernel)[0].flush()
    out = subprocess.run([MODELCALL, "report", "http-trip", "--ledger", str(db), "--json"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    rep = json.loads(out.stdout)
    c = rep["completed"]
    assert c["completed"] and [r["finish_reason"] for r in c["requests"]] == ["tool_calls", "stop"]
    [tc] = c["requests"][0]["tool_calls"]
    assert (tc["call_id"], tc["name"], tc["outcome"]) == (call["id"], "get_weather", "returned")
    usage = [b1["usage"], b2["usage"]]
    assert rep["cost"]["input_tokens"] == sum(u["prompt_tokens"] for u in usage)
    assert rep["cost"]["output_tokens"] == sum(u["completion_tokens"] for u in usage)
    t = rep["time"]
    assert sum(t["by_stage"].values()) == pytest.approx(t["wall"], abs=1e-6)
    assert all(r["streaming"] >= 0 for r in t["requests"])  # response sent after the last token


def test_requests_of_a_task_that_overlap_still_add_up_to_the_wall_time(tmp_path):
    import sqlite3

    from modelcall.plugins.ledger.report import render, task_report
    from modelcall.plugins.ledger.store import connect

    conn = connect(tmp_path / "l.db")
    for rid, t0 in (("a", 0.0), ("b", 0.5), ("c", 3.0)):  # b starts before a ends; c after a gap
        conn.execute("INSERT INTO requests (request_id, task_id, status, finish_reason, received, admitted, scheduled, "
                     "first_token, last_token, finished, prompt_tokens, completion_tokens) "
                     "VALUES (?, 't', 200, 'stop', ?, ?, ?, ?, ?, ?, 10, 5)",
                     (rid, t0, t0 + 0.1, t0 + 0.2, t0 + 0.4, t0 + 0.9, t0 + 1.0))
    conn.row_factory = sqlite3.Row
    rep = task_report(conn, "t")
    t = rep["time"]
    assert t["wall"] == pytest.approx(4.0)
    assert sum(t["by_stage"].values()) == pytest.approx(4.0)
    assert t["by_stage"]["overlap"] == pytest.approx(-0.5) and t["by_stage"]["other"] == pytest.approx(1.5)
    assert "overlaps the next request by" in render(rep)
