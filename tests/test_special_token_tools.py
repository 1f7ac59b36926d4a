"""Must-show: on a model whose tokenizer makes `<tool_call>`, `</tool_call>`, `<think>` and `</think>`
special tokens (as several fine-tunes do), forced and auto tool calls come out as calls through the
openai and anthropic SDKs against a live server, streamed and whole, equal; special tokens never
show in content; a call written inside reasoning is reasoning; reasoning tokens in usage equal the
reasoning deltas' tokens; a call cut by max_tokens is not a call (length / max_tokens, never 5xx)."""
from __future__ import annotations

import json
import os
import shutil

import anthropic
import openai
import pytest
from http_server import ServerThread

from modelcall.events import Finished, TokensEmitted, ToolRequested
from modelcall.testing import ScriptedSampler
from modelcall.testing.collector import EventCollector

TAGS = ("<tool_call>", "</tool_call>", "<think>", "</think>")
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"],
           "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": WEATHER}}]
A_TOOLS = [{"name": "get_weather", "description": "Weather", "input_schema": WEATHER}]
MSG = [{"role": "user", "content": "Weather in Paris?"}]
CALL = '\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'


@pytest.fixture(scope="module")
def special_model_dir(demo_model_dir, tmp_path_factory) -> str:
    """The demo model with its tool and think tags turned into special tokens (same ids, same weights)."""
    out = str(tmp_path_factory.mktemp("special") / "special-tags")
    shutil.copytree(demo_model_dir, out)
    path = os.path.join(out, "tokenizer.json")
    with open(path, encoding="utf-8") as f:
        spec = json.load(f)
    for added in spec["added_tokens"]:
        if added["content"] in TAGS:
            added["special"] = True
    with open(path, "w", encoding="utf-8") as f:
        json.dump(spec, f)
    return out


def _ids(tok, *parts):
    """Token ids of parts: a tag is its one special token, text is encoded."""
    out = []
    for p in parts:
        out += [tok.token_to_id(p)] if p in TAGS else tok.encode(p)
    return out


# ---- forced calls: the real sampler under the constraint backend --------------------------------

@pytest.fixture(scope="module")
def forced(special_model_dir):
    with ServerThread(model=special_model_dir, max_model_len=1024, num_kv_blocks=512) as s:
        tok = s.kernel.tokenizer
        assert all(tok.token_to_id(t) in tok.special_token_ids for t in TAGS)
        yield s


def _oai(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _anth(server):
    return anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)


def oai_whole(server, **kw):
    r = _oai(server).chat.completions.create(model=server.kernel.model_name, messages=MSG, **kw)
    c = r.choices[0]
    calls = [(t.function.name, json.loads(t.function.arguments)) for t in c.message.tool_calls or ()]
    return c.finish_reason, c.message.content, c.message.reasoning_content if hasattr(c.message, "reasoning_content") \
        else None, calls, r.usage


def oai_stream(server, **kw):
    calls: dict[int, list] = {}
    content, reasoning, finish, usage = "", "", None, None
    for chunk in _oai(server).chat.completions.create(model=server.kernel.model_name, messages=MSG, stream=True,
                                                      stream_options={"include_usage": True}, **kw):
        usage = chunk.usage or usage
        for ch in chunk.choices:
            content += ch.delta.content or ""
            reasoning += getattr(ch.delta, "reasoning_content", None) or ""
            for d in ch.delta.tool_calls or ():
                if d.id is not None:
                    calls[d.index] = [d.function.name, ""]
                calls[d.index][1] += d.function.arguments or ""
            finish = ch.finish_reason or finish
    return finish, content or None, reasoning or None, [(n, json.loads(a)) for n, a in calls.values()], usage


def anth_whole(server, **kw):
    m = _anth(server).messages.create(model=server.kernel.model_name, max_tokens=kw.pop("max_tokens", 96),
                                      messages=MSG, **kw)
    return m.stop_reason, [b.model_dump(exclude={"signature", "id"}) for b in m.content]


def anth_stream(server, **kw):
    with _anth(server).messages.stream(model=server.kernel.model_name, max_tokens=kw.pop("max_tokens", 96),
                                       messages=MSG, **kw) as s:
        m = s.get_final_message()
    return m.stop_reason, [b.model_dump(exclude={"signature", "id"}) for b in m.content]


def test_forced_calls_parse_streamed_and_whole_equal_through_the_openai_sdk(forced):
    for seed in range(6):
        kw = dict(tools=TOOLS, tool_choice="required", parallel_tool_calls=False, temperature=1.0, seed=seed,
                  max_tokens=96)
        whole, streamed = oai_whole(forced, **kw), oai_stream(forced, **kw)
        assert whole[0] == "tool_calls" and whole[3] and whole[3][0][0] == "get_weather", whole
        assert not any(t in (whole[1] or "") for t in TAGS)
        assert (streamed[0], streamed[3]) == (whole[0], whole[3])


def test_forced_calls_parse_streamed_and_whole_equal_through_the_anthropic_sdk(forced):
    for seed in range(4):
        kw = dict(tools=A_TOOLS, tool_choice={"type": "any", "disable_parallel_tool_use": True}, max_tokens=160, extra_body={"seed": seed, "temperature": 1.0})
        whole, streamed = anth_whole(forced, **kw), anth_stream(forced, **kw)
        assert whole[0] == "tool_use", whole
        uses = [b for b in whole[1] if b["type"] == "tool_use"]
        assert uses and uses[0]["name"] == "get_weather"
        assert streamed == whole


