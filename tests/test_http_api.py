"""The OpenAI and Anthropic APIs through their official SDKs against a live server on loopback.

Greedy outputs streamed must concatenate to exactly the non-streamed ones (Chinese included);
usage, n, logprobs, stop and seeds behave as the protocols say.
"""
from __future__ import annotations

import json

import anthropic
import httpx2 as httpx
import openai
import pytest
from http_server import ServerThread

from modelcall.plugins.http.settings import ServerSettings

PROMPTS = ["Write a haiku about the sea.", "用中文介绍一下你自己，然后讲个笑话。", "naïve café ☕ — emoji 🎉 and ümlauts"]


@pytest.fixture(scope="module")
def server():
    with ServerThread(ServerSettings(port=0, max_body_bytes=64 * 1024, ping_interval_s=0.05)) as s:
        yield s


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def claude(server):
    return anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def model(oai):
    return oai.models.list().data[0].id


@pytest.mark.parametrize("prompt", PROMPTS)
def test_openai_chat_stream_concatenates_to_the_whole_answer(server, oai, model, prompt):
    msgs = [{"role": "user", "content": prompt}]
    whole = oai.chat.completions.create(model=model, messages=msgs, max_tokens=40, temperature=0)
    chunks = list(oai.chat.completions.create(model=model, messages=msgs, max_tokens=40, temperature=0, stream=True,
                                              stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole.choices[0].message.content and streamed
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == [whole.choices[0].finish_reason] == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    u, w = chunks[-1].usage, whole.usage
    assert (u.prompt_tokens, u.completion_tokens, u.total_tokens) == (w.prompt_tokens, 40, w.prompt_tokens + 40)
    assert u.completion_tokens_details.reasoning_tokens == 0
    # the streamed request repeats the whole one's prompt: every full block of it but the last token's is cached
    block = server.kernel.config.block_size
    assert u.prompt_tokens > block and u.prompt_tokens_details.cached_tokens == (u.prompt_tokens - 1) // block * block


@pytest.mark.parametrize("prompt", PROMPTS)
def test_anthropic_stream_concatenates_to_the_whole_answer(claude, model, prompt):
    kw = dict(model=model, max_tokens=40, extra_body={"temperature": 0}, system="Answer briefly.",
              messages=[{"role": "user", "content": prompt}])
    whole = claude.messages.create(**kw)
    with claude.messages.stream(**kw) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == whole.content[0].text and streamed
    assert final.stop_reason == whole.stop_reason == "max_tokens"
    assert final.usage.output_tokens == whole.usage.output_tokens == 40
    total = lambda u: u.input_tokens + (u.cache_read_input_tokens or 0)  # noqa: E731
    assert total(final.usage) == total(whole.usage)


def test_openai_completions_stream_and_token_id_prompts(oai, model):
    whole = oai.completions.create(model=model, prompt="def fibonacci(n):", max_tokens=30, temperature=0)
    chunks = list(oai.completions.create(model=model, prompt="def fibonacci(n):", max_tokens=30, temperature=0,
                                         stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].usage.completion_tokens == 30
    ids = [5, 6, 7, 100, 200, 300]
    two = oai.completions.create(model=model, prompt=[ids, ids[:3]], max_tokens=5, temperature=0)
    assert [c.index for c in two.choices] == [0, 1]
    assert two.usage.prompt_tokens == 9 and two.usage.completion_tokens == 10


def test_n_choices_with_a_seed_are_reproducible_and_differ(oai, model):
    kw = dict(model=model, messages=[{"role": "user", "content": "Tell me a story"}], max_tokens=12, n=3,
              temperature=1.0, seed=1234)
    a, b = oai.chat.completions.create(**kw), oai.chat.completions.create(**kw)
    texts = [c.message.content for c in a.choices]
    assert [c.index for c in a.choices] == [0, 1, 2]
    assert texts == [c.message.content for c in b.choices]
    assert len(set(texts)) > 1, "choice i uses seed + i, so sampled choices differ"
    assert a.usage.completion_tokens == 36
    streamed = ["", "", ""]
    for c in oai.chat.completions.create(**kw, stream=True):
        for ch in c.choices:
            streamed[ch.index] += ch.delta.content or ""
    assert streamed == texts


def test_logprobs_one_entry_per_token_with_alternatives(oai, model):
    r = oai.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=8,
                                    temperature=0, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == 8 and all(len(t.top_logprobs) == 3 for t in content)
    assert all(t.logprob <= 0 and t.logprob == pytest.approx(t.top_logprobs[0].logprob) for t in content)
    streamed = [t for c in oai.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                                                        max_tokens=8, temperature=0, logprobs=True, top_logprobs=3,
                                                        stream=True) if c.choices and c.choices[0].logprobs
                for t in c.choices[0].logprobs.content]
    assert [t.token for t in streamed] == [t.token for t in content]
    legacy = oai.completions.create(model=model, prompt="x = 1", max_tokens=4, temperature=0, logprobs=2)
    assert len(legacy.choices[0].logprobs.tokens) == 4 and len(legacy.choices[0].logprobs.top_logprobs[0]) == 2


def test_stop_strings_end_the_answer_before_them(oai, claude, model):
    msgs = [{"role": "user", "content": "Count for me"}]
    free = oai.chat.completions.create(model=model, messages=msgs, max_tokens=30, temperature=0).choices[0].message.content
    stop = free[10:13]
    cut = oai.chat.completions.create(model=model, messages=msgs, max_tokens=30, temperature=0, stop=[stop])
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].message.content == free[:free.index(stop)]
    m = claude.messages.create(model=model, max_tokens=30, extra_body={"temperature": 0}, messages=msgs,
                               stop_sequences=[stop])
    assert (m.stop_reason, m.stop_sequence) == ("stop_sequence", stop)


def test_repeated_prompt_reports_cached_tokens(oai, claude, model):
    msgs = [{"role": "user", "content": "A long shared prefix " * 20}]
    oai.chat.completions.create(model=model, messages=msgs, max_tokens=2, temperature=0)
    again = oai.chat.completions.create(model=model, messages=msgs, max_tokens=2, temperature=0)
    assert again.usage.prompt_tokens_details.cached_tokens >= 16
    m = claude.messages.create(model=model, max_tokens=2, messages=msgs)
    assert m.usage.cache_read_input_tokens >= 16
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == again.usage.prompt_tokens


def test_count_tokens_matches_the_prompt_of_a_message(claude, model, demo_model_dir):
    from transformers import PreTrainedTokenizerFast

    kw = dict(model=model, system="Be kind.", messages=[{"role": "user", "content": "你好"}])
    counted = claude.messages.count_tokens(**kw).input_tokens
    m = claude.messages.create(max_tokens=1, **kw)
    assert counted == m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0)
    # and both equal the model's own chat template rendered by transformers, not by our entry stage
    hf = PreTrainedTokenizerFast.from_pretrained(demo_model_dir, local_files_only=True)
    ids = hf.apply_chat_template([{"role": "system", "content": "Be kind."}, {"role": "user", "content": "你好"}],
                                 add_generation_prompt=True, tokenize=True, return_dict=False)
    assert counted == len(ids)


