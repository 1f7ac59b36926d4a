"""A tool call an earlier assistant turn made reaches the chat template in one shape whichever API sent it
back (chat completions, Responses items, Anthropic messages): HF conventions, arguments as an object when
their text is a JSON object, any other text kept as it came."""
from __future__ import annotations

import msgspec
import pytest

from modelcall.plugins.http.anthropic_messages import template_messages as anthropic_messages
from modelcall.plugins.http.openai_chat import template_messages as chat_messages
from modelcall.plugins.http.responses_items import normalize_input, to_messages
from modelcall.plugins.http.schemas_anthropic import InputMessage
from modelcall.plugins.http.schemas_openai import Message
from modelcall.plugins.http.tool_calls import template_call


@pytest.mark.parametrize("text, seen", [
    ('{"city": "Paris", "days": 2}', {"city": "Paris", "days": 2}),
    ("{}", {}),
    ('["not", "an object"]', '["not", "an object"]'),   # a template iterating .items() must not get a list
    ("{truncated", "{truncated"),                        # what the model wrote, not an error
])
def test_a_calls_arguments_are_an_object_when_their_text_is_one(text, seen):
    assert template_call("c1", "weather", text) == {
        "id": "c1", "type": "function", "function": {"name": "weather", "arguments": seen}}


def test_the_three_front_ends_give_the_template_the_same_call():
    args = '{"city": "Paris"}'
    chat = chat_messages(msgspec.convert([
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "weather", "arguments": args}}]},
    ], list[Message]))
    responses = to_messages(normalize_input([
        {"type": "message", "role": "user", "content": "weather?"},
        {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": args},
    ]), None)
    anthropic = anthropic_messages(None, msgspec.convert([
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "c1", "name": "weather",
                                           "input": {"city": "Paris"}}]},
    ], list[InputMessage]))
    want = {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}}
    for messages in (chat, responses, anthropic):
        assert messages[0] == {"role": "user", "content": "weather?"}
        assert messages[1]["role"] == "assistant" and messages[1]["tool_calls"] == [want], messages
