"""The context budget: a prompt's tokens by part add up; over the window a request gets 400 with the
breakdown, or — when it asked for `context_policy: drop_oldest` — its oldest history goes and the
response says what was dropped. Never silent."""
from __future__ import annotations

import httpx2 as httpx
import pytest
from http_server import ServerThread

from modelcall.core.context import count_parts, drop_oldest, drop_units, part_of
from modelcall.core.errors import ContextOverflow, InvalidRequest

SYSTEM = {"role": "system", "content": "You are a careful assistant."}


def _history(turns: int) -> list[dict]:
    msgs = [SYSTEM]
    for i in range(turns):
        msgs += [{"role": "user", "content": f"Question number {i}: tell me about the river {i} in detail please."},
                 {"role": "assistant", "content": f"River {i} is long and wide and flows to the sea slowly."}]
    return msgs + [{"role": "user", "content": "And the last question?"}]


def test_parts_sum_to_the_prompt_and_name_each_message():
    msgs = _history(2) + [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c", "content": "result"}]
    assert [part_of(msgs, i) for i in range(len(msgs))] == (
        ["system"] + ["history"] * 4 + ["user", "history", "tool_results"])
    parts = count_parts(msgs, 200, lambda s: s.split(), tools_tokens=30)
    assert sum(parts.values()) == 200 and parts["tools"] == 30 and parts["tool_results"] == 1


def test_drop_oldest_never_splits_a_tool_call_from_its_result_nor_drops_the_turn():
    msgs = [SYSTEM, {"role": "user", "content": "a"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "1", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "1", "content": "r"},
            {"role": "user", "content": "b"}, {"role": "assistant", "content": "c"}, {"role": "user", "content": "now"}]
    assert drop_units(msgs) == [[1], [2, 3], [4], [5]]
    kept, gone = drop_oldest(msgs, 2, lambda i: 1)
    assert gone == [1, 2, 3] and kept[0] == SYSTEM and kept[-1]["content"] == "now"
    kept, gone = drop_oldest(msgs, 100, lambda i: 1)
    assert [m["content"] for m in kept] == [SYSTEM["content"], "now"]


@pytest.mark.anyio
async def test_over_the_window_is_refused_with_the_breakdown_or_dropped_by_policy(make_kernel):
    async with make_kernel(max_model_len=160) as kernel:
        msgs = _history(6)
        with pytest.raises(ContextOverflow) as e:
            await kernel.submit(messages=msgs, max_tokens=16)
        b = e.value.breakdown
        assert b["system"] > 0 and b["history"] > 0 and b["user"] > 0
        assert sum(b.values()) == e.value.prompt_tokens > 160 - 16
        assert "history: " in str(e.value) and e.value.status == 400
        h = await kernel.submit(messages=msgs, max_tokens=16, context_policy="drop_oldest")
        done = await h.result()
        assert h.context["policy"] == "drop_oldest" and h.context["dropped_messages"] >= 2
        assert h.context["dropped_tokens"] > 0
        assert done.usage.prompt_tokens + 16 <= 160
        assert done.usage.prompt_tokens == e.value.prompt_tokens - h.context["dropped_tokens"]
        assert sum(h.prompt_parts.values()) == done.usage.prompt_tokens
        with pytest.raises(ContextOverflow):  # nothing droppable left: still an error, never a silent cut
            await kernel.submit(messages=[SYSTEM, {"role": "user", "content": "word " * 300}], max_tokens=16,
                                context_policy="drop_oldest")
        with pytest.raises(InvalidRequest, match="context_policy"):
            await kernel.submit(messages=msgs, max_tokens=16, context_policy="truncate_middle")


def test_over_http_the_400_names_the_parts_and_the_policy_header_says_what_went():
    with ServerThread(max_model_len=160) as server:
        base = server.base_url
        model = httpx.get(base + "/v1/models").json()["data"][0]["id"]
        body = {"model": model, "messages": _history(6), "max_tokens": 16}
        r = httpx.post(base + "/v1/chat/completions", json=body)
        err = r.json()["error"]
        assert r.status_code == 400 and err["code"] == "context_length_exceeded"
        assert "system: " in err["message"] and "history: " in err["message"]
        r = httpx.post(base + "/v1/chat/completions", json={**body, "context_policy": "drop_oldest"})
        assert r.status_code == 200
        dropped = r.headers["x-modelcall-context-dropped"]
        assert "policy=drop_oldest" in dropped and "messages=" in dropped
        with httpx.stream("POST", base + "/v1/chat/completions",
                          json={**body, "context_policy": "drop_oldest", "stream": True}) as r:
            assert r.status_code == 200 and "messages=" in r.headers["x-modelcall-context-dropped"]
            assert any(line.startswith("data: ") for line in r.iter_lines())
        r = httpx.post(base + "/v1/messages", headers={"x-modelcall-context-policy": "drop_oldest"},
                       json={"model": model, "max_tokens": 16, "system": SYSTEM["content"], "messages": _history(6)[1:]})
        assert r.status_code == 200 and "messages=" in r.headers["x-modelcall-context-dropped"]
