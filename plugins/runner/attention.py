"""modelcall's paged attention, registered with transformers' AttentionInterface.

transformers' model definitions call `paged_attention` once per layer with this step's
query/key/value for the whole flattened batch ([1, H, T, D], rotary applied). It writes the new
K/V into their cache slots, then attends: the paged group reads each request's context from the
cache by its slots, fresh prompts attend to their own new K/V only.

The layer's own attention variant comes with the call, as transformers hands it to every
attention backend: `sliding_window` (a query at position i sees keys i-W+1..i; None: all),
`softcap` (scores become cap * tanh(scores / cap) before the mask, Gemma 2), `s_aux` (one sink
logit per query head that joins the softmax and is then dropped, gpt-oss) and `scaling`
(query_pre_attn_scalar ** -0.5 for Gemma, attention_multiplier for Granite).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

from modelcall.plugins.runner import cascade, cpu_kernel
from modelcall.plugins.runner.batch import StepBatch

NAME = "modelcall_paged"


@dataclass(frozen=True, slots=True)
class Variant:
    """How one layer attends beyond plain causal softmax attention."""

    scale: float
    window: int | None = None            # sliding window in tokens; None: the whole context
    softcap: float | None = None         # attention-logit soft-capping
    sinks: torch.Tensor | None = None    # [Hq] sink logits (gpt-oss)

    @property
    def plain(self) -> bool:
        """SDPA computes it (a window is only a mask)."""
        return self.softcap is None and self.sinks is None


def paged_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: Any, dropout: float = 0.0, scaling: float | None = None,
                    modelcall_step: StepBatch | None = None, sliding_window: int | None = None,
                    softcap: float | None = None, s_aux: torch.Tensor | None = None,
                    **kwargs: Any) -> tuple[torch.Tensor, None]:
    step = modelcall_step
    if step is None:
        raise RuntimeError("modelcall_paged attention runs only inside the modelcall runner (no step given)")
    layer = module.layer_idx
    kc, vc = step.kv[layer]
    _, n_q_heads, num_tokens, head_dim = query.shape
    var = Variant(scaling if scaling is not None else head_dim ** -0.5,
                  int(sliding_window) if sliding_window else None, float(softcap) if softcap else None, s_aux)
    probe = step.scratch.get("probe_windows")
    if probe is not None:   # the load-time probe: record the layer's window, compute nothing
        probe[layer] = var.window or 0
        return query.new_zeros(1, num_tokens, n_q_heads, head_dim), None
    declared = step.scratch.get("layer_windows")
    if declared and (var.window or 0) != declared[module.layer_idx]:
        # NOTE: the KV policy frees blocks by the declared windows: a layer reading further back would read
        # reused blocks. Refuse rather than compute something else.
        raise RuntimeError(f"layer {module.layer_idx} attends with sliding window {var.window}, but the model "
                           f"spec declares {declared[module.layer_idx] or None} (loader.layer_windows misreads "
                           f"{type(module).__name__}'s config)")
    groups = step.scratch.get("layer_group")
    group = groups[layer] if groups else 0      # KV group: whose block tables place this layer's K/V
    slot_mapping = step.slot_mapping if group == 0 else step.group_slot_mapping[group - 1]
    k_new, v_new = key[0].transpose(0, 1), value[0].transpose(0, 1)   # [T, Hkv, D]
    q_rows = query[0].transpose(0, 1)                                  # [T, Hq, D]
    kernel = cpu_kernel.usable(q_rows, kc)
    if kernel:   # one C pass, the rows read in place from the packed QKV buffer
        cpu_kernel.write_kv(k_new, v_new, kc, vc, slot_mapping)
    else:
        store_rows(kc, slot_mapping, k_new)
        store_rows(vc, slot_mapping, v_new)

    gqa = n_q_heads != key.shape[1]
    if not step.fresh:
        out = _paged(q_rows, kc, vc, step, var, gqa, group, kernel)
        return out.unsqueeze(0), None
    out = query.new_empty(num_tokens, n_q_heads, head_dim)
    if step.num_paged:
        _paged(q_rows[:step.num_paged], kc, vc, step, var, gqa, group, kernel, out[:step.num_paged])
    # NOTE: bf16 only: an fp32 run is the parity reference, and SDPA is what transformers' own fp32 forward
    # computes (block_attention is as close to fp64 as SDPA, but not the same sums: prompt logprobs moved 1.09e-4)
    blocked = (var.plain and var.window is None and query.dtype == kc.dtype == torch.bfloat16
               and step.scratch.get("attention_backend") is None and kernel and cpu_kernel.has_block_attention())
    for g in step.fresh:
        end = g.start + g.num_seqs * g.q_len
        if blocked and g.q_len >= LONG_CHUNK:   # the C kernel over the K/V just written (same values: same dtype)
            last = _causal_keys(step, 0, g.q_len)
            for b in range(g.start, end, g.q_len):
                cpu_kernel.block_attention(q_rows[b:b + g.q_len], kc, vc, slot_mapping[b:b + g.q_len], var.scale, last,
                                           with_lse=False, out=out[b:b + g.q_len])
            continue
        q = query[0, :, g.start:end].unflatten(1, (g.num_seqs, g.q_len)).transpose(0, 1)   # [B, Hq, q, D]
        k = key[0, :, g.start:end].unflatten(1, (g.num_seqs, g.q_len)).transpose(0, 1)
        v = value[0, :, g.start:end].unflatten(1, (g.num_seqs, g.q_len)).transpose(0, 1)
        if var.plain and (var.window is None or var.window >= g.q_len):
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=var.scale, enable_gqa=gqa)
        elif step.scratch.get("attention_backend") == "triton":   # the variant in the kernel: no [q, q] mask
            from modelcall.plugins.runner import cuda_attention
            cuda_attention.fresh_group(q_rows, kc, vc, step, var, g, slot_mapping, group, out)
            continue
        else:
            i = torch.arange(g.q_len, device=q.device)
            mask = i[None, :] <= i[:, None]
            if var.window is not None:
                mask &= i[None, :] > i[:, None] - var.window
            o = _attend(q, k, v, mask, var, gqa)
        out[g.start:end] = o.transpose(1, 2).reshape(-1, n_q_heads, head_dim)
    return out.unsqueeze(0), None


# an fp8 cache's largest finite values: writes saturate there (torch's E5M2 conversion would give inf)
FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}


def store_rows(cache: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor) -> None:
    """cache[slots[t]] = rows[t] in the cache's dtype (the portable path). fp8 caches: saturated at the format's
    largest finite value, rounded to nearest even, written as bytes (torch has no index_copy_ for fp8 on CPU)."""
    top = FP8_MAX.get(cache.dtype)
    if top is None:
        cache.index_copy_(0, slots, rows.to(cache.dtype))
        return
    codes = rows.float().clamp(-top, top).to(cache.dtype)
    cache.view(torch.uint8).index_copy_(0, slots, codes.view(torch.uint8))


def _paged(q_rows: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, step: StepBatch, var: Variant,
           gqa: bool, group: int = 0, kernel: bool | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of the paged group's tokens over their requests' cached context: [n, Hq, D] in q's dtype (into
    `out` when given, contiguous). `kernel`: cpu_kernel.usable(q_rows, kc), when the caller knows it."""
    slots = step.paged_slots if group == 0 else step.group_paged_slots[group - 1]
    if step.scratch.get("attention_backend") == "triton":   # CUDA (or Triton's interpreter in tests)
        from modelcall.plugins.runner import cuda_attention
        return _into(out, cuda_attention.paged_step(q_rows, kc, vc, step, var, slots, group))
    if kernel if kernel is not None else cpu_kernel.usable(q_rows, kc):
        plain = var.plain and var.window is None
        long = _long_chunks(step) if plain else None
        shared = _shared_prefix(step, slots, group, q_rows.shape[1] // kc.shape[1]) if plain else None
        if long or shared:
            return _into(out, _paged_split(q_rows, kc, vc, step, var, slots, long or [], shared, group))
        # NOTE: q read in place from the packed rows, the output written in the model's dtype: no copies here
        return cpu_kernel.paged_attention(q_rows, kc, vc, step, var.scale, var.window or 0, var.softcap or 0.0,
                                          var.sinks, slots, out)
    return _into(out, _paged_torch(q_rows, kc, vc, step, var, gqa, group, slots))


def _into(out: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    if out is None:
        return x
    out.copy_(x)
    return out


LONG_CHUNK = 32   # a continued prefill chunk of this many queries or more runs as blocked GEMMs (flash attention)


def _long_chunks(step: StepBatch) -> list[tuple[int, int, int, int]]:
    """The paged group's continued prefill chunks of LONG_CHUNK queries or more, as (first row, q_len, ctx_len,
    row of paged_slots); computed once per step."""
    long = step.scratch.get("long_chunks")
    if long is None:
        long, row = [], 0
        for s, (q, ctx) in enumerate(zip(step.paged_q_lens, step.paged_ctx_lens)):
            if q >= LONG_CHUNK:
                long.append((row, q, ctx, s))
            row += q
        step.scratch["long_chunks"] = long
    return long


def _shared_prefix(step: StepBatch, slots: torch.Tensor, group: int, group_heads: int) -> cascade.CascadePlan | None:
    """The step's shared-prefix groups over this KV group's slots (cascade.py), computed once per step."""
    key = ("cascade", group)
    if key not in step.scratch:
        step.scratch[key] = cascade.plan(slots, step.paged_ctx_lens, step.paged_q_lens, step.paged_token_seq,
                                         max_queries=LONG_CHUNK, group_heads=group_heads)   # longer: _long_chunks'
    return step.scratch[key]


def _paged_split(q_rows: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, step: StepBatch, var: Variant,
                 slots: torch.Tensor, long: list[tuple[int, int, int, int]],
                 shared: cascade.CascadePlan | None = None, group: int = 0) -> torch.Tensor:
    """Long continued chunks through `_chunk_attention` (flash attention over blocks of queries), rows sharing
    a cached prefix through `cascade.attend`, the other paged tokens (decodes, short chunks) through the C
    kernel, which reads the context once per query token.

    NOTE: per query token the C kernel is a matrix-vector product over the context; a 1,792-token chunk over
    1,920 keys took 322 ms of CPU per layer that way and 57 + 55 ms as the two flash calls (W3's shape)."""
    out = q_rows.new_empty(q_rows.shape)
    key = ("short_rows", group)
    cached = step.scratch.get(key)
    if cached is None:   # the short rows and their (request, position) columns: the same for every layer
        keep = torch.ones(q_rows.shape[0], dtype=torch.bool)
        for row, q, _, _ in long:
            keep[row:row + q] = False
        if shared is not None:
            keep[shared.tokens] = False
        short = keep.nonzero().squeeze(1)
        cached = step.scratch[key] = (short, step.paged_token_seq.index_select(0, short),
                                      step.paged_token_pos.index_select(0, short))
    short, short_seq, short_pos = cached
    if shared is not None:
        out.index_copy_(0, shared.tokens, cascade.attend(q_rows, kc, vc, shared, var.scale).to(out.dtype))
    if short.numel():
        out.index_copy_(0, short, cpu_kernel.attend_tokens(
            q_rows.index_select(0, short), kc, vc, short_seq, short_pos, slots, var.scale).to(out.dtype))
    blocked = cpu_kernel.has_block_attention(kc)
    for row, q, ctx, s in long:
        if blocked:
            cpu_kernel.block_attention(q_rows[row:row + q], kc, vc, slots[s, :ctx], var.scale,
                                       _causal_keys(step, ctx - q, q), with_lse=False, out=out[row:row + q])
        else:
            out[row:row + q] = _chunk_attention(q_rows[row:row + q], kc, vc, slots[s, :ctx], var.scale)
    return out


def _causal_keys(step: StepBatch, start: int, q_len: int) -> torch.Tensor:
    """[q_len] int64: the last key each query of a chunk at positions start.. sees (causal), shared by the layers."""
    key = ("causal_keys", start, q_len)
    last = step.scratch.get(key)
    if last is None:
        last = step.scratch[key] = torch.arange(start, start + q_len)
    return last


def _chunk_attention(q_rows: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, slots: torch.Tensor,
                     scale: float) -> torch.Tensor:
    """(Without AVX-512: the C kernel's block_attention does this 1.5-2x faster.) [q, Hq, D] causal attention of a chunk's q queries, the last q of `slots`' positions, over all of them.

    Two flash-attention calls and a log-sum-exp merge: the earlier context with no mask (every query sees all
    of it) and the chunk's own keys with the causal mask; no masked-out block is computed."""
    q_len, hq, _ = q_rows.shape
    start = slots.shape[0] - q_len
    k = kc.index_select(0, slots).to(q_rows.dtype).transpose(0, 1).unsqueeze(0)      # [1, Hkv, ctx, D]
    v = vc.index_select(0, slots).to(q_rows.dtype).transpose(0, 1).unsqueeze(0)
    if k.shape[1] != hq:
        k, v = k.repeat_interleave(hq // k.shape[1], dim=1), v.repeat_interleave(hq // v.shape[1], dim=1)
    q = q_rows.transpose(0, 1).unsqueeze(0)                                           # [1, Hq, q, D]
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    o_own, l_own = flash(q, k[:, :, start:], v[:, :, start:], is_causal=True, scale=scale)
    if start == 0:
        return o_own[0].transpose(0, 1)
    o_pre, l_pre = flash(q, k[:, :, :start], v[:, :, :start], is_causal=False, scale=scale)
    m = torch.maximum(l_pre, l_own)
    w_pre, w_own = torch.exp(l_pre - m), torch.exp(l_own - m)                        # [1, Hq, q] fp32
    o = (o_pre.float() * w_pre.unsqueeze(-1) + o_own.float() * w_own.unsqueeze(-1)) / (w_pre + w_own).unsqueeze(-1)
    return o[0].transpose(0, 1).to(q_rows.dtype)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, var: Variant,
            gqa: bool) -> torch.Tensor:
    """Attention with a boolean `mask` (True: attend); SDPA when it computes the variant, else the eager
    math transformers' own eager path uses (scale, soft-cap, mask, softmax with the sink column)."""
    if var.plain:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=var.scale, enable_gqa=gqa)
    if gqa:
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    s = torch.matmul(q, k.transpose(-1, -2)) * var.scale
    if var.softcap is not None:
        s = torch.tanh(s / var.softcap) * var.softcap
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    if var.sinks is not None:
        sink = var.sinks.to(s.dtype).view(1, -1, 1, 1).expand(s.shape[0], -1, s.shape[2], 1)
        p = torch.softmax(torch.cat([s, sink], dim=-1), dim=-1)[..., :-1]
    else:
        p = torch.softmax(s, dim=-1)
    return torch.matmul(p.to(v.dtype), v)


def _paged_torch(q_rows: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, step: StepBatch, var: Variant,
                 gqa: bool, group: int = 0, slots: torch.Tensor | None = None) -> torch.Tensor:
    """Portable path (any device, the CUDA path too): gather each request's context, padded attention with
    a bottom-right causal mask (and the layer's window)."""
    key = ("torch_paged", var.window, group)
    meta = step.scratch.get(key)
    if meta is None:
        meta = step.scratch[key] = _torch_meta(step, q_rows.device, var.window,
                                               step.paged_slots if slots is None else slots)
    slots, mask, q_index, valid = meta
    n_seq, max_ctx = slots.shape
    k = kc.index_select(0, slots.view(-1)).view(n_seq, max_ctx, *kc.shape[1:]).transpose(1, 2).to(q_rows.dtype)
    v = vc.index_select(0, slots.view(-1)).view(n_seq, max_ctx, *vc.shape[1:]).transpose(1, 2).to(q_rows.dtype)
    if q_index is None:  # every request has one query token: no padding of queries
        return _attend(q_rows.unsqueeze(2), k, v, mask, var, gqa).squeeze(2)
    q = q_rows[q_index].transpose(1, 2)                                 # [S, Hq, qmax, D]
    o = _attend(q, k, v, mask, var, gqa)
    return o.transpose(1, 2).flatten(0, 1)[valid]


def _torch_meta(step: StepBatch, device: torch.device, window: int | None, slots: torch.Tensor | None) -> tuple:
    assert slots is not None
    ctx = torch.tensor(step.paged_ctx_lens, device=device)
    q_lens = step.paged_q_lens
    ar = torch.arange(slots.shape[1], device=device)
    if max(q_lens) == 1:
        uniform = min(step.paged_ctx_lens) == max(step.paged_ctx_lens)
        if window is None or window >= max(step.paged_ctx_lens):
            mask = None if uniform else (ar[None, :] < ctx[:, None])[:, None, None, :]
        else:  # the one query sits at ctx - 1 and sees keys ctx - window .. ctx - 1
            mask = ((ar[None, :] < ctx[:, None]) & (ar[None, :] >= ctx[:, None] - window))[:, None, None, :]
        return slots, mask, None, None
    qmax = max(q_lens)
    q_len_t = torch.tensor(q_lens, device=device)
    offsets = torch.cumsum(q_len_t, 0) - q_len_t
    i = torch.arange(qmax, device=device)
    q_index = offsets[:, None] + torch.minimum(i[None, :], q_len_t[:, None] - 1)      # [S, qmax]
    start = ctx - q_len_t
    # NOTE: causal aligned bottom-right: query i of a chunk starting at `start` sees keys 0..start+i
    # (with a window W: start+i-W+1..start+i).
    qpos = (start[:, None] + i[None, :])[:, :, None]                                  # [S, qmax, 1]
    mask = ar[None, None, :] <= qpos
    if window is not None:
        mask &= ar[None, None, :] > qpos - window
    valid = (i[None, :] < q_len_t[:, None]).flatten().nonzero().squeeze(1)
    return slots, mask[:, None], q_index, valid                                       # mask [S, 1, qmax, L]


AttentionInterface.register(NAME, paged_attention)
