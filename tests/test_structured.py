"""Constrained decoding with the llguidance backend on the random-weight demo model: every
response_format / forced tool_choice output is valid, whitespace is bounded, strings hold no raw
control characters, and masks are computed ahead of the sampler."""
from __future__ import annotations

import json

import anyio
import jsonschema
import pytest

from modelcall.core import InvalidRequest, Kernel
from modelcall.events import ToolRequested

pytestmark = pytest.mark.anyio
CFG = dict(dtype="float32", num_kv_blocks=512, block_size=16)
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16},
                                            "unit": {"enum": ["c", "f"]},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 14}},
           "required": ["city", "unit", "days"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}]
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 24},
                                           "score": {"type": "integer", "minimum": 0, "maximum": 100},
                                           "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}},
          "required": ["answer", "score", "tags"], "additionalProperties": False}
MSG = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture
async def kernel(demo_model_dir):
    async with Kernel(model=demo_model_dir, **CFG) as k:
        while not k.ready:
            await anyio.sleep(0.01)
        yield k


async def test_json_schema_responses_all_validate(kernel):
    fmt = {"type": "json_schema", "json_schema": {"name": "r", "schema": SCHEMA, "strict": True}}
    results = [None] * 16

    async def one(i: int) -> None:
        results[i] = await kernel.complete(messages=MSG, response_format=fmt, max_tokens=64, temperature=1.0, seed=i)
    async with anyio.create_task_group() as tg:
        for i in range(16):
            tg.start_soon(one, i)
    for c in results:
        assert c.finish_reason == "stop", c
        jsonschema.validate(json.loads(c.text), SCHEMA)
        assert "\n" not in c.text and "  " not in c.text  # compact: one space after ':' and ','


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
async def test_forced_tool_choice_gives_a_schema_valid_call_of_an_allowed_tool(kernel, choice):
    for seed in range(8):
        handle = await kernel.submit(messages=MSG, tools=TOOLS, tool_choice=choice, parallel_tool_calls=False,
                                     max_tokens=96, temperature=1.0, seed=seed)
        calls, finished = [], None
        async with handle:
            async for ev in handle:
                if isinstance(ev, ToolRequested):
                    calls.append(ev)
                finished = ev
        assert finished.reason == "tool_calls" and len(calls) == 1
        call = calls[0]
        if isinstance(choice, dict):
            assert call.name == "get_weather"
        schema = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}[call.name]
        jsonschema.validate(json.loads(call.arguments), schema)


async def test_masks_are_prefetched_not_computed_on_the_sampler_path(kernel):
    fmt = {"type": "json_object"}
    handle = await kernel.submit(prompt="{", response_format=fmt, max_tokens=40, temperature=1.0, seed=3)
    proc = kernel.tools.backend.prefetch.active[handle.request_id]
    async with handle:
        c = await handle.result()
    assert c.usage.completion_tokens >= 2
    assert proc.inline_masks == 0, f"{proc.inline_masks} of {c.usage.completion_tokens} masks computed inline"


def test_json_whitespace_is_bounded_and_strings_admit_no_control_characters(demo_model_dir):
    from modelcall.core.constraints import ConstraintSpec
    from modelcall.plugins.structured.backend import LLGuidanceBackend
    from modelcall.plugins.tokenizer_hf.tokenizer import HFTokenizer

    tok = HFTokenizer(demo_model_dir)
    backend = LLGuidanceBackend(tok, demo_model_dir)
    try:
        def allowed_after(text: str) -> list[str]:
            import torch
            spec = ConstraintSpec(kind="json", schema={"type": "object"})
            proc = backend.logits_processor(spec, text, tok.eos_token_ids)
            row = torch.zeros(tok.vocab_size)
            proc(tok.encode(text), row)
            return [tok.decode([i], skip_special_tokens=False) for i in range(tok.vocab_size) if row[i] == 0]
        assert not [t for t in allowed_after("{") if t.strip() == "" or t.startswith((" ", "\n"))]
        inside = allowed_after('{"k": "ab')
        assert inside and not [t for t in inside if any(ord(ch) < 0x20 for ch in t)]
        assert not [t for t in allowed_after('{"k": 1') if t[:1].isspace()]
    finally:
        backend.prefetch.close()


async def test_unenforceable_requests_are_refused_naming_the_field(kernel):
    with pytest.raises(InvalidRequest) as e:
        await kernel.submit(messages=MSG, response_format={"type": "json_schema", "json_schema": {"name": "x"}})
    assert e.value.field == "response_format"
    with pytest.raises(InvalidRequest) as e:
        await kernel.submit(messages=MSG, tools=TOOLS, tool_choice="required", tool_parser="pythonic")
    assert e.value.field == "tool_choice"


async def test_parallel_calls_by_default_are_each_complete_and_valid(kernel):
    for seed in range(6):
        handle = await kernel.submit(messages=MSG, tools=TOOLS, tool_choice="required", max_tokens=256,
                                     temperature=1.0, seed=seed)
        calls, finished = [], None
        async with handle:
            async for ev in handle:
                if isinstance(ev, ToolRequested):
                    calls.append(ev)
                finished = ev
        assert finished.reason == "tool_calls" and calls
        for call in calls:
            schema = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}[call.name]
            jsonschema.validate(json.loads(call.arguments), schema)