def test_anthropic_raw_stream_event_order(server, model):
    body = {"model": model, "max_tokens": 6, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    with httpx.stream("POST", server.base_url + "/v1/messages", json=body) as r:
        events = [line[len("event: "):] for line in r.iter_lines() if line.startswith("event: ")]
    assert events[0] == "message_start" and "ping" in events
    core = [e for e in events if e != "ping"]
    assert core[1] == "content_block_start" and core[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(core[2:-3]) == {"content_block_delta"}


def test_openai_raw_stream_ends_with_done(server, model):
    body = {"model": model, "max_tokens": 3, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", json=body) as r:
        lines = [line for line in r.iter_lines() if line]
    assert r.headers["content-type"].startswith("text/event-stream")
    assert lines[-1] == "data: [DONE]"
    first = json.loads(lines[0][6:])
    assert first["object"] == "chat.completion.chunk" and first["choices"][0]["delta"]["role"] == "assistant"
    assert first["choices"][0]["finish_reason"] is None


def test_models_health_ready(server, model):
    assert httpx.get(server.base_url + "/health").json() == {"status": "ok"}
    assert httpx.get(server.base_url + "/ready").json() == {"status": "ready"}
    cards = httpx.get(server.base_url + "/v1/models").json()
    assert cards["object"] == "list" and cards["data"][0]["id"] == model


def test_kernel_sampling_fields_and_max_completion_tokens(server, oai, model):
    msgs = [{"role": "user", "content": "Name three rivers"}]

    def ask(**kw):
        return oai.chat.completions.create(model=model, messages=msgs, **kw)

    def text(r) -> str:
        return r.choices[0].message.content

    greedy = ask(max_tokens=16, temperature=0, logprobs=True)
    sampled = dict(max_tokens=16, temperature=1.0, seed=11)
    assert text(ask(**sampled)) != text(greedy)   # the control: at temperature 1 this seed strays from greedy
    top1 = ask(**{**sampled, "max_tokens": 3}, max_completion_tokens=16, user="someone", extra_body={"top_k": 1})
    assert text(top1) == text(greedy)             # top_k 1 leaves only the most likely token
    assert top1.usage.completion_tokens == 16     # max_completion_tokens wins over max_tokens
    assert text(ask(**sampled, extra_body={"min_p": 1.0})) == text(greedy)   # so does min_p 1
    # repetition_penalty: greedy repeats a token; a strong penalty on seen tokens (prompt and output) does not
    tokens = [t.token for t in greedy.choices[0].logprobs.content]
    assert len(set(tokens)) < len(tokens), tokens
    penalized = ask(max_tokens=16, temperature=0, logprobs=True, extra_body={"repetition_penalty": 100.0})
    tokens = [t.token for t in penalized.choices[0].logprobs.content]
    assert len(set(tokens)) == len(tokens) == 16, tokens
    # min_tokens: a stop token greedy meets at its third token ends it there, unless min_tokens says go on
    stop_id = server.call(lambda: server.kernel.tokenizer.encode(greedy.choices[0].logprobs.content[2].token))
    assert len(stop_id) == 1
    early = ask(max_tokens=16, temperature=0, extra_body={"stop_token_ids": stop_id})
    assert (early.choices[0].finish_reason, early.usage.completion_tokens) == ("stop", 3)
    floor = ask(max_tokens=16, temperature=0, extra_body={"stop_token_ids": stop_id, "min_tokens": 16})
    assert (floor.choices[0].finish_reason, floor.usage.completion_tokens) == ("length", 16)


def test_anthropic_system_blocks_equal_a_system_string(claude, model):
    kw = dict(model=model, max_tokens=10, extra_body={"temperature": 0}, messages=[{"role": "user", "content": "hi"}])
    plain = claude.messages.create(system="You are terse. Answer now.", **kw)
    blocks = claude.messages.create(system=[{"type": "text", "text": "You are terse. "},
                                            {"type": "text", "text": "Answer now."}], **kw)
    assert blocks.content[0].text == plain.content[0].text
    assert blocks.usage.input_tokens + blocks.usage.cache_read_input_tokens == \
           plain.usage.input_tokens + plain.usage.cache_read_input_tokens


def test_anthropic_thinking_option_reaches_the_chat_template(claude, model):
    kw = dict(model=model, messages=[{"role": "user", "content": "hi"}])
    plain = claude.messages.count_tokens(**kw).input_tokens
    no_thinking = claude.messages.count_tokens(thinking={"type": "disabled"}, **kw).input_tokens
    assert no_thinking > plain  # the demo template closes an empty <think></think> when thinking is off
