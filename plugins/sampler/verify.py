"""Verifying a draft (speculative decoding) against the target model's logits at its 1 + k rows.

    rows:   r0 (after the last known token)  r1 (after d1) ... rk (after dk)
    greedy: accept d(j+1) while it is argmax(r_j); the first mismatch's argmax (or argmax(rk) when
            every draft matched) is the one more token: output identical to decoding one at a time.
    sampled: the draft of a lookup proposer is a point mass q = delta(d), so rejection sampling
            accepts d with probability min(1, p(d) / q(d)) = p(d); on rejection it draws from the residual
            max(0, p - q) normalized, which is p with d removed. Each emitted token then follows p
            exactly (Leviathan et al. 2023, Chen et al. 2023), p being the distribution `sample` draws
            from (temperature, top-k, top-p, min-p).
"""
from __future__ import annotations

from typing import Any

import torch


def verify(sampler: Any, logits: torch.Tensor, chunk: Any, argmax: Any, target_probs: Any) -> list[int]:
    """The tokens `chunk.request` appends: its accepted drafts, then one correction or bonus token."""
    draft: list[int] = chunk.draft
    req = chunk.request
    if req.params.greedy:
        return verify_many(sampler, logits, [chunk], argmax, target_probs)[0]
    probs = target_probs(logits.float(), [req] * logits.shape[0])
    gen = sampler._generator(req, probs.device) if req.params.seed is not None else None
    uniform = torch.rand(len(draft), generator=gen, device=probs.device).tolist()
    p_draft = probs[torch.arange(len(draft), device=probs.device),
                    torch.tensor(draft, device=probs.device)].tolist()
    out = []
    for j, d in enumerate(draft):
        if uniform[j] < p_draft[j]:
            out.append(d)
            continue
        residual = probs[j].clone()
        residual[d] = 0.0
        out.append(_draw(residual, gen))
        return out
    out.append(_draw(probs[len(draft)], gen))
    return out


def verify_many(sampler: Any, logits: torch.Tensor, chunks: list[Any], argmax: Any, target_probs: Any
                ) -> list[list[int]]:
    """`verify` of several drafted chunks whose 1 + k rows lie back to back in `logits`, in order.

    NOTE: the greedy ones share one argmax over all rows and one transfer to Python (a call per chunk
    cost ~0.15 ms each, several percent of a step in which most of a large batch drafted)."""
    greedy = [c.request.params.greedy for c in chunks]
    best = argmax(logits).tolist() if any(greedy) else None
    out: list[list[int]] = []
    row = 0
    for c, g in zip(chunks, greedy):
        n = 1 + len(c.draft)
        if g:
            tokens: list[int] = []
            for j, d in enumerate(c.draft):
                if best[row + j] != d:
                    break
                tokens.append(d)
            tokens.append(best[row + len(tokens)])
            out.append(tokens)
        else:
            out.append(verify(sampler, logits[row:row + n], c, argmax, target_probs))
        row += n
    return out


def _draw(p: torch.Tensor, gen: torch.Generator | None) -> int:
    """One token from the (unnormalized) probabilities `p`: argmax(p / E), E ~ Exp(1), as `_draw` does."""
    noise = torch.empty_like(p).exponential_(generator=gen)
    return int((p / noise).argmax())
