"""pydantic-ai's `OpenAIChatModel` (its default for OpenAI-compatible servers: chat completions) against a live
server: a text agent whole and streamed with its usage, function tools run by the agent loop, structured
`output_type` through its output tool and through `NativeOutput` (response_format json_schema), and
server errors mapped to pydantic-ai's own error classes (context overflow, unknown model), never a 500."""
from __future__ import annotations

import asyncio
from typing import Literal

import jsonschema
import openai
import pytest
from http_server import ServerThread
from pydantic import BaseModel, Field

import pydantic_ai  # noqa: E402  (the test extra: a missing package is an error, not a skip)
from pydantic_ai import Agent, ModelSettings, NativeOutput  # noqa: E402
from pydantic_ai.capabilities import AbstractCapability  # noqa: E402
from pydantic_ai.messages import ToolCallPart, ToolReturnPart  # noqa: E402
from pydantic_ai.models.openai import OpenAIChatModel  # noqa: E402
from pydantic_ai.providers.openai import OpenAIProvider  # noqa: E402
# Async SDK clients these tests leave open are collected at the end of the module (conftest).
pytestmark = pytest.mark.usefixtures("free_unclosed_async_clients")

MODEL = "demo-model-1"


class Weather(BaseModel):
    """A weather report."""

    city: str = Field(max_length=12)
    unit: Literal["celsius", "fahrenheit"]
    days: int = Field(ge=1, le=7)


class Leg(BaseModel):
    city: str = Field(max_length=12)
    days: int = Field(ge=1, le=7)


class Trip(BaseModel):
    """A trip: a nested model, so its schema has `$defs` and `$ref`."""

    legs: list[Leg] = Field(min_length=1, max_length=2)


@pytest.fixture(scope="module")
def server(demo_model_dir):
    with ServerThread(dtype="float32", max_model_len=1024, num_kv_blocks=256) as s:
        yield s


def model(server, name: str = MODEL) -> OpenAIChatModel:
    client = openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=60)
    return OpenAIChatModel(name, provider=OpenAIProvider(openai_client=client))


def settings(**kw) -> ModelSettings:
    return ModelSettings(**{"max_tokens": 8, "temperature": 0.0, **kw})


def test_text_agent_returns_the_servers_text_and_usage(server):
    agent = Agent(model(server), instructions="You are terse.", model_settings=settings(extra_body={"ignore_eos": True}))
    result = agent.run_sync("Say something about Paris.")
    oai = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
    ref = oai.chat.completions.create(model=MODEL, max_completion_tokens=8, temperature=0.0,
                                      messages=[{"role": "system", "content": "You are terse."},
                                                {"role": "user", "content": "Say something about Paris."}],
                                      extra_body={"ignore_eos": True})
    assert result.output == ref.choices[0].message.content and result.output
    usage = result.usage
    assert usage.requests == 1 and usage.output_tokens == 8 and usage.input_tokens == ref.usage.prompt_tokens
    response = result.all_messages()[-1]
    assert response.model_name == MODEL and response.finish_reason == "length"


def test_streamed_text_equals_the_whole_answer(server):
    def agent() -> Agent:  # one client per event loop: run_sync and asyncio.run each start their own
        return Agent(model(server), instructions="You are terse.", model_settings=settings(extra_body={"ignore_eos": True}))

    whole = agent().run_sync("Say something about Paris.").output

    async def go():
        async with agent().run_stream("Say something about Paris.") as run:
            deltas = [d async for d in run.stream_text(delta=True, debounce_by=None)]
            return deltas, run.usage

    deltas, usage = asyncio.run(go())
    assert len(deltas) > 1 and "".join(deltas) == whole
    assert usage.output_tokens == 8  # pydantic-ai asks for stream_options.include_usage and reads it


class ForecastFirst(AbstractCapability):
    """Force the function tool on the first step only, pydantic-ai's documented way to vary tool_choice."""

    def get_model_settings(self):
        return lambda ctx: ModelSettings(tool_choice=["get_forecast"]) if ctx.run_step <= 1 else ModelSettings()


