"""LangChain's `ChatOpenAI` (langchain-openai) against a live server, the way its users drive it: invoke and
stream (sync and async), usage and finish reasons in its own metadata, `bind_tools` with a forced choice,
`with_structured_output` in json_schema and function_calling modes, a tool round trip, and a bad request
surfacing as the openai SDK's 4xx error (LangChain re-raises it) rather than a 500."""
from __future__ import annotations

import asyncio
from typing import Literal

import openai
import pytest
from http_server import ServerThread
from pydantic import BaseModel, Field

import langchain_openai  # noqa: E402  (the test extra: a missing package is an error, not a skip)
from langchain_core.exceptions import ContextOverflowError  # noqa: E402
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, SystemMessage, ToolMessage  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
# Async SDK clients these tests leave open are collected at the end of the module (conftest).
pytestmark = pytest.mark.usefixtures("free_unclosed_async_clients")

MODEL = "demo-model-1"
QUESTION = [SystemMessage("You are terse."), HumanMessage("Say something about Paris.")]


class Weather(BaseModel):
    """The weather forecast for a city."""

    city: str = Field(max_length=12, description="the city's name")
    unit: Literal["celsius", "fahrenheit"]
    days: int = Field(ge=1, le=7)


class Forecast(BaseModel):
    city: str = Field(max_length=12, description="the city's name")
    days: int = Field(ge=1, le=7, description="how many days ahead")


class Leg(BaseModel):
    city: str = Field(max_length=12)
    days: int = Field(ge=1, le=7)


class Trip(BaseModel):
    """A trip of one or two legs: pydantic writes Leg as `$defs` + `$ref`, as it does any nested model."""

    legs: list[Leg] = Field(min_length=1, max_length=2)
    unit: Literal["celsius", "fahrenheit"]


@tool(args_schema=Forecast)
def get_weather(city: str, days: int) -> str:
    """The weather forecast for a city, `days` days ahead."""
    return f"sunny in {city} for {days} days"


@pytest.fixture(scope="module")
def server(demo_model_dir):
    with ServerThread(dtype="float32", max_model_len=1024, num_kv_blocks=256) as s:
        yield s


def chat(server, **kw) -> langchain_openai.ChatOpenAI:
    kw = {"max_tokens": 8, "temperature": 0.0, **kw}
    return langchain_openai.ChatOpenAI(model=MODEL, base_url=server.base_url + "/v1", api_key="unused",
                                       max_retries=0, timeout=60, **kw)


def sdk_reference(server, max_tokens: int = 8) -> str:
    """The same greedy request through the openai SDK: what LangChain must hand back."""
    oai = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
    r = oai.chat.completions.create(model=MODEL, max_completion_tokens=max_tokens, temperature=0.0,
                                    messages=[{"role": "system", "content": "You are terse."},
                                              {"role": "user", "content": "Say something about Paris."}],
                                    extra_body={"ignore_eos": True})
    return r.choices[0].message.content


def test_invoke_returns_the_servers_text_usage_and_finish_reason(server):
    msg = chat(server, extra_body={"ignore_eos": True}).invoke(QUESTION)
    assert isinstance(msg, AIMessage)
    assert msg.content == sdk_reference(server) and msg.content
    assert msg.response_metadata["finish_reason"] == "length"
    assert msg.response_metadata["model_name"] == MODEL
    u = msg.usage_metadata
    assert u["output_tokens"] == 8 and u["input_tokens"] > 5 and u["total_tokens"] == u["input_tokens"] + 8


def test_stream_chunks_add_up_to_the_whole_answer_with_usage(server):
    model = chat(server, extra_body={"ignore_eos": True}, stream_usage=True)
    chunks = list(model.stream(QUESTION))
    assert len(chunks) > 2 and all(isinstance(c, AIMessageChunk) for c in chunks)
    total = chunks[0]
    for c in chunks[1:]:
        total += c
    assert total.content == sdk_reference(server)
    assert total.response_metadata["finish_reason"] == "length"
    assert total.usage_metadata["output_tokens"] == 8  # from the include_usage chunk LangChain asked for


def test_async_invoke_and_stream(server):
    model = chat(server, extra_body={"ignore_eos": True})

    async def go():
        whole = await model.ainvoke(QUESTION)
        parts = [c.content async for c in model.astream(QUESTION)]
        return whole, "".join(parts)

    whole, streamed = asyncio.run(go())
    assert whole.content == streamed == sdk_reference(server)


