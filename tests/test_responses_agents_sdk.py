"""Must-show: the OpenAI Agents SDK with its DEFAULT model class (OpenAIResponsesModel, the Responses
API) runs a function-tool agent against a live server, whole and streamed. On the random-weight demo
model the first turn forces the tool (tool_choice required); the SDK runs the tool on the client and,
with tool_use_behavior "stop_on_first_tool", the tool's result is the agent's final output."""
from __future__ import annotations

import asyncio
import json
from typing import Annotated

import jsonschema
import pytest
from agents import (
    Agent, ModelSettings, RunConfig, Runner, function_tool, set_default_openai_client, set_tracing_disabled,
)
from agents.models.openai_responses import OpenAIResponsesModel
from agents.models.openai_provider import OpenAIProvider
from http_server import ServerThread
from openai import AsyncOpenAI
from pydantic import Field

from modelcall.core import hookimpl
from modelcall.events import RequestAdmitted
from modelcall.plugins.http.settings import ServerSettings
from modelcall.testing.collector import EventCollector

CALLS: list[dict] = []


@function_tool
def get_weather(city: Annotated[str, Field(max_length=12)], days: Annotated[int, Field(ge=1, le=7)]) -> str:
    """The weather forecast for a city.

    Args:
        city: the city's name
        days: how many days ahead
    """
    CALLS.append({"city": city, "days": days})
    return f"forecast:{len(CALLS)}"


@pytest.fixture(scope="module")
def collector():
    return EventCollector()


@pytest.fixture(scope="module")
def server(collector):
    with ServerThread(ServerSettings(port=0), plugins=(collector,), max_model_len=2048, num_kv_blocks=1024) as s:
        yield s


def _agent() -> Agent:
    return Agent(name="weather", instructions="Answer with the weather tool.", tools=[get_weather],
                 model="demo-model-1", tool_use_behavior="stop_on_first_tool",
                 model_settings=ModelSettings(tool_choice="required", parallel_tool_calls=False, max_tokens=160, temperature=1.0,
                                              extra_body={"seed": 7}))


def _run(server, streamed: bool):
    async def go():
        client = AsyncOpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
        set_default_openai_client(client, use_for_tracing=False)
        set_tracing_disabled(True)
        config = RunConfig(model_provider=OpenAIProvider(openai_client=client))
        model = config.model_provider.get_model("demo-model-1")
        assert type(model) is OpenAIResponsesModel  # the SDK's default, nothing set to avoid it
        if not streamed:
            return await Runner.run(_agent(), "Weather in Paris for two days?", run_config=config), []
        run = Runner.run_streamed(_agent(), "Weather in Paris for two days?", run_config=config)
        kinds = [getattr(ev, "data", None) and getattr(ev.data, "type", None) async for ev in run.stream_events()]
        await client.close()
        return run, kinds

    return asyncio.run(go())


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
def test_agents_sdk_default_model_runs_a_function_tool_agent(server, collector, streamed):
    CALLS.clear()
    before = len(collector.of(RequestAdmitted))
    result, kinds = _run(server, streamed)
    assert len(CALLS) == 1  # the SDK ran the tool the model called through /v1/responses
    schema = get_weather.params_json_schema
    jsonschema.validate(CALLS[0], schema)
    assert result.final_output == "forecast:1"
    calls = [i for i in result.new_items if i.type == "tool_call_item"]
    outputs = [i for i in result.new_items if i.type == "tool_call_output_item"]
    assert len(calls) == 1 and len(outputs) == 1
    assert calls[0].raw_item.call_id == outputs[0].raw_item["call_id"]
    assert json.loads(calls[0].raw_item.arguments) == CALLS[0]
    assert len(collector.of(RequestAdmitted)) == before + 1  # one model request, made through /v1/responses
    if streamed:
        assert "response.function_call_arguments.delta" in kinds and kinds.count("response.completed") == 1


class _Clock:
    """A plugin hosting one Python tool on the server (label "py")."""

    modelcall_plugin_name = "test.agents_clock"

    def __init__(self) -> None:
        self.calls = 0

    @hookimpl
    def register_server_tools(self, register):
        def clock(zone: str = "UTC") -> str:
            """The time in a zone."""
            self.calls += 1
            return f"12:00 {zone}"

        register(clock, server_label="py")


def test_agents_sdk_hosted_mcp_tool_runs_on_the_server():
    """The SDK's HostedMCPTool: the server runs the call inside the model request (a scripted model writes
    the call; with max_tool_calls 1 the second pass is offered no tool and answers), the SDK only reads
    the mcp_call item."""
    from agents import HostedMCPTool

    from modelcall.testing.scripted import ScriptedSampler

    sampler, clock = ScriptedSampler(), _Clock()
    with ServerThread(ServerSettings(port=0), plugins=(sampler, clock), max_model_len=2048, num_kv_blocks=512) as s:
        sampler.say(s.kernel.tokenizer.encode('<tool_call>\n{"name": "py__clock", "arguments": {"zone": "CET"}}\n'
                                              '</tool_call>'))

        async def go():
            client = AsyncOpenAI(base_url=s.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
            set_tracing_disabled(True)
            agent = Agent(name="clock", instructions="Tell the time.", model="demo-model-1", tools=[HostedMCPTool(
                tool_config={"type": "mcp", "server_label": "py", "server_url": "unused", "require_approval": "never"})],
                model_settings=ModelSettings(max_tokens=200, extra_body={"max_tool_calls": 1}))
            result = await Runner.run(agent, "What time is it?",
                                      run_config=RunConfig(model_provider=OpenAIProvider(openai_client=client)))
            await client.close()
            return result

        result = asyncio.run(go())
    assert clock.calls == 1
    [raw] = result.raw_responses
    assert [o.type for o in raw.output] == ["mcp_list_tools", "mcp_call", "message"]
    call = raw.output[1]
    assert (call.server_label, call.name, call.output, call.status) == ("py", "clock", "12:00 CET", "completed")
    assert any(getattr(i.raw_item, "type", None) == "mcp_call" for i in result.new_items)
    assert result.final_output  # the second pass's answer
