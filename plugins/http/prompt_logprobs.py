"""Prompt logprobs in the two shapes clients read: OpenAI's legacy `echo` logprobs (tokens,
token_logprobs, top_logprobs, text_offset over the prompt, the first token's entries null) and
vLLM's `prompt_logprobs` (per prompt token a dict keyed by token id, the first entry null)."""
from __future__ import annotations

from modelcall.events import PromptLogprobs
from modelcall.plugins.http.schemas_openai import CompletionLogprobs, PromptLogprob, PromptLogprobsList
from modelcall.plugins.http.service import ServingContext

MAX_TOP = 20  # alternatives kept at most: the runner computes only as many as the request asked


def echo_logprobs(ctx: ServingContext, prompt_ids: list[int], scored: PromptLogprobs | None,
                  num_top: int) -> CompletionLogprobs:
    """The prompt's part of a completion's legacy logprobs; text offsets start at 0.

    `top_logprobs` holds the `num_top` most likely tokens and the prompt token itself (as vLLM:
    a reader checking whether the prompt token was the greedy one finds both)."""
    tokens, lps, tops, offsets = [], [], [], []
    offset = 0
    for k, tid in enumerate(prompt_ids):
        text = ctx.token_text(tid)
        p = scored.logprobs[k] if scored is not None and k < len(scored.logprobs) else None
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
        if p is None:
            lps.append(None)
            tops.append(None)
            continue
        lps.append(p.logprob)
        top = {ctx.token_text(x.token_id): x.logprob for x in p.top[:num_top]}
        top.setdefault(text, p.logprob)
        tops.append(top)
    return CompletionLogprobs(tokens, lps, tops, offsets)


def vllm_prompt_logprobs(ctx: ServingContext, scored: PromptLogprobs | None, num_top: int) -> PromptLogprobsList:
    """vLLM's shape: the prompt token and its `num_top` alternatives, keyed by token id (as a string)."""
    if scored is None:
        return []
    out: PromptLogprobsList = []
    for k, p in enumerate(scored.logprobs):
        if p is None:
            out.append(None)
            continue
        entry = {str(x.token_id): PromptLogprob(x.logprob, r, ctx.token_text(x.token_id))
                 for r, x in enumerate(p.top[:num_top], start=1)}
        rank = scored.ranks[k] if k < len(scored.ranks) else None
        entry.setdefault(str(p.token_id), PromptLogprob(p.logprob, rank, ctx.token_text(p.token_id)))
        out.append(entry)
    return out
