"""Sampling a step that verifies drafts (speculative decoding): plain chunks go to the sampler's `sample`
as ever, each drafted chunk's 1 + k rows to its `verify`.

    logits rows (plan order of sampled chunks):  [ a | b0 b1 b2 b3 | c ]   b drafted 3 tokens
    sample(rows a, c)  ->  one token each         verify(rows b0..b3) -> accepted drafts + 1 token
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def sample_with_drafts(sampler: Any, logits: torch.Tensor, chunks: Sequence[Any]
                       ) -> tuple[list[int], list[Any] | None, list[list[int] | None]]:
    """Per sampled chunk: its first new token, its logprobs (plain chunks only; None when none asked),
    and the tokens a drafted chunk appends (None for plain chunks)."""
    verify = getattr(sampler, "verify", None)
    if verify is None:
        raise RuntimeError(f"the sampler {type(sampler).__name__} cannot verify drafts (no verify method)")
    plain_rows: list[int] = []
    plain: list[int] = []
    spans: list[tuple[int, int, int]] = []   # (chunk index, first row, rows)
    row = 0
    for j, c in enumerate(chunks):
        if c.draft:
            spans.append((j, row, 1 + len(c.draft)))
            row += 1 + len(c.draft)
        else:
            plain.append(j)
            plain_rows.append(row)
            row += 1
    ids: list[int] = [0] * len(chunks)
    spec: list[list[int] | None] = [None] * len(chunks)
    lps: list[Any] | None = None
    if plain:
        rows = torch.tensor(plain_rows, dtype=torch.long, device=logits.device)
        got, got_lp = sampler.sample(logits.index_select(0, rows), [chunks[j] for j in plain])
        if got_lp is not None:
            lps = [None] * len(chunks)
        for n, j in enumerate(plain):
            ids[j] = got[n]
            if lps is not None:
                lps[j] = got_lp[n]
    many = getattr(sampler, "verify_many", None)
    if many is not None:   # every drafted chunk in one call (a sampler may batch the greedy ones)
        drafted = logits
        if plain:
            rows = torch.tensor([r for _, first, n in spans for r in range(first, first + n)],
                                dtype=torch.long, device=logits.device)
            drafted = logits.index_select(0, rows)
        results = many(drafted, [chunks[j] for j, _, _ in spans])
    else:
        results = [verify(logits[first:first + n], chunks[j]) for j, first, n in spans]
    for (j, _, _), tokens in zip(spans, results):
        ids[j] = tokens[0]
        spec[j] = tokens
    return ids, lps, spec
