"""POST /v1/messages and /v1/messages/count_tokens: the Anthropic Messages API, streaming or not."""
from __future__ import annotations

from typing import Any

import msgspec
from aiohttp import web

from modelcall.events import Finished, RequestFailed, TokensEmitted, ToolRequested
from modelcall.plugins.http import sse
from modelcall.plugins.http.errors import ApiError, sse_error_payload
from modelcall.plugins.http.schemas_anthropic import (
    AnthropicUsage, CountTokensRequest, CountTokensResponse, ImageBlock, InputMessage, MessageResponse,
    MessagesRequest, OutText, OutThinking, OutToolUse, TextBlock, ToolResultBlock, ToolUseBlock,
)
from modelcall.plugins.http.service import (
    Generation, ServingContext, check_outcome, close_all, sampling_params,
)
from modelcall.plugins.http.tool_calls import (
    anthropic_input, anthropic_options, anthropic_tool_frames, task_id_of, template_call,
)

_enc = msgspec.json.Encoder()


def _frame(name: str, payload: dict[str, Any]) -> bytes:
    return sse.event_frame(name.encode(), _enc.encode(payload))


PING = _frame("ping", {"type": "ping"})


# ---- request → kernel -------------------------------------------------------------------------

def template_messages(system: str | list[TextBlock] | None, messages: list[InputMessage]) -> list[dict[str, Any]]:
    """Anthropic messages as the OpenAI-style dicts chat templates read."""
    out: list[dict[str, Any]] = []
    if system:
        out.append({"role": "system", "content": system if isinstance(system, str) else "".join(b.text for b in system)})
    for i, m in enumerate(messages):
        if isinstance(m.content, str):
            out.append({"role": m.role, "content": m.content})
            continue
        text, calls = [], []
        for block in m.content:
            t = type(block)
            if t is TextBlock:
                text.append(block.text)
            elif t is ToolUseBlock:
                calls.append(template_call(block.id, block.name, block.input))
            elif t is ToolResultBlock:
                content = block.content if isinstance(block.content, str) else "".join(
                    _block_text(b, i) for b in block.content)
                out.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": content})
            elif t is ImageBlock:
                raise ApiError(400, "this model takes text only; image blocks are not supported",
                               param=f"messages.{i}.content")
            # thinking and redacted_thinking blocks of earlier turns are not shown to the model again
        if text or calls or m.role == "assistant":
            d: dict[str, Any] = {"role": m.role, "content": "".join(text)}
            if calls:
                d["tool_calls"] = calls
            out.append(d)
    return out


def _block_text(block: Any, i: int) -> str:
    if type(block) is ImageBlock:
        raise ApiError(400, "this model takes text only; image blocks are not supported", param=f"messages.{i}.content")
    return block.text


def _tools(body: MessagesRequest | CountTokensRequest) -> list[dict[str, Any]] | None:
    if not body.tools or (body.tool_choice is not None and body.tool_choice.type == "none"):
        return None
    return [{"type": "function", "function": {"name": t.name, "description": t.description or "",
                                              "parameters": t.input_schema}} for t in body.tools]


def _template_kwargs(body: MessagesRequest | CountTokensRequest) -> dict[str, Any] | None:
    if body.thinking is None:
        return None
    return {"enable_thinking": body.thinking.type == "enabled"}


def stop_reason(ev: Finished) -> tuple[str, str | None]:
    """Anthropic's stop_reason (and the stop sequence that matched) for a kernel finish."""
    if ev.reason == "stop":
        return ("stop_sequence", ev.stop_reason) if isinstance(ev.stop_reason, str) else ("end_turn", None)
    return {"length": "max_tokens", "tool_calls": "tool_use", "content_filter": "refusal"}.get(ev.reason, "end_turn"), None


def usage(g: Generation) -> AnthropicUsage:
    u = g.usage
    return AnthropicUsage(input_tokens=u.prompt_tokens - u.cached_tokens, output_tokens=u.completion_tokens,
                          cache_read_input_tokens=u.cached_tokens, cache_creation_input_tokens=0)


# ---- handlers ---------------------------------------------------------------------------------

async def handle(request: web.Request, ctx: ServingContext, body: MessagesRequest) -> web.StreamResponse:
    model = ctx.check_model(body.model, lora=True)
    fields = {"max_tokens": body.max_tokens, "temperature": body.temperature, "top_p": body.top_p,
              "top_k": body.top_k, "seed": body.seed, "min_p": body.min_p,
              "repetition_penalty": body.repetition_penalty, "stop": tuple(body.stop_sequences or ()) or None}
    params = sampling_params(fields, 1)
    handles = await ctx.submit(params, messages=template_messages(body.system, body.messages), tools=_tools(body),
                               chat_template_kwargs=_template_kwargs(body), task_id=task_id_of(request),
                               **anthropic_options(body))
    try:
        g = Generation(0, handles[0])
        mid = "msg_" + handles[0].request_id
        if body.stream:
            return await _stream(request, ctx, g, mid, model)
        return await _whole(g, mid, model)
    finally:
        close_all(handles)


