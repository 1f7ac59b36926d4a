"""Agent runtime parts on their own: schemas from type hints, the policy, idempotency stores, budgets,
retries, the in-process kernel client and the `modelcall agent` command."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from typing import Annotated, Literal

import jsonschema
import msgspec
import pytest
from aiohttp import web

from modelcall.plugins.agent import (
    Agent, Budget, KernelChatClient, ModelReply, OpenAIChatClient, Policy, RetryPolicy, SQLiteStore, tool,
)
from modelcall.plugins.agent.tools import schema_of

pytestmark = pytest.mark.anyio


class Point(msgspec.Struct):
    x: int
    y: int


def locate(city: Annotated[str, msgspec.Meta(max_length=20, description="a city")], near: Point | None = None,
           unit: Literal["km", "mi"] = "km", idempotency_key: str = "") -> str:
    """Find a city."""
    return city


def test_schema_comes_from_type_hints_and_hides_the_idempotency_key():
    s = schema_of(locate)
    assert s["required"] == ["city"] and set(s["properties"]) == {"city", "near", "unit"}
    assert s["properties"]["city"] == {"description": "a city", "type": "string", "maxLength": 20}
    assert s["additionalProperties"] is False
    jsonschema.validate({"city": "Oslo", "near": {"x": 1, "y": 2}, "unit": "mi"}, s)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"city": "Oslo", "unit": "parsec"}, s)
    assert tool(locate).openai()["function"]["description"] == "Find a city."


async def test_policy_allowlist_per_caller_and_confirmation_of_dangerous_tools():
    wipe = tool(dangerous=True)(lambda: "ok")
    wipe.name = "wipe"
    asked = []
    p = Policy({"alice": ["wipe", "read"], "*": ["read"]}, confirm=lambda c, t, a: asked.append(c) or c == "alice")
    assert p.allowed("bob", "read") and not p.allowed("bob", "wipe")
    assert await p.authorize("alice", wipe, {}) is None and asked == ["alice"]
    assert "not permitted" in await p.authorize("bob", wipe, {})
    assert "no one is here to confirm" in await Policy().authorize("x", wipe, {})


def test_sqlite_store_remembers_claims_across_reopening(tmp_path):
    path = str(tmp_path / "keys.db")
    assert SQLiteStore(path).claim("t:c", "pay", '{"a": 1}') == (True, None)
    fresh, record = SQLiteStore(path).claim("t:c", "pay", '{"a": 1}')
    assert not fresh and record["state"] == "started"


class FakeClient:
    def __init__(self, replies, delay=0.0):
        self.replies, self.delay, self.seen = replies, delay, []

    async def chat(self, messages, *, tools, tool_choice, task_id, params):
        self.seen.append((task_id, tool_choice))
        await asyncio.sleep(self.delay)
        calls = self.replies[min(len(self.seen) - 1, len(self.replies) - 1)]
        return ModelReply(request_id=f"r{len(self.seen)}", content="" if calls else "answer", tool_calls=calls,
                          finish_reason="tool_calls" if calls else "stop",
                          usage={"prompt_tokens": 40, "completion_tokens": 10, "total_tokens": 50})


ECHO = tool(lambda text: text)
ECHO.name = "echo"
ECHO.parameters = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
LOOP = [[{"id": "a", "name": "echo", "arguments": '{"text": "again"}'}]]


@pytest.mark.parametrize(("budget", "status", "requests"), [
    (Budget(max_turns=3), "max_turns", 3),
    (Budget(max_turns=50, max_tokens=120), "max_tokens", 3),
    (Budget(max_turns=50, max_wall_s=0.25), "timeout", None),
])
async def test_budgets_end_the_task_with_a_clear_status(budget, status, requests):
    client = FakeClient(LOOP, delay=0.1)
    r = await Agent(client, [ECHO], budget=budget).run("loop", task_id="t-budget")
    assert r.status == status and r.answer is None
    if requests is not None:
        assert len(r.requests) == requests
    assert {t for t, _ in client.seen} == {"t-budget"}


async def test_model_requests_retry_429_and_503_with_backoff_and_record_it():
    hits = []

    async def handle(request: web.Request) -> web.Response:
        hits.append(request.headers.get("x-modelcall-task-id"))
        if len(hits) == 1:
            return web.Response(status=429, headers={"Retry-After": "0.05"}, text="slow down")
        if len(hits) == 2:
            return web.Response(status=503, text="busy")
        return web.json_response({"id": "x", "choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}],
                                  "usage": {"total_tokens": 3}})
    app = web.Application()
    app.router.add_post("/v1/chat/completions", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    client = OpenAIChatClient(f"http://127.0.0.1:{runner.addresses[0][1]}/v1", retry=RetryPolicy(base_delay_s=0.01))
    try:
        r = await Agent(client, []).run("hi", task_id="t-retry")
    finally:
        await client.close()
        await runner.cleanup()
    assert r.status == "answered" and hits == ["t-retry"] * 3
    retries = r.requests[0].retries
    assert [x.attempt for x in retries] == [1, 2] and "429" in retries[0].error and retries[0].delay_s == 0.05


async def test_the_agent_runs_on_an_in_process_kernel(demo_model_dir):
    from modelcall.core import Kernel
    from modelcall.events import ToolExecuted, ToolRequested
    from modelcall.testing.collector import EventCollector

    @tool
    def lookup(key: Annotated[str, msgspec.Meta(max_length=8)]) -> str:
        """Look a key up."""
        return "value"
    events = EventCollector()
    async with Kernel(model=demo_model_dir, dtype="float32", num_kv_blocks=512, plugins=[events]) as kernel:
        while not kernel.ready:
            await asyncio.sleep(0.01)
        choice = {"type": "function", "function": {"name": "lookup"}}
        agent = Agent(KernelChatClient(kernel), [lookup], tool_choice=lambda turn: choice if turn == 0 else "none",
                      params={"temperature": 0, "max_tokens": 64})
        r = await agent.run("look up k", task_id="t-kernel")
    assert r.status in ("answered", "truncated") and [t.status for t in r.tool_calls] == ["ok"]
    assert r.requests[0].finish_reason == "tool_calls" and r.requests[0].timings["e2e_s"] > 0
    (requested,) = [e for e in events.of(ToolRequested) if e.task_id == "t-kernel"]
    (executed,) = [e for e in events.of(ToolExecuted) if e.task_id == "t-kernel"]
    assert requested.name == executed.name == "lookup" and executed.request_id == requested.request_id
    assert executed.call_id == requested.call_id


def test_the_agent_command_against_a_live_server(tmp_path):
    from http_server import ServerThread
    from modelcall.plugins.http.settings import ServerSettings

    (tmp_path / "mytools.py").write_text(
        "from typing import Annotated\nimport msgspec\nDigit = Annotated[int, msgspec.Meta(ge=0, le=9)]\n"
        "def add(a: Digit, b: Digit) -> int:\n    'Add two digits.'\n    return a + b\n")
    with ServerThread(ServerSettings(port=0), max_model_len=1024) as server:
        out = subprocess.run(
            [os.path.join(os.path.dirname(sys.executable), "modelcall"), "agent", "--base-url", server.base_url,
             "--tools", "mytools:add", "--tool-choice", "add", "--max-turns", "3", "--json",
             "--param", "temperature=0", "--param", "max_tokens=48", "Add 2 and 3"],
            capture_output=True, text=True, timeout=120, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    result = json.loads(out.stdout)
    # the first request is forced to call add; the next one (auto) is the random model's answer
    assert out.returncode == 0 and result["status"] in ("answered", "truncated"), out.stderr
    assert [r["finish_reason"] for r in result["requests"]][0] == "tool_calls"
    (call,) = result["tool_calls"]
    assert call["name"] == "add" and call["status"] == "ok"
    assert int(call["result"]) == sum(json.loads(call["arguments"]).values())
