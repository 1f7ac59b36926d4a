"""Shared-prefix ("cascade") attention on CPU: rows whose contexts begin with the same cached blocks attend to
that shared part together, as one dense attention per KV head, and to their own suffix each.

With prefix caching, requests that share a system prompt hold the same physical blocks at the head of their
block tables, so their context slots agree position by position up to where they diverge. Read row by row,
the shared K/V is streamed once per row (32 rows x 1,024 shared keys: 32 reads of the same 2 MB per layer);
here it is gathered once and every row's query heads of one KV head meet it as one matrix product:

    shared keys 0..L-1 (same slots in every row of the group)      each row's suffix L..pos
      per KV head: Q [rows x G, D] x K [L, D]^T, softmax, x V        the C kernel row by row, keys L..pos only
      (cpu_kernel.block_attention, no mask) -> o_shared, lse_shared   -> o_own, lse_own
    out = (o_shared e^(lse_shared - m) + o_own e^(lse_own - m)) / (e^(lse_shared - m) + e^(lse_own - m))

W2's shape (32 rows x 1,024 shared keys, 8 heads of 64, bf16, one thread): the shared part costs 0.95 ms of CPU
per layer as block_attention, 1.6 ms through torch's flash attention, 2.2 ms row by row (2026-12-01; docs/benchmarks.md).

Exact (to rounding): softmax over the union of two disjoint key sets is the log-sum-exp-weighted mix of the two
softmaxes. Only for plain attention (no window, soft-cap or sinks: the caller falls back for those).

When it pays (the decision per step; vLLM decides per batch with a GPU occupancy model and keeps one common
prefix for the whole batch; here several groups may each share their own): a group's rows x G query heads fill
at least MIN_LANES of block_attention's 32 vector lanes and share at least MIN_SHARED tokens. block_attention's cost
per KV head hardly depends on how many of the 32 lanes are used, the row-by-row kernel's grows with the rows, so few
rows lose. Measured (2026-12-01, 8 heads of 64 (G = 1), bf16, one thread; row-by-row CPU /
shared-prefix CPU): 32 rows x 1,024 shared 1.41x, x 256 1.05x; 16 x 512 0.85x; 8 x 1,024 0.76x; 4 x 1,024 0.46x;
GQA G = 4, 8 rows x 2,048: 1.46x.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from modelcall.plugins.runner import cpu_kernel

MIN_SHARED = 512   # shared tokens a group needs
MIN_LANES = 24     # rows x query heads per KV head a group needs (of block_attention's 32 lanes)


@dataclass(slots=True)
class SharedGroup:
    """Rows of the paged group whose first `length` context slots are `slots` (the same in each)."""

    tokens: torch.Tensor      # [n] flat rows (paged-group token index) of the group's query tokens
    slots: torch.Tensor       # [length] slots of the shared keys
    length: int


@dataclass(slots=True)
class CascadePlan:
    """One step's shared-prefix split (every layer of a KV group uses it)."""

    groups: list[SharedGroup]
    tokens: torch.Tensor      # [n] every cascade token's flat row, groups in order
    suffix_seq: torch.Tensor  # [n] row of suffix_slots per token
    suffix_pos: torch.Tensor  # [n] position of the token within its suffix (its own key is the last it sees)
    suffix_slots: torch.Tensor  # [rows, max suffix] slots of each row's keys after its shared part