# ---- scripted outputs: auto calls, a call inside reasoning, a cut call ---------------------------

@pytest.fixture(scope="module")
def scripted(special_model_dir):
    sampler, collector = ScriptedSampler(), EventCollector()
    with ServerThread(model=special_model_dir, plugins=(sampler, collector), max_model_len=1024,
                      num_kv_blocks=512) as s:
        s.sampler, s.collector = sampler, collector
        yield s


def say(server, ids):
    server.call(lambda: server.sampler.say(ids))


def test_auto_calls_of_special_token_markup_through_both_sdks(scripted):
    tok = scripted.kernel.tokenizer
    say(scripted, _ids(tok, "Let me check.", "<tool_call>", CALL, "</tool_call>"))
    kw = dict(tools=TOOLS, max_tokens=96)
    whole, streamed = oai_whole(scripted, **kw), oai_stream(scripted, **kw)
    assert whole[0] == "tool_calls" and whole[1] == "Let me check."
    assert whole[3] == [("get_weather", {"city": "Paris"})]
    assert (streamed[0], streamed[1], streamed[3]) == (whole[0], whole[1], whole[3])
    a_whole, a_stream = anth_whole(scripted, tools=A_TOOLS), anth_stream(scripted, tools=A_TOOLS)
    assert a_whole[0] == "tool_use"
    assert [(b["type"], b.get("text"), b.get("name"), b.get("input")) for b in a_whole[1]] == [
        ("text", "Let me check.", None, None), ("tool_use", None, "get_weather", {"city": "Paris"})]
    assert a_stream == a_whole


def test_without_tools_special_markup_never_shows_in_content(scripted):
    tok = scripted.kernel.tokenizer
    say(scripted, _ids(tok, "Plain ", "<tool_call>", CALL, "</tool_call>"))
    finish, content, _, calls, _ = oai_whole(scripted, max_tokens=96)
    assert finish == "stop" and not calls
    assert not any(t in content for t in TAGS) and "get_weather" in content


def test_a_call_inside_reasoning_is_reasoning_and_reasoning_tokens_match_on_both_apis(scripted):
    tok = scripted.kernel.tokenizer
    script = _ids(tok, "<think>", "\nI could call ", "<tool_call>", CALL, "</tool_call>", " but no.\n", "</think>",
                  "\n\nIt is sunny.")
    n_reasoning = script.index(tok.token_to_id("</think>")) + 1
    say(scripted, script)
    kw = dict(tools=TOOLS, max_tokens=96)
    whole, streamed = oai_whole(scripted, **kw), oai_stream(scripted, **kw)
    for finish, content, reasoning, calls, usage in (whole, streamed):
        assert (finish, content, calls) == ("stop", "It is sunny.", [])
        assert '"get_weather"' in reasoning and not any(t in reasoning for t in TAGS)
        assert usage.completion_tokens_details.reasoning_tokens == n_reasoning
    assert streamed[2] == whole[2]
    scripted.collector.clear()
    a_whole = anth_whole(scripted, tools=A_TOOLS)
    assert a_whole[0] == "end_turn" and [b["type"] for b in a_whole[1]] == ["thinking", "text"]
    assert '"get_weather"' in a_whole[1][0]["thinking"] and a_whole[1][1]["text"] == "It is sunny."
    assert anth_stream(scripted, tools=A_TOOLS) == a_whole
    assert not scripted.collector.of(ToolRequested)
    for fin in scripted.collector.of(Finished):  # Anthropic's usage has no reasoning field: the kernel's count
        deltas = [e for e in scripted.collector.of(TokensEmitted) if e.request_id == fin.request_id]
        assert fin.usage.reasoning_tokens == sum(e.reasoning_tokens for e in deltas) == n_reasoning
        assert "".join(e.reasoning for e in deltas) == fin.reasoning == a_whole[1][0]["thinking"]


def test_a_call_cut_by_max_tokens_is_not_a_call(scripted):
    tok = scripted.kernel.tokenizer
    script = _ids(tok, "<tool_call>", CALL, "</tool_call>")
    say(scripted, script)
    cut = len(script) - 6
    whole = oai_whole(scripted, tools=TOOLS, max_tokens=cut)
    assert (whole[0], whole[3]) == ("length", [])
    r = _oai(scripted).chat.completions.create(model=scripted.kernel.model_name, messages=MSG, tools=TOOLS,
                                               max_tokens=cut, stream=True)
    assert [c.choices[0].finish_reason for c in r if c.choices and c.choices[0].finish_reason] == ["length"]
    stop, blocks = anth_whole(scripted, tools=A_TOOLS, max_tokens=cut)
    assert stop == "max_tokens" and not [b for b in blocks if b["type"] == "tool_use"]
    stop, _ = anth_stream(scripted, tools=A_TOOLS, max_tokens=cut)
    assert stop == "max_tokens"


def test_an_abandoned_call_is_not_listed_beside_finish_stop(scripted):
    tok = scripted.kernel.tokenizer
    say(scripted, _ids(tok, "<tool_call>", '\n{"name": "get_weather", "arguments": {"city": ', "</tool_call>", " Sorry."))
    scripted.collector.clear()
    finish, content, _, calls, _ = oai_whole(scripted, tools=TOOLS, max_tokens=96)
    assert (finish, calls) == ("stop", [])
    assert not any(t in (content or "") for t in TAGS)
    stop, blocks = anth_whole(scripted, tools=A_TOOLS)
    assert stop == "end_turn" and not [b for b in blocks if b["type"] == "tool_use"]
    assert not scripted.collector.of(ToolRequested)
