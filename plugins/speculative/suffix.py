"""Suffix decoding (vLLM's `suffix` method, after Arctic Inference): match the longest suffix of the
request's tokens against the request itself and against the tokens of recent requests (retrying
agents and regenerations repeat whole outputs), and propose what followed the longest match.

    recent requests:  [ ...prompt A... | output A ]  [ ...prompt B... | output B ]  (the last `capacity`)
    this request:     [ ...prompt C...  x y z ]     "x y z" ended in output A: propose what came next there

The cross-request store is an n-gram index per remembered sequence folded into one dict
(n-gram -> (sequence, end)); a sequence pushed out of the ring leaves stale entries, ignored on lookup.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any

from modelcall.plugins.speculative.index import NgramIndex

KEY = "spec.suffix"  # request.extra: the request's own NgramIndex


class SuffixProposer:
    """`modelcall.core.speculative.Proposer` over the request's tokens and the last `capacity` finished
    requests' tokens (prompt + output). Matches need at least `min_n` tokens; the longest wins, the
    request's own text on a tie (it is the likelier continuation)."""

    def __init__(self, min_n: int, max_n: int, capacity: int = 256, max_tokens_per_seq: int = 8192) -> None:
        self.min_n = min_n
        self.max_n = max_n
        self.capacity = capacity
        self.max_tokens_per_seq = max_tokens_per_seq
        self.seqs: OrderedDict[int, list[int]] = OrderedDict()
        self.ends: dict[tuple[int, ...], tuple[int, int]] = {}
        self._next_id = 0

    def propose(self, request: Any, k: int) -> list[int]:
        tokens = request.all_token_ids
        own = request.extra.get(KEY)
        if own is None:
            own = request.extra[KEY] = NgramIndex(self.min_n, self.max_n)
        own.update(tokens, len(tokens) - 1)
        n, end = own.match(tokens)
        best = tokens[end + 1:end + 1 + k] if n else []
        if self.seqs:
            size = len(tokens)
            for m in range(min(self.max_n, size), max(n, self.min_n - 1), -1):   # only longer than own
                hit = self.ends.get(tuple(tokens[size - m:]))
                if hit is not None and hit[0] in self.seqs:
                    seq = self.seqs[hit[0]]
                    cont = seq[hit[1] + 1:hit[1] + 1 + k]
                    if cont:
                        return cont
        return best

    def finished(self, request: Any) -> None:
        request.extra.pop(KEY, None)
        if request.num_output_tokens == 0:
            return
        tokens = request.all_token_ids[-self.max_tokens_per_seq:]
        sid = self._next_id
        self._next_id += 1
        self.seqs[sid] = tokens
        ends = self.ends
        for p in range(len(tokens) - 1):   # the last token has no continuation
            for n in range(self.min_n, min(self.max_n, p + 1) + 1):
                ends[tuple(tokens[p - n + 1:p + 1])] = (sid, p)
        while len(self.seqs) > self.capacity:
            self.seqs.popitem(last=False)
        if len(ends) > 64 * self.capacity * self.max_n:   # stale entries of forgotten sequences
            self.ends = {key: v for key, v in ends.items() if v[0] in self.seqs}
