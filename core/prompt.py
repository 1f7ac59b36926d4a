"""The entry stage's pure parts (core/entry.py runs them): the prompt's token ids, the context
budget, what the messages answer. Over budget is an error with the numbers, never a silent cut.
"""
from __future__ import annotations

import math

import anyio

from modelcall.core.errors import ContextOverflow, InvalidRequest
from modelcall.core.params import SamplingParams
from modelcall.core.stages import KVCachePolicy, Tokenizer


INLINE_ENCODE_CHARS = 512  # text prompts up to this long are encoded without a worker thread


async def prompt_token_ids_of(tokenizer: Tokenizer, vocab_size: int, prompt: str | None, messages: list[dict] | None,
                             tools: list[dict] | None, ids: list[int] | None, template_kwargs: dict | None) -> list[int]:
    """The prompt's token ids from exactly one of text, chat messages (rendered with the model's
    template) or ids; tokenizing runs in a worker thread. Raises InvalidRequest naming the field."""
    given = [name for name, v in (("prompt", prompt), ("messages", messages), ("prompt_token_ids", ids))
             if v is not None]
    if len(given) != 1:
        raise InvalidRequest(f"give exactly one of prompt, messages, prompt_token_ids (got {given or 'none'})",
                             field="prompt")
    if ids is not None:
        bad = next((t for t in ids if not isinstance(t, int) or not 0 <= t < vocab_size), None)
        if bad is not None:
            raise InvalidRequest(f"token id {bad!r} is outside the vocabulary [0, {vocab_size})", field="prompt_token_ids")
        out = list(ids)
    elif messages is not None:
        out = await anyio.to_thread.run_sync(lambda: chat_token_ids(tokenizer, messages, tools, template_kwargs))
    else:
        if not isinstance(prompt, str):
            raise InvalidRequest("prompt must be a string", field="prompt")
        # NOTE: a short text encodes on the loop faster (~60 µs) than a worker-thread hop costs (~90 µs)
        out = tokenizer.encode(prompt) if len(prompt) <= INLINE_ENCODE_CHARS else \
            await anyio.to_thread.run_sync(tokenizer.encode, prompt)
    if not out:
        raise InvalidRequest("the prompt is empty (0 tokens)", field="prompt" if messages is None else "messages")
    return out


def chat_token_ids(tokenizer: Tokenizer, messages: list[dict], tools: list[dict] | None,
                   template_kwargs: dict | None) -> list[int]:
    """Chat messages rendered with the model's template and encoded (blocking: the caller picks the
    thread; render and encode share one hop, each hop costs more than a short encode)."""
    if not messages:
        raise InvalidRequest("messages must not be empty", field="messages")
    out = tokenizer.encode(tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True,
                                                         **(template_kwargs or {})))
    if not out:
        raise InvalidRequest("the prompt is empty (0 tokens)", field="messages")
    return out


def resolve_max_tokens(num_prompt: int, params: SamplingParams, window: int, kv: KVCachePolicy) -> int:
    """Resolve max_tokens against the window; over budget is an error, never a silent cut."""
    if params.max_tokens is None:
        if num_prompt >= window:
            raise ContextOverflow(num_prompt, 1, window)
        max_tokens = window - num_prompt
    else:
        max_tokens = params.max_tokens
        if num_prompt + max_tokens > window:
            raise ContextOverflow(num_prompt, max_tokens, window)
    # a policy that frees blocks as a request runs (sliding windows) says how many it holds at most
    blocks_needed = getattr(kv, "blocks_needed", None)
    need_blocks = blocks_needed(num_prompt + max_tokens) if blocks_needed is not None \
        else math.ceil((num_prompt + max_tokens) / kv.block_size)
    if need_blocks > kv.num_blocks:
        raise InvalidRequest(
            f"prompt ({num_prompt}) + max_tokens ({max_tokens}) needs {need_blocks} KV blocks but the cache "
            f"holds {kv.num_blocks}; lower max_tokens or raise kv_cache_memory_gb", field="max_tokens")
    return max_tokens


def answered_calls(messages: list[dict] | None) -> tuple[str, ...]:
    """Ids of the tool calls whose results the messages carry (how a front end learns a call's outcome)."""
    if not messages:
        return ()
    return tuple(m["tool_call_id"] for m in messages
                 if m.get("role") == "tool" and isinstance(m.get("tool_call_id"), str))
