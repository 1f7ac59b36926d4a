"""The Hugging Face tokenizer stage: exact incremental detokenization, chat template, clear errors."""
from __future__ import annotations

import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from modelcall.core import InvalidRequest, KernelConfig, PluginHost
from modelcall.core.stages import IncrementalDetokenizer, Tokenizer
from modelcall.plugins.tokenizer_hf import ByteLevelDetokenizer, HFTokenizer, WindowDetokenizer

TEXT = st.lists(st.one_of(
    st.characters(min_codepoint=0x20, max_codepoint=0x7E),
    st.sampled_from("你好世界中文字符，。！日本語한국어éüß✓\n\t "),
    st.sampled_from(["🎉", "👨‍👩‍👧", "🇫🇷", "🙂", "𝔘"]),
    st.sampled_from(["<think>", "</think>", "<tool_call>", "<|im_end|>", "<|im_start|>"]),
), max_size=40).map("".join)


@pytest.fixture(scope="module")
def tok(demo_model_dir) -> HFTokenizer:
    return HFTokenizer(demo_model_dir)


@pytest.fixture(scope="module")
def sp_tok(tmp_path_factory) -> HFTokenizer:
    return HFTokenizer(_sentencepiece_style_tokenizer(str(tmp_path_factory.mktemp("sp"))))


def _sentencepiece_style_tokenizer(path: str) -> str:
    """A Llama-2-style tokenizer (Metaspace, byte fallback): not byte-level, so the window path."""
    from tokenizers import Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}}
    for ch in "▁abcdefghijklmnopqrstuvwxyz,.你好世界":
        vocab.setdefault(ch, len(vocab))
    merges = [("▁", "h"), ("▁h", "e"), ("l", "l"), ("▁he", "ll"), ("▁hell", "o"), ("▁", "w"), ("o", "r"),
              ("▁w", "or"), ("▁wor", "l"), ("▁worl", "d"), ("你", "好"), ("▁", "你好")]
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True, unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>").save_pretrained(path)
    return path


def _incremental(detok, ids, chunks) -> list[str]:
    pieces, i = [], 0
    for n in chunks:
        if i >= len(ids):
            break
        pieces.append(detok.push(ids[i:i + n]))
        i += n
    if i < len(ids):
        pieces.append(detok.push(ids[i:]))
    return pieces + [detok.flush()]


