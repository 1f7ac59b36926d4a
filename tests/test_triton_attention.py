"""The Triton paged-attention kernel (plugins/runner/cuda_attention.py) against the portable torch path
(attention._paged_torch), run here by Triton's CPU interpreter (TRITON_INTERPRET=1) on CPU tensors.

Ragged batches read through shuffled block tables: decodes, chunks over a cached prefix (chunked prefill,
prefix hits), whole prompts, mixed; block sizes 4 and 16; GQA, MQA and MHA; head_dim 16 and 24 (not a
power of two: masked lanes); sliding windows, soft-capping, sinks and a query_pre_attn_scalar-style scale.
Tolerance: fp32 in and out, |diff| <= 2e-5 (different summation order of the same fp32 math).
"""
from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")   # before the kernel is first decorated

import pytest
import torch

from modelcall.plugins.runner import attention, cuda_attention
from modelcall.plugins.runner.batch import StepBatch, _context_slots

pytestmark = pytest.mark.skipif(not cuda_attention.available(), reason="triton is not installed")
if cuda_attention.available() and not cuda_attention.interpreting():
    pytest.skip("TRITON_INTERPRET was off when triton was first imported", allow_module_level=True)

TOL = 2e-5


def paged_case(ctx_q: list[tuple[int, int]], block_size: int, hq: int, hkv: int, dim: int, seed: int = 0):
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
    slots = _context_slots(table, torch.arange(max_ctx), block_size)
    kc = torch.randn(pool * block_size, hkv, dim, generator=g)
    vc = torch.randn(pool * block_size, hkv, dim, generator=g)
    n = sum(q for _, q in ctx_q)
    q_rows = torch.randn(hq, n, dim, generator=g).transpose(0, 1)   # [n, Hq, D] strided, as attention gets it
    step = StepBatch(input_ids=torch.zeros(1, n, dtype=torch.long), positions=torch.zeros(1, n, dtype=torch.long),
                     slot_mapping=torch.zeros(n, dtype=torch.long), sample_rows=None, num_sampled=0, num_paged=n,
                     paged_slots=slots, paged_ctx_lens=[c for c, _ in ctx_q], paged_q_lens=[q for _, q in ctx_q])
    step.scratch["block_size"] = block_size
    return q_rows, kc, vc, step


def compare(ctx_q, block_size=4, hq=4, hkv=2, dim=16, window=None, softcap=None, sinks=False, scale=None, seed=0):
    q_rows, kc, vc, step = paged_case(ctx_q, block_size, hq, hkv, dim, seed)
    sink = torch.randn(hq, generator=torch.Generator().manual_seed(seed + 1)) if sinks else None
    var = attention.Variant(scale if scale is not None else dim ** -0.5, window, softcap, sink)
    want = attention._paged_torch(q_rows, kc, vc, step, var, hq != hkv, 0, step.paged_slots)
    got = cuda_attention.paged_step(q_rows, kc, vc, step, var, step.paged_slots)
    assert got.shape == want.shape == (sum(q for _, q in ctx_q), hq, dim)
    err = (got - want).abs().max().item()
    assert err <= TOL, f"max |triton - torch| = {err}"
    return got


DECODE = [(5, 1), (17, 1), (33, 1), (1, 1)]
MIXED = [(12, 12), (40, 7), (9, 1), (21, 3), (16, 16)]   # whole prompts, chunks over a prefix, a decode


@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("ctx_q", [DECODE, MIXED], ids=["decode", "mixed"])
def test_plain_causal_matches_torch(ctx_q, block_size):
    compare(ctx_q, block_size)


@pytest.mark.parametrize("hq,hkv", [(4, 4), (8, 1), (6, 2)], ids=["mha", "mqa", "gqa3"])
def test_head_layouts_match_torch(hq, hkv):
    compare(MIXED, 4, hq, hkv)
    compare(DECODE, 16, hq, hkv)


def test_head_dim_not_a_power_of_two():
    compare(MIXED, 4, dim=24)
    compare(DECODE, 4, dim=24)


@pytest.mark.parametrize("ctx_q", [DECODE, MIXED], ids=["decode", "mixed"])
@pytest.mark.parametrize("window", [3, 8])
def test_sliding_window_matches_torch(ctx_q, window):
    compare(ctx_q, 4, window=window)


@pytest.mark.parametrize("ctx_q", [DECODE, MIXED], ids=["decode", "mixed"])
def test_softcap_and_query_pre_attn_scalar_match_torch(ctx_q):
    # Gemma 2: scores scaled by query_pre_attn_scalar ** -0.5 (not head_dim), soft-capped at 50; a low cap
    # (2.0) makes the tanh bite on these random scores
    compare(ctx_q, 4, scale=24 ** -0.5, softcap=2.0, window=8)
    compare(ctx_q, 16, scale=3.0, softcap=50.0)


@pytest.mark.parametrize("ctx_q", [DECODE, MIXED], ids=["decode", "mixed"])
def test_sinks_match_torch(ctx_q):
    out = compare(ctx_q, 4, sinks=True, window=8)
    # the sink takes probability mass: the output differs from the same attention without it
    plain = compare(ctx_q, 4, window=8)
    assert (out - plain).abs().max() > 1e-3


def test_released_blocks_out_of_the_window_are_never_read():
    # the KV policy releases blocks a window left behind (-1 in the table; the slots clamp them to 0):
    # NaN in every slot out of the window must not reach the output
    q_rows, kc, vc, step = paged_case([(30, 2), (21, 1)], 4, 4, 2, 16)
    window = 6
    keep = torch.zeros(kc.shape[0], dtype=torch.bool)
    for s, (ctx, q) in enumerate([(30, 2), (21, 1)]):
        keep[step.paged_slots[s, max(ctx - q - window + 1, 0):ctx]] = True
    kc[~keep] = float("nan")
    vc[~keep] = float("nan")
    var = attention.Variant(0.25, window)
    got = cuda_attention.paged_step(q_rows, kc, vc, step, var, step.paged_slots)
    assert torch.isfinite(got).all()
    kc[~keep] = 0.0
    vc[~keep] = 0.0
    want = attention._paged_torch(q_rows, kc, vc, step, var, True, 0, step.paged_slots)
    assert (got - want).abs().max().item() <= TOL


def test_reduced_precision_kv_stays_close():
    # fp16 queries and cache (the interpreter runs numpy, which has no bf16 dot; bf16 is checked on CUDA in
    # tests/test_gpu.py): against the fp32 torch path on the same rounded values, within fp16 rounding
    q_rows, kc, vc, step = paged_case(MIXED, 4, 4, 2, 16)
    q16, k16, v16 = q_rows.half(), kc.half(), vc.half()
    var = attention.Variant(0.25)
    got = cuda_attention.paged_step(q16, k16, v16, step, var, step.paged_slots)
    assert got.dtype == torch.float16
    want = attention._paged_torch(q16.float(), k16.float(), v16.float(), step, var, True, 0, step.paged_slots)
    assert (got.float() - want).abs().max().item() <= 2e-3


def test_choose_backend():
    from modelcall.core import ConfigError
    assert cuda_attention.choose_backend("torch", torch.device("cpu")) is None
    assert cuda_attention.choose_backend("auto", torch.device("cpu")) is None     # CPU keeps the C kernel
    assert cuda_attention.choose_backend("triton", torch.device("cpu")) == "triton"   # interpreter on
    with pytest.raises(ConfigError, match="auto, triton or torch"):
        cuda_attention.choose_backend("flash", torch.device("cpu"))
