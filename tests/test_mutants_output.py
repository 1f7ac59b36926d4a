"""Output-stage behaviours a hand-run mutation pass (docs/mutation.md) found no test for: EOS is honoured
only after min_tokens other tokens, and text the reasoning parser holds back (it might begin a tag) is
released when the request ends."""
from __future__ import annotations

import pytest

from modelcall.core import Request, SamplingParams
from modelcall.core.output import OutputState
from test_output_stage import PieceDetok


EOS = 0


def test_eos_ends_a_request_only_after_min_tokens_other_tokens():
    # min_tokens=2: an EOS after one other token is too early (not honoured); after two (here the 4th token) it ends.
    params = SamplingParams.create(min_tokens=2, max_tokens=8)
    pieces = ["", "a", "b", "c"]
    req = Request("r", [5], params, max_tokens=8, eos_token_ids=frozenset({EOS}))
    out = OutputState(PieceDetok(pieces), (), False)
    reasons = []
    for t in (1, EOS, 2, EOS):
        req.all_token_ids.append(t)
        reasons.append(out.on_token(req, t, window=10_000).reason)
    assert reasons == [None, None, None, "stop"]
    assert out.text == "ab"


@pytest.mark.parametrize(("pieces", "reasoning", "content"), [
    (["<think>plan", "</think>ok <"], "plan", "ok <"),       # held after the reasoning: content
    (["<think>plan </thi"], "plan </thi", ""),                 # held inside the reasoning: reasoning
])
def test_text_held_by_the_reasoning_parser_is_released_at_the_end(pieces, reasoning, content):
    from modelcall.plugins.reasoning.think import ThinkParser

    pieces = ["<unused>", *pieces]
    params = SamplingParams.create(max_tokens=len(pieces) - 1)
    req = Request("r", [5], params, max_tokens=len(pieces) - 1)
    out = OutputState(PieceDetok(pieces), reasoning=ThinkParser())
    for t in range(1, len(pieces)):
        req.all_token_ids.append(t)
        r = out.on_token(req, t, window=10_000)
    assert r.reason == "length"
    assert (out.reasoning_text, out.text) == (reasoning, content)
