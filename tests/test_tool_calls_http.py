"""Must-show: with the random-weight demo model, forced tool_choice (required or a named function)
returns a schema-valid call of an allowed tool in 50 of 50 requests, streamed and whole, through
the official openai SDK against a live server; json_schema responses validate 50 of 50. The
Anthropic SDK sees tool_use blocks with input_json_delta and stop_reason tool_use."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import anthropic
import jsonschema
import openai
import pytest
from http_server import ServerThread

from modelcall.events import RequestAdmitted, ToolRequested
from modelcall.plugins.http.settings import ServerSettings
from modelcall.testing.collector import EventCollector

N = 50
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16},
                                            "unit": {"enum": ["celsius", "fahrenheit"]},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 14}},
           "required": ["city", "unit", "days"], "additionalProperties": False}
SEARCH = {"type": "object", "properties": {"query": {"type": "string", "maxLength": 24},
                                           "limit": {"type": "integer", "minimum": 1, "maximum": 10}},
          "required": ["query"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather forecast",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "search", "description": "Web search", "parameters": SEARCH}},
         {"type": "function", "function": {"name": "get_time", "description": "The time now"}}]
SCHEMAS = {"get_weather": WEATHER, "search": SEARCH, "get_time": {"type": "object", "properties": {}}}
ANSWER = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 32},
                                           "confidence": {"type": "number", "minimum": 0, "maximum": 1},
                                           "sources": {"type": "array", "items": {"type": "string", "maxLength": 8},
                                                       "maxItems": 2}},
          "required": ["answer", "confidence", "sources"], "additionalProperties": False}
MSG = [{"role": "user", "content": "What's the weather in Paris this week?"}]
CHOICES = {"required": "required", "named": {"type": "function", "function": {"name": "get_weather"}}}


@pytest.fixture(scope="module")
def collector():
    return EventCollector()


@pytest.fixture(scope="module")
def server(collector):
    with ServerThread(ServerSettings(port=0), plugins=(collector,), max_model_len=1024, num_kv_blocks=1024) as s:
        yield s


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def parallel(fn, n: int = N) -> list:
    with ThreadPoolExecutor(16) as pool:
        return list(pool.map(fn, range(n)))


def whole_call(oai, choice, seed: int):
    r = oai.chat.completions.create(model="demo-model-1", messages=MSG, tools=TOOLS, tool_choice=choice,
                                    parallel_tool_calls=False, temperature=1.0, seed=seed, max_tokens=128)
    c = r.choices[0]
    return c.finish_reason, [(t.id, t.function.name, t.function.arguments) for t in c.message.tool_calls or ()]


def streamed_call(oai, choice, seed: int):
    calls: dict[int, list] = {}
    finish = None
    for chunk in oai.chat.completions.create(model="demo-model-1", messages=MSG, tools=TOOLS, tool_choice=choice,
                                             parallel_tool_calls=False, temperature=1.0, seed=seed,
                                             max_tokens=128, stream=True):
        for ch in chunk.choices:
            for d in ch.delta.tool_calls or ():
                if d.id is not None:
                    assert d.index not in calls, "id and name are sent once per call"
                    assert d.function.name, "the name comes whole with the id"
                    calls[d.index] = [d.id, d.function.name, ""]
                calls[d.index][2] += d.function.arguments or ""
            finish = ch.finish_reason or finish
    return finish, [tuple(v) for _, v in sorted(calls.items())]


def assert_valid(finish: str, calls: list, choice) -> None:
    assert finish == "tool_calls", finish
    assert len(calls) == 1, calls
    _id, name, arguments = calls[0]
    assert name in SCHEMAS and (choice == "required" or name == "get_weather")
    jsonschema.validate(json.loads(arguments), SCHEMAS[name])


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("choice", list(CHOICES))
def test_forced_tool_choice_gives_50_of_50_schema_valid_calls(oai, choice, stream):
    fn = streamed_call if stream else whole_call
    results = parallel(lambda seed: fn(oai, CHOICES[choice], seed))
    for finish, calls in results:
        assert_valid(finish, calls, CHOICES[choice])
    assert len(results) == N


def test_streamed_call_equals_the_whole_one(oai):
    for seed in range(3):
        assert whole_call(oai, "required", seed)[1][0][1:] == streamed_call(oai, "required", seed)[1][0][1:]


def test_json_schema_responses_validate_50_of_50(oai):
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER, "strict": True}}

    def one(seed: int) -> tuple[str, str]:
        r = oai.chat.completions.create(model="demo-model-1", messages=MSG, response_format=fmt, temperature=1.0, seed=seed,
                                        max_tokens=128)
        return r.choices[0].finish_reason, r.choices[0].message.content
    results = parallel(one)
    for finish, content in results:
        assert finish == "stop"
        jsonschema.validate(json.loads(content), ANSWER)


def test_anthropic_tool_use_blocks_whole_and_streamed(server):
    client = anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0)
    tools = [{"name": t["function"]["name"], "description": "", "input_schema": SCHEMAS[t["function"]["name"]]}
             for t in TOOLS]
    kw = dict(model="demo-model-1", max_tokens=128, messages=MSG, tools=tools, tool_choice={"type": "tool", "name": "get_weather"},
              extra_body={"seed": 7, "temperature": 1.0})
    whole = client.messages.create(**kw)
    assert whole.stop_reason == "tool_use"
    use = [b for b in whole.content if b.type == "tool_use"]
    assert len(use) == 1 and use[0].name == "get_weather"
    jsonschema.validate(use[0].input, WEATHER)
    with client.messages.stream(**kw) as s:
        events = list(s)
        final = s.get_final_message()
    assert any(e.type == "content_block_delta" and e.delta.type == "input_json_delta" for e in events)
    assert final.stop_reason == "tool_use"
    (block,) = [b for b in final.content if b.type == "tool_use"]
    assert block.name == "get_weather" and block.input == use[0].input  # same seed, same call


def test_task_id_header_reaches_the_kernel_and_tool_requested_events(server, oai, collector):
    r = oai.chat.completions.with_raw_response.create(
        model="demo-model-1", messages=MSG, tools=TOOLS, tool_choice="required", max_tokens=128, seed=1,
        extra_headers={"x-modelcall-task-id": "task-42"})
    assert r.http_response.status_code == 200
    body = r.parse()
    call = body.choices[0].message.tool_calls[0]
    rid = body.id.removeprefix("chatcmpl-")
    admitted = [e for e in collector.of(RequestAdmitted) if e.request_id == rid]
    requested = [e for e in collector.of(ToolRequested) if e.request_id == rid]
    assert admitted[0].task_id == "task-42"
    assert [(e.task_id, e.call_id, e.name, e.arguments) for e in requested] == [
        ("task-42", call.id, call.function.name, call.function.arguments)]
