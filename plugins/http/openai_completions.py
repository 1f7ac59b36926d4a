"""POST /v1/completions: OpenAI (legacy) text completions of one or several prompts, text or token ids."""
from __future__ import annotations

from typing import Any

from aiohttp import web

from modelcall.core import RequestHandle
from modelcall.events import Finished, RequestFailed, TokensEmitted, Usage
from modelcall.plugins.http import sse
from modelcall.plugins.http.errors import ApiError, sse_error_payload
from modelcall.plugins.http.openai_common import completion_logprobs, finish_reason, sampling_fields, usage_info
from modelcall.plugins.http.schemas_openai import Completion, CompletionChoice, CompletionRequest, encoder
from modelcall.plugins.http.service import (
    Generation, ServingContext, check_outcome, close_all, events_of, read_whole, sampling_params, unix_time,
)


def prompts_of(body: CompletionRequest) -> list[dict[str, Any]]:
    """Each prompt as kernel.submit arguments: a string, a list of strings, token ids, or lists of them."""
    p = body.prompt
    if isinstance(p, str):
        return [{"prompt": p}]
    if all(isinstance(x, str) for x in p):
        return [{"prompt": x} for x in p]
    if all(isinstance(x, int) for x in p):
        return [{"prompt_token_ids": list(p)}]
    if all(isinstance(x, list) for x in p):
        return [{"prompt_token_ids": x} for x in p]
    raise ApiError(400, "prompt must be a string, a list of strings, a list of token ids, or a list of such lists",
                   param="prompt")


async def handle(request: web.Request, ctx: ServingContext, body: CompletionRequest) -> web.StreamResponse:
    model = ctx.check_model(body.model)
    if body.suffix:
        raise ApiError(400, "suffix is not supported by this server", param="suffix")
    if body.best_of is not None and body.best_of != body.n:
        raise ApiError(400, "best_of other than n is not supported by this server", param="best_of")
    params = sampling_params(sampling_fields(body, max_tokens=body.max_tokens, logprobs=body.logprobs), body.n)
    handles: list[RequestHandle] = []
    try:
        for prompt in prompts_of(body):
            handles += await ctx.submit(params, **prompt, priority=body.priority, cache_salt=body.cache_salt)
        gens = [Generation(i, h, None) for i, h in enumerate(handles)]
        echoes = [_echo(ctx, g.handle) if body.echo else "" for g in gens]
        rid = "cmpl-" + handles[0].request_id
        if body.stream:
            return await _stream(request, ctx, body, gens, echoes, rid, model)
        return await _whole(ctx, body, gens, echoes, rid, model)
    finally:
        close_all(handles)


def _echo(ctx: ServingContext, handle: RequestHandle) -> str:
    return ctx.kernel.tokenizer.decode(handle.prompt_token_ids, skip_special_tokens=False)


def _usage(gens: list[Generation], n: int) -> Usage:
    """Each prompt counted once (choices of a prompt share it), outputs summed."""
    prompt = sum(g.usage.prompt_tokens for g in gens[::n])
    cached = sum(g.usage.cached_tokens for g in gens[::n])
    return Usage(prompt_tokens=prompt, cached_tokens=cached, completion_tokens=sum(g.usage.completion_tokens for g in gens))


async def _whole(ctx: ServingContext, body: CompletionRequest, gens: list[Generation], echoes: list[str],
                 rid: str, model: str) -> web.Response:
    await read_whole(gens)
    choices = [CompletionChoice(index=g.index, text=echoes[g.index] + g.text, finish_reason=finish_reason(g.finished.reason),
                                logprobs=completion_logprobs(ctx, g.logprobs, len(echoes[g.index]))
                                if body.logprobs is not None else None)
               for g in gens]
    out = Completion(id=rid, created=unix_time(), model=model, choices=choices, usage=usage_info(_usage(gens, body.n)))
    return web.Response(body=encoder.encode(out), content_type="application/json")


async def _stream(request: web.Request, ctx: ServingContext, body: CompletionRequest, gens: list[Generation],
                  echoes: list[str], rid: str, model: str) -> web.StreamResponse:
    created = unix_time()
    offsets = [len(e) for e in echoes]

    def chunk(choices: list[CompletionChoice], usage: Any = None) -> bytes:
        return sse.data_frame(encoder.encode(Completion(id=rid, created=created, model=model, choices=choices,
                                                        usage=usage)))

    out = sse.SSEWriter(request)
    await out.prepare({"X-Request-Id": rid})
    try:
        if body.echo:
            await out.send(*(chunk([CompletionChoice(index=i, text=e, finish_reason=None)]) for i, e in enumerate(echoes)))
        async for i, ev in events_of([g.handle for g in gens]):
            g = gens[i]
            if type(ev) is TokensEmitted:
                _, text = g.on_tokens(ev)
                lp = None
                if body.logprobs is not None and ev.logprobs:
                    lp = completion_logprobs(ctx, ev.logprobs, offsets[i])
                    offsets[i] += sum(len(t) for t in lp.tokens)
                if text or lp:
                    await out.send(chunk([CompletionChoice(index=i, text=text, finish_reason=None, logprobs=lp)]))
            elif type(ev) is Finished or type(ev) is RequestFailed:
                check_outcome(ev)
                g.on_finished(ev)
                await out.send(chunk([CompletionChoice(index=i, text="", finish_reason=finish_reason(ev.reason))]))
        if body.stream_options is not None and body.stream_options.include_usage:
            await out.send(chunk([], usage=usage_info(_usage(gens, body.n))))
        await out.send(sse.DONE)
    except ApiError as e:
        await out.send(sse_error_payload(e, anthropic=False), sse.DONE)
    await out.close()
    return out.response
