"""The attention kernel's AVX2 paths (csrc/attention_rows_avx2.c, attention_decode_avx2.c: CPUs without AVX-512) on any
x86 machine: the same sources built with -mno-avx512f, so a CI machine with AVX-512 checks them too (on an AVX2-only
CPU it is the kernel the runner loads). Decode rows with fp32 and bf16 queries over bf16 and fp8 caches, by the
blocked row kernel (decode_row8), against fp64 attention over the values the cache holds; a head size that is not a
multiple of 16 takes attend_vec8."""
from __future__ import annotations

import platform

import pytest
import torch

from modelcall.plugins.runner import cpu_kernel
from test_attention_decode import decode_case, fp64_reference

pytestmark = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64") or cpu_kernel.load() is None,
                                reason="x86 with a C compiler only")


@pytest.fixture(scope="module")
def avx2_kernel():
    lib = cpu_kernel._LIB.compile(("-mno-avx512f",), name="paged_attention_avx2")
    assert not hasattr(lib, "block_pairs")   # the AVX-512 block kernels are not in it: this is the AVX2 build
    return lib


@pytest.fixture
def threads():
    yield torch.set_num_threads
    torch.set_num_threads(1)


CACHES = [torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2]


@pytest.mark.parametrize("cache_dtype", CACHES, ids=["bf16", "e4m3", "e5m2"])
@pytest.mark.parametrize("hq,hkv,d", [(8, 8, 64), (6, 2, 64), (4, 1, 128), (3, 3, 96), (8, 8, 16), (2, 1, 256)])
@pytest.mark.parametrize("q_dtype", [torch.float32, torch.bfloat16], ids=["q32", "q16"])
@pytest.mark.parametrize("n_threads", [1, 2])
def test_decode_rows_over_bf16_and_fp8_caches_equal_fp64(avx2_kernel, monkeypatch, threads, cache_dtype, hq, hkv, d,
                                                         q_dtype, n_threads):
    """Contexts of 1 key, within a 16-key block, one key past it, and long: every row's fp32 output within fp32
    rounding of fp64 attention over the cache's values (scores scaled by 2^8 for E4M3 and the output back: exact);
    its log-sum-exp as torch's."""
    threads(n_threads)
    monkeypatch.setattr(cpu_kernel, "load", lambda: avx2_kernel)
    ctx = [1, 7, 8, 15, 16, 17, 70, 300, 1100]
    q, _, _, kc, vc, step = decode_case(ctx, hq, hkv, d, dtype=q_dtype, cache_dtype=cache_dtype, seed=5)
    q_rows = q[0].transpose(0, 1)
    lse = torch.empty(len(ctx), hq)
    out = cpu_kernel.attend_tokens(q_rows, kc, vc, step.paged_token_seq, step.paged_token_pos, step.paged_slots,
                                   d ** -0.5, lse=lse)
    ref = fp64_reference(q, kc, vc, step, d ** -0.5)
    assert (out.double() - ref).abs().max().item() < 2e-5 * ref.abs().max().item()
    rep = hq // hkv
    for t, c in enumerate(ctx):
        keys = kc[step.paged_slots[t, :c]].double().repeat_interleave(rep, 1)
        want = torch.logsumexp(torch.einsum("hd,jhd->hj", q_rows[t].double(), keys) * d ** -0.5, dim=1)
        assert (lse[t].double() - want).abs().max().item() < 1e-4


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_a_head_size_of_eight_times_an_odd_number_takes_the_vector_row_kernel(avx2_kernel, monkeypatch, cache_dtype):
    """d = 40 (not a multiple of 16): attend_vec8, eight keys' sums at a time, against fp64."""
    monkeypatch.setattr(cpu_kernel, "load", lambda: avx2_kernel)
    ctx = [3, 16, 33, 250]
    q, _, _, kc, vc, step = decode_case(ctx, 4, 2, 40, dtype=torch.float32, cache_dtype=cache_dtype, seed=6)
    out = cpu_kernel.attend_tokens(q[0].transpose(0, 1), kc, vc, step.paged_token_seq, step.paged_token_pos,
                                   step.paged_slots, 40 ** -0.5)
    ref = fp64_reference(q, kc, vc, step, 40 ** -0.5)
    assert (out.double() - ref).abs().max().item() < 2e-5 * ref.abs().max().item()
