"""modelcall's paged attention, registered with transformers' AttentionInterface.

transformers' model definitions call `paged_attention` once per layer with this step's
query/key/value for the whole flattened batch ([1, H, T, D], rotary applied). It writes the new
K/V into their cache slots, then attends: the paged group reads each request's context from the
cache by its slots, fresh prompts attend to their own new K/V only.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

from modelcall.plugins.runner import cpu_kernel
from modelcall.plugins.runner.batch import StepBatch

NAME = "modelcall_paged"


def paged_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: Any, dropout: float = 0.0, scaling: float | None = None,
                    modelcall_step: StepBatch | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    step = modelcall_step
    if step is None:
        raise RuntimeError("modelcall_paged attention runs only inside the modelcall runner (no step given)")
    kc, vc = step.kv[module.layer_idx]
    _, n_q_heads, num_tokens, head_dim = query.shape
    scale = scaling if scaling is not None else head_dim ** -0.5
    k_new, v_new = key[0].transpose(0, 1), value[0].transpose(0, 1)   # [T, Hkv, D]
    kc.index_copy_(0, step.slot_mapping, k_new.to(kc.dtype))
    vc.index_copy_(0, step.slot_mapping, v_new.to(vc.dtype))

    q_rows = query[0].transpose(0, 1)                                  # [T, Hq, D]
    gqa = n_q_heads != key.shape[1]
    if not step.fresh:
        out = _paged(q_rows, kc, vc, step, scale, gqa)
        return out.unsqueeze(0), None
    out = query.new_empty(num_tokens, n_q_heads, head_dim)
    if step.num_paged:
        out[:step.num_paged] = _paged(q_rows[:step.num_paged], kc, vc, step, scale, gqa)
    for g in step.fresh:
        end = g.start + g.num_seqs * g.q_len
        q = query[0, :, g.start:end].unflatten(1, (g.num_seqs, g.q_len)).transpose(0, 1)   # [B, Hq, q, D]
        k = key[0, :, g.start:end].unflatten(1, (g.num_seqs, g.q_len)).transpose(0, 1)
        v = value[0, :, g.start:end].unflatten(1, (g.num_seqs, g.q_len)).transpose(0, 1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=gqa)
        out[g.start:end] = o.transpose(1, 2).reshape(-1, n_q_heads, head_dim)
    return out.unsqueeze(0), None


def _paged(q_rows: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, step: StepBatch, scale: float,
           gqa: bool) -> torch.Tensor:
    """Attention of the paged group's tokens over their requests' cached context: [n, Hq, D]."""
    if cpu_kernel.usable(q_rows, kc):
        return cpu_kernel.paged_attention(q_rows, kc, vc, step, scale)
    return _paged_torch(q_rows, kc, vc, step, scale, gqa)


def _paged_torch(q_rows: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, step: StepBatch, scale: float,
                 gqa: bool) -> torch.Tensor:
    """Portable path (any device): gather each request's context, padded SDPA with a bottom-right causal mask."""
    meta = step.scratch.get("torch_paged")
    if meta is None:
        meta = step.scratch["torch_paged"] = _torch_meta(step, q_rows.device)
    slots, mask, q_index, valid = meta
    n_seq, max_ctx = slots.shape
    k = kc.index_select(0, slots.view(-1)).view(n_seq, max_ctx, *kc.shape[1:]).transpose(1, 2).to(q_rows.dtype)
    v = vc.index_select(0, slots.view(-1)).view(n_seq, max_ctx, *vc.shape[1:]).transpose(1, 2).to(q_rows.dtype)
    if q_index is None:  # every request has one query token: no padding of queries
        o = F.scaled_dot_product_attention(q_rows.unsqueeze(2), k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)
        return o.squeeze(2)
    q = q_rows[q_index].transpose(1, 2)                                 # [S, Hq, qmax, D]
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)
    return o.transpose(1, 2).flatten(0, 1)[valid]


def _torch_meta(step: StepBatch, device: torch.device) -> tuple:
    slots = step.paged_slots
    assert slots is not None
    ctx = torch.tensor(step.paged_ctx_lens, device=device)
    q_lens = step.paged_q_lens
    ar = torch.arange(slots.shape[1], device=device)
    if max(q_lens) == 1:
        uniform = min(step.paged_ctx_lens) == max(step.paged_ctx_lens)
        mask = None if uniform else (ar[None, :] < ctx[:, None])[:, None, None, :]
        return slots, mask, None, None
    qmax = max(q_lens)
    q_len_t = torch.tensor(q_lens, device=device)
    offsets = torch.cumsum(q_len_t, 0) - q_len_t
    i = torch.arange(qmax, device=device)
    q_index = offsets[:, None] + torch.minimum(i[None, :], q_len_t[:, None] - 1)      # [S, qmax]
    start = ctx - q_len_t
    # NOTE: causal aligned bottom-right: query i of a chunk starting at `start` sees keys 0..start+i.
    mask = (ar[None, None, :] <= (start[:, None] + i[None, :])[:, :, None])[:, None]  # [S, 1, qmax, L]
    valid = (i[None, :] < q_len_t[:, None]).flatten().nonzero().squeeze(1)
    return slots, mask, q_index, valid


AttentionInterface.register(NAME, paged_attention)
