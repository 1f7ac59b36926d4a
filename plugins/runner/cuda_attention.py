"""Paged attention on CUDA: one Triton kernel that reads K/V in place through the block tables.

Why: the portable path (attention._paged_torch) gathers each request's whole context out of the block
pool into a padded copy and builds a dense mask, per layer, per step. This kernel never copies a
context: each program walks its request's block table and loads K/V tiles straight from their slots.

One kernel serves decode and varlen prefill (chunked prefill, prefix-cache hits, mixed steps): the paged
group's queries are packed ([n, Hq, D], each request's rows contiguous), and each request's chunk sits at
the end of its context, so query i of a chunk of q_len tokens over a context of ctx tokens is at position
ctx - q_len + i and sees keys 0..that position (its own new K/V were written to the cache just before).

    grid (request s, KV head, query block)      rows of a program = BLOCK_Q query tokens x GP heads:
        row r -> token mb * BLOCK_Q + r // GP,  query head kv_head * G + r % GP   (G = Hq / Hkv, GQA)
        for each key tile of the visible range (window-aware start, causal end):
            slot = table[s, pos // block_size] * block_size + pos % block_size      (K, V read once)
            online softmax, scores = scale * q.k [soft-capped: cap * tanh(s / cap)], masked causal/window
        a sink logit per head (gpt-oss) starts the softmax as one extra column (m = sink, l = 1)

Decode (every q_len 1) is the same kernel with BLOCK_Q = 1 and the group's heads padded to 16 rows, so
every K/V tile feeds all query heads that share it through one tl.dot. The dots take the queries' dtype
(bf16 on tensor cores; fp32 in IEEE precision, not TF32, so fp32 parity with the torch path holds) and
accumulate in fp32; the softmax statistics and the output accumulator are fp32.

The kernels are decorated on first use, not at import: TRITON_INTERPRET=1 (Triton's CPU interpreter, which
the tests use on CPU tensors) is read when a function is decorated.
"""
from __future__ import annotations

import functools
from typing import Any

import torch

try:   # optional: the `cuda` extra (the device image has it); without it choose_backend keeps the torch path
    import triton
    import triton.language as tl
except ImportError:
    triton = tl = None

BLOCK_N = 32   # keys per tile
PREFILL_ROWS = 64   # rows (query tokens x heads of a KV group) per prefill program


def available() -> bool:
    """Triton imports (the `cuda` extra; the device image has it)."""
    return triton is not None


def interpreting() -> bool:
    """Triton's CPU interpreter is on (TRITON_INTERPRET=1): the kernels run on CPU tensors, slowly.

    NOTE: Triton decorates its own library (tl.zeros, tl.max...) when it is first imported, so the variable
    must be set before that (transformers imports triton): set later, kernels fail inside the interpreter.
    Hence the check on one of those.
    """
    if triton is None:
        return False
    from triton.runtime.interpreter import InterpretedFunction
    return isinstance(tl.zeros, InterpretedFunction)


def choose_backend(config_value: Any, device: torch.device) -> str | None:
    """The attention path of the paged group: "triton" (this kernel) or None (attention.py's own choice:
    the C kernel on CPU, the portable torch path elsewhere). `config_value` is plugin_config runner
    `attention`: "auto" (default: Triton on CUDA when it imports), "triton" or "torch".

    NOTE: "triton" on a CPU device works only under TRITON_INTERPRET=1 (tests); anywhere else it is refused
    rather than silently ignored.
    """
    value = config_value or "auto"
    if value == "torch":
        return None
    if value not in ("auto", "triton"):
        from modelcall.core import ConfigError
        raise ConfigError(f"runner attention {value!r}: give auto, triton or torch")
    if device.type == "cuda":
        if available():
            return "triton"
        if value == "triton":
            from modelcall.core import ConfigError
            raise ConfigError("runner attention 'triton': triton does not import (pip install 'modelcall[cuda]')")
        return None
    if value == "triton":
        if available() and interpreting():
            return "triton"
        from modelcall.core import ConfigError
        raise ConfigError("runner attention 'triton' on CPU needs TRITON_INTERPRET=1 (Triton's interpreter)")
    return None