def test_satisfies_the_tokenizer_protocol(tok):
    assert isinstance(tok, Tokenizer)
    assert isinstance(tok.detokenizer([]), IncrementalDetokenizer)
    assert isinstance(tok.detokenizer([]), ByteLevelDetokenizer)  # the demo tokenizer is byte-level
    assert tok.vocab_size == 2048
    assert tok.eos_token_ids == {tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")}
    assert tok.think_token_ids == (tok.token_to_id("<think>"), tok.token_to_id("</think>"))


@settings(max_examples=150, deadline=None)
@given(text=TEXT, chunks=st.lists(st.integers(1, 4), max_size=60), skip=st.booleans())
def test_incremental_text_equals_one_shot_decode(tok, text, chunks, skip):
    ids = tok.encode(text)
    one_shot = tok.decode(ids, skip_special_tokens=skip)
    for detok in (tok.detokenizer([], skip_special_tokens=skip), WindowDetokenizer(tok.backend, [], skip)):
        pieces = _incremental(detok, ids, chunks)
        assert "".join(pieces) == one_shot
        assert not any("\ufffd" in p for p in pieces)  # valid text: never half a character
    if not skip:
        assert one_shot == unicodedata.normalize("NFC", text)  # byte-level: everything round-trips


@settings(max_examples=300, deadline=None)
@given(ids=st.lists(st.one_of(st.integers(0, 2047), st.integers(0, 264)), max_size=40),  # < 265: specials, single bytes
       chunks=st.lists(st.integers(1, 5), max_size=40), skip=st.booleans())
def test_arbitrary_token_sequences_decode_the_same_incrementally(tok, ids, chunks, skip):
    # Random ids are mostly broken UTF-8; the replacement characters must still match one-shot decode.
    one_shot = tok.decode(ids, skip_special_tokens=skip)
    assert "".join(_incremental(tok.detokenizer([], skip_special_tokens=skip), ids, chunks)) == one_shot
    assert "".join(_incremental(WindowDetokenizer(tok.backend, [], skip), ids, chunks)) == one_shot


@settings(max_examples=150, deadline=None)
@given(text=TEXT, chunks=st.lists(st.integers(1, 4), max_size=60), skip=st.booleans())
def test_other_tokenizers_use_the_window_detokenizer_with_the_same_guarantee(sp_tok, text, chunks, skip):
    ids = sp_tok.encode(text)
    detok = sp_tok.detokenizer([], skip_special_tokens=skip)
    assert isinstance(detok, WindowDetokenizer)
    pieces = _incremental(detok, ids, chunks)
    assert "".join(pieces) == sp_tok.decode(ids, skip_special_tokens=skip)
    assert not any("\ufffd" in p for p in pieces)


def test_window_detokenizer_reads_the_prompt_for_the_first_tokens_leading_space(sp_tok):
    prompt, output = sp_tok.encode("hello"), sp_tok.encode("hello world")[1:]
    assert sp_tok.decode(output) == "world"  # alone, the decoder strips the leading space
    detok = sp_tok.detokenizer(prompt)
    assert "".join(detok.push([i]) for i in output) + detok.flush() == " world"


@pytest.mark.parametrize("make", [lambda t: t.detokenizer([]), lambda t: WindowDetokenizer(t.backend, [], True)])
def test_bytes_of_an_unfinished_character_are_held_until_completed_or_flushed(tok, make):
    ids = tok.encode("中🎉")
    assert len(ids) >= 4  # each character spans several byte tokens
    detok = make(tok)
    pieces = [detok.push([i]) for i in ids]
    assert [p for p in pieces if p] == ["中", "🎉"]
    detok = make(tok)
    assert [detok.push([i]) for i in ids[:2]] == ["", ""]  # the first two bytes of 中
    assert detok.flush() == "\ufffd"  # given up at the end, as one-shot decode would
    assert tok.decode(ids[:2]) == "\ufffd"


def test_skip_special_tokens_drops_control_tokens_but_keeps_tags(tok):
    ids = tok.encode("<|im_start|>hi<think>x</think><|im_end|>")
    skip = tok.detokenizer([], skip_special_tokens=True)
    keep = tok.detokenizer([], skip_special_tokens=False)
    assert "".join(_incremental(skip, ids, [1] * len(ids))) == "hi<think>x</think>"
    assert "".join(_incremental(keep, ids, [1] * len(ids))) == "<|im_start|>hi<think>x</think><|im_end|>"


def test_window_detokenizer_keeps_only_a_few_tokens(tok):
    ids = tok.encode("def f(x):\n    return x * 2  # 你好 🎉\n" * 200)
    detok = WindowDetokenizer(tok.backend, ids[:10], True)
    longest = 0
    for i in ids:
        detok.push([i])
        longest = max(longest, len(detok._ids))
    assert longest <= WindowDetokenizer.MAX_PENDING + 2


def test_chat_template_renders_tools_and_generation_prompt(tok):
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    text = tok.apply_chat_template([{"role": "user", "content": "Weather in Paris?"}], tools=tools)
    assert "<tools>\n" in text and '"name": "get_weather"' in text and "</tools>" in text
    assert text.endswith("<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n")


def test_chat_template_renders_tool_calls_results_and_thinking(tok):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "2+2?"}]},
        {"role": "assistant", "content": None, "reasoning_content": "add them",
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 2}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "4"},
    ]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, enable_thinking=False)
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
                    "<|im_start|>assistant\n<think>\nadd them\n</think>\n\n"
                    '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 2}}\n</tool_call><|im_end|>\n'
                    "<|im_start|>user\n<tool_response>\n4\n</tool_response><|im_end|>\n"
                    "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not tok.apply_chat_template(messages[:2], add_generation_prompt=False).endswith("assistant\n")


@pytest.mark.parametrize("messages", [
    [{"role": "wizard", "content": "hi"}],
    [{"content": "no role"}],
    ["just a string"],
    [],
    [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
])
def test_messages_the_template_cannot_render_are_invalid_requests_naming_messages(tok, messages):
    with pytest.raises(InvalidRequest) as e:
        tok.apply_chat_template(messages)
    assert e.value.field == "messages"


def test_template_arguments_that_change_the_output_type_are_refused(tok):
    with pytest.raises(InvalidRequest) as e:
        tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=True)
    assert e.value.field == "chat_template_kwargs"


def test_special_token_strings_in_text_encode_to_their_ids(tok):
    assert tok.encode("<|im_end|>") == [tok.token_to_id("<|im_end|>")]


def test_plugin_provides_unless_another_tokenizer_is_configured(demo_model_dir):
    from modelcall.plugins.tokenizer_hf import plugin

    host = PluginHost([plugin], load_entrypoints=False)
    provided = host.pm.hook.provide_tokenizer(config=KernelConfig(), model_dir=demo_model_dir)
    assert isinstance(provided, HFTokenizer)
    assert host.pm.hook.provide_tokenizer(config=KernelConfig(tokenizer="other"), model_dir=demo_model_dir) is None
