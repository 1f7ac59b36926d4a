"""Shared-prefix (cascade) attention on CPU equals attention row by row: ragged decodes and short chunks, several
groups sharing different prefixes beside rows sharing nothing, MHA/GQA/MQA; greedy text through the Kernel with
prefix caching equals transformers with the cascade path taken."""
from __future__ import annotations

import random

import anyio
import pytest
import torch
import torch.nn.functional as F

from modelcall.plugins.runner import attention, cascade, cpu_kernel
from modelcall.plugins.runner.batch import StepBatch, _context_slots

import block_reference

pytestmark = pytest.mark.skipif(cpu_kernel.load() is None, reason="no C compiler: no CPU kernel")
BS = 16


def shared_case(rows: list[tuple[int, int, int, int]], hq: int, hkv: int, d: int, dtype=torch.float32, seed=0):
    """A paged group: row = (prefix id, shared tokens, own tokens, new tokens); rows with the same prefix id hold
    the same physical blocks for their first `shared` tokens (as prefix-cache hits do), the rest their own."""
    g = torch.Generator().manual_seed(seed)
    perm = iter(torch.randperm(4096, generator=g).tolist())
    prefixes: dict[int, list[int]] = {}
    tables, ctx, qs = [], [], []
    for pid, shared, own, new in rows:
        assert shared % BS == 0
        blocks = prefixes.setdefault(pid, [next(perm) for _ in range(shared // BS)])[:shared // BS]
        n = shared + own + new
        tables.append(blocks + [next(perm) for _ in range(-(-n // BS) - len(blocks))])
        ctx.append(n)
        qs.append(new)
    width = max(len(t) for t in tables)
    table = torch.tensor([t + [0] * (width - len(t)) for t in tables])
    slots = _context_slots(table, torch.arange(max(ctx)), BS)
    kc = torch.randn(4096 * BS, hkv, d, generator=g).to(dtype)
    vc = torch.randn(4096 * BS, hkv, d, generator=g).to(dtype)
    seq = [s for s, q in enumerate(qs) for _ in range(q)]
    pos = [c - q + i for c, q in zip(ctx, qs) for i in range(q)]
    q_rows = torch.randn(hq, len(seq), d, generator=g).to(dtype).transpose(0, 1)   # [n, Hq, D], strided like a layer's
    step = StepBatch(input_ids=None, positions=None, slot_mapping=None, sample_rows=None, num_sampled=0,
                     num_paged=len(seq), paged_token_seq=torch.tensor(seq), paged_token_pos=torch.tensor(pos),
                     paged_slots=slots, paged_ctx_lens=ctx, paged_q_lens=qs)
    return q_rows, kc, vc, step


def reference(q_rows, kc, vc, step, scale):
    """Attention of every query over its request's keys 0..pos, in fp64, one token at a time."""
    out = []
    for t in range(q_rows.shape[0]):
        s, p = int(step.paged_token_seq[t]), int(step.paged_token_pos[t])
        sl = step.paged_slots[s, :p + 1]
        k, v = kc[sl].double().transpose(0, 1), vc[sl].double().transpose(0, 1)
        rep = q_rows.shape[1] // k.shape[0]
        k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
        out.append(F.scaled_dot_product_attention(q_rows[t].double()[:, None], k, v, scale=scale)[:, 0])
    return torch.stack(out)


ROWS = [  # two groups on different prefixes (one of them with a short chunk and a row sharing less), loners
    (0, 512, 7, 1), (0, 512, 130, 1), (0, 512, 0, 1), (0, 512, 33, 5), (0, 256, 40, 1), (0, 512, 64, 1),
    (1, 320, 3, 1), (1, 320, 90, 2), (1, 320, 17, 1), (1, 320, 200, 1),
    (2, 512, 10, 1), (3, 0, 300, 1), (4, 1024, 5, 40),   # alone on its prefix; no prefix; a long chunk (flash path)
]


@pytest.fixture
def small_groups(monkeypatch):
    """Thresholds low enough for these small cases (the defaults are for whether it pays, tested below)."""
    monkeypatch.setattr(cascade, "MIN_LANES", 4)
    monkeypatch.setattr(cascade, "MIN_SHARED", 256)


@pytest.mark.parametrize("hq,hkv,d", [(8, 8, 64), (8, 2, 64), (4, 1, 32), (6, 3, 48)])
def test_cascade_equals_row_by_row_attention_fp32(hq, hkv, d, small_groups):
    q_rows, kc, vc, step = shared_case(ROWS, hq, hkv, d, seed=hq + hkv + d)
    plan = cascade.plan(step.paged_slots, step.paged_ctx_lens, step.paged_q_lens, step.paged_token_seq,
                        max_queries=attention.LONG_CHUNK, group_heads=hq // hkv)
    assert plan is not None and sorted(g.length for g in plan.groups) == [320, 512]
    # group 0 keeps its five 512-token rows and drops the one sharing 256; the short chunk joins with its 5 queries
    assert sorted(g.tokens.numel() for g in plan.groups) == [5, 9]
    var = attention.Variant(d ** -0.5)
    got = attention._paged(q_rows, kc, vc, step, var, hq != hkv)
    want = reference(q_rows, kc, vc, step, var.scale)
    assert (got.double() - want).abs().max().item() < 2e-5
    plain = cpu_kernel.paged_attention(q_rows, kc, vc, step, var.scale)   # the row-by-row kernel on the same step
    assert (got - plain).abs().max().item() < 2e-5


def test_cascade_bf16_cache_matches_fp32_attention(small_groups):
    q_rows, kc, vc, step = shared_case(ROWS, 8, 8, 64, dtype=torch.bfloat16, seed=3)
    got = attention._paged(q_rows, kc, vc, step, attention.Variant(0.125), False)
    assert step.scratch[("cascade", 0)] is not None
    want = reference(q_rows, kc, vc, step, 0.125)
    assert (got.double() - want).abs().max().item() < 2e-2   # bf16 output and bf16 probabilities in the GEMM


@pytest.mark.parametrize("rows,shared,group_heads,taken", [
    (32, 1024, 1, True),     # W2: 32 rows x 1,024 shared tokens, MHA
    (23, 1024, 1, False),    # too few lanes for one KV head (23 of 32)
    (32, 256, 1, False),     # too short a prefix
    (6, 1024, 4, True),      # GQA: 6 rows x 4 query heads fill 24 lanes
    (5, 1024, 4, False),
])
def test_shared_prefix_is_taken_only_where_it_pays(rows, shared, group_heads, taken):
    case = [(0, shared, 64, 1)] * rows + [(1, 0, 2000, 1)]   # and a row sharing nothing
    _, _, _, step = shared_case(case, group_heads, 1, 16)
    plan = cascade.plan(step.paged_slots, step.paged_ctx_lens, step.paged_q_lens, step.paged_token_seq, 32, group_heads)
    assert (plan is not None) == taken
    if taken:
        assert [(g.tokens.numel(), g.length) for g in plan.groups] == [(rows, shared)]


def test_variants_fall_back(small_groups):
    q_rows, kc, vc, step = shared_case(ROWS, 4, 2, 32)
    var = attention.Variant(32 ** -0.5, softcap=30.0)   # a variant: the row-by-row kernel computes it
    got = attention._paged(q_rows, kc, vc, step, var, True)
    assert ("cascade", 0) not in step.scratch
    assert (got - cpu_kernel.paged_attention(q_rows, kc, vc, step, var.scale, 0, 30.0)).abs().max().item() == 0


@pytest.mark.parametrize("m,hq,hkv,d,keys,dtype", block_reference.CASES)
def test_block_attention_with_causal_limits_equals_masked_softmax(m, hq, hkv, d, keys, dtype):
    """block_attention (the long prefill chunks' and the shared part's kernel): row r sees keys 0..last[r]; tiles of
    32 lanes cut across rows and their group heads (GQA/MQA), a last partial tile, an odd key count, scattered slots,
    head sizes off the 16 x 16 transposes (48, 40). bf16: both GEMMs on bf16 pairs, the probabilities rounded to bf16
    for P V (as torch's flash attention), where the pairs pay; else widened to fp32 (the next test runs the other
    path). Into a bf16 `out`: the fp32 result's bits as .to(bf16) rounds them."""
    if not cpu_kernel.has_block_attention():
        pytest.skip("no AVX-512 kernel")
    block_reference.check(m, hq, hkv, d, keys, dtype)


def test_block_attentions_other_bf16_path_equals_masked_softmax_too():
    """block_attention picks bf16 pairs or widened fp32 GEMMs once per process (measured: attention_block.c's pairs_pay),
    so a suite run on one CPU exercises one of them. The same cases run again in a process forced onto the path
    this one did not pick (MODELCALL_BLOCK_PAIRS), and pass there too."""
    import os
    import subprocess
    import sys

    if not cpu_kernel.has_block_attention() or not hasattr(cpu_kernel.load(), "block_pairs"):
        pytest.skip("no AVX-512 kernel")
    other = "0" if cpu_kernel.block_uses_pairs() else "1"
    env = {**os.environ, "MODELCALL_BLOCK_PAIRS": other, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, block_reference.__file__, other], env=env, capture_output=True, text=True,
                          cwd=os.path.dirname(block_reference.__file__))
    assert done.returncode == 0, (done.stdout + done.stderr)[-2000:]
    assert f"{len(block_reference.CASES)} cases passed" in done.stdout


def test_kernel_log_sum_exp_is_the_scores_log_sum_exp():
    q_rows, kc, vc, step = shared_case([(0, 0, 37, 1), (1, 0, 200, 3), (2, 0, 5, 1)], 8, 2, 64)
    lse = torch.empty(q_rows.shape[0], 8)
    cpu_kernel.attend_tokens(q_rows, kc, vc, step.paged_token_seq, step.paged_token_pos, step.paged_slots, 0.125,
                             lse=lse)
    for t in range(q_rows.shape[0]):
        s, p = int(step.paged_token_seq[t]), int(step.paged_token_pos[t])
        k = kc[step.paged_slots[s, :p + 1]].transpose(0, 1).repeat_interleave(4, 0)   # [Hq, len, D]
        want = torch.logsumexp((k @ q_rows[t][:, :, None])[..., 0] * 0.125, dim=-1)
        assert (lse[t] - want).abs().max().item() < 1e-4


@pytest.mark.parametrize("runner_config", [{}, {"lean": True}], ids=["modules", "lean"])
def test_greedy_text_with_a_shared_cached_prefix_equals_transformers(runner_config, demo_model_dir, monkeypatch):
    """Eight requests on one cached 48-token prefix (thresholds lowered to the demo model's size), decoding
    together through the Kernel: the cascade path runs, and each request's greedy tokens equal `generate`'s;
    through transformers' modules and through the lean stack (whose one-call decode steps leave such steps to
    attention.paged_attention: plain_decode.py)."""
    from transformers import AutoModelForCausalLM

    from modelcall.core import Kernel
    monkeypatch.setattr(cascade, "MIN_SHARED", 32)
    monkeypatch.setattr(cascade, "MIN_LANES", 4)
    calls = []
    inner = cascade.attend
    monkeypatch.setattr(cascade, "attend", lambda *a: calls.append(len(a[3].groups)) or inner(*a))
    rng = random.Random(5)
    prefix = [rng.randrange(10, 500) for _ in range(48)]
    prompts = [prefix + [rng.randrange(10, 500) for _ in range(rng.randrange(1, 20))] for _ in range(8)]

    async def run() -> list[list[int]]:
        async with Kernel(model=demo_model_dir, dtype="float32", threads=1, block_size=16, num_kv_blocks=256,
                          plugin_config={"runner": runner_config}) as k:
            assert (k.runner.lean is not None) == bool(runner_config)
            await k.complete(prompt_token_ids=prefix + [7], max_tokens=1, temperature=0)   # caches the prefix
            out: list[list[int]] = [[] for _ in prompts]

            async def one(i: int) -> None:
                done = await k.complete(prompt_token_ids=prompts[i], max_tokens=12, temperature=0, ignore_eos=True)
                out[i] = done.token_ids
            async with anyio.create_task_group() as tg:
                for i in range(len(prompts)):
                    tg.start_soon(one, i)
            return out

    got = anyio.run(run)
    assert calls, "the shared-prefix path never ran"
    hf = AutoModelForCausalLM.from_pretrained(demo_model_dir, local_files_only=True, dtype=torch.float32).eval()
    for ids, tokens in zip(prompts, got):
        t = torch.tensor([ids])
        ref = hf.generate(t, attention_mask=torch.ones_like(t), max_new_tokens=12, min_new_tokens=12,
                          do_sample=False)[0, len(ids):].tolist()
        assert tokens == ref
