"""Pieces both OpenAI routes share: usage, finish reasons, logprobs, and the sampling fields of a request."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from modelcall.events import PositionLogprobs, Usage
from modelcall.plugins.http.errors import ApiError
from modelcall.plugins.http.schemas_openai import (
    ChoiceLogprobs, CompletionLogprobs, CompletionTokensDetails, KernelSampling, PromptTokensDetails, TokenLogprobInfo,
    TopLogprob, UsageInfo,
)
from modelcall.plugins.http.service import ServingContext

FINISH_REASONS = {"stop": "stop", "length": "length", "tool_calls": "tool_calls", "content_filter": "content_filter"}


def finish_reason(kernel_reason: str) -> str:
    return FINISH_REASONS.get(kernel_reason, "stop")


def usage_info(u: Usage) -> UsageInfo:
    return UsageInfo(prompt_tokens=u.prompt_tokens, completion_tokens=u.completion_tokens,
                     total_tokens=u.prompt_tokens + u.completion_tokens,
                     prompt_tokens_details=PromptTokensDetails(cached_tokens=u.cached_tokens),
                     completion_tokens_details=CompletionTokensDetails(reasoning_tokens=u.reasoning_tokens))


def sampling_fields(req: Any, *, max_tokens: int | None, logprobs: int | None) -> dict[str, Any]:
    """The kernel's SamplingParams fields from an OpenAI request (standard and extra fields)."""
    if req.logit_bias:
        raise ApiError(400, "logit_bias is not supported by this server", param="logit_bias")
    stop = req.stop
    fields: dict[str, Any] = {
        "max_tokens": max_tokens, "temperature": req.temperature, "top_p": req.top_p, "seed": req.seed,
        "presence_penalty": req.presence_penalty, "frequency_penalty": req.frequency_penalty,
        "stop": (stop,) if isinstance(stop, str) else tuple(stop) if stop else None, "logprobs": logprobs,
    }
    for name in KernelSampling.__struct_fields__:
        if name not in ("priority", "cache_salt"):
            value = getattr(req, name)
            fields[name] = tuple(value) if isinstance(value, list) else value
    return fields


def chat_logprobs(ctx: ServingContext, positions: Sequence[PositionLogprobs]) -> ChoiceLogprobs:
    content = []
    for p in positions:
        token = ctx.token_text(p.token_id)
        top = [TopLogprob(ctx.token_text(x.token_id), x.logprob, ctx.token_bytes(x.token_id)) for x in p.top]
        content.append(TokenLogprobInfo(token, p.logprob, ctx.token_bytes(p.token_id), top))
    return ChoiceLogprobs(content)


def completion_logprobs(ctx: ServingContext, positions: Sequence[PositionLogprobs], offset: int) -> CompletionLogprobs:
    """Legacy logprobs; `offset` is where the first token's text starts in the choice's text."""
    tokens, lps, tops, offsets = [], [], [], []
    for p in positions:
        token = ctx.token_text(p.token_id)
        tokens.append(token)
        lps.append(p.logprob)
        tops.append({ctx.token_text(x.token_id): x.logprob for x in p.top})
        offsets.append(offset)
        offset += len(token)
    return CompletionLogprobs(tokens, lps, tops, offsets)