def _attention_kernel(Q, K, V, O, TABLES, CTX, QSTART, QLEN, SINKS,
                      sq_t, sq_h, sk_s, sk_h, sv_s, sv_h, so_t, so_h, st_s, st_b,
                      scale, window, softcap,
                      G: tl.constexpr, GP: tl.constexpr, BLOCK_Q: tl.constexpr, D: tl.constexpr,
                      DP: tl.constexpr, BS: tl.constexpr, BN: tl.constexpr, HAS_WINDOW: tl.constexpr,
                      HAS_SOFTCAP: tl.constexpr, HAS_SINKS: tl.constexpr, PRECISION: tl.constexpr):
    s = tl.program_id(0)
    kvh = tl.program_id(1)
    mb = tl.program_id(2)
    ctx = tl.load(CTX + s)
    q_len = tl.load(QLEN + s)
    q_start = tl.load(QSTART + s)
    BM: tl.constexpr = BLOCK_Q * GP
    r = tl.arange(0, BM)
    tok = mb * BLOCK_Q + r // GP
    g = r % GP
    head = kvh * G + g
    row_ok = (g < G) & (tok < q_len)
    d = tl.arange(0, DP)
    d_ok = d < D
    q = tl.load(Q + (q_start + tok)[:, None] * sq_t + head[:, None] * sq_h + d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    q_pos = ctx - q_len + tok                                  # absolute position of each row's token
    first_pos = ctx - q_len + mb * BLOCK_Q
    hi = tl.minimum(ctx, first_pos + BLOCK_Q)                   # causal: no key past the block's last query
    lo = 0
    if HAS_WINDOW:
        lo = tl.maximum(first_pos - window + 1, 0)              # window: nothing before the first query's reach
    if HAS_SINKS:
        m_i = tl.load(SINKS + head, mask=g < G, other=0.0).to(tl.float32)
        l_i = tl.full([BM], 1.0, tl.float32)
    else:
        m_i = tl.full([BM], -1.0e30, tl.float32)                # finite: a fully masked tile gives no NaN
        l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, DP], tl.float32)
    start = (lo // BN) * BN
    for n0 in range(start, hi, BN):
        pos = n0 + tl.arange(0, BN)
        p_ok = (pos < hi) & (pos >= lo)
        blk = tl.load(TABLES + s * st_s + (pos // BS) * st_b, mask=p_ok, other=0)
        slot = blk.to(tl.int64) * BS + pos % BS
        kv_ok = p_ok[:, None] & d_ok[None, :]
        k = tl.load(K + slot[:, None] * sk_s + kvh * sk_h + d[None, :], mask=kv_ok, other=0.0).to(q.dtype)
        sc = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        if HAS_SOFTCAP:
            # tanh through exp (no tl.tanh on every Triton): cap * tanh(x / cap)
            sc = softcap * (1.0 - 2.0 / (tl.exp(2.0 * sc / softcap) + 1.0))
        seen = p_ok[None, :] & (pos[None, :] <= q_pos[:, None])
        if HAS_WINDOW:
            seen = seen & (pos[None, :] > q_pos[:, None] - window)
        sc = tl.where(seen, sc, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(sc, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(sc - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + slot[:, None] * sv_s + kvh * sv_h + d[None, :], mask=kv_ok, other=0.0).to(q.dtype)
        acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v, input_precision=PRECISION)
        m_i = m_new
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(O + (q_start + tok)[:, None] * so_t + head[:, None] * so_h + d[None, :],
             out.to(O.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


@functools.cache
def _kernel(interpret: bool) -> Any:
    """The kernel decorated for the current mode (compiled or interpreted: Triton decides at decoration)."""
    return triton.jit(_attention_kernel)


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def paged_attention(q_rows: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, tables: torch.Tensor,
                    ctx_lens: torch.Tensor, q_starts: torch.Tensor, q_lens: torch.Tensor, max_q: int,
                    block_size: int, scale: float, window: int = 0, softcap: float = 0.0,
                    sinks: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of packed queries over their requests' paged context: [n, Hq, D] (q_rows' dtype).

    q_rows [n, Hq, D] (any strides, last one 1); kc/vc [slots, Hkv, D]; tables [S, W] block ids (entries
    out of a window may be anything: they are never read); ctx_lens, q_starts, q_lens [S] int32/int64 on the
    device: request s's queries are rows q_starts[s].. of q_rows, the last q_lens[s] positions of its
    ctx_lens[s]. `max_q` bounds q_lens (host int: it sizes the grid, so a CUDA graph fixes it).
    """
    n, hq, dim = q_rows.shape
    hkv = kc.shape[1]
    group = hq // hkv
    if out is None:
        out = torch.empty(n, hq, dim, dtype=q_rows.dtype, device=q_rows.device)
    num_seqs = tables.shape[0]
    if num_seqs == 0 or n == 0:
        return out
    gp = _pow2(group)
    block_q = 1 if max_q == 1 else max(PREFILL_ROWS // gp, 1)
    gp = max(gp, 16 // block_q)           # tl.dot needs 16 rows: pad the heads of a decode program
    grid = (num_seqs, hkv, -(-max_q // block_q))
    fp32 = q_rows.dtype == torch.float32 or kc.dtype == torch.float32
    _kernel(interpreting())[grid](
        q_rows, kc, vc, out, tables, ctx_lens, q_starts, q_lens, sinks if sinks is not None else q_rows,
        q_rows.stride(0), q_rows.stride(1), kc.stride(0), kc.stride(1), vc.stride(0), vc.stride(1),
        out.stride(0), out.stride(1), tables.stride(0), tables.stride(1),
        float(scale), int(window or 0), float(softcap or 0.0),
        G=group, GP=gp, BLOCK_Q=block_q, D=dim, DP=max(_pow2(dim), 16), BS=block_size, BN=BLOCK_N,
        HAS_WINDOW=bool(window), HAS_SOFTCAP=bool(softcap), HAS_SINKS=sinks is not None,
        PRECISION="ieee" if fp32 else "tf32")
    return out


def step_metadata(step: Any, slots: torch.Tensor, block_size: int) -> tuple:
    """(tables, ctx_lens, q_starts, q_lens, max_q) of a step's paged group, built once per step and KV group.

    The block table is read back off the step's per-position slots (position j's slot is table[j // bs] * bs
    + j % bs, so every bs-th column divided by bs is the table): a [S, max_ctx / bs] strided view on the
    device, no context copied.
    """
    dev = slots.device
    tables = torch.div(slots[:, ::block_size], block_size, rounding_mode="floor")
    ctx = torch.tensor(step.paged_ctx_lens, dtype=torch.int32, device=dev)
    q_len = torch.tensor(step.paged_q_lens, dtype=torch.int32, device=dev)
    q_start = torch.cumsum(q_len, 0, dtype=torch.int32) - q_len
    return tables, ctx, q_start, q_len, max(step.paged_q_lens)


def paged_step(q_rows: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, step: Any, var: Any,
               slots: torch.Tensor, group: int = 0) -> torch.Tensor:
    """attention._paged's Triton path: the step's paged group over its KV group's slots."""
    block_size = step.scratch["block_size"]
    key = ("triton_meta", group)
    meta = step.scratch.get(key)
    if meta is None:
        meta = step.scratch[key] = step.scratch.get("static_meta") or step_metadata(step, slots, block_size)
    tables, ctx, q_start, q_len, max_q = meta
    return paged_attention(q_rows, kc, vc, tables, ctx, q_start, q_len, max_q, block_size, var.scale,
                           var.window or 0, var.softcap or 0.0, var.sinks)


def fresh_group(q_rows: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, step: Any, var: Any, g: Any,
                slot_mapping: torch.Tensor, group: int, out: torch.Tensor) -> None:
    """A fresh group (`g.num_seqs` whole prompts of `g.q_len` tokens at rows g.start..) through the kernel, into
    `out`'s rows: for the variants SDPA does not compute (soft-capping, sinks, a window shorter than the prompt),
    instead of a dense [q_len, q_len] mask. Their K/V were just written at `slot_mapping`; a prompt starts at
    position 0, so its block table is the slot of every block_size-th position divided by block_size."""
    bs = step.scratch["block_size"]
    key = ("triton_fresh", g.start, group)
    meta = step.scratch.get(key)
    if meta is None:
        n, q = g.num_seqs, g.q_len
        rows = slot_mapping[g.start:g.start + n * q].view(n, q)
        tables = torch.div(rows[:, ::bs], bs, rounding_mode="floor")
        lens = torch.full((n,), q, dtype=torch.int32, device=rows.device)
        starts = g.start + q * torch.arange(n, dtype=torch.int32, device=rows.device)
        meta = step.scratch[key] = (tables, lens, starts)
    tables, lens, starts = meta
    paged_attention(q_rows, kc, vc, tables, lens, starts, lens, g.q_len, bs, var.scale, var.window or 0,
                    var.softcap or 0.0, var.sinks, out=out)