def test_function_tool_agent_runs_the_tool_and_returns_its_output_type(server):
    """Output type Weather: the first step is forced to the function tool (a named tool_choice), later ones
    to pydantic-ai's output tool (tool_choice required over the output tools); constrained decoding keeps
    every call valid, so the loop runs get_forecast once and ends on the output tool."""
    calls: list[dict] = []
    agent = Agent(model(server), output_type=Weather, capabilities=[ForecastFirst()],
                  model_settings=settings(max_tokens=96, temperature=1.0, seed=4))

    @agent.tool_plain
    def get_forecast(city: str, days: int) -> str:
        """The forecast for a city, `days` days ahead."""
        calls.append({"city": city, "days": days})
        return f"sunny in {city}"

    result = agent.run_sync("Weather in Paris for two days?")
    assert isinstance(result.output, Weather)
    parts = [p for m in result.all_messages() for p in m.parts]
    asked = [p for p in parts if isinstance(p, ToolCallPart) and p.tool_name == "get_forecast"]
    returned = [p for p in parts if isinstance(p, ToolReturnPart) and p.tool_name == "get_forecast"]
    assert len(calls) == len(asked) == len(returned) >= 1  # the agent ran the tool the server's model called
    assert all(isinstance(c["city"], str) and isinstance(c["days"], int) for c in calls)
    assert [p.tool_call_id for p in asked] == [p.tool_call_id for p in returned]
    assert result.usage.requests == len(calls) + 1 and result.usage.tool_calls == len(calls)


def test_nested_output_type_through_the_output_tool(server):
    """Break checked: a nested output type got a 400 ("Pointer '/$defs/Leg' does not exist") before the
    call grammar rebased the tool schema's refs."""
    agent = Agent(model(server), output_type=Trip, model_settings=settings(max_tokens=160, temperature=1.0, seed=6))
    result = agent.run_sync("Plan a trip.")
    assert isinstance(result.output, Trip) and 1 <= len(result.output.legs) <= 2
    assert result.usage.requests == 1


def test_native_output_uses_response_format_json_schema(server):
    agent = Agent(model(server), output_type=NativeOutput(Weather),
                  model_settings=settings(max_tokens=96, temperature=1.0, seed=9))
    result = agent.run_sync("Weather in Oslo, as JSON.")
    assert isinstance(result.output, Weather)
    jsonschema.validate(result.output.model_dump(), Weather.model_json_schema())
    assert result.usage.requests == 1  # valid on the first try: the grammar held, no retry round


def test_streamed_structured_output_validates(server):
    agent = Agent(model(server), output_type=Weather, model_settings=settings(max_tokens=96, temperature=1.0, seed=2))

    async def go():
        async with agent.run_stream("Weather in Rome?") as run:
            return await run.get_output()

    assert isinstance(asyncio.run(go()), Weather)


def test_responses_model_runs_text_and_output_tool(server):
    """OpenAIResponsesModel, pydantic-ai's class for the Responses API: the same greedy text, and an output
    tool through a forced function_call."""
    from pydantic_ai.models.openai import OpenAIResponsesModel

    client = openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=60)
    responses = OpenAIResponsesModel(MODEL, provider=OpenAIProvider(openai_client=client))
    chat_text = Agent(model(server), model_settings=settings(extra_body={"ignore_eos": True})).run_sync("Hello.").output
    text = Agent(responses, model_settings=settings(extra_body={"ignore_eos": True})).run_sync("Hello.")
    assert text.output == chat_text and text.usage.output_tokens == 8
    client = openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=60)
    responses = OpenAIResponsesModel(MODEL, provider=OpenAIProvider(openai_client=client))
    out = Agent(responses, output_type=Weather, model_settings=settings(max_tokens=96, temperature=1.0, seed=3))
    assert isinstance(out.run_sync("Weather in Rome?").output, Weather)


def test_errors_map_to_pydantic_ai_error_classes(server):
    from pydantic_ai import ModelContextWindowExceededError, ModelHTTPError

    too_long = Agent(model(server), model_settings=settings(max_tokens=100_000))
    with pytest.raises(ModelContextWindowExceededError) as e:
        too_long.run_sync("hello")
    assert e.value.status_code == 400
    with pytest.raises(ModelHTTPError) as e:
        Agent(model(server, "no-such-model"), model_settings=settings()).run_sync("hello")
    assert e.value.status_code == 404
