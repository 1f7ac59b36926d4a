"""Prebuilt token frames (plugins/http/frames.py): the bytes a stream writes are the bytes the chunk Structs
encode to, for completions and chat, one choice and several; finish reasons and usage unchanged."""
from __future__ import annotations

import msgspec
import pytest

from modelcall.plugins.http import sse
from modelcall.plugins.http.frames import TextFrame
from modelcall.plugins.http.schemas_openai import (
    ChatChunkChoice, ChatCompletionChunk, ChatDelta, Completion, CompletionChoice, encoder,
)

TEXTS = ["", "a", 'say "hi"\\ there', "tab\there\nnew line\r\x00\x1f\x7f", "é中文😀", "\u2028\u2029</script>",
         "\ue000 private \ue001", " " * 40]


def completion(t: str, i: int = 0) -> bytes:
    return encoder.encode(Completion(id="cmpl-x1", created=1700000000, model="w1",
                                     choices=[CompletionChoice(index=i, text=t, finish_reason=None)]))


def chat(t: str, i: int = 0) -> bytes:
    return encoder.encode(ChatCompletionChunk(id="chatcmpl-x1", created=1700000000, model='m "q"', choices=[
        ChatChunkChoice(index=i, delta=ChatDelta(content=t), finish_reason=None)]))


@pytest.mark.parametrize("make", [completion, chat])
@pytest.mark.parametrize("text", TEXTS)
def test_a_prebuilt_frame_is_the_structs_encoding(make, text):
    frame = TextFrame.of(make)
    assert frame is not None
    assert frame.frame(text) == sse.data_frame(make(text))


def test_no_template_when_the_marker_is_not_found_once():
    assert TextFrame.of(lambda t: b'{"a":1}') is None
    assert TextFrame.of(lambda t: encoder.encode([t, t])) is None



async def _frames(server, path: str, body: dict) -> list[bytes]:
    async with server.client.post(path, json=body) as resp:
        assert resp.status == 200
        raw = await resp.read()
    return [f + b"\n\n" for f in raw.split(b"\n\n") if f.startswith(b"data: {")]


@pytest.mark.anyio
@pytest.mark.parametrize("overlap", [False, True])
async def test_streamed_completions_frames_are_the_struct_encoding(live_server, overlap):
    async with live_server(async_scheduling=overlap) as server:
        body = {"model": server.kernel.model_name, "prompt": [11, 12, 13, 14], "max_tokens": 12, "min_tokens": 12,
                "ignore_eos": True, "temperature": 0, "stream": True, "n": 2,
                "stream_options": {"include_usage": True}}
        frames = await _frames(server, "/v1/completions", body)
    chunks = [msgspec.json.decode(f[6:], type=Completion) for f in frames]
    for f, c in zip(frames, chunks):
        assert f == sse.data_frame(encoder.encode(c))  # byte for byte what the Structs write
    texts = [c for c in chunks if c.choices and c.choices[0].text]
    assert len(texts) >= 12  # the token frames are among them (a token may decode to no text yet)
    ends = sorted((c.choices[0].index, c.choices[0].finish_reason) for c in chunks
                  if c.choices and c.choices[0].finish_reason is not None)
    assert ends == [(0, "length"), (1, "length")]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 24


@pytest.mark.anyio
async def test_streamed_chat_frames_are_the_struct_encoding(live_server):
    async with live_server() as server:
        body = {"model": server.kernel.model_name, "messages": [{"role": "user", "content": "hello there"}],
                "max_tokens": 10, "min_tokens": 10, "ignore_eos": True, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}}
        frames = await _frames(server, "/v1/chat/completions", body)
    chunks = [msgspec.json.decode(f[6:], type=ChatCompletionChunk) for f in frames]
    for f, c in zip(frames, chunks):
        assert f == sse.data_frame(encoder.encode(c))
    assert chunks[0].choices[0].delta.role == "assistant"
    content = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert content and all(c.choices[0].finish_reason is None for c in content)
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 10
