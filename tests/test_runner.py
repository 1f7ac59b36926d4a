"""The torch runner computes what transformers computes: logits of ragged, mixed prefill/decode
batches over the paged KV cache match a plain forward, and greedy text through the Kernel equals
`generate` token for token."""
from __future__ import annotations

import random
import shutil

import anyio
import pytest
import torch

from modelcall.core import Kernel, KernelConfig, Request, SamplingParams, ScheduledChunk, SchedulePlan
from modelcall.core.plan import GROUP_TABLES
from modelcall.plugins.runner import plugin as runner_plugin
from modelcall.plugins.runner.runner import TorchModelRunner
from modelcall.plugins.sampler.sampler import TorchSampler

BLOCK = 4


@pytest.fixture(scope="module")
def hf_model(demo_model_dir):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(demo_model_dir, local_files_only=True, dtype=torch.float32).eval()


def make_runner(model_dir: str, **config) -> TorchModelRunner:
    cfg = KernelConfig(model=model_dir, **{"dtype": "float32", "threads": 1, **config})
    runner = TorchModelRunner(cfg, model_dir, TorchSampler())
    runner.allocate_kv_cache(512, BLOCK)
    return runner


class Blocks:
    """The smallest block allocator: hands out fresh block ids, shuffled so tables are not contiguous; with several
    KV groups (sliding and full layers), one table per group (the others in the request's GROUP_TABLES)."""

    def __init__(self, rng: random.Random, groups: int = 1) -> None:
        self.free = list(range(512))
        rng.shuffle(self.free)
        self.groups = groups

    def grow(self, req: Request, n: int) -> None:
        need = -(-(req.num_computed_tokens + n) // BLOCK)
        tables = [req.block_table, *req.extra.setdefault(GROUP_TABLES, [[] for _ in range(self.groups - 1)])]
        for table in tables:
            while len(table) < need:
                table.append(self.free.pop())


def drive_ragged_steps(runner: TorchModelRunner, hf_model, seed: int, tol: float = 1e-4) -> float:
    """Run random mixed steps (partial prefill chunks, whole prompts, decodes; shuffled order) and return
    the largest difference between the runner's logits and transformers' at every sampled position."""
    rng = random.Random(seed)
    vocab = runner.spec.vocab_size
    blocks = Blocks(rng, len(runner.groups))
    reqs = [Request(f"r{i}", [rng.randrange(10, vocab) for _ in range(n)], SamplingParams(temperature=0),
                    max_tokens=16) for i, n in enumerate([1, 2, 5, 13, 16, 17, 30, 41])]
    worst, checked = 0.0, 0
    for _ in range(10):
        chunks = []
        for req in reqs:
            left = req.num_tokens - req.num_computed_tokens
            n = min(left, rng.choice([1, 3, 8, 64]))
            blocks.grow(req, n)
            chunks.append(ScheduledChunk(req, n, req.num_computed_tokens + n == req.num_tokens))
        rng.shuffle(chunks)
        logits = runner.compute_logits(SchedulePlan(chunks=chunks)).cpu()
        rows = iter(range(logits.shape[0]))
        for c in chunks:
            if c.sample:
                upto = c.request.num_computed_tokens + c.num_new_tokens
                with torch.no_grad():
                    ref = hf_model(torch.tensor([c.request.all_token_ids[:upto]])).logits[0, -1]
                got = logits[next(rows)]
                # NOTE: 1e-4 relative to the row's scale (|logits| reach ~20 with the demo model's large random
                # weights); fp32 sums in a different order (a flattened batch) differ at ~1e-6 of that scale.
                err = ((got - ref).abs().max() / ref.abs().max().clamp(min=1.0)).item()
                assert err < tol, f"logits differ by {err:.2e} of their scale"
                worst = max(worst, err)
                checked += 1
        for c in chunks:  # what the kernel does after a step
            c.request.num_computed_tokens += c.num_new_tokens
            if c.sample:
                c.request.all_token_ids.append(rng.randrange(10, vocab))
    assert checked > 40
    return worst


@pytest.mark.parametrize("seed", [0, 1])
def test_logits_match_transformers_on_ragged_mixed_batches(demo_model_dir, hf_model, seed):
    runner = make_runner(demo_model_dir)
    assert drive_ragged_steps(runner, hf_model, seed) < 1e-4


def test_portable_attention_path_matches_too(demo_model_dir, hf_model, monkeypatch):
    """The pure-torch paged path (used on CUDA, or when the CPU kernel cannot be built) is exact as well."""
    from modelcall.plugins.runner import cpu_kernel
    monkeypatch.setattr(cpu_kernel, "usable", lambda *a: False)
    runner = make_runner(demo_model_dir)
    assert drive_ragged_steps(runner, hf_model, 2) < 1e-4


@pytest.mark.parametrize("blocked", [True, False])
def test_long_continued_chunks_run_as_flash_blocks_and_match(demo_model_dir, hf_model, monkeypatch, blocked):
    """Continued prefill chunks of LONG_CHUNK queries or more go through the blocked path (the C kernel's
    block_attention; without AVX-512 torch's flash attention), the decodes and short chunks of the same steps
    through the C kernel row by row; logits still match transformers."""
    from modelcall.plugins.runner import attention, cpu_kernel
    if blocked and not cpu_kernel.has_block_attention():
        pytest.skip("no AVX-512 C kernel")
    calls = []
    where, name = (cpu_kernel, "block_attention") if blocked else (attention, "_chunk_attention")
    inner = getattr(where, name)
    monkeypatch.setattr(attention, "LONG_CHUNK", 8)
    monkeypatch.setattr(where, name, lambda *a, **k: calls.append(a[0].shape[0]) or inner(*a, **k))
    if not blocked:
        monkeypatch.setattr(cpu_kernel, "has_block_attention", lambda kc=None: False)
    runner = make_runner(demo_model_dir)
    assert drive_ragged_steps(runner, hf_model, 3) < 1e-4
    assert calls and min(calls) >= 8


def test_bf16_kv_cache_stays_close(demo_model_dir, hf_model):
    runner = make_runner(demo_model_dir, kv_cache_dtype="bfloat16")
    assert runner.placement.kv_dtype == torch.bfloat16
    with pytest.raises(AssertionError, match="logits differ"):  # bf16 K/V is not exact...
        drive_ragged_steps(runner, hf_model, 3)
    runner = make_runner(demo_model_dir, kv_cache_dtype="bfloat16")
    assert drive_ragged_steps(runner, hf_model, 3, tol=0.1) > 1e-4  # ...but close


def test_execute_returns_tokens_aligned_with_chunks(demo_model_dir):
    runner = make_runner(demo_model_dir)
    rng = random.Random(5)
    blocks = Blocks(rng)
    a = Request("a", [11, 12, 13, 14, 15], SamplingParams(temperature=0), max_tokens=4)
    b = Request("b", [21, 22], SamplingParams(temperature=0), max_tokens=4)
    blocks.grow(a, 3)
    blocks.grow(b, 2)
    out = runner.execute(SchedulePlan(chunks=[ScheduledChunk(a, 3, False), ScheduledChunk(b, 2, True)]))
    assert out.token_ids[0] is None and isinstance(out.token_ids[1], int)
    assert out.logprobs is None and out.forward_s > 0
    assert a.num_computed_tokens == 0 and a.all_token_ids == [11, 12, 13, 14, 15]  # requests untouched


def test_spec_describes_the_model(demo_model_dir, tmp_path):
    runner = make_runner(demo_model_dir)
    s = runner.spec
    assert (s.num_layers, s.num_kv_heads, s.head_dim, s.vocab_size) == (2, 2, 32, 2048)
    assert s.max_model_len == 4096 and s.eos_token_ids and s.dtype == "float32" and s.device == "cpu"
    assert runner.kv_block_bytes(16) == 2 * 2 * 16 * 2 * 32 * 4
    assert make_runner(demo_model_dir, max_model_len=512).spec.max_model_len == 512
    copy = tmp_path / "copy"
    shutil.copytree(demo_model_dir, copy)
    assert make_runner(str(copy)).spec.identity == s.identity   # same files, same identity
    (copy / "config.json").write_text((copy / "config.json").read_text().replace('"rms_norm_eps": 1e-06',
                                                                                   '"rms_norm_eps": 1e-05'))
    assert make_runner(str(copy)).spec.identity != s.identity


def test_plugin_declines_when_another_runner_is_configured(demo_model_dir):
    assert runner_plugin.provide_model_runner(KernelConfig(runner="other"), demo_model_dir, TorchSampler()) is None


PROMPTS = ["Hello", "a", "def add(a, b):\n    return a + b\n", "中文测试，你好世界。", "emoji 🎉🚀 party 😀",
           "import os\nimport sys\n" * 6, "The quick brown fox jumps over the lazy dog. " * 4,
           "class Foo:\n    pass\n", "混合 mixed 文本 with 🤖 robots"]


def test_greedy_through_the_kernel_equals_transformers_generate(demo_model_dir, hf_model):
    max_tokens = 12

    async def main():
        async with Kernel(model=demo_model_dir, dtype="float32", threads=1, num_kv_blocks=256,
                          max_num_batched_tokens=64) as kernel:
            results = [None] * len(PROMPTS)

            async def one(i: int) -> None:
                handle = await kernel.submit(PROMPTS[i], max_tokens=max_tokens, temperature=0, ignore_eos=True)
                async with handle:
                    results[i] = (handle.prompt_token_ids, await handle.result())

            await anyio.sleep(0)
            async with anyio.create_task_group() as tg:
                for i in range(len(PROMPTS)):
                    tg.start_soon(one, i)
            return results

    results = anyio.run(main)
    lengths = set()
    for ids, done in results:
        lengths.add(len(ids))
        ids_t = torch.tensor([ids])
        ref = hf_model.generate(ids_t, attention_mask=torch.ones_like(ids_t), max_new_tokens=max_tokens,
                                min_new_tokens=max_tokens, do_sample=False)[0, len(ids):].tolist()
        assert done.token_ids == ref
    assert len(lengths) >= 8


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_logits_match_transformers(demo_model_dir, hf_model):
    runner = make_runner(demo_model_dir, device="cuda")
    assert runner.spec.device.startswith("cuda")
    assert drive_ragged_steps(runner, hf_model, 4) < 1e-3


def test_cpu_attention_kernel_is_built_where_a_compiler_exists():
    """The fast CPU path must not silently fall back to the portable one (a 4x slower decode)."""
    import os

    from modelcall.plugins.runner import cpu_kernel
    if shutil.which(os.environ.get("CC", "cc")) is None:
        pytest.skip("no C compiler: the portable path is used")
    assert cpu_kernel.load() is not None


@pytest.mark.parametrize("heads,kv_heads,head_dim", [(8, 8, 64), (8, 2, 64), (4, 4, 32), (4, 1, 48)])
def test_cpu_kernel_bf16_queries_over_bf16_cache_match_fp32_attention(heads, kv_heads, head_dim):
    """The C kernel's bf16 paths (row-order AVX512-BF16 reads, the 16-key blocks, the scalar tail) on ragged
    contexts, shuffled blocks and grouped heads equal fp32 attention over the same bf16 values, to bf16 rounding."""
    import torch.nn.functional as F

    from modelcall.plugins.runner import cpu_kernel
    from modelcall.plugins.runner.batch import StepBatch
    if cpu_kernel.load() is None:
        pytest.skip("no C compiler")
    gen = torch.Generator().manual_seed(heads * head_dim + kv_heads)
    ctx = [1, 5, 16, 17, 31, 48, 200]
    width = -(-max(ctx) // 16)
    blocks = torch.randperm(len(ctx) * width, generator=gen).view(len(ctx), width)
    kc = torch.randn(blocks.numel() * 16, kv_heads, head_dim, generator=gen).to(torch.bfloat16)
    vc = torch.randn(blocks.numel() * 16, kv_heads, head_dim, generator=gen).to(torch.bfloat16)
    at = torch.arange(max(ctx))
    slots = blocks[:, at // 16] * 16 + at % 16
    q = torch.randn(len(ctx), heads, head_dim, generator=gen).to(torch.bfloat16)
    step = StepBatch(input_ids=None, positions=None, slot_mapping=None, sample_rows=None, num_sampled=len(ctx),
                     num_paged=len(ctx))
    step.paged_token_seq, step.paged_token_pos, step.paged_slots = torch.arange(len(ctx)), torch.tensor(ctx) - 1, slots
    got = cpu_kernel.paged_attention(q, kc, vc, step, head_dim ** -0.5).float()
    rep = heads // kv_heads
    for s, n in enumerate(ctx):
        k = kc[slots[s, :n]].float().transpose(0, 1).repeat_interleave(rep, 0)
        v = vc[slots[s, :n]].float().transpose(0, 1).repeat_interleave(rep, 0)
        ref = F.scaled_dot_product_attention(q[s].float()[:, None], k, v, scale=head_dim ** -0.5)[:, 0]
        assert (got[s] - ref).abs().max().item() < 1e-2   # the output is rounded to bf16 (~4e-3 at |x| ~ 1)
