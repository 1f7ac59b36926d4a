"""POST /v1/completions: OpenAI (legacy) text completions of one or several prompts, text or token ids."""
from __future__ import annotations

from typing import Any

from aiohttp import web

from modelcall.core import RequestHandle
from modelcall.events import Finished, PromptLogprobs, RequestFailed, TokensEmitted, Usage
from modelcall.plugins.http import sse
from modelcall.plugins.http.errors import ApiError, sse_error_payload
from modelcall.plugins.http.frames import TextFrame
from modelcall.plugins.http.openai_common import completion_logprobs, finish_reason, sampling_fields, usage_info
from modelcall.plugins.http.prompt_logprobs import echo_logprobs, vllm_prompt_logprobs
from modelcall.plugins.http.schemas_openai import (
    Completion, CompletionChoice, CompletionLogprobs, CompletionRequest, encoder,
)
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


def check_scoring(body: CompletionRequest) -> int:
    """How many samples to draw per prompt (best_of); a 400 for the combinations that stay unsupported."""
    if body.suffix:
        raise ApiError(400, "suffix is not supported by this server", param="suffix")
    best_of = body.best_of if body.best_of is not None else body.n
    if best_of < body.n:
        raise ApiError(400, f"best_of ({best_of}) must be at least n ({body.n})", param="best_of")
    if best_of > body.n and body.stream:
        raise ApiError(400, "best_of greater than n cannot stream (the best are known only at the end)",
                       param="best_of")
    if body.max_tokens == 0:
        if not body.echo:
            raise ApiError(400, "max_tokens 0 generates nothing; with echo (and logprobs) it scores the prompt",
                           param="max_tokens")
        if best_of > 1:
            raise ApiError(400, f"max_tokens 0 scores the prompt once; n and best_of must be 1, got {best_of}",
                           param="n")
    return best_of


def _fields(body: CompletionRequest, best_of: int) -> dict[str, Any]:
    """Sampling fields; echo with logprobs (and max_tokens 0) need the prompt scored in the prefill."""
    logprobs = body.logprobs
    if best_of > body.n and logprobs is None:
        logprobs = 0  # the sampled tokens' logprobs rank the samples
    fields = sampling_fields(body, max_tokens=body.max_tokens, logprobs=logprobs)
    wanted = [x for x in (body.prompt_logprobs, body.logprobs if body.echo else None) if x is not None]
    if body.max_tokens == 0 and not wanted:
        wanted = [0]
    fields["prompt_logprobs"] = max(wanted) if wanted else None
    return fields


async def handle(request: web.Request, ctx: ServingContext, body: CompletionRequest) -> web.StreamResponse:
    model = ctx.check_model(body.model, lora=True)
    best_of = check_scoring(body)
    params = sampling_params(_fields(body, best_of), best_of)
    handles: list[RequestHandle] = []
    try:
        for prompt in prompts_of(body):
            handles += await ctx.submit(params, **prompt, priority=body.priority, cache_salt=body.cache_salt)
        gens = [Generation(i, h, None) for i, h in enumerate(handles)]
        echoes = [_echo(ctx, g.handle) if body.echo else "" for g in gens]
        rid = "cmpl-" + handles[0].request_id
        if body.stream:
            return await _stream(request, ctx, body, gens, echoes, rid, model)
        return await _whole(ctx, body, gens, echoes, rid, model, best_of)
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
                 rid: str, model: str, best_of: int) -> web.Response:
    await read_whole(gens)
    usage = usage_info(_usage(gens, best_of))
    choices = []
    for k, group in enumerate(gens[i:i + best_of] for i in range(0, len(gens), best_of)):
        scored = group[0].prompt_logprobs  # the first sample of a prompt scores it for all
        for j, g in enumerate(_best(group, body.n) if best_of > body.n else group):
            choices.append(_choice(ctx, body, g, echoes[g.index], scored, k * body.n + j))
    out = Completion(id=rid, created=unix_time(), model=model, choices=choices, usage=usage)
    return web.Response(body=encoder.encode(out), content_type="application/json")


def _best(group: list[Generation], n: int) -> list[Generation]:
    """best_of: the n samples of highest cumulative logprob (OpenAI's and vLLM's ranking), best first."""
    return sorted(group, key=lambda g: -sum(p.logprob for p in g.logprobs))[:n]


