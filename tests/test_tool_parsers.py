"""Tool-call parsers on recorded outputs of each format: the whole-output parse is what the format
means, and streaming the same text in any chunking (hypothesis) gives exactly the same result."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from modelcall.core.tools import ToolParser
from modelcall.plugins.tool_parsers.hermes import HermesParser
from modelcall.plugins.tool_parsers.llama3 import Llama3JsonParser
from modelcall.plugins.tool_parsers.mistral import MistralParser
from modelcall.plugins.tool_parsers.pythonic import PythonicParser

W = {"city": "Paris", "unit": "c"}
# (parser, recorded output, expected content, expected calls as (name, arguments as a dict))
RECORDED = [
    (HermesParser, 'Let me check the weather.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
                   '"unit": "c"}}\n</tool_call>', "Let me check the weather.", [("get_weather", W)]),
    (HermesParser, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}\n</tool_call>\n'
                   '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>', "",
     [("get_weather", W), ("get_time", {})]),
    (HermesParser, '<tool_call>{"arguments": {"q": "a \\"}\\" <tool_call> \\u00e9 ü 𝄞", "n": [1, {"x": null}]}, '
                   '"name": "search"}</tool_call>', "",
     [("search", {"q": 'a "}" <tool_call> é ü 𝄞', "n": [1, {"x": None}]})]),
    (HermesParser, '<tool_call>\n{"name": "ping"}\n</tool_call>', "", [("ping", {})]),
    (HermesParser, '<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}\n</tool_call>', "",
     [("get_weather", {"city": "Paris"})]),
    (HermesParser, "I use <tool_call> tags like <tool_call>this</tool_call>.", "I use <tool_call> tags like "
                   "<tool_call>this</tool_call>.", []),
    (HermesParser, "No tools needed: 2 + 2 = 4.\n", "No tools needed: 2 + 2 = 4.\n", []),
    (HermesParser, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par', "", []),  # cut by max_tokens
    (HermesParser, 'Done.<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\nAnything else?', "Done.\nAnything else?",
     [("a", {})]),
    (Llama3JsonParser, '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "c"}}', "", [("get_weather", W)]),
    (Llama3JsonParser, '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "unit": "c"}}; '
                       '{"name": "get_time", "parameters": {}}', "", [("get_weather", W), ("get_time", {})]),
    (Llama3JsonParser, '  {"type": "function", "name": "now", "parameters": {}}', "", [("now", {})]),
    (Llama3JsonParser, 'The answer is {"a": 1}.', 'The answer is {"a": 1}.', []),
    (Llama3JsonParser, '{"answer": 42}', '{"answer": 42}', []),
    (Llama3JsonParser, '<|python_tag|>print(1)', "<|python_tag|>print(1)", []),
    (MistralParser, '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}]', "",
     [("get_weather", W)]),
    (MistralParser, 'Sure.[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}, '
                    '{"name": "get_time", "arguments": {}}]', "Sure.", [("get_weather", W), ("get_time", {})]),
    (MistralParser, "[TOOL_CALLS] sorry", "[TOOL_CALLS] sorry", []),
    (MistralParser, "Arrays look like [1, 2].", "Arrays look like [1, 2].", []),
    (PythonicParser, '[get_weather(city="Paris", unit=\'c\')]', "", [("get_weather", W)]),
    (PythonicParser, '[get_weather(city="Paris", unit="c"), get_time(), search(q="a, b) [x]", n=[1, {"k": None}], '
                     'flag=True)]', "", [("get_weather", W), ("get_time", {}),
                                        ("search", {"q": "a, b) [x]", "n": [1, {"k": None}], "flag": True})]),
    (PythonicParser, "[1, 2, 3] is a list", "[1, 2, 3] is a list", []),
    (PythonicParser, "Paris is sunny.", "Paris is sunny.", []),
    (PythonicParser, '[get_weather("Paris")]', '[get_weather("Paris")]', []),
]
IDS = [f"{c.name}-{i}" for i, (c, *_rest) in enumerate(RECORDED)]


def run(cls: type, chunks: list[str]) -> dict:
    """Feed `chunks`, check the per-delta promises, and return what the client would assemble."""
    parser: ToolParser = cls(lambda i: f"call_{i}")
    content, headers, args, completed = [], {}, {}, []
    for d in [parser.feed(c) for c in chunks] + [parser.finish()]:
        content.append(d.content)
        for delta in d.deltas:
            if delta.name is not None:
                assert delta.index not in headers, "a call's name is sent once"
                assert delta.index == len(headers), "calls are numbered in order"
                headers[delta.index] = (delta.id, delta.name)
                args[delta.index] = ""
            else:
                assert delta.index in headers, "arguments only after the call's id and name"
            args[delta.index] += delta.arguments
        completed.extend(d.completed)
    for call in completed:
        i = int(call.id.split("_")[1])
        assert headers[i] == (call.id, call.name), "a completed call was announced with its full name"
        assert args[i] == call.arguments and isinstance(json.loads(args[i]), dict)
    return {"content": "".join(content), "headers": headers, "args": args,
            "completed": [(c.name, c.arguments) for c in completed]}


@pytest.mark.parametrize(("cls", "text", "content", "calls"), RECORDED, ids=IDS)
def test_whole_output_parse(cls: type, text: str, content: str, calls: list) -> None:
    parsed = cls().parse(text)
    assert parsed.content == content
    assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == calls
    assert run(cls, [text])["completed"] == [(c.name, c.arguments) for c in parsed.tool_calls]


@pytest.mark.parametrize(("cls", "text"), [(r[0], r[1]) for r in RECORDED], ids=IDS)
def test_one_character_at_a_time_equals_whole(cls: type, text: str) -> None:
    assert run(cls, list(text)) == run(cls, [text])


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_any_chunking_equals_whole(data: st.DataObject) -> None:
    cls, text, *_ = data.draw(st.sampled_from(RECORDED))
    cuts = sorted(data.draw(st.sets(st.integers(0, len(text)), max_size=12)))
    chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    assert run(cls, chunks) == run(cls, [text])


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([HermesParser, Llama3JsonParser, MistralParser, PythonicParser]),
       st.text(alphabet='<>{}[]()",:; \n_abtolcTOLS|\\', max_size=60), st.data())
def test_arbitrary_text_never_breaks_the_promises(cls: type, text: str, data: st.DataObject) -> None:
    cuts = sorted(data.draw(st.sets(st.integers(0, len(text)), max_size=8)))
    chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    assert run(cls, chunks) == run(cls, [text])


def test_partial_tag_is_held_back_not_leaked() -> None:
    p = HermesParser()
    assert p.feed("Let me look <tool_").content == "Let me look"
    d = p.feed('call>{"name": "f"')
    assert d.content == "" and d.deltas[0].name == "f"
    assert p.feed("}").completed[0].arguments == "{}"


def test_name_is_never_sent_half_done() -> None:
    p = HermesParser()
    assert p.feed('<tool_call>{"name": "get_wea').deltas == ()
    assert p.feed('ther", "arguments": {"a"').deltas[0].name == "get_weather"


def test_text_before_a_call_stays_content() -> None:
    p = MistralParser()
    assert p.feed("Checking now. [TOOL").content == "Checking now."
    d = p.feed('_CALLS][{"name": "f", "arguments": {"x": 1}}]')
    assert d.content == "" and [c.name for c in d.completed] == ["f"]
