"""Tool calls through the kernel's output stage: markup becomes `TokensEmitted.tool_calls` deltas (never
content text), each complete call one `ToolRequested`, and the request finishes with "tool_calls"."""
from __future__ import annotations

import json

import anyio
import pytest

from modelcall.core import InvalidRequest, Kernel
from modelcall.events import Finished, TokensEmitted, ToolRequested

pytestmark = pytest.mark.anyio
CFG = dict(dtype="float32", num_kv_blocks=128, block_size=16)
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def forcing(token_ids: list[int], eos: int):
    """A logits processor that makes the model say exactly `token_ids`, then stop."""
    def fn(out: list[int], row):  # noqa: ANN001, ANN202
        want = token_ids[len(out)] if len(out) < len(token_ids) else eos
        row.fill_(float("-inf"))
        row[want] = 0.0
    return fn


async def started(kernel: Kernel) -> Kernel:
    while not kernel.ready:  # NOTE: the engine task starts on the next checkpoint after start()
        await anyio.sleep(0.01)
    return kernel


async def test_a_forced_call_streams_as_deltas_and_one_tool_requested(demo_model_dir):
    async with Kernel(model=demo_model_dir, **CFG) as kernel:
        await started(kernel)
        text = 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
        ids = kernel.tokenizer.encode(text)
        eos = min(kernel.tokenizer.eos_token_ids)
        handle = await kernel.submit(messages=[{"role": "user", "content": "weather?"}], tools=TOOLS,
                                     max_tokens=len(ids) + 4, temperature=0,
                                     logits_processors=[forcing(ids, eos)])
        content, args, names, requested, finished = "", "", [], [], None
        async with handle:
            async for ev in handle:
                if isinstance(ev, TokensEmitted):
                    content += ev.text
                    for d in ev.tool_calls or ():
                        names += [d.name] if d.name else []
                        args += d.arguments
                elif isinstance(ev, ToolRequested):
                    requested.append(ev)
                elif isinstance(ev, Finished):
                    finished = ev
    assert content == "Checking."
    assert names == ["get_weather"] and json.loads(args) == {"city": "Paris"}
    assert [(r.name, json.loads(r.arguments)) for r in requested] == [("get_weather", {"city": "Paris"})]
    assert finished is not None and finished.reason == "tool_calls"


async def test_tool_choice_none_leaves_markup_as_text_and_bad_choices_are_refused(demo_model_dir):
    async with Kernel(model=demo_model_dir, **CFG) as kernel:
        await started(kernel)
        text = '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>'
        ids = kernel.tokenizer.encode(text)
        c = await kernel.complete(messages=[{"role": "user", "content": "hi"}], tools=TOOLS, tool_choice="none",
                                  max_tokens=len(ids) + 2, temperature=0,
                                  logits_processors=[forcing(ids, min(kernel.tokenizer.eos_token_ids))])
        assert c.text == text and c.finish_reason == "stop"
        for bad, field in [({"type": "function", "function": {"name": "nope"}}, "tool_choice"),
                           ("sometimes", "tool_choice")]:
            with pytest.raises(InvalidRequest) as e:
                await kernel.submit(messages=[{"role": "user", "content": "hi"}], tools=TOOLS, tool_choice=bad,
                                    max_tokens=8)
            assert e.value.field == field
        with pytest.raises(InvalidRequest) as e:
            await kernel.submit(prompt="hi", response_format={"type": "xml"}, max_tokens=8)
        assert e.value.field == "response_format"
