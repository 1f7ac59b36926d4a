"""The Triton paged-attention kernel (plugins/runner/cuda_attention.py) against the portable torch path
(attention._paged_torch), run here by Triton's CPU interpreter (TRITON_INTERPRET=1) on CPU tensors.

Ragged batches read through shuffled block tables: decodes, chunks over a cached prefix (chunked prefill,
prefix hits), whole prompts, mixed; block sizes 4 and 16; GQA, MQA and MHA; head_dim 16 and 24 (not a
power of two: masked lanes); sliding windows, soft-capping, sinks and a query_pre_attn_scalar-style scale.
Tolerance: fp32 in and out, |diff| <= 2e-5 (different summation order of the same fp32 math).
"""
from __future__ import annotations

import pytest
import torch

from paged_cases import DECODE, MIXED, compare, paged_case

from modelcall.plugins.runner import attention, cuda_attention

import triton  # noqa: E402,F401  (the test extra: a missing or broken triton is an error, not a skip)

if not cuda_attention.interpreting():
    pytest.skip("Triton's interpreter is off (TRITON_INTERPRET=1 must be set before triton is first imported: "
                "tests/conftest.py does so without an NVIDIA driver)", allow_module_level=True)

TOL = 2e-5


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
    compare(MIXED, 4, tol=2e-3, dtype=torch.float16)
    compare(DECODE, 4, tol=2e-3, dtype=torch.float16, window=8, sinks=True)


def test_choose_backend():
    from modelcall.core import ConfigError
    assert cuda_attention.choose_backend("torch", torch.device("cpu")) is None
    assert cuda_attention.choose_backend("auto", torch.device("cpu")) is None     # CPU keeps the C kernel
    assert cuda_attention.choose_backend("triton", torch.device("cpu")) == "triton"   # interpreter on
    with pytest.raises(ConfigError, match="auto, triton or torch"):
        cuda_attention.choose_backend("flash", torch.device("cpu"))
