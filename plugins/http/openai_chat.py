"""POST /v1/chat/completions: OpenAI chat completions, streaming (SSE) or not, n choices."""
from __future__ import annotations

from typing import Any

import msgspec
from aiohttp import web

from modelcall.events import Finished, RequestFailed, TokensEmitted
from modelcall.plugins.http import sse
from modelcall.plugins.http.errors import ApiError, sse_error_payload
from modelcall.plugins.http.frames import TextFrame
from modelcall.plugins.http.openai_common import chat_logprobs, finish_reason, sampling_fields, usage_info
from modelcall.plugins.http.schemas_openai import (
    AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletion, ChatCompletionChunk, ChatCompletionRequest,
    ChatDelta, ChatMessage, DeveloperMessage, FunctionCall, ImagePart, Message, SystemMessage, ToolCall, ToolCallDelta,
    ToolMessage, encoder,
)
from modelcall.plugins.http.prompt_logprobs import MAX_TOP, vllm_prompt_logprobs
from modelcall.plugins.http.timing import server_timing
from modelcall.plugins.http.tool_calls import (
    openai_calls, openai_deltas, openai_options, task_id_of, template_call,
)
from modelcall.plugins.http.service import (
    Generation, ServingContext, check_outcome, close_all, events_of, read_whole, sampling_params, total_usage, unix_time,
)

RESERVED_TEMPLATE_KWARGS = {"messages", "tools", "add_generation_prompt", "tokenize", "conversation", "documents"}


async def handle(request: web.Request, ctx: ServingContext, body: ChatCompletionRequest) -> web.StreamResponse:
    model = ctx.check_model(body.model, lora=True)
    submit_kw = prompt_of(body)
    submit_kw["task_id"] = task_id_of(request)
    if body.top_logprobs is not None and not body.logprobs:
        raise ApiError(400, "top_logprobs needs logprobs set to true", param="top_logprobs")
    if body.stream and body.prompt_logprobs is not None:
        # NOTE: refused rather than computed and dropped: a streamed chat chunk has no place for them
        raise ApiError(400, "prompt_logprobs is returned on whole chat responses only: send stream: false, "
                            "or use /v1/completions (whose stream carries them in its first chunk)",
                       param="prompt_logprobs")
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    max_tokens = body.max_completion_tokens or body.max_tokens
    params = sampling_params(sampling_fields(body, max_tokens=max_tokens, logprobs=logprobs), body.n)
    handles = await ctx.submit(params, **submit_kw)
    try:
        gens = [Generation(i, h) for i, h in enumerate(handles)]
        rid = "chatcmpl-" + handles[0].request_id
        if body.stream:
            return await _stream(request, ctx, body, gens, rid, model)
        return await _whole(ctx, gens, rid, model, body.logprobs)
    finally:
        close_all(handles)


def prompt_of(body: ChatCompletionRequest) -> dict[str, Any]:
    """The kernel.submit arguments for the prompt: template messages, tools, template options."""
    kwargs = dict(body.chat_template_kwargs or {})
    bad = sorted(RESERVED_TEMPLATE_KWARGS & kwargs.keys())
    if bad:
        raise ApiError(400, f"chat_template_kwargs may not set {bad}", param="chat_template_kwargs")
    tools = None
    if body.tools and body.tool_choice != "none":
        tools = [msgspec.to_builtins(t) for t in body.tools]
    return {"messages": template_messages(body.messages), "tools": tools, "chat_template_kwargs": kwargs or None,
            "priority": body.priority, "cache_salt": body.cache_salt, **openai_options(body)}


def template_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """OpenAI messages as the dicts chat templates read (HF conventions: tool arguments as objects)."""
    out = []
    for i, m in enumerate(messages):
        t = type(m)
        if t is SystemMessage or t is DeveloperMessage:
            d: dict[str, Any] = {"role": "system", "content": _text(m.content, i)}
        elif t is AssistantMessage:
            d = {"role": "assistant", "content": _text(m.content, i) if m.content is not None else ""}
            if m.tool_calls:
                d["tool_calls"] = [template_call(c.id, c.function.name, c.function.arguments) for c in m.tool_calls]
            if m.reasoning_content:
                d["reasoning_content"] = m.reasoning_content
        elif t is ToolMessage:
            d = {"role": "tool", "tool_call_id": m.tool_call_id, "content": _text(m.content, i)}
        else:
            d = {"role": "user", "content": _text(m.content, i)}
        if getattr(m, "name", None):
            d["name"] = m.name
        out.append(d)
    return out


