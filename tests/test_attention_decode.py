"""The decode attention path of the C kernel (plugins/runner/csrc/attention_decode.c) as the lean stack calls it:
q/k/v are [1, H, T, D] views of one packed QKV buffer, the step's K/V go into the cache inside the kernel
(`write_kv`), q is read in place and the output comes back in the model's dtype. Checked against attention in
fp64 over what the cache holds, with one and two OpenMP threads (two threads split a few long rows' keys and
merge the parts by log-sum-exp); fp32, the parity reference, stays bit for bit what it was with one thread."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from modelcall.plugins.runner import attention, cpu_kernel
from paged_cases import paged_case

pytestmark = pytest.mark.skipif(cpu_kernel.load() is None, reason="no C compiler: no CPU kernel")
BS = 16


class Layer:
    layer_idx = 0


@pytest.fixture
def threads():
    """Set torch's (and the kernel's) thread count for a test; back to one afterwards, also on failure."""
    yield torch.set_num_threads
    torch.set_num_threads(1)


def decode_case(ctx: list[int], hq: int, hkv: int, d: int, dtype=torch.bfloat16, cache_dtype=None, seed=0):
    """One decode step: row r at position ctx[r] - 1, its blocks scattered over a pool, the earlier K/V in the
    cache and the new token's K/V only in the packed buffer. Returns (q, k, v views, cache, step)."""
    _, kc, vc, step = paged_case([(c, 1) for c in ctx], BS, hkv, hkv, d, seed, dtype=cache_dtype or dtype)
    g = torch.Generator().manual_seed(seed + 100)
    n, slots = len(ctx), step.paged_slots
    pos = torch.tensor(ctx) - 1
    slot_mapping = slots[torch.arange(n), pos].contiguous()
    qkv = (torch.randn(n, (hq + 2 * hkv) * d, generator=g) * 2).to(dtype)   # the packed QKV GEMM's output
    q = qkv[:, :hq * d].view(n, hq, d).transpose(0, 1).unsqueeze(0)
    k = qkv[:, hq * d:(hq + hkv) * d].view(n, hkv, d).transpose(0, 1).unsqueeze(0)
    v = qkv[:, (hq + hkv) * d:].view(n, hkv, d).transpose(0, 1).unsqueeze(0)
    step.slot_mapping, step.paged_token_seq, step.paged_token_pos = slot_mapping, torch.arange(n), pos
    step.kv = [(kc, vc)]
    return q, k, v, kc, vc, step


def fp64_reference(q, kc, vc, step, scale):
    """[n, Hq, D] fp64: each row over its keys 0..pos as the cache holds them."""
    out = []
    q_rows = q[0].transpose(0, 1)
    for t in range(q_rows.shape[0]):
        sl = step.paged_slots[t, :int(step.paged_token_pos[t]) + 1]
        kk, vv = kc[sl].double().transpose(0, 1), vc[sl].double().transpose(0, 1)
        rep = q_rows.shape[1] // kk.shape[0]
        kk, vv = kk.repeat_interleave(rep, 0), vv.repeat_interleave(rep, 0)
        out.append(F.scaled_dot_product_attention(q_rows[t].double()[:, None], kk, vv, scale=scale)[:, 0])
    return torch.stack(out)


def run(q, k, v, step, d):
    o, _ = attention.paged_attention(Layer(), q, k, v, None, scaling=d ** -0.5, sliding_window=None,
                                     modelcall_step=step)
    return o[0]


@pytest.fixture
def split(monkeypatch):
    """Turn on splitting a row's keys across threads (parts of at least `keys` keys); off by default."""
    return lambda keys: monkeypatch.setattr(cpu_kernel, "MIN_SPLIT", keys)


@pytest.mark.parametrize("hq,hkv,d", [(8, 8, 64), (6, 2, 64), (4, 1, 128), (8, 8, 32), (3, 3, 96)])
@pytest.mark.parametrize("n_threads,min_split", [(1, 0), (2, 0), (2, 256)])
def test_bf16_decode_equals_fp64_attention_and_writes_the_cache(hq, hkv, d, n_threads, min_split, threads, split):
    """With the split on, two threads cut the 700-token row in two and leave the 1-key row's second part empty."""
    threads(n_threads)
    split(min_split)
    ctx = [1, 17, 130, 700, 33]
    q, k, v, kc, vc, step = decode_case(ctx, hq, hkv, d)
    before_k, before_v = kc.clone(), vc.clone()
    out = run(q, k, v, step, d)
    assert out.dtype == torch.bfloat16 and out.shape == (len(ctx), hq, d)
    # the cache holds exactly the new K/V rows at their slots, and nothing else changed
    sm = step.slot_mapping
    assert torch.equal(kc[sm], k[0].transpose(0, 1)) and torch.equal(vc[sm], v[0].transpose(0, 1))
    keep = torch.ones(kc.shape[0], dtype=torch.bool)
    keep[sm] = False
    assert torch.equal(kc[keep], before_k[keep]) and torch.equal(vc[keep], before_v[keep])
    ref = fp64_reference(q, kc, vc, step, d ** -0.5)
    err = (out.double() - ref).abs().max().item()
    assert err < 1.6e-2 * ref.abs().max().item(), err   # bf16 output: half an ulp is 2^-9 of the value


