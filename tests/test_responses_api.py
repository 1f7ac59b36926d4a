"""Must-show: the OpenAI Responses API against a live server with the official openai SDK — whole and
streamed give the same text and ids with events in OpenAI's order; forced function tools; json_schema
output; max_output_tokens ends `incomplete`; previous_response_id over three turns with a function
call between; stored responses owned by their key; background then cancel; the store stays bounded."""
from __future__ import annotations

import json
import time

import urllib.error
import urllib.request
import jsonschema
import openai
import pytest
from http_server import ServerThread
from keys_util import write_keys

from modelcall.events import RequestAdmitted
from modelcall.plugins.http.responses_store import ResponseStore
from modelcall.plugins.http.settings import ServerSettings
from modelcall.testing.collector import EventCollector

MODEL = "demo-model-1"
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather forecast", "parameters": WEATHER},
         {"type": "function", "name": "get_time", "description": "The time now",
          "parameters": {"type": "object", "properties": {}}}]
KEY_A, KEY_B = "mc-test-alice", "mc-test-bob"


@pytest.fixture(scope="module")
def collector():
    return EventCollector()


@pytest.fixture(scope="module")
def server(collector, tmp_path_factory):
    keys = write_keys(tmp_path_factory.mktemp("keys") / "keys.toml", {KEY_A: {"name": "alice"}, KEY_B: {"name": "bob"}})
    with ServerThread(ServerSettings(port=0), plugins=(collector,), max_model_len=1024, num_kv_blocks=1024,
                      plugin_config={"auth": {"api_keys": str(keys)}}) as s:
        yield s


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=KEY_A, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def oai_b(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=KEY_B, max_retries=0, timeout=120)


def test_whole_and_streamed_give_the_same_text_ids_in_stream_equal_final(oai):
    kw = dict(model=MODEL, input="Tell me about the sea.", instructions="Answer briefly.", max_output_tokens=24,
              temperature=0, extra_body={"ignore_eos": True})  # the limit, not the model, ends it
    whole = oai.responses.create(**kw)
    assert whole.object == "response" and whole.id.startswith("resp_")
    assert whole.status == "incomplete" and whole.incomplete_details.reason == "max_output_tokens"
    assert whole.usage.output_tokens == 24 and whole.usage.input_tokens > 0
    assert whole.usage.total_tokens == whole.usage.input_tokens + whole.usage.output_tokens
    assert whole.usage.input_tokens_details.cached_tokens >= 0
    assert whole.usage.output_tokens_details.reasoning_tokens >= 0

    events = list(oai.responses.create(**kw, stream=True))
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.incomplete"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response
    assert final.output_text == whole.output_text and final.output_text
    # item ids in the stream are those of the final response
    added = [e.item.id for e in events if e.type == "response.output_item.added"]
    done = [e.item.id for e in events if e.type == "response.output_item.done"]
    assert added == done == [o.id for o in final.output]
    msg = final.output[0]
    assert [e.type for e in events if getattr(e, "item_id", msg.id) == msg.id and e.type.startswith("response.")
            ][2:4] == ["response.output_item.added", "response.content_part.added"]
    streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert streamed == final.output_text
    text_done = next(e for e in events if e.type == "response.output_text.done")
    assert text_done.text == final.output_text and text_done.item_id == msg.id
    order = [t for t in types if t != "response.output_text.delta"]
    assert order == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", "response.output_text.done", "response.content_part.done",
                     "response.output_item.done", "response.incomplete"]
    # the stored copy is the final response
    assert oai.responses.retrieve(final.id).output_text == final.output_text