async def _whole(g: Generation, mid: str, model: str) -> web.Response:
    async for ev in g.handle:
        if type(ev) is TokensEmitted:
            g.on_tokens(ev)
        elif type(ev) is ToolRequested:
            g.on_tool(ev)
        elif type(ev) is Finished or type(ev) is RequestFailed:
            check_outcome(ev)
            g.on_finished(ev)
    content: list[Any] = []
    if g.reasoning_text is not None:
        content.append(OutThinking(thinking=g.reasoning_text))
    if g.text or not content and not g.tool_calls:
        content.append(OutText(text=g.text))
    content += [OutToolUse(id=c["id"], name=c["name"], input=anthropic_input(c["arguments"]))
                for c in g.tool_calls.calls]
    reason, sequence = stop_reason(g.finished)
    out = MessageResponse(id=mid, model=model, content=content, stop_reason=reason, stop_sequence=sequence,
                          usage=usage(g))
    return web.Response(body=_enc.encode(out), content_type="application/json")


class _Blocks:
    """Opens, fills and closes content blocks as the output switches between thinking and text."""

    def __init__(self) -> None:
        self.index = -1
        self.kind: str | None = None
        self.tools: dict[int, int] = {}  # open tool_use blocks: call index -> block index

    def frames(self, kind: str, text: str) -> list[bytes]:
        out = []
        if kind != self.kind:
            out += self.stop()
            self.index += 1
            self.kind = kind
            start = {"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking" else {"type": "text", "text": ""}
            out.append(_frame("content_block_start", {"type": "content_block_start", "index": self.index,
                                                      "content_block": start}))
        delta = {"type": "thinking_delta", "thinking": text} if kind == "thinking" else {"type": "text_delta", "text": text}
        out.append(_frame("content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta}))
        return out

    def stop(self) -> list[bytes]:
        out = [_frame("content_block_stop", {"type": "content_block_stop", "index": b}) for b in self.tools.values()]
        self.tools.clear()
        if self.kind is None:
            return out
        self.kind = None
        return out + [_frame("content_block_stop", {"type": "content_block_stop", "index": self.index})]

    def tool_frames(self, deltas: Any) -> list[bytes]:
        """`tool_use` blocks for tool-call deltas (after closing an open text or thinking block)."""
        out = []
        if self.kind is not None:
            out.append(_frame("content_block_stop", {"type": "content_block_stop", "index": self.index}))
            self.kind = None
        return out + anthropic_tool_frames(deltas, self._next_index, _frame, self.tools)

    def _next_index(self) -> int:
        self.index += 1
        return self.index


async def _stream(request: web.Request, ctx: ServingContext, g: Generation, mid: str, model: str) -> web.StreamResponse:
    out = sse.SSEWriter(request)
    await out.prepare({"X-Request-Id": mid})
    # NOTE: message_start goes out at once (time to first byte); the prompt's cache split is known
    # only once the request is scheduled, so message_delta carries the final input/cache figures.
    prompt_tokens = len(g.handle.prompt_token_ids)
    start = {"type": "message_start", "message": {
        "id": mid, "type": "message", "role": "assistant", "model": model, "content": [], "stop_reason": None,
        "stop_sequence": None, "usage": {"input_tokens": prompt_tokens, "output_tokens": 0,
                                         "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0}}}
    await out.send(_frame("message_start", start), PING)
    out.start_pings(ctx.settings.ping_interval_s, PING)
    blocks = _Blocks()
    try:
        async for ev in g.handle:
            if type(ev) is TokensEmitted:
                frames = _deltas(blocks, *g.on_tokens(ev))
                if ev.tool_calls:
                    frames += blocks.tool_frames(ev.tool_calls)
                if frames:
                    await out.send(*frames)
            elif type(ev) is Finished or type(ev) is RequestFailed:
                check_outcome(ev)
                frames = _deltas(blocks, *g.on_finished(ev))
                if blocks.index == -1:  # no output at all: still one (empty) text block, as non-streaming has
                    frames += blocks.frames("text", "")
                frames += blocks.stop()
                reason, sequence = stop_reason(ev)
                frames.append(_frame("message_delta", {"type": "message_delta",
                                                       "delta": {"stop_reason": reason, "stop_sequence": sequence},
                                                       "usage": msgspec.to_builtins(usage(g))}))
                frames.append(_frame("message_stop", {"type": "message_stop"}))
                await out.send(*frames)
    except ApiError as e:
        await out.send(sse_error_payload(e, anthropic=True))
    await out.close()
    return out.response


def _deltas(blocks: _Blocks, reasoning: str, answer: str) -> list[bytes]:
    frames = blocks.frames("thinking", reasoning) if reasoning else []
    if answer:
        frames += blocks.frames("text", answer)
    return frames


async def count_tokens(request: web.Request, ctx: ServingContext, body: CountTokensRequest) -> web.Response:
    ctx.check_model(body.model)
    # The kernel's entry pipeline counts it (caps, filters, permissions, one request for the key's rpm).
    n = await ctx.count_tokens(messages=template_messages(body.system, body.messages), tools=_tools(body),
                               chat_template_kwargs=_template_kwargs(body))
    return web.Response(body=_enc.encode(CountTokensResponse(input_tokens=n)), content_type="application/json")