def test_two_threads_split_few_long_rows_and_merge_by_log_sum_exp(threads, split):
    """3 rows of 2-3K keys on two threads: each row's keys run in parts on both threads (MIN_SPLIT 256), merged
    by log-sum-exp; the result matches fp64 and one thread's, and the log-sum-exp matches torch's."""
    split(256)
    ctx = [3000, 2048, 1200]
    q, k, v, kc, vc, step = decode_case(ctx, 8, 8, 64, seed=3)
    q_rows = q[0].transpose(0, 1)
    cpu_kernel.write_kv(k[0].transpose(0, 1), v[0].transpose(0, 1), kc, vc, step.slot_mapping)
    outs, lses = [], []
    for n_threads in (1, 2):
        threads(n_threads)
        lse = torch.empty(len(ctx), 8)
        outs.append(cpu_kernel.attend_tokens(q_rows, kc, vc, step.paged_token_seq, step.paged_token_pos,
                                             step.paged_slots, 0.125, lse=lse))
        lses.append(lse)
    ref = fp64_reference(q, kc, vc, step, 0.125)
    for o in outs:
        assert (o.double() - ref).abs().max().item() < 2e-5
    assert (outs[0] - outs[1]).abs().max().item() < 2e-6
    for t, c in enumerate(ctx):
        sl = step.paged_slots[t, :c]
        s = torch.einsum("hd,jhd->hj", q_rows[t].double(), kc[sl].double()) * 0.125
        want = torch.logsumexp(s, dim=1)
        for lse in lses:
            assert (lse[t].double() - want).abs().max().item() < 1e-4


@pytest.mark.parametrize("n_threads", [1, 2])
def test_fp32_decode_is_bit_for_bit_the_row_kernel_on_a_contiguous_copy(n_threads, threads):
    """fp32 (the parity reference): reading q in place from the packed rows gives the same bits as the kernel on
    a contiguous fp32 copy, on one thread and on two, and is within 1e-5 of fp64."""
    threads(n_threads)
    ctx = [5, 64, 300, 1500]
    q, k, v, kc, vc, step = decode_case(ctx, 8, 2, 64, dtype=torch.float32)
    out = run(q, k, v, step, 64)
    assert out.dtype == torch.float32
    copy = cpu_kernel.attend_tokens(q[0].transpose(0, 1).contiguous().clone(), kc, vc, step.paged_token_seq,
                                    step.paged_token_pos, step.paged_slots, 0.125)
    assert torch.equal(out, copy)
    ref = fp64_reference(q, kc, vc, step, 0.125)
    assert (out.double() - ref).abs().max().item() < 1e-5
    assert torch.equal(kc[step.slot_mapping], k[0].transpose(0, 1))


def test_write_kv_rounds_into_a_bf16_cache_as_torch_does():
    """fp32 rows into a bf16 cache: the bits of `.to(torch.bfloat16)` (ties to even, NaN, inf, subnormals);
    bf16 rows into an fp32 cache: exact."""
    n, hkv, d = 7, 2, 48
    g = torch.Generator().manual_seed(1)
    rows = torch.randn(n, 3 * hkv * d, generator=g)
    base = torch.tensor([1.0, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, -(1.0 + 2 ** -8), float("nan"), float("inf"),
                         -float("inf"), 1e-40, -3e-39, 0.0, -0.0, 3.3895e38, 65504.0, 2 ** -133])
    rows.view(-1)[:base.numel()] = base                        # ties, specials and subnormals in row 0
    k, v = rows[:, :hkv * d].view(n, hkv, d), rows[:, hkv * d:2 * hkv * d].view(n, hkv, d)
    kc, vc = torch.zeros(40, hkv, d, dtype=torch.bfloat16), torch.zeros(40, hkv, d, dtype=torch.bfloat16)
    slots = torch.tensor([3, 0, 39, 17, 5, 8, 21])
    cpu_kernel.write_kv(k, v, kc, vc, slots)
    want_k, want_v = k.to(torch.bfloat16), v.to(torch.bfloat16)
    for got, want in ((kc[slots], want_k), (vc[slots], want_v)):
        # NOTE: a NaN is a NaN: torch's own payload differs by path (0x7fc0 scalar, 0xffff vectorised)
        nan = want.isnan()
        assert torch.equal(got.isnan(), nan) and int(nan.sum()) == (1 if want is want_k else 0)
        assert torch.equal(got.view(torch.int16)[~nan], want.view(torch.int16)[~nan])
    kf, vf = torch.zeros(40, hkv, d), torch.zeros(40, hkv, d)
    cpu_kernel.write_kv(want_k, want_v, kf, vf, slots)
    assert torch.equal(kf[slots].view(torch.int32), want_k.float().view(torch.int32))   # bits: NaN included
    assert torch.equal(vf[slots].view(torch.int32), want_v.float().view(torch.int32))


