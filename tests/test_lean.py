"""The lean decoder stack (plugins/runner/lean.py) computes what transformers' modules compute: fp32 logits of
ragged mixed steps within 1e-4 of transformers' forward, bf16 logits within 4 bf16 ulps of transformers' bf16 forward
and equal to the HF-module runner's up to the RMSNorm sums' order; it is the path taken for bf16 Llama-like models on CPU and never for other families."""
from __future__ import annotations

import random
import tempfile

import pytest
import torch

from family_models import build_family
from test_runner import Blocks, drive_ragged_steps, make_runner

from modelcall.core import Request, SamplingParams, ScheduledChunk, SchedulePlan
from modelcall.plugins.runner import fused_ops, lean, lean_gemma, packing

pytestmark = pytest.mark.skipif(fused_ops.load() is None, reason="no C compiler here")
LEAN_FAMILIES = ["llama3", "qwen2", "qwen3", "mistral_window"]


@pytest.fixture(autouse=True)
def one_thread_after():
    """Runners made with threads=2 set torch's thread count for the whole process: back to one after each test."""
    yield
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def family_dirs(demo_model_dir):
    root = tempfile.mkdtemp()
    dirs = {name: build_family(name, f"{root}/{name}", demo_model_dir) for name in [*LEAN_FAMILIES, "gemma3"]}
    dirs["demo"] = demo_model_dir
    return dirs


def no_hf_layers(runner, monkeypatch) -> None:
    """Make the runner's transformers model and decoder layers raise if the runner still calls them."""
    def refuse(*a, **k):
        raise AssertionError("the HF decoder ran")
    for mod in (runner.base, *runner.base.layers):
        monkeypatch.setattr(mod, "forward", refuse)


@pytest.mark.parametrize("name", [*LEAN_FAMILIES, "demo"])
def test_lean_stack_fp32_matches_transformers_on_ragged_batches(name, family_dirs, monkeypatch):
    from transformers import AutoModelForCausalLM
    model_dir = family_dirs[name]
    hf = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=torch.float32).eval()
    runner = make_runner(model_dir, plugin_config={"runner": {"lean": True}})
    assert isinstance(runner.lean, lean.LeanStack)
    no_hf_layers(runner, monkeypatch)
    assert drive_ragged_steps(runner, hf, seed=5) < 1e-4, name


def test_gemma3_stack_fp32_matches_transformers_on_ragged_batches(family_dirs, monkeypatch):
    """Gemma 3 (lean_gemma.py): four (1 + w) norms a layer, q/k norms, GELU-tanh, sliding and full layers with their
    own rotary tables, the scaled embedding; ragged steps past the 8-token window."""
    from transformers import AutoModelForCausalLM
    model_dir = family_dirs["gemma3"]
    hf = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=torch.float32).eval()
    runner = make_runner(model_dir, plugin_config={"runner": {"lean": True}})
    assert isinstance(runner.lean, lean_gemma.GemmaStack)
    assert {L.table for L in runner.lean.layers} == {"sliding_attention", "full_attention"}
    no_hf_layers(runner, monkeypatch)
    assert drive_ragged_steps(runner, hf, seed=7) < 1e-4
    # only fp32 (Gemma rounds after the weight product in bf16, the fused ops before it); "auto" wants quantized
    # linears (GGUF), so a dense fp32 checkpoint keeps transformers' modules
    assert make_runner(model_dir, dtype="bfloat16", plugin_config={"runner": {"lean": True}}).lean is None
    assert make_runner(model_dir).lean is None


def test_gelu_tanh_mul_equals_torch():
    gen = torch.Generator().manual_seed(3)
    gate, up = torch.randn(5, 200, generator=gen) * 4, torch.randn(5, 200, generator=gen)
    out = torch.empty_like(gate)
    fused_ops.gelu_tanh_mul(gate, up, out)
    want = torch.nn.functional.gelu(gate, approximate="tanh") * up
    torch.testing.assert_close(out, want, rtol=2e-6, atol=2e-6)


def lockstep_logits(runners: list, seed: int) -> list[list[torch.Tensor]]:
    """The same random mixed steps (prefill chunks, whole prompts, decodes) through each runner: per step, each
    runner's logits."""
    rng = random.Random(seed)
    vocab = runners[0].spec.vocab_size
    blocks = Blocks(rng, len(runners[0].groups))
    reqs = [Request(f"r{i}", [rng.randrange(10, vocab) for _ in range(n)], SamplingParams(temperature=0),
                    max_tokens=16) for i, n in enumerate([1, 4, 13, 17, 33, 40])]
    out = []
    for _ in range(8):
        chunks = []
        for req in reqs:
            n = min(req.num_tokens - req.num_computed_tokens, rng.choice([1, 3, 8, 64]))
            blocks.grow(req, n)
            chunks.append(ScheduledChunk(req, n, req.num_computed_tokens + n == req.num_tokens))
        rng.shuffle(chunks)
        plan = SchedulePlan(chunks=chunks)
        out.append([r.compute_logits(plan).float() for r in runners])
        for c in chunks:
            c.request.num_computed_tokens += c.num_new_tokens
            if c.sample:
                c.request.all_token_ids.append(rng.randrange(10, vocab))
    return out


