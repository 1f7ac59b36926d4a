"""Shared by the CUDA-path tests: paged-attention cases for the Triton kernel (tests/test_triton_attention.py on
CPU in Triton's interpreter, tests/test_gpu.py compiled on CUDA) and a hand-driven runner loop (run_steps).
No TRITON_INTERPRET here: the importer decides."""
from __future__ import annotations

import torch

from modelcall.plugins.runner import attention, cuda_attention
from modelcall.plugins.runner.batch import StepBatch, _context_slots

DECODE = [(5, 1), (17, 1), (33, 1), (1, 1)]
MIXED = [(12, 12), (40, 7), (9, 1), (21, 3), (16, 16)]   # whole prompts, chunks over a prefix, a decode


def paged_case(ctx_q: list[tuple[int, int]], block_size: int, hq: int, hkv: int, dim: int, seed: int = 0,
               device: str = "cpu", dtype: torch.dtype = torch.float32):
    """A step's paged group: request s has ctx_q[s] = (context length, new tokens), its blocks scattered
    over a pool (a shuffled permutation), the cache filled with random K/V (unused slots too)."""
    g = torch.Generator().manual_seed(seed)
    blocks = [-(-c // block_size) for c, _ in ctx_q]
    pool = sum(blocks) + 3
    perm = torch.randperm(pool, generator=g).tolist()
    tables, at = [], 0
    for nb in blocks:
        tables.append(perm[at:at + nb])
        at += nb
    width = max(blocks)
    table = torch.tensor([t + [0] * (width - len(t)) for t in tables])
    max_ctx = max(c for c, _ in ctx_q)
    slots = _context_slots(table, torch.arange(max_ctx), block_size).to(device)
    kc = torch.randn(pool * block_size, hkv, dim, generator=g).to(device, dtype)
    vc = torch.randn(pool * block_size, hkv, dim, generator=g).to(device, dtype)
    n = sum(q for _, q in ctx_q)
    q_rows = torch.randn(hq, n, dim, generator=g).to(device, dtype).transpose(0, 1)   # [n, Hq, D] strided
    step = StepBatch(input_ids=torch.zeros(1, n, dtype=torch.long), positions=torch.zeros(1, n, dtype=torch.long),
                     slot_mapping=torch.zeros(n, dtype=torch.long), sample_rows=None, num_sampled=0, num_paged=n,
                     paged_slots=slots, paged_ctx_lens=[c for c, _ in ctx_q], paged_q_lens=[q for _, q in ctx_q])
    step.scratch["block_size"] = block_size
    return q_rows, kc, vc, step


def compare(ctx_q, block_size=4, hq=4, hkv=2, dim=16, window=None, softcap=None, sinks=False, scale=None, seed=0,
            tol=2e-5, device="cpu", dtype=torch.float32):
    """The Triton kernel against attention._paged_torch on one case (the reference in fp32 on the same rounded
    inputs); returns the kernel's output."""
    q_rows, kc, vc, step = paged_case(ctx_q, block_size, hq, hkv, dim, seed, device, dtype)
    sink = torch.randn(hq, generator=torch.Generator().manual_seed(seed + 1)).to(device) if sinks else None
    var = attention.Variant(scale if scale is not None else dim ** -0.5, window, softcap, sink)
    want = attention._paged_torch(q_rows.float(), kc.float(), vc.float(), step, var, hq != hkv, 0, step.paged_slots)
    got = cuda_attention.paged_step(q_rows, kc, vc, step, var, step.paged_slots)
    # and again into a NaN-poisoned output: every element must be written
    tables, ctx, q_start, q_len, max_q = step.scratch[("triton_meta", 0)]
    poisoned = torch.full_like(got, float("nan"))
    cuda_attention.paged_attention(q_rows, kc, vc, tables, ctx, q_start, q_len, max_q, block_size, var.scale,
                                   var.window or 0, var.softcap or 0.0, var.sinks, out=poisoned)
    assert torch.equal(poisoned, got), "the kernel left output elements unwritten (or is not deterministic)"
    assert got.shape == want.shape == (sum(q for _, q in ctx_q), hq, dim)
    assert got.dtype == dtype
    err = (got.float() - want).abs().max().item()
    assert err <= tol, f"max |triton - torch| = {err}"
    return got


def run_steps(runner, reqs, num_steps: int, block_size: int, measure, num_blocks: int = 64) -> None:
    """Drive `runner.execute` by hand: each step schedules every request's remaining tokens (its prompt, then one
    decode per step) with blocks from a free list; `measure(step, execute)` calls `execute()` and returns its
    StepOutput (to count or time around it); the sampled tokens are appended as the kernel would."""
    from modelcall.core import ScheduledChunk, SchedulePlan

    free = list(range(num_blocks))
    for step in range(num_steps):
        chunks = []
        for q in reqs:
            n = q.num_tokens - q.num_computed_tokens
            while len(q.block_table) < -(-(q.num_computed_tokens + n) // block_size):
                q.block_table.append(free.pop())
            chunks.append(ScheduledChunk(q, n, True))
        plan = SchedulePlan(chunks=chunks)
        out = measure(step, lambda: runner.execute(plan))
        for c, t in zip(chunks, out.token_ids):
            c.request.num_computed_tokens += c.num_new_tokens
            c.request.all_token_ids.append(t)
