"""Admission of a chat prompt: count its parts, fit it to the window by an explicit policy, or refuse.

Runs in a worker thread (it tokenizes). Over the window, the request is refused with the
breakdown by part unless it named a policy; with `drop_oldest` the oldest history turns go
and the result says how many messages and tokens were dropped. Never silent.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from modelcall.core.context import POLICIES, count_parts, drop_oldest, message_text, tools_cost
from modelcall.core.errors import ContextOverflow, InvalidRequest


class ChatPrompt(msgspec.Struct, kw_only=True):
    ids: list[int]
    parts: dict[str, int]
    max_tokens: int
    dropped_messages: int = 0
    dropped_tokens: int = 0


def check_policy(policy: str | None) -> str:
    policy = policy or "error"
    if policy not in POLICIES:
        raise InvalidRequest(f"context_policy must be one of {', '.join(POLICIES)}, got {policy!r}",
                             field="context_policy")
    return policy


def admit_chat(tokenizer: Any, messages: list[dict], tools: list[dict] | None, template_kwargs: dict | None,
               ids: list[int], budget: Callable[[int], int], policy: str | None) -> ChatPrompt:
    """Count `ids`' parts and resolve max_tokens with `budget(num_prompt)` (which raises
    ContextOverflow over the window); under `drop_oldest`, drop history until it fits."""
    policy = check_policy(policy)
    kw = template_kwargs or {}

    def render(msgs: list[dict], with_tools: list[dict] | None) -> str:
        return tokenizer.apply_chat_template(msgs, tools=with_tools, add_generation_prompt=True, **kw)

    def parts_of(msgs: list[dict], prompt_ids: list[int]) -> dict[str, int]:
        try:
            cost = tools_cost(lambda t: render(msgs, t), tokenizer.encode, len(prompt_ids), tools)
        except Exception:  # NOTE: a template that cannot render without tools must not fail the request
            cost = 0       # (their tokens then count as template)
        return count_parts(msgs, len(prompt_ids), tokenizer.encode, cost)

    parts = parts_of(messages, ids)
    first_len = len(ids)
    dropped = 0
    while True:
        try:
            max_tokens = budget(len(ids))
            return ChatPrompt(ids=ids, parts=parts, max_tokens=max_tokens, dropped_messages=dropped,
                              dropped_tokens=first_len - len(ids))
        except ContextOverflow as e:
            refusal = ContextOverflow(e.prompt_tokens, e.max_tokens, e.window, breakdown=parts)
            if policy != "drop_oldest":
                raise refusal from None
            over = e.prompt_tokens + e.max_tokens - e.window
            sizes = [len(tokenizer.encode(message_text(m))) + 4 for m in messages]  # +4: role markup, roughly
            kept, gone = drop_oldest(messages, over, sizes.__getitem__)
            if not gone:
                raise ContextOverflow(e.prompt_tokens, e.max_tokens, e.window,
                                      breakdown={**parts, "droppable_history": 0}) from None
            messages, dropped = kept, dropped + len(gone)
            ids = tokenizer.encode(render(messages, tools))
            parts = parts_of(messages, ids)
