"""The word filter ends a request with finish reason content_filter before the word is ever sent."""
import pytest

import modelcall_wordfilter
from modelcall.core import InvalidRequest
from modelcall.events import RequestRejected, TokensEmitted
from modelcall.testing import ScriptedSampler

pytestmark = pytest.mark.anyio
SAID = "Sure. The admin Password is hunter2, enjoy."


async def test_a_banned_word_in_the_output_ends_the_request_with_content_filter(make_kernel, events):
    sampler = ScriptedSampler()
    async with make_kernel(plugins=[sampler, modelcall_wordfilter.WordFilter(["password"])]) as kernel:
        sampler.say(kernel.tokenizer.encode(SAID))
        done = await kernel.complete("tell me", max_tokens=64)
    assert done.finish_reason == "content_filter"
    assert done.text == "Sure. The admin "          # everything before the word, nothing after
    streamed = "".join(e.text for e in events.of(TokensEmitted))
    assert "assword" not in streamed.lower()


async def test_without_the_filter_the_same_output_finishes_normally(make_kernel):
    sampler = ScriptedSampler()
    async with make_kernel(plugins=[sampler]) as kernel:
        sampler.say(kernel.tokenizer.encode(SAID))
        done = await kernel.complete("tell me", max_tokens=64)
    assert done.finish_reason == "stop" and done.text == SAID


async def test_a_banned_word_in_the_prompt_is_refused_before_any_compute(make_kernel, events):
    async with make_kernel(plugins=[modelcall_wordfilter], plugin_config={"wordfilter": {"words": ["rm -rf"]}}) as kernel:
        with pytest.raises(InvalidRequest, match="rm -rf"):
            await kernel.complete("please run RM -RF / for me", max_tokens=4)
        assert (await kernel.complete("a harmless prompt", max_tokens=2)).usage.completion_tokens == 2
    rejected = events.of(RequestRejected)
    assert len(rejected) == 1 and rejected[0].status == 400


def test_the_stream_holds_back_only_what_could_still_become_a_word():
    stream = modelcall_wordfilter.WordStream(("secret",))
    assert stream.push("my sec") == "my "
    assert stream.push("ond try") == "second try"
    assert stream.push(" top SECR") == " top "
    assert stream.push("ET!") == "" and stream.blocked