@pytest.mark.parametrize("choice", ["required", "get_weather"])
@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
def test_bind_tools_forced_call_parses_into_tool_calls(server, choice, streamed):
    model = chat(server, max_tokens=96, temperature=1.0, seed=3).bind_tools([get_weather, Weather], tool_choice=choice,
                                                                          parallel_tool_calls=False)
    if streamed:
        msg = None
        for c in model.stream([HumanMessage("Weather in Paris?")]):
            msg = c if msg is None else msg + c
    else:
        msg = model.invoke([HumanMessage("Weather in Paris?")])
    assert msg.response_metadata["finish_reason"] == "tool_calls"
    assert len(msg.tool_calls) == 1 and not msg.invalid_tool_calls
    call = msg.tool_calls[0]
    assert call["id"] and call["type"] == "tool_call"
    if choice == "get_weather":
        assert call["name"] == "get_weather"
    schema = Forecast if call["name"] == "get_weather" else Weather
    schema.model_validate(call["args"])  # the bounds held: constrained decoding followed the tool's schema


def test_tool_round_trip_sends_the_tool_result_back(server):
    """The call LangChain parsed, run by LangChain, sent back as a ToolMessage: the server takes the history."""
    model = chat(server, max_tokens=96, temperature=1.0, seed=5)
    first = model.bind_tools([get_weather], tool_choice="get_weather").invoke([HumanMessage("Weather in Rome?")])
    call = first.tool_calls[0]
    result = get_weather.invoke(call)
    assert isinstance(result, ToolMessage) and result.tool_call_id == call["id"]
    second = model.bind_tools([get_weather]).invoke([HumanMessage("Weather in Rome?"), first, result])
    assert isinstance(second, AIMessage)
    assert second.response_metadata["finish_reason"] in ("stop", "length", "tool_calls")
    assert second.usage_metadata["input_tokens"] > first.usage_metadata["input_tokens"]


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_structured_output_returns_a_valid_pydantic_object(server, method):
    model = chat(server, max_tokens=96, temperature=1.0, seed=11).with_structured_output(Weather, method=method,
                                                                                         include_raw=True)
    out = model.invoke([HumanMessage("Weather in Oslo, in celsius, for 3 days, as JSON.")])
    assert out["parsing_error"] is None
    w = out["parsed"]
    assert isinstance(w, Weather)  # pydantic validated max_length, the enum and the day range
    assert 1 <= w.days <= 7 and len(w.city) <= 12


def test_nested_pydantic_models_as_tools(server):
    """Break checked: a tool whose parameters use `$defs`/`$ref` (any nested pydantic model) got a 400,
    "failed to compile JSON schema: Pointer '/$defs/Leg' does not exist": the call grammar nested the
    parameters under "arguments" and left their refs pointing at the document root. One tool among two
    (the grammar's anyOf) and the only tool (with_structured_output's function calling) are both served."""
    model = chat(server, max_tokens=160, temperature=1.0, seed=2)
    msg = model.bind_tools([get_weather, Trip], tool_choice="Trip", parallel_tool_calls=False).invoke("Plan a trip.")
    (call,) = msg.tool_calls
    assert call["name"] == "Trip"
    trip = Trip.model_validate(call["args"])
    assert 1 <= len(trip.legs) <= 2
    out = model.with_structured_output(Trip, method="function_calling", include_raw=True).invoke("Plan a trip.")
    assert out["parsing_error"] is None and isinstance(out["parsed"], Trip)


def test_responses_api_mode(server):
    """ChatOpenAI(use_responses_api=True), what LangChain switches to for OpenAI's newer features: the same
    greedy text through /v1/responses, streamed too, its incomplete status for a max_output_tokens cut, and
    a forced tool call parsed from a function_call item."""
    model = chat(server, use_responses_api=True, extra_body={"ignore_eos": True})
    msg = model.invoke(QUESTION)
    assert msg.text == sdk_reference(server)
    assert msg.response_metadata["status"] == "incomplete" and msg.usage_metadata["output_tokens"] == 8
    assert "".join(c.text for c in model.stream(QUESTION)) == msg.text
    tools = chat(server, use_responses_api=True, max_tokens=96, temperature=1.0, extra_body={"seed": 3}).bind_tools(
        [get_weather], tool_choice="get_weather")
    (call,) = tools.invoke([HumanMessage("Weather in Paris?")]).tool_calls
    assert call["name"] == "get_weather" and Forecast.model_validate(call["args"])


def test_bad_requests_raise_the_sdk_4xx_errors(server):
    with pytest.raises(openai.NotFoundError) as e:
        langchain_openai.ChatOpenAI(model="no-such-model", base_url=server.base_url + "/v1", api_key="unused",
                                    max_retries=0).invoke("hi")
    assert e.value.status_code == 404
    with pytest.raises(ContextOverflowError) as e:  # LangChain's own class (a BadRequestError too)
        chat(server, max_tokens=100_000).invoke(QUESTION)  # over the 1024-token window
    assert isinstance(e.value, openai.BadRequestError)
    assert e.value.status_code == 400 and e.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as e:
        chat(server, extra_body={"top_k": "many"}).invoke(QUESTION)
    assert e.value.status_code == 400 and "top_k" in str(e.value)