@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "get_weather"}])
def test_forced_function_tools_whole_and_streamed(oai, choice):
    for seed in range(3):
        kw = dict(model=MODEL, input="Weather in Paris?", tools=TOOLS, tool_choice=choice, parallel_tool_calls=False,
                  temperature=1.0, extra_body={"seed": seed}, max_output_tokens=96)
        whole = oai.responses.create(**kw)
        calls = [o for o in whole.output if o.type == "function_call"]
        assert whole.status == "completed" and len(calls) == 1
        call = calls[0]
        if isinstance(choice, dict):
            assert call.name == "get_weather"
        args = json.loads(call.arguments)
        jsonschema.validate(args, WEATHER if call.name == "get_weather" else TOOLS[1]["parameters"])
        assert call.call_id and call.id != call.call_id

        events = list(oai.responses.create(**kw, stream=True))
        final = events[-1].response
        assert events[-1].type == "response.completed"
        scall = next(o for o in final.output if o.type == "function_call")
        assert (scall.name, scall.arguments) == (call.name, call.arguments)  # same seed, same call
        added = next(e for e in events if e.type == "response.output_item.added" and e.item.type == "function_call")
        assert added.item.id == scall.id and added.item.call_id == scall.call_id
        deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta"
                         and e.item_id == scall.id)
        args_done = next(e for e in events if e.type == "response.function_call_arguments.done")
        assert deltas == args_done.arguments == scall.arguments


CALL_MARKUP = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}\n</tool_call>'


@pytest.fixture(scope="module")
def calls_weather():
    """A server whose model writes a get_weather call whatever it is asked (a ScriptedSampler)."""
    from modelcall.testing.scripted import ScriptedSampler

    sampler, admitted = ScriptedSampler(), EventCollector()
    with ServerThread(ServerSettings(port=0), plugins=(sampler, admitted), max_model_len=1024, num_kv_blocks=256) as s:
        sampler.say(s.kernel.tokenizer.encode(CALL_MARKUP))
        yield openai.OpenAI(base_url=s.base_url + "/v1", api_key="unused", max_retries=0, timeout=120), admitted


def test_tool_choice_none_gives_text_only(calls_weather):
    """The model writes a call's markup either way: with `auto` it is a function_call item; with `none`
    no tool is offered (a shorter prompt) and the markup stays text in the one message."""
    client, admitted = calls_weather
    kw = dict(model=MODEL, input="Weather in Oslo?", tools=TOOLS, max_output_tokens=64)
    auto = client.responses.create(**kw, tool_choice="auto")
    none = client.responses.create(**kw, tool_choice="none")
    [call] = [o for o in auto.output if o.type == "function_call"]
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Oslo", "days": 2})
    assert [o.type for o in none.output] == ["message"]
    assert none.output_text == CALL_MARKUP
    prompt = {e.request_id: e.prompt_tokens for e in admitted.of(RequestAdmitted)}
    first, second = prompt.values()  # auto's request, then none's
    assert second < first  # no tool definitions rendered


def test_json_schema_text_format_validates(oai):
    schema = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 16},
                                               "score": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["answer", "score"], "additionalProperties": False}
    for seed in range(3):
        r = oai.responses.create(model=MODEL, input="Rate it", max_output_tokens=200, temperature=1.0, extra_body={"seed": seed},
                                 text={"format": {"type": "json_schema", "name": "rating", "schema": schema,
                                                  "strict": True}})
        assert r.status == "completed"
        jsonschema.validate(json.loads(r.output_text), schema)


def test_repeated_prompt_reports_cached_tokens(oai):
    long = "The quick brown fox jumps over the lazy dog. " * 12
    oai.responses.create(model=MODEL, input=long, max_output_tokens=2)
    r = oai.responses.create(model=MODEL, input=long, max_output_tokens=2)
    assert r.usage.input_tokens_details.cached_tokens > 0


def test_previous_response_id_three_turns_with_a_function_call_between(oai, collector):
    r1 = oai.responses.create(model=MODEL, input="Weather in Oslo?", instructions="Use the tools.", tools=TOOLS,
                              tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=96, extra_body={"seed": 3})
    call = next(o for o in r1.output if o.type == "function_call")
    r2 = oai.responses.create(model=MODEL, previous_response_id=r1.id, tools=TOOLS, tool_choice="none",
                              max_output_tokens=6, extra_body={"seed": 3},
                              input=[{"type": "function_call_output", "call_id": call.call_id,
                                      "output": json.dumps({"forecast": "sunny", "high_c": 21})}])
    r3 = oai.responses.create(model=MODEL, previous_response_id=r2.id, input="And tomorrow?", max_output_tokens=6,
                              extra_body={"seed": 3})
    assert r2.previous_response_id == r1.id and r3.previous_response_id == r2.id
    admitted = {e.request_id: e for e in collector.of(RequestAdmitted)}
    by_task = {e.task_id: e for e in admitted.values()}
    a1, a2, a3 = by_task[r1.id], by_task[r2.id], by_task[r3.id]
    # turn 2 and turn 3 both carry the function call's output (the rebuilt context kept the call)
    assert call.call_id in a2.tool_results and call.call_id in a3.tool_results
    # turn 2's only history is the assistant's function call, its tool_results the output
    assert a2.prompt_parts["history"] > 0 and a2.prompt_parts["tool_results"] > 0
    assert a3.prompt_parts["history"] >= a2.prompt_parts["history"] + a2.prompt_parts["tool_results"]
    assert a1.task_id == r1.id
    items = oai.responses.input_items.list(r2.id, order="asc")
    assert [i.type for i in items.data] == ["function_call_output"] and items.data[0].call_id == call.call_id
    assert [i.type for i in oai.responses.input_items.list(r3.id).data] == ["message"]


