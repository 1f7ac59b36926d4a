"""The xmlcall parser turns `<call name="...">{...}</call>` into tool calls, however the text is chunked."""
import pytest

import modelcall_xmlcall
from modelcall.events import ToolRequested
from modelcall.testing import ScriptedSampler

SAID = 'Let me check. <call name="get_weather">{"city": "Paris"}</call><call name="now"> </call>'
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
         {"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}}]


def stream(text: str, cuts: list[int]):
    parser = modelcall_xmlcall.XmlCallParser()
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    outs = [parser.feed(p) for p in pieces] + [parser.finish()]
    content = "".join(o.content for o in outs)
    args: dict[int, str] = {}
    names = {}
    for o in outs:
        for d in o.deltas:
            if d.name:
                names[d.index] = d.name
            args[d.index] = args.get(d.index, "") + d.arguments
    completed = [c for o in outs for c in o.completed]
    return content, names, args, completed


def test_a_whole_output_splits_into_content_and_calls():
    parsed = modelcall_xmlcall.XmlCallParser().parse(SAID)
    assert parsed.content == "Let me check. "
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("get_weather", '{"city": "Paris"}'), ("now", "{}")]


@pytest.mark.parametrize("step", [1, 2, 3, 5, 7, 11])
def test_streamed_in_any_chunks_it_says_what_the_whole_parse_says(step):
    whole = stream(SAID, [])
    assert stream(SAID, list(range(step, len(SAID), step))) == whole
    content, names, args, completed = whole
    assert names == {0: "get_weather", 1: "now"} and args == {0: '{"city": "Paris"}', 1: "{}"}
    assert [c.arguments for c in completed] == [args[0], args[1]]


def test_a_partial_tag_is_held_back_and_becomes_content_when_the_output_ends():
    parser = modelcall_xmlcall.XmlCallParser()
    assert parser.feed("x <cal").content == "x "
    assert parser.finish().content == "<cal"


def test_invalid_json_arguments_never_complete_a_call():
    parsed = modelcall_xmlcall.XmlCallParser().parse('<call name="f">{"a": </call>')
    assert parsed.tool_calls == ()


@pytest.mark.anyio
@pytest.mark.parametrize("with_plugin", [True, False])
async def test_in_a_kernel_the_calls_become_tool_requested_events(make_kernel, events, with_plugin):
    sampler = ScriptedSampler()
    plugins = [sampler, modelcall_xmlcall] if with_plugin else [sampler]
    async with make_kernel(plugins=plugins) as kernel:
        sampler.say(kernel.tokenizer.encode(SAID))
        handle = await kernel.submit(messages=[{"role": "user", "content": "Weather in Paris?"}], tools=TOOLS,
                                     tool_parser="xmlcall" if with_plugin else None, max_tokens=64)
        done = await handle.result()
    calls = [(e.name, e.arguments) for e in events.of(ToolRequested)]
    if with_plugin:
        assert done.finish_reason == "tool_calls" and done.text == "Let me check. "
        assert calls == [("get_weather", '{"city": "Paris"}'), ("now", "{}")]
    else:  # the built-in parser the demo model's template picks does not know this format
        assert done.finish_reason == "stop" and done.text == SAID and calls == []
