"""LiteLLM's SDK against a live server through the providers its users point at a self-hosted engine:
`openai/` and `hosted_vllm/` (chat completions) and `anthropic/` (Messages): whole and streamed text with
usage and finish reasons, forced tool calls whole and streamed (reassembled by `stream_chunk_builder`),
text completions, and errors as LiteLLM's own classes. A context overflow must be LiteLLM's
ContextWindowExceededError (what its routers' context-window fallbacks catch): LiteLLM knows it by
OpenAI's wording of the message, so the server words it that way."""
from __future__ import annotations

import asyncio
import json
import os

import jsonschema
import openai
import pytest
from http_server import ServerThread

# NOTE: before litellm is imported: its model price map is read from the package, never fetched.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
import litellm  # noqa: E402  (the test extra: a missing package is an error, not a skip)
# Async SDK clients these tests leave open are collected at the end of the module (conftest).
pytestmark = pytest.mark.usefixtures("free_unclosed_async_clients")

MODEL = "demo-model-1"
MSG = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say something about Paris."}]
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather forecast",
                                           "parameters": WEATHER}}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture(scope="module")
def server(demo_model_dir):
    with ServerThread(dtype="float32", max_model_len=1024, num_kv_blocks=256) as s:
        yield s


def call(server, provider: str = "openai", **kw):
    base = server.base_url if provider == "anthropic" else server.base_url + "/v1"
    kw = {"max_tokens": 8, "temperature": 0.0, "messages": MSG, **kw}
    return litellm.completion(model=f"{provider}/{MODEL}", api_base=base, api_key="unused", num_retries=0, **kw)


@pytest.fixture(scope="module")
def reference(server) -> str:
    """The greedy answer through the openai SDK: what LiteLLM must hand back."""
    oai = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
    r = oai.chat.completions.create(model=MODEL, max_tokens=8, temperature=0.0, messages=MSG,
                                    extra_body={"ignore_eos": True})
    return r.choices[0].message.content


@pytest.mark.parametrize("provider", ["openai", "hosted_vllm", "anthropic"])
def test_completion_returns_the_servers_text_usage_and_finish_reason(server, reference, provider):
    r = call(server, provider, extra_body={"ignore_eos": True})
    assert r.choices[0].message.content == reference and reference
    assert r.choices[0].finish_reason == "length"  # anthropic's max_tokens mapped back by LiteLLM
    assert r.usage.completion_tokens == 8 and r.usage.prompt_tokens > 5
    assert r.usage.total_tokens == r.usage.prompt_tokens + 8


@pytest.mark.parametrize("provider", ["openai", "hosted_vllm", "anthropic"])
def test_stream_adds_up_to_the_whole_answer_with_usage(server, reference, provider):
    chunks = list(call(server, provider, stream=True, stream_options={"include_usage": True},
                       extra_body={"ignore_eos": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == reference
    built = litellm.stream_chunk_builder(chunks, messages=MSG)
    assert built.choices[0].message.content == reference and built.choices[0].finish_reason == "length"
    assert built.usage.completion_tokens == 8


@pytest.mark.parametrize("provider", ["openai", "hosted_vllm", "anthropic"])
@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
def test_forced_tool_call_parses_and_validates(server, provider, streamed):
    kw = {"tools": TOOLS, "tool_choice": "required" if provider != "hosted_vllm" else NAMED,
          "max_tokens": 96, "temperature": 1.0, "messages": [{"role": "user", "content": "Weather in Paris?"}]}
    # one call asked of every provider: LiteLLM sends Anthropic's as tool_choice.disable_parallel_tool_use (without
    # it "any" allows several, and at temperature 1 the demo model sometimes made two)
    kw["parallel_tool_calls"] = False
    r = call(server, provider, stream=streamed, **kw)
    if streamed:
        r = litellm.stream_chunk_builder(list(r), messages=kw["messages"])
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    (tc,) = choice.message.tool_calls
    assert tc.function.name == "get_weather" and tc.id
    jsonschema.validate(json.loads(tc.function.arguments), WEATHER)


def test_tool_result_round_trip(server):
    first = call(server, tools=TOOLS, tool_choice=NAMED, max_tokens=96, temperature=1.0,
                 messages=[{"role": "user", "content": "Weather in Rome?"}])
    tc = first.choices[0].message.tool_calls[0]
    history = [{"role": "user", "content": "Weather in Rome?"}, first.choices[0].message.model_dump(),
               {"role": "tool", "tool_call_id": tc.id, "content": "sunny"}]
    second = call(server, tools=TOOLS, messages=history)
    assert second.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert second.usage.prompt_tokens > first.usage.prompt_tokens


def test_text_completion_and_async(server):
    r = litellm.text_completion(model=f"openai/{MODEL}", prompt="def add(a, b):", max_tokens=6, temperature=0.0,
                                api_base=server.base_url + "/v1", api_key="unused", extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 6 and r.choices[0].text

    async def go():
        return await litellm.acompletion(model=f"openai/{MODEL}", messages=MSG, max_tokens=8, temperature=0.0,
                                         api_base=server.base_url + "/v1", api_key="unused",
                                         extra_body={"ignore_eos": True})

    assert asyncio.run(go()).usage.completion_tokens == 8


@pytest.mark.parametrize("provider", ["openai", "hosted_vllm", "anthropic"])
@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
def test_context_overflow_is_litellms_context_window_error(server, provider, streamed):
    """Break checked: with the server's own wording ("context window is N tokens; ...") LiteLLM raised a
    plain BadRequestError on every provider, so a router's context-window fallback never ran."""
    with pytest.raises(litellm.ContextWindowExceededError) as e:
        r = call(server, provider, max_tokens=100_000, stream=streamed)
        list(r) if streamed else None
    assert e.value.status_code == 400


def test_other_errors_are_litellms_4xx_classes(server):
    with pytest.raises(litellm.NotFoundError):
        litellm.completion(model="openai/no-such-model", messages=MSG, api_base=server.base_url + "/v1",
                           api_key="unused", num_retries=0)
    with pytest.raises(litellm.BadRequestError) as e:
        call(server, extra_body={"top_k": "many"})
    assert e.value.status_code == 400 and "top_k" in str(e.value)
    assert not isinstance(e.value, litellm.ContextWindowExceededError)