def _choice(ctx: ServingContext, body: CompletionRequest, g: Generation, echo: str, scored: Any,
            index: int) -> CompletionChoice:
    logprobs = None
    if body.logprobs is not None:
        logprobs = completion_logprobs(ctx, g.logprobs, len(echo))
        if body.echo:
            head = echo_logprobs(ctx, g.handle.prompt_token_ids, scored, body.logprobs)
            logprobs = CompletionLogprobs(head.tokens + logprobs.tokens, head.token_logprobs + logprobs.token_logprobs,
                                          head.top_logprobs + logprobs.top_logprobs, head.text_offset + logprobs.text_offset)
    plp = vllm_prompt_logprobs(ctx, scored, body.prompt_logprobs) if body.prompt_logprobs is not None else None
    return CompletionChoice(index=index, text=echo + g.text, finish_reason=finish_reason(g.finished.reason),
                            logprobs=logprobs, prompt_logprobs=plp)


async def _stream(request: web.Request, ctx: ServingContext, body: CompletionRequest, gens: list[Generation],
                  echoes: list[str], rid: str, model: str) -> web.StreamResponse:
    created = unix_time()
    offsets = [len(e) for e in echoes]

    def chunk(choices: list[CompletionChoice], usage: Any = None) -> bytes:
        return sse.data_frame(encoder.encode(Completion(id=rid, created=created, model=model, choices=choices,
                                                        usage=usage)))

    # A plain token delta of choice i: its frame from bytes built once (frames.py), the same bytes as chunk().
    plain = [TextFrame.of(lambda t, i=i: encoder.encode(Completion(
        id=rid, created=created, model=model, choices=[CompletionChoice(index=i, text=t, finish_reason=None)])))
        for i in range(len(gens))]

    out = sse.SSEWriter(request)
    await out.prepare({"X-Request-Id": rid})
    # NOTE: with prompt scores asked, a choice's first chunk (echo, prompt logprobs) waits for the
    # scores of its prompt; what the choice produces before that is held, in order.
    scores_first = (body.echo and body.logprobs is not None) or body.prompt_logprobs is not None
    ready = [not scores_first] * len(gens)
    held: list[list[bytes]] = [[] for _ in gens]

    async def send(i: int, frame: bytes) -> None:
        if ready[i]:
            await out.send(frame)
        else:
            held[i].append(frame)

    async def first_chunks(first: int, scored: PromptLogprobs | None) -> None:
        for i in range(first, first + body.n):
            lp = (echo_logprobs(ctx, gens[i].handle.prompt_token_ids, scored, body.logprobs)
                  if body.echo and body.logprobs is not None else None)
            plp = vllm_prompt_logprobs(ctx, scored, body.prompt_logprobs) if body.prompt_logprobs is not None else None
            await out.send(chunk([CompletionChoice(index=i, text=echoes[i], finish_reason=None, logprobs=lp,
                                                   prompt_logprobs=plp)]), *held[i])
            ready[i], held[i] = True, []

    try:
        if body.echo and not scores_first:
            await out.send(*(chunk([CompletionChoice(index=i, text=e, finish_reason=None)]) for i, e in enumerate(echoes)))
        async for i, ev in events_of([g.handle for g in gens]):
            g = gens[i]
            if type(ev) is TokensEmitted:
                _, text = g.on_tokens(ev)
                lp = None
                if body.logprobs is not None and ev.logprobs:
                    lp = completion_logprobs(ctx, ev.logprobs, offsets[i])
                    offsets[i] += sum(len(t) for t in lp.tokens)
                if lp is None and text and plain[i] is not None:
                    await send(i, plain[i].frame(text))
                elif text or lp:
                    await send(i, chunk([CompletionChoice(index=i, text=text, finish_reason=None, logprobs=lp)]))
            elif type(ev) is PromptLogprobs:
                await first_chunks(i - i % body.n, ev)
            elif type(ev) is Finished or type(ev) is RequestFailed:
                check_outcome(ev)
                g.on_finished(ev)
                await send(i, chunk([CompletionChoice(index=i, text="", finish_reason=finish_reason(ev.reason))]))
        if body.stream_options is not None and body.stream_options.include_usage:
            await out.send(chunk([], usage=usage_info(_usage(gens, body.n))))
        await out.send(sse.DONE)
    except ApiError as e:
        await out.send(sse_error_payload(e, anthropic=False), sse.DONE)
    await out.close()
    return out.response