def test_stored_responses_belong_to_their_key(oai, oai_b):
    r = oai.responses.create(model=MODEL, input="secret", max_output_tokens=2)
    assert oai.responses.retrieve(r.id).id == r.id
    for call in (lambda: oai_b.responses.retrieve(r.id), lambda: oai_b.responses.delete(r.id),
                 lambda: oai_b.responses.input_items.list(r.id),
                 lambda: oai_b.responses.create(model=MODEL, input="x", previous_response_id=r.id)):
        with pytest.raises(openai.NotFoundError):
            call()
    oai.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(r.id)
    unstored = oai.responses.create(model=MODEL, input="x", max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(unstored.id)


def test_background_polls_to_completion_and_cancel_stops_a_long_one(oai, server):
    r = oai.responses.create(model=MODEL, input="short", max_output_tokens=4, background=True,
                             extra_body={"ignore_eos": True})
    assert r.status in ("queued", "in_progress") and r.background
    deadline = time.monotonic() + 60
    while (got := oai.responses.retrieve(r.id)).status in ("queued", "in_progress"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert got.status == "incomplete" and got.usage.output_tokens == 4

    long = oai.responses.create(model=MODEL, input="long", max_output_tokens=900, background=True, temperature=1.0,
                                extra_body={"ignore_eos": True})
    time.sleep(0.3)
    cancelled = oai.responses.cancel(long.id)
    assert cancelled.status == "cancelled"
    assert oai.responses.retrieve(long.id).status == "cancelled"
    deadline = time.monotonic() + 10
    while server.stats()["unfinished"]:  # the model request was aborted, not left running
        assert time.monotonic() < deadline
        time.sleep(0.05)
    with pytest.raises(openai.BadRequestError):
        oai.responses.cancel(oai.responses.create(model=MODEL, input="x", max_output_tokens=1).id)


def _http(method: str, url: str, body: dict | None = None, key: str = KEY_A) -> tuple[int, dict]:
    req = urllib.request.Request(url, method=method, data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_bad_input_is_a_4xx_in_openai_shape(server):
    cases = [
        ({"model": MODEL, "input": [{"type": "web_search_call"}]}, "input[0].type"),
        ({"model": MODEL, "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
         "input[0].content[0]"),
        ({"model": MODEL, "input": "x", "tools": TOOLS, "tool_choice": {"type": "function", "name": "nope"}},
         "tool_choice"),
        ({"model": MODEL, "input": "x", "tools": [{"type": "mcp", "server_label": "nowhere"}]}, "tools[0].server_label"),
        ({"model": MODEL}, "input"),
        ({"model": MODEL, "input": "x", "background": True, "store": False}, "background"),
    ]
    for body, param in cases:
        status, got = _http("POST", server.base_url + "/v1/responses", body)
        assert status == 400, (body, got)
        err = got["error"]
        assert err["param"] == param and err["message"], err
    status, got = _http("GET", server.base_url + "/v1/responses/resp_missing")
    assert status == 404 and got["error"]["code"] == "not_found"


def test_store_is_bounded_by_count_and_age():
    store = ResponseStore(max_responses=3, max_age_s=3600)
    for i in range(5):
        store.put("alice", {"id": f"resp_{i}", "status": "completed", "output": []}, [], [])
    assert len(store) == 3
    assert store.get("resp_0", "alice") is None and store.get("resp_4", "alice") is not None
    assert store.get("resp_4", "bob") is None
    aged = ResponseStore(max_responses=100, max_age_s=0.05)
    aged.put("a", {"id": "resp_old", "status": "completed", "output": []}, [], [])
    time.sleep(0.1)
    assert aged.get("resp_old", "a") is None
    aged.put("a", {"id": "resp_new", "status": "completed", "output": []}, [], [])
    assert len(aged) == 1


@pytest.fixture(scope="module")
def scripted():
    from modelcall.testing.scripted import ScriptedSampler

    sampler = ScriptedSampler()
    with ServerThread(ServerSettings(port=0), plugins=(sampler,), max_model_len=1024, num_kv_blocks=512) as s:
        sampler.say(s.kernel.tokenizer.encode("<think>\nThe user greets me.\n</think>\n\nHello there, friend."))
        yield s


def test_reasoning_items_whole_and_streamed(scripted):
    oai = openai.OpenAI(base_url=scripted.base_url + "/v1", api_key="unused", max_retries=0, timeout=60)
    whole = oai.responses.create(model=MODEL, input="Hi!", max_output_tokens=64)
    assert [o.type for o in whole.output] == ["reasoning", "message"]
    assert whole.output[0].content[0].type == "reasoning_text"
    assert whole.output[0].content[0].text.strip() == "The user greets me."
    assert whole.output_text.strip() == "Hello there, friend."
    assert 0 < whole.usage.output_tokens_details.reasoning_tokens < whole.usage.output_tokens

    events = list(oai.responses.create(model=MODEL, input="Hi!", max_output_tokens=64, stream=True))
    final = events[-1].response
    assert events[-1].type == "response.completed"
    rs = final.output[0]
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == rs.content[0].text
    assert next(e for e in events if e.type == "response.reasoning_text.done").text == rs.content[0].text
    kinds = [e.type for e in events if e.type.endswith((".added", ".done")) and "text" not in e.type]
    assert kinds == ["response.output_item.added", "response.content_part.added", "response.content_part.done",
                     "response.output_item.done"] * 2
    assert final.output_text == whole.output_text
    # the reasoning item goes back as input (the Agents SDK sends it so) and is accepted
    again = oai.responses.create(model=MODEL, max_output_tokens=8, previous_response_id=final.id,
                                 input=[{"role": "user", "content": "And?"}])
    assert again.status == "incomplete" and again.previous_response_id == final.id


def test_client_sent_history_with_calls_and_outputs_validates_on_turn_two(oai, collector):
    """Codex-style: no store, the client sends the whole conversation back (its output items as they came)."""
    first = [{"role": "user", "content": "Weather in Rome?"}]
    r1 = oai.responses.create(model=MODEL, input=first, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
                              max_output_tokens=96, store=False, extra_body={"seed": 4})
    call = next(o for o in r1.output if o.type == "function_call")
    history = first + [o.model_dump(exclude_none=True) for o in r1.output] + [
        {"type": "function_call_output", "call_id": call.call_id, "output": "rain"},
        {"role": "user", "content": [{"type": "input_text", "text": "Thanks, and Milan?"}]}]
    r2 = oai.responses.create(model=MODEL, input=history, tools=TOOLS, tool_choice="required",
                              parallel_tool_calls=False, max_output_tokens=96, store=False, extra_body={"seed": 4})
    assert r2.status == "completed" and any(o.type == "function_call" for o in r2.output)
    [a2] = [e for e in collector.of(RequestAdmitted) if e.task_id == r2.id]
    assert a2.tool_results == (call.call_id,) and a2.prompt_parts["history"] > 0


def test_a_file_store_survives_a_restart_and_fails_what_was_left_running(tmp_path):
    path = str(tmp_path / "responses.sqlite3")
    before = ResponseStore(path)
    before.put("a", {"id": "resp_done", "status": "completed", "output": []}, [], [])
    before.put("a", {"id": "resp_bg", "status": "in_progress", "background": True, "output": []}, [], [])
    before.close()
    after = ResponseStore(path)
    assert after.fail_unfinished("restarted") == 1
    assert after.get("resp_done", "a").status == "completed"
    bg = after.get("resp_bg", "a")
    assert bg.status == "failed" and bg.response["status"] == "failed" and bg.response["error"]["message"] == "restarted"