def _text(content: Any, i: int) -> str:
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if type(part) is ImagePart:
            raise ApiError(400, "this model takes text only; image_url content is not supported",
                           param=f"messages[{i}].content")
        parts.append(getattr(part, "text", None) or getattr(part, "refusal", ""))
    return "".join(parts)


async def _whole(ctx: ServingContext, gens: list[Generation], rid: str, model: str,
                 want_logprobs: bool) -> web.Response:
    await read_whole(gens)
    choices = [ChatChoice(index=g.index, message=ChatMessage(
                              role="assistant", content=g.text if g.text or not g.tool_calls else None,
                              reasoning_content=g.reasoning_text,
                              tool_calls=openai_calls(g.tool_calls, ToolCall, FunctionCall)),
                          finish_reason=finish_reason(g.finished.reason),
                          logprobs=chat_logprobs(ctx, g.logprobs) if want_logprobs else None)
               for g in gens]
    scored = gens[0].prompt_logprobs  # only when the request asked (vLLM's prompt_logprobs), N alternatives each
    body = ChatCompletion(id=rid, created=unix_time(), model=model, choices=choices,
                          usage=usage_info(total_usage(gens)),
                          prompt_logprobs=vllm_prompt_logprobs(ctx, scored, MAX_TOP) if scored is not None else None)
    return web.Response(body=encoder.encode(body), content_type="application/json",
                        headers=server_timing(gens[0].finished if len(gens) == 1 else None))


async def _stream(request: web.Request, ctx: ServingContext, body: ChatCompletionRequest, gens: list[Generation],
                  rid: str, model: str) -> web.StreamResponse:
    created = unix_time()
    want_logprobs = body.logprobs

    def chunk(*choices: ChatChunkChoice, usage: Any = None) -> bytes:
        return sse.data_frame(encoder.encode(ChatCompletionChunk(id=rid, created=created, model=model,
                                                                  choices=list(choices), usage=usage)))

    # A content-only delta of choice i: its frame from bytes built once (frames.py), the same bytes as delta().
    plain = [TextFrame.of(lambda t, i=g.index: chunk(ChatChunkChoice(index=i, delta=ChatDelta(content=t),
                                                                      finish_reason=None))[6:-2]) for g in gens]

    def delta(g: Generation, reasoning: str, answer: str, positions: Any = None) -> bytes:
        if answer and not reasoning and not positions:
            frame = plain[g.index]
            if frame is not None:
                return frame.frame(answer)
        lp = chat_logprobs(ctx, positions) if positions else None
        return chunk(ChatChunkChoice(index=g.index, delta=ChatDelta(content=answer or None,
                                                                     reasoning_content=reasoning or None),
                                     finish_reason=None, logprobs=lp))

    out = sse.SSEWriter(request)
    await out.prepare({"X-Request-Id": rid})
    await out.send(*(chunk(ChatChunkChoice(index=g.index, delta=ChatDelta(role="assistant", content=""),
                                           finish_reason=None)) for g in gens))
    try:
        async for i, ev in events_of([g.handle for g in gens]):
            g = gens[i]
            if type(ev) is TokensEmitted:
                reasoning, answer = g.on_tokens(ev)
                positions = ev.logprobs if want_logprobs else None
                if reasoning or answer or positions:
                    await out.send(delta(g, reasoning, answer, positions))
                if ev.tool_calls:
                    await out.send(chunk(ChatChunkChoice(index=g.index, finish_reason=None, delta=ChatDelta(
                        tool_calls=openai_deltas(ev.tool_calls, ToolCallDelta)))))
            elif type(ev) is Finished or type(ev) is RequestFailed:
                check_outcome(ev)
                reasoning, answer = g.on_finished(ev)
                frames = [delta(g, reasoning, answer)] if reasoning or answer else []
                frames.append(chunk(ChatChunkChoice(index=g.index, delta=ChatDelta(),
                                                    finish_reason=finish_reason(ev.reason))))
                await out.send(*frames)
        if body.stream_options is not None and body.stream_options.include_usage:
            await out.send(chunk(usage=usage_info(total_usage(gens))))
        await out.send(sse.DONE)
    except ApiError as e:
        await out.send(sse_error_payload(e, anthropic=False), sse.DONE)
    await out.close()
    return out.response