@pytest.mark.parametrize("name,threads", [("llama3", 1), ("qwen2", 2)])
def test_fp32_packed_layers_do_their_residual_adds_as_gemm_post_ops(name, threads, family_dirs, monkeypatch):
    """fp32 with packed linears (as for a large bf16 checkpoint on an AVX2 CPU): the o and down GEMMs add their
    output to the residual stream as a post-op, so add_rmsnorm only normalizes (it is never handed a summand);
    logits equal the same runner's with the post-ops off and are within 1e-4 of transformers'."""
    from transformers import AutoModelForCausalLM
    if not packing.can_pack(torch.float32):
        pytest.skip("oneDNN cannot pack fp32 here")
    monkeypatch.setattr(packing, "FP32_MIN_WEIGHTS", 0)   # the test models are small: pack them as a large one
    model_dir = family_dirs[name]
    runner = make_runner(model_dir, threads=threads)
    plain = make_runner(model_dir, threads=threads, plugin_config={"runner": {"lean_epilogues": False}})
    assert isinstance(runner.lean, lean.LeanStack) and isinstance(plain.lean, lean.LeanStack)
    assert all(L.o_add is not None and L.down_add is not None for L in runner.lean.layers)
    assert plain.lean.layers[0].o_add is None and plain.lean.layers[0].down_add is None
    summands = []
    real = fused_ops.add_rmsnorm
    def spy(x, *a, **k):
        summands.append(x is not None)
        return real(x, *a, **k)
    monkeypatch.setattr(fused_ops, "add_rmsnorm", spy)
    steps = lockstep_logits([runner], seed=11)
    assert summands and not any(summands), "add_rmsnorm was handed a GEMM output to add"
    monkeypatch.setattr(fused_ops, "add_rmsnorm", real)
    ref = lockstep_logits([plain], seed=11)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(steps, ref))   # fp32: the same bits as the add apart
    hf = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=torch.float32).eval()
    assert drive_ragged_steps(make_runner(model_dir, threads=threads), hf, seed=5) < 1e-4


@pytest.mark.parametrize("name,threads", [("llama3", 1), ("qwen3", 2), ("demo", 1)])
def test_lean_stack_bf16_equals_the_hf_module_runner(name, threads, family_dirs, monkeypatch):
    """bf16 on CPU takes the lean stack by default (packed GEMMs; gate/up fused on two threads) and gives
    transformers' own bf16 logits, and the HF-module runner's: the fused ops round where the modules round,
    only the norms' sums differ in order."""
    from transformers import AutoModelForCausalLM
    model_dir = family_dirs[name]
    # the independent reference: transformers' model in bf16, each sampled row against a whole-sequence forward.
    # NOTE: 3e-2 of the logits' scale is ~4 bf16 ulps (2^-7 relative); measured 0.021-0.023 on llama3, qwen3 and
    # demo (Zen 3, one thread); bf16 against fp32 itself differs by 0.04-0.37 on these random-weight models, so
    # fp32 cannot be the reference at any bound that still fails a real error (logits 10% off: 0.1).
    hf = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=torch.bfloat16).eval()
    assert drive_ragged_steps(make_runner(model_dir, dtype="bfloat16", threads=threads), hf, seed=7, tol=3e-2) < 3e-2
    hf_modules = make_runner(model_dir, dtype="bfloat16", threads=threads, plugin_config={"runner": {"lean": False}})
    lean_runner = make_runner(model_dir, dtype="bfloat16", threads=threads)
    assert hf_modules.lean is None and isinstance(lean_runner.lean, lean.LeanStack)
    # gate/up fuse on two threads where oneDNN can pack bf16 here (AVX-512); else they stay apart
    assert (lean_runner.lean.layers[0].gate_up is not None) == (threads > 1 and packing.can_pack(torch.bfloat16))
    steps = lockstep_logits([hf_modules, lean_runner], seed=7)
    worst = max(((a - b).abs().max() / a.abs().max().clamp(min=1.0)).item() for a, b in steps)
    agree = sum(int((a.argmax(-1) == b.argmax(-1)).sum()) for a, b in steps)
    rows = sum(a.shape[0] for a, _ in steps)
    assert worst < 3e-2, worst           # a few bf16 ulps of the logits' scale
    assert agree >= 0.95 * rows, (agree, rows)