def test_a_step_with_fresh_prompts_writes_every_token_and_attends_as_before():
    """Decodes plus a fresh 40-token prompt in one step through attention.paged_attention: every token's K/V lands
    in its slot (fresh rows too) and the decode rows match fp64."""
    from modelcall.plugins.runner.batch import FreshGroup

    ctx = [90, 260]
    q, k, v, kc, vc, step = decode_case(ctx, 8, 8, 64, seed=5)
    g = torch.Generator().manual_seed(6)
    fresh = 40
    qkv = torch.randn(2 + fresh, 24 * 64, generator=g).bfloat16()
    qkv[:2] = torch.cat([q[0].transpose(0, 1).reshape(2, -1), k[0].transpose(0, 1).reshape(2, -1),
                         v[0].transpose(0, 1).reshape(2, -1)], dim=1)
    free = torch.ones(kc.shape[0], dtype=torch.bool)
    free[step.paged_slots.flatten()] = False
    fresh_slots = free.nonzero()[:fresh, 0]
    step.slot_mapping = torch.cat([step.slot_mapping, fresh_slots])
    step.fresh = [FreshGroup(start=2, num_seqs=1, q_len=fresh)]
    tokens = 2 + fresh
    qq = qkv[:, :512].view(tokens, 8, 64).transpose(0, 1).unsqueeze(0)
    kk = qkv[:, 512:1024].view(tokens, 8, 64).transpose(0, 1).unsqueeze(0)
    vv = qkv[:, 1024:].view(tokens, 8, 64).transpose(0, 1).unsqueeze(0)
    out = run(qq, kk, vv, step, 64)
    assert torch.equal(kc[step.slot_mapping], kk[0].transpose(0, 1))
    assert torch.equal(vc[step.slot_mapping], vv[0].transpose(0, 1))
    ref = fp64_reference(qq[:, :, :2], kc, vc, step, 0.125)
    assert (out[:2].double() - ref).abs().max().item() < 1.6e-2 * ref.abs().max().item()
    own = F.scaled_dot_product_attention(qq[:, :, 2:].double(), kk[:, :, 2:].double(), vv[:, :, 2:].double(),
                                         is_causal=True, scale=0.125)[0].transpose(0, 1)
    assert (out[2:].double() - own).abs().max().item() < 3e-2


@pytest.mark.parametrize("hq,hkv,d", [(9, 3, 64), (4, 1, 256), (8, 8, 32), (3, 3, 96)])
@pytest.mark.parametrize("n_threads", [1, 2])
def test_fp32_queries_over_a_bf16_cache_equal_fp64_attention(hq, hkv, d, n_threads, threads):
    """A GGUF model (fp32 compute, bf16 cache): each query is split into bf16 halves, hi + lo, for the bf16 pair
    kernel. The output stays within fp32 rounding of fp64 attention over what the cache holds; the hi half alone
    (the query rounded to bf16) would be ~100x further off, so a kernel dropping lo fails the bound."""
    threads(n_threads)
    ctx = [1, 17, 130, 700, 33]
    q, k, v, kc, vc, step = decode_case(ctx, hq, hkv, d, dtype=torch.float32, cache_dtype=torch.bfloat16)
    out = run(q, k, v, step, d)
    assert out.dtype == torch.float32
    assert torch.equal(kc[step.slot_mapping], k[0].transpose(0, 1).bfloat16())
    ref = fp64_reference(q, kc, vc, step, d ** -0.5)
    err = (out.double() - ref).abs().max().item()
    hi_only = fp64_reference(q.bfloat16().float(), kc, vc, step, d ** -0.5)
    assert err < 2e-5 * ref.abs().max().item(), err
    assert (hi_only - ref).abs().max().item() > 20 * err   # the bound above tells a hi-only kernel apart
