"""Reasoning: text inside <think>…</think> is `reasoning_content` (OpenAI) or a `thinking` block
(Anthropic), counted as reasoning tokens by token id, the same streamed or not."""
from __future__ import annotations

import anthropic
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from http_server import ServerThread

from modelcall.plugins.reasoning.think import ThinkParser
from modelcall.testing.scripted import ScriptedSampler

THOUGHT, ANSWER = "I should greet them warmly.", "Hello there, 你好!"
START, END = 7, 8  # the demo tokenizer's <think> and </think>


@pytest.fixture(scope="module")
def scripted():
    sampler = ScriptedSampler()
    with ServerThread(plugins=(sampler,)) as server:
        tok = server.kernel.tokenizer
        assert tuple(tok.think_token_ids) == (START, END)
        script = tok.encode(f"<think>\n{THOUGHT}\n</think>\n\n{ANSWER}")
        sampler.say(script)
        reasoning_tokens = script.index(END) + 1
        yield server, reasoning_tokens, len(script)


def test_openai_reasoning_content_whole_and_streamed(scripted):
    server, reasoning_tokens, total = scripted
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
    msgs = [{"role": "user", "content": "hi"}]
    whole = client.chat.completions.create(model=server.kernel.model_name, messages=msgs, max_tokens=64)
    message = whole.choices[0].message
    assert message.reasoning_content.strip() == THOUGHT
    assert message.content == ANSWER
    assert whole.usage.completion_tokens_details.reasoning_tokens == reasoning_tokens
    assert whole.usage.completion_tokens == total + 1  # the script, then end-of-sequence
    assert whole.choices[0].finish_reason == "stop"
    reasoning, content, usage = "", "", None
    for chunk in client.chat.completions.create(model=server.kernel.model_name, messages=msgs, max_tokens=64,
                                                stream=True, stream_options={"include_usage": True}):
        if chunk.choices:
            reasoning += getattr(chunk.choices[0].delta, "reasoning_content", None) or ""
            content += chunk.choices[0].delta.content or ""
        usage = chunk.usage or usage
    assert (reasoning, content) == (message.reasoning_content, message.content)
    assert usage.completion_tokens_details.reasoning_tokens == reasoning_tokens


def test_anthropic_thinking_blocks_whole_and_streamed(scripted):
    server, _, _ = scripted
    client = anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0)
    kw = dict(model=server.kernel.model_name, max_tokens=64, messages=[{"role": "user", "content": "hi"}])
    whole = client.messages.create(**kw)
    assert [b.type for b in whole.content] == ["thinking", "text"]
    assert whole.content[0].thinking.strip() == THOUGHT and whole.content[1].text == ANSWER
    assert whole.stop_reason == "end_turn"
    with client.messages.stream(**kw) as stream:
        kinds = [ev.content_block.type for ev in stream if ev.type == "content_block_start"]
        final = stream.get_final_message()
    assert kinds == ["thinking", "text"]
    assert [b.model_dump(exclude={"signature"}) for b in final.content] == \
           [b.model_dump(exclude={"signature"}) for b in whole.content]


# ---- the parser alone -------------------------------------------------------------------------

TOKENS = [(1, "Hi "), (START, "<think>"), (2, "\nhmm"), (3, " <not a tag>"), (END, "</think>"), (4, "\n\nYes"), (5, ".")]


def run(parser: ThinkParser, deltas: list[list[tuple[int, str]]]) -> tuple[str, str, int]:
    reasoning, answer, n = "", "", 0
    for d in deltas:
        n += sum(parser.is_reasoning(t) for t, _ in d)
        r, a = parser.feed("".join(s for _, s in d))
        reasoning, answer = reasoning + r, answer + a
    r, a = parser.finish()
    return reasoning + r, answer + a, n


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, len(TOKENS) - 1), unique=True).map(sorted))
def test_splitting_does_not_depend_on_how_tokens_are_grouped(cuts):
    bounds = [0, *cuts, len(TOKENS)]
    deltas = [TOKENS[a:b] for a, b in zip(bounds, bounds[1:])]
    assert run(ThinkParser(START, END), deltas) == ("hmm <not a tag>", "Hi Yes.", 4)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="ab<>/thinkTHINK", max_size=40), st.lists(st.integers(0, 40), max_size=6))
def test_text_split_anywhere_gives_the_same_result(text, cuts):
    whole = run(ThinkParser(START, END), [[(0, text)]])
    pieces, last = [], 0
    for c in sorted(set(min(c, len(text)) for c in cuts)):
        pieces.append([(0, text[last:c])])
        last = c
    pieces.append([(0, text[last:])])
    assert run(ThinkParser(START, END), pieces) == whole


def test_a_prompt_that_opens_thinking_starts_in_reasoning():
    assert run(ThinkParser(START, END, inside=True), [[(2, "thinking")], [(END, "</think>")], [(4, "\nanswer")]]) \
        == ("thinking", "answer", 2)


def test_the_built_in_parsers_read_the_prompt_and_the_switch(demo_model_dir):
    from modelcall.plugins.reasoning.plugin import qwen3, think, think_in_prompt
    from modelcall.plugins.tokenizer_hf import HFTokenizer

    tok = HFTokenizer(demo_model_dir)
    opened, closed, plain = tok.encode("hi<think>\n"), tok.encode("<think>\n\n</think>\n\n"), tok.encode("hi")
    assert think(tok, opened).inside and not think(tok, closed).inside and not think(tok, plain).inside
    assert think_in_prompt(tok, plain).inside and not think_in_prompt(tok, closed).inside
    assert qwen3(tok, plain, {"enable_thinking": False}) is None and qwen3(tok, plain, {}) is not None
    p = think(tok, plain)
    assert [p.is_reasoning(t) for t in tok.encode("a<think>b</think>c")] == [False, True, True, True, False]


@pytest.mark.anyio
async def test_the_configuration_picks_or_turns_off_the_reasoning_parser(make_kernel):
    from modelcall.core import ConfigError

    async with make_kernel(plugin_config={"reasoning": {"parser": "none"}}) as kernel:
        assert kernel.output_stage.reasoning.default is None
    async with make_kernel() as kernel:
        assert kernel.output_stage.reasoning.default == "qwen3"  # the demo template has the switch
    with pytest.raises(ConfigError, match="nope"):
        async with make_kernel(plugin_config={"reasoning": {"parser": "nope"}}):
            pass