def plan(slots: torch.Tensor, ctx_lens: list[int], q_lens: list[int], tok_seq: torch.Tensor,
         max_queries: int, group_heads: int = 1) -> CascadePlan | None:
    """The shared-prefix groups of a paged group (`slots` [S, max_ctx] of its requests' context positions), or
    None when no group pays (`group_heads`: query heads per KV head). Rows of `max_queries` queries or more are left out (the caller's flash path takes
    long chunks). A row joins a group only with its computed tokens: every query of it comes after the shared
    keys, so they need no mask."""
    min_shared, min_rows = MIN_SHARED, max(2, -(-MIN_LANES // group_heads))
    starts = [c - q for c, q in zip(ctx_lens, q_lens)]
    rows = [s for s, (q, st) in enumerate(zip(q_lens, starts)) if q < max_queries and st >= min_shared]
    if len(rows) < min_rows:
        return None
    by_first: dict[int, list[int]] = {}
    for s, first in zip(rows, slots[rows, 0].tolist()):
        by_first.setdefault(first, []).append(s)
    chosen: list[tuple[list[int], int]] = []
    for members in by_first.values():
        if len(members) < min_rows:
            continue
        # how far each member agrees with the first one, capped at its computed tokens
        width = max(starts[s] for s in members)
        ref = slots[members[0], :width]
        same = (slots[members, :width] == ref).to(torch.int8).cumprod(1).sum(1).tolist()
        agree = sorted(((min(n, starts[s]), s) for n, s in zip(same, members)), reverse=True)
        # the length shared by the k rows that agree furthest: keep the k that saves the most reads
        best_k = max(range(min_rows, len(agree) + 1), key=lambda k: k * agree[k - 1][0])
        length = agree[best_k - 1][0]
        if length >= min_shared:
            chosen.append((sorted(s for _, s in agree[:best_k]), length))
    if not chosen:
        return None
    groups, all_tokens, suf_seq, suf_pos, suf_rows = [], [], [], [], []
    seq_list = tok_seq.tolist()
    token_of: dict[int, list[int]] = {}
    for t, s in enumerate(seq_list):
        token_of.setdefault(s, []).append(t)
    for members, length in chosen:
        toks = []
        for s in members:
            r = len(suf_rows)
            suf_rows.append((s, length))
            for k, t in enumerate(token_of[s]):
                toks.append(t)
                suf_seq.append(r)
                suf_pos.append(starts[s] - length + k)
        groups.append(SharedGroup(torch.tensor(toks), slots[members[0], :length].contiguous(), length))
        all_tokens.extend(toks)
    suf_len = max(ctx_lens[s] - length for s, length in suf_rows)
    at = torch.arange(suf_len)
    src = torch.tensor([s for s, _ in suf_rows])
    off = torch.tensor([length for _, length in suf_rows])
    index = (off[:, None] + at[None, :]).clamp_(max=slots.shape[1] - 1)   # past a row's end: never read
    return CascadePlan(groups, torch.tensor(all_tokens), torch.tensor(suf_seq), torch.tensor(suf_pos),
                       slots[src[:, None], index].contiguous())


def attend(q_rows: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, casc: CascadePlan,
           scale: float) -> torch.Tensor:
    """[n, Hq, D] fp32 attention of `casc.tokens`' queries (rows of `q_rows`, [*, Hq, D]) over their contexts."""
    q = q_rows.index_select(0, casc.tokens)
    n, hq, _ = q.shape
    lse_own = torch.empty(n, hq)
    out = cpu_kernel.attend_tokens(q, kc, vc, casc.suffix_seq, casc.suffix_pos, casc.suffix_slots, scale, lse=lse_own)
    at = 0
    for grp in casc.groups:
        m = grp.tokens.numel()
        if cpu_kernel.has_block_attention(kc):
            o_sh, lse_sh = cpu_kernel.block_attention(q[at:at + m], kc, vc, grp.slots, scale)
        else:
            o_sh, lse_sh = _flash_shared(q[at:at + m], kc, vc, grp.slots, scale)
        merge(out[at:at + m], lse_own[at:at + m], o_sh, lse_sh)
        at += m
    return out


def _flash_shared(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, slots: torch.Tensor,
                  scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The shared part without AVX-512: torch's flash attention over a gathered copy of the shared K/V, each KV
    head's query heads of every row as one block of queries ([1, Hkv, m * G, D]); 1.6 ms of CPU per W2 layer
    (32 rows x 1,024 keys, bf16) against the C kernel's 0.95 and the row-by-row kernel's 2.2."""
    m, hq, d = q.shape
    hkv = kc.shape[1]
    g = hq // hkv
    k = kc.index_select(0, slots).to(q.dtype).transpose(0, 1).unsqueeze(0)          # [1, Hkv, L, D]
    v = vc.index_select(0, slots).to(q.dtype).transpose(0, 1).unsqueeze(0)
    qg = q.view(m, hkv, g, d).transpose(0, 1).reshape(1, hkv, m * g, d)
    o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(qg, k, v, is_causal=False, scale=scale)
    return (o[0].view(hkv, m, g, d).transpose(0, 1).reshape(m, hq, d).float(),
            lse[0].view(hkv, m, g).transpose(0, 1).reshape(m, hq))


def merge(out: torch.Tensor, lse: torch.Tensor, other: torch.Tensor, other_lse: torch.Tensor) -> None:
    """out <- softmax-weighted mix of two attentions over disjoint keys ([n, Hq, D] fp32, lse [n, Hq]), in place."""
    top = torch.maximum(lse, other_lse)
    w, w_other = torch.exp(lse - top), torch.exp(other_lse - top)
    total = w + w_other
    out.mul_((w / total).unsqueeze(-1)).add_(other * (w_other / total).unsqueeze(-1))