def test_lean_is_not_taken_in_fp32_by_default_nor_for_other_families(family_dirs, demo_model_dir):
    assert make_runner(family_dirs["demo"]).lean is None   # fp32, "auto": transformers' modules (exactness)
    root = tempfile.mkdtemp()
    for name in ("gemma2", "phi3", "granite", "qwen3_moe"):
        model_dir = build_family(name, f"{root}/{name}", demo_model_dir)
        assert make_runner(model_dir, dtype="bfloat16", plugin_config={"runner": {"lean": True}}).lean is None, name


def bf16(*shape, gen) -> torch.Tensor:
    return torch.randn(*shape, generator=gen).to(torch.bfloat16)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("d", [32, 64, 128, 48])
def test_rope_without_head_norms_equals_transformers_bit_for_bit(dtype, d):
    """Llama's rotary (no q/k norm) on the packed rows: with AVX-512 and d % 32 == 0 it runs 16 lanes at a time
    (d 48: the scalar loop); in bf16 either way the bits of transformers' apply_rotary_pos_emb, V untouched. fp32
    within an ulp of them (the scalar loop is built with -ffast-math: its product and sum may fuse)."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    gen = torch.Generator().manual_seed(d)
    rows, hq, hkv = 21, 6, 2
    qkv = torch.randn(rows, (hq + 2 * hkv) * d, generator=gen).to(dtype)
    pos = torch.randint(0, 300, (rows,), generator=gen)
    ang = torch.rand(300, d // 2, generator=gen) * 6.3
    cos, sin = torch.cat([ang.cos()] * 2, 1).to(dtype), torch.cat([ang.sin()] * 2, 1).to(dtype)
    q = qkv[:, :hq * d].view(1, rows, hq, d).transpose(1, 2)
    k = qkv[:, hq * d:(hq + hkv) * d].view(1, rows, hkv, d).transpose(1, 2)
    ref_q, ref_k = apply_rotary_pos_emb(q, k, cos[pos][None], sin[pos][None])
    got = qkv.clone()
    fused_ops.rope(got, pos, cos, sin, hq, hkv, d)
    same = torch.equal if dtype == torch.bfloat16 else lambda a, b: torch.allclose(a, b, rtol=2e-7, atol=1e-6)
    assert same(got[:, :hq * d].view(rows, hq, d), ref_q[0].transpose(0, 1))
    assert same(got[:, hq * d:(hq + hkv) * d].view(rows, hkv, d), ref_k[0].transpose(0, 1))
    assert torch.equal(got[:, (hq + hkv) * d:], qkv[:, (hq + hkv) * d:])


def test_fused_ops_round_where_transformers_modules_round():
    """bf16: rotary (with Qwen3's per-head norms) and silu*up equal the HF modules' ops bit for bit; the residual
    add too; the RMSNorm output within one bf16 ulp (its variance is summed in another order)."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb
    gen = torch.Generator().manual_seed(0)
    rows, hq, hkv, d = 37, 4, 2, 32
    qkv = bf16(rows, (hq + 2 * hkv) * d, gen=gen)
    pos = torch.randint(0, 100, (rows,), generator=gen)
    cos, sin = bf16(100, d, gen=gen), bf16(100, d, gen=gen)
    qn, kn = LlamaRMSNorm(d, 1e-6).to(torch.bfloat16), LlamaRMSNorm(d, 1e-6).to(torch.bfloat16)
    qn.weight.data, kn.weight.data = bf16(d, gen=gen), bf16(d, gen=gen)
    with torch.inference_mode():
        q = qn(qkv[:, :hq * d].view(1, rows, hq, d)).transpose(1, 2)
        k = kn(qkv[:, hq * d:(hq + hkv) * d].view(1, rows, hkv, d)).transpose(1, 2)
        ref_q, ref_k = apply_rotary_pos_emb(q, k, cos[pos][None], sin[pos][None])
        got = qkv.clone()
        fused_ops.rope(got, pos, cos, sin, hq, hkv, d, qn.weight, kn.weight, 1e-6)
        assert torch.equal(got[:, :hq * d].view(rows, hq, d), ref_q[0].transpose(0, 1))
        assert torch.equal(got[:, hq * d:(hq + hkv) * d].view(rows, hkv, d), ref_k[0].transpose(0, 1))
        assert torch.equal(got[:, (hq + hkv) * d:], qkv[:, (hq + hkv) * d:])   # V untouched

        y = bf16(rows, 2 * 96, gen=gen)
        act = torch.empty(rows, 96, dtype=torch.bfloat16)
        fused_ops.silu_mul(y[:, :96], y[:, 96:], act)   # strided halves of one GEMM result
        assert torch.equal(act, torch.nn.functional.silu(y[:, :96]) * y[:, 96:])

        norm = LlamaRMSNorm(96, 1e-5).to(torch.bfloat16)
        norm.weight.data = bf16(96, gen=gen)
        h, x = bf16(rows, 96, gen=gen), bf16(rows, 96, gen=gen)
        res, out = h.clone(), torch.empty_like(h)
        fused_ops.add_rmsnorm(x, res, out, norm.weight, 1e-5)
        assert torch.equal(res, h + x)
        ref = norm(h + x)
        ulp = ref.float().abs() * 2 ** -7
        assert ((out.float() - ref.float()).abs() <= ulp + 1e-30).all()


def _qwen2_mixed_windows(out_dir: str, tokenizer_dir: str) -> str:
    """Qwen2 with layer 0 full and layers 1-2 sliding (8 tokens): several KV groups, each with its own tables."""
    import shutil

    import transformers
    from family_models import COMMON, TOKENIZER_FILES, WINDOW
    cfg = transformers.Qwen2Config(**COMMON, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(out_dir)
    for f in TOKENIZER_FILES:
        shutil.copy(f"{tokenizer_dir}/{f}", f"{out_dir}/{f}")
    return out_dir


@pytest.mark.anyio
@pytest.mark.parametrize("name", ["llama3", "qwen2_mixed_windows", "gemma3"])
async def test_lean_greedy_through_the_kernel_equals_generate(name, family_dirs, demo_model_dir, make_kernel, events,
                                                              tmp_path):
    """Through the whole kernel with the lean stack forced (fp32): transformers' greedy tokens under concurrency,
    chunked prefill (16-token budget), prefix-cache hits and preemption; with several KV groups too."""
    from test_families import MAX_TOKENS, PROMPTS, _run_all
    from greedy_refs import greedy_continuations
    from transformers import AutoConfig

    from modelcall.core.plan import kv_groups
    from modelcall.events import Preempted
    from modelcall.plugins.runner.loader import layer_windows

    model_dir = family_dirs[name] if name in family_dirs else _qwen2_mixed_windows(str(tmp_path), demo_model_dir)
    cfg = AutoConfig.from_pretrained(model_dir)
    groups = len(kv_groups(layer_windows(cfg), cfg.num_hidden_layers))
    assert (groups > 1) == (name in ("qwen2_mixed_windows", "gemma3"))
    refs = greedy_continuations(model_dir, PROMPTS, MAX_TOKENS)
    async with make_kernel(model=model_dir, dtype="float32", block_size=16, num_kv_blocks=7 * groups,
                           max_num_batched_tokens=16, plugin_config={"runner": {"lean": True}}) as kernel:
        assert isinstance(kernel.runner.lean, lean_gemma.GemmaStack if name == "gemma3" else lean.LeanStack)
        first = await kernel.complete(prompt_token_ids=PROMPTS[0], max_tokens=MAX_TOKENS, temperature=0,
                                      ignore_eos=True)
        results = await _run_all(kernel, list(range(1, len(PROMPTS))))
    results[0] = first
    for i, done in sorted(results.items()):
        assert done.token_ids == refs[i], f"{name}: prompt {i}"
    assert any(results[i].usage.cached_tokens for i in (1, 2)), "no prefix-cache hit"
    assert events.of(Preempted), "the pool was meant to force preemption"


def test_fused_ops_on_prefill_sized_rows_run_in_parallel_with_the_serial_numbers():
    """Above 65k elements the rows are split over the threads (prefill): the same bits as one thread."""
    gen = torch.Generator().manual_seed(1)
    rows, w = 1500, bf16(128, gen=gen)
    res, x = bf16(rows, 128, gen=gen), bf16(rows, 128, gen=gen)
    qkv, pos = bf16(rows, 4 * 32, gen=gen), torch.randint(0, 64, (rows,), generator=gen)
    cos, sin = bf16(64, 32, gen=gen), bf16(64, 32, gen=gen)
    y = bf16(rows, 2 * 96, gen=gen)
    outs = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        r, out, q, act = res.clone(), torch.empty_like(res), qkv.clone(), torch.empty(rows, 96, dtype=torch.bfloat16)
        fused_ops.add_rmsnorm(x, r, out, w, 1e-6)
        fused_ops.rope(q, pos, cos, sin, 2, 1, 32)
        fused_ops.silu_mul(y[:, :96], y[:, 96:], act)
        outs.append((r, out, q, act))
    for a, b in zip(*outs):
        assert torch.equal(a, b)
