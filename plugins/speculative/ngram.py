"""Prompt lookup (vLLM's `ngram` method): find the request's last n tokens earlier in its own prompt or
output (the longest n in prompt_lookup_min..prompt_lookup_max) and propose what followed there."""
from __future__ import annotations

from typing import Any

from modelcall.plugins.speculative.index import NgramIndex

KEY = "spec.ngram"  # request.extra: the request's NgramIndex


class NgramProposer:
    """`modelcall.core.speculative.Proposer` over the request's own tokens (no state across requests)."""

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n = min_n
        self.max_n = max_n

    def propose(self, request: Any, k: int) -> list[int]:
        tokens = request.all_token_ids
        index = request.extra.get(KEY)
        if index is None:
            index = request.extra[KEY] = NgramIndex(self.min_n, self.max_n)
        index.update(tokens, len(tokens) - 1)
        n, end = index.match(tokens)
        if not n:
            return []
        return tokens[end + 1:end + 1 + k]

    def finished(self, request: Any) -> None:
        request.extra.pop(KEY, None)
