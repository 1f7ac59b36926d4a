"""The family matrix: a tiny random checkpoint of every popular architecture (transformers' own config
classes) is served with exactly transformers' greedy output, under concurrency, a small token budget
(prompts prefill in chunks), prefix-cache hits and a pool small enough to preempt.

The windowed families (Gemma 2/3, gpt-oss, Mistral with a window) use an 8-token window on 40+ token
prompts, so every paged path (fresh prompts, continued chunks, decodes, chunks after a cache hit) attends
through a window that has slid; Gemma 2 adds logit soft-capping and query_pre_attn_scalar, gpt-oss sinks,
Granite its multipliers, the MoE families their own expert code.
"""
from __future__ import annotations

import os
import random

import anyio
import pytest
from family_models import FAMILIES, build_family
from kv_invariants import check_whole

from modelcall.events import Preempted

pytestmark = pytest.mark.anyio

MAX_TOKENS = 12
_rng = random.Random(99)
_PREFIX = [_rng.randrange(10, 2048) for _ in range(36)]   # two full blocks of 16 shared: prefix-cache hits
PROMPTS = ([_PREFIX + [_rng.randrange(10, 2048) for _ in range(_rng.randrange(1, 20))] for _ in range(3)]
           + [[_rng.randrange(10, 2048) for _ in range(_rng.randrange(2, 50))] for _ in range(3)])


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory, demo_model_dir) -> tuple[str, str, list[list[int]]]:
    """(name, checkpoint dir, transformers' greedy continuation of each prompt, one at a time)."""
    import torch
    from transformers import AutoModelForCausalLM

    name = request.param
    model_dir = build_family(name, str(tmp_path_factory.mktemp(name)), demo_model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=torch.float32).eval()
    refs = []
    for prompt in PROMPTS:
        ids = torch.tensor([prompt])
        gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_TOKENS, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
        refs.append(gen[0, len(prompt):].tolist())
    return name, model_dir, refs


async def _run_all(kernel, order: list[int]) -> dict[int, object]:
    results: dict[int, object] = {}

    async def one(i: int) -> None:
        results[i] = await kernel.complete(prompt_token_ids=PROMPTS[i], max_tokens=MAX_TOKENS, temperature=0,
                                           ignore_eos=True)

    with anyio.fail_after(120):
        async with anyio.create_task_group() as tg:
            for i in order:
                tg.start_soon(one, i)
    return results


async def test_family_greedy_equals_generate_with_chunks_prefix_hits_and_preemption(family, make_kernel, events):
    from transformers import AutoConfig

    from modelcall.core.plan import kv_groups
    from modelcall.plugins.runner.loader import layer_windows

    name, model_dir, refs = family
    cfg = AutoConfig.from_pretrained(model_dir)
    groups = len(kv_groups(layer_windows(cfg), cfg.num_hidden_layers))
    # 7 blocks of 16 (of every KV group) hold about two requests (the longest is 55 + 12 tokens): the rest
    # wait or are preempted. Mixed full/sliding models have a table per group over one pool of smaller blocks.
    async with make_kernel(model=model_dir, dtype="float32", block_size=16, num_kv_blocks=7 * groups,
                           max_num_batched_tokens=16) as kernel:
        first = await kernel.complete(prompt_token_ids=PROMPTS[0], max_tokens=MAX_TOKENS, temperature=0,
                                      ignore_eos=True)       # the shared prefix goes into the cache
        results = await _run_all(kernel, list(range(1, len(PROMPTS))))
        results[0] = first
        check_whole(kernel.kv)
    for i, done in sorted(results.items()):
        assert done.token_ids == refs[i], f"{name}: prompt {i} ({len(PROMPTS[i])} tokens)"
    assert any(results[i].usage.cached_tokens for i in (1, 2)), f"{name}: no prefix-cache hit"
    assert events.of(Preempted), f"{name}: the pool was meant to force preemption"


@pytest.mark.parametrize("portable", [False, True], ids=["cpu_kernel", "torch_path"])
def test_family_logits_match_transformers_on_ragged_batches(family, portable, monkeypatch):
    """Logits, not only argmax: every sampled row of random mixed steps (prefill chunks, whole prompts,
    decodes) within 1e-4 of transformers' forward, through the C kernel and the portable torch path."""
    import torch
    from test_runner import drive_ragged_steps, make_runner
    from transformers import AutoModelForCausalLM

    from modelcall.plugins.runner import cpu_kernel

    name, model_dir, _ = family
    if portable:
        monkeypatch.setattr(cpu_kernel, "usable", lambda *a: False)
    elif cpu_kernel.load() is None:
        pytest.skip("no C compiler here")
    hf = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=torch.float32).eval()
    runner = make_runner(model_dir)
    assert drive_ragged_steps(runner, hf, seed=3) < 1e-4, name   # one block table per KV group (test_runner.Blocks)


@pytest.mark.parametrize("name", ["mistral_window", "gemma3", "gpt_oss"])
async def test_window_blocks_go_back_to_the_pool_and_change_no_output(name, tmp_path, demo_model_dir, make_kernel):
    """An 8-token window, requests of up to 100 tokens (25 blocks of 4 per KV group): sliding groups give
    back what left their window as a request runs, so a pool about one request's full groups plus 7 blocks
    per sliding group serves them, alone and side by side; output unchanged. Without the release the
    admission check refuses (the pool is under what one request would hold)."""
    import torch
    from transformers import AutoModelForCausalLM

    model_dir = build_family(name, str(tmp_path / "m"), demo_model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=torch.float32).eval()
    prompts = [PROMPTS[0][:40], PROMPTS[3][:30], PROMPTS[1][:20]]
    refs = []
    for p in prompts:
        ids = torch.tensor([p])
        gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=60, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
        refs.append(gen[0, len(p):].tolist())
    async with make_kernel(model=model_dir, dtype="float32", block_size=4, num_kv_blocks=1,
                           max_num_batched_tokens=8) as probe:
        windows = probe.kv.group_windows
    n_full, n_window = windows.count(0), len(windows) - windows.count(0)
    assert n_window and (name != "mistral_window" or windows == (8,))
    num_blocks = 26 * n_full + 7 * n_window
    assert num_blocks < 25 * len(windows)   # under what one request holds without the release
    async with make_kernel(model=model_dir, dtype="float32", block_size=4, num_kv_blocks=num_blocks,
                           max_num_batched_tokens=8) as kernel:
        done = [await kernel.complete(prompt_token_ids=prompts[0], max_tokens=60, temperature=0, ignore_eos=True)]
        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                async def one(i: int) -> None:
                    done.append((i, await kernel.complete(prompt_token_ids=prompts[i], max_tokens=60,
                                                          temperature=0, ignore_eos=True)))
                for i in (1, 2):
                    tg.start_soon(one, i)
        check_whole(kernel.kv)
    assert done[0].token_ids == refs[0]
    for i, c in done[1:]:
        assert c.token_ids == refs[i], i


def test_mixed_models_get_one_table_per_kv_group(tmp_path, demo_model_dir):
    """Gemma 3 (3 sliding, 1 full layer): four groups of one layer, the full one first; a block is one layer's."""
    from test_runner import make_runner

    from modelcall.core import KernelConfig
    from modelcall.plugins.kv_cache import plugin as kv_plugin

    runner = make_runner(build_family("gemma3", str(tmp_path / "g"), demo_model_dir))
    assert runner.spec.layer_windows == (8, 8, 0, 8)
    assert [g.layers for g in runner.groups] == [(2,), (0,), (1,), (3,)]
    assert runner.kv_block_bytes(16) == 2 * 1 * 16 * 2 * 16 * 4
    assert kv_plugin.provide_kv_cache(KernelConfig(), runner.spec, 16).group_windows == (0, 8, 8, 8)


def test_window_policy_holds_at_most_blocks_needed_and_keeps_released_prefixes_findable():
    from modelcall.core import Request, SamplingParams
    from modelcall.plugins.kv_cache import PagedKVCache
    from modelcall.plugins.kv_cache.policy import RELEASED

    kv = PagedKVCache(64, 4, group_windows=(8,), max_chunk=8)
    req = Request("a", list(range(10, 50)), SamplingParams(), max_tokens=40)
    peak = 0
    while req.num_computed_tokens < 80:
        n = min(8, req.num_tokens - req.num_computed_tokens) or 1
        assert kv.allocate(req, n)
        peak = max(peak, sum(b != RELEASED for b in req.block_table))
        req.num_computed_tokens += n
        kv.commit(req)
        if req.num_computed_tokens >= req.num_tokens:
            req.all_token_ids.append(7)
    assert peak <= kv.blocks_needed(80) < 80 // 4
    # the next query sits at 80 and sees keys 73..: blocks 0..17 (positions 0..71) were given back
    kv.allocate(req, 1)
    assert req.block_table[:18] == [RELEASED] * 18 and RELEASED not in req.block_table[18:]
    twin = Request("b", list(range(10, 50)), SamplingParams(), max_tokens=4)
    assert kv.match_prefix(twin) == 36        # released prompt blocks are still findable by prefix
    kv.free(req)
    kv.free(twin)
    assert kv.num_free_blocks() == 64


async def test_a_model_definition_registered_with_transformers_is_served(tmp_path, demo_model_dir, make_kernel):
    """What a plugin bringing its own architecture does: register config and model with transformers'
    Auto classes (here a Llama subclass under a new model_type); the runner serves it like a built-in."""
    import shutil

    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    class ToyConfig(LlamaConfig):
        model_type = "modelcall_toy"

    class ToyForCausalLM(LlamaForCausalLM):
        config_class = ToyConfig

    try:
        AutoConfig.register("modelcall_toy", ToyConfig)
        AutoModelForCausalLM.register(ToyConfig, ToyForCausalLM)
    except ValueError:   # registered by an earlier run in this process
        pass
    base = build_family("llama3", str(tmp_path / "base"), demo_model_dir)
    cfg = ToyConfig(**{k: v for k, v in transformers.AutoConfig.from_pretrained(base).to_dict().items()
                       if k not in ("model_type", "architectures", "transformers_version")})
    torch.manual_seed(1)
    model = ToyForCausalLM(cfg).eval()
    model_dir = tmp_path / "toy"
    model.save_pretrained(model_dir)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(base, f), model_dir / f)
    ids = torch.tensor([PROMPTS[0]])
    ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_TOKENS, do_sample=False,
                         eos_token_id=None, pad_token_id=0)[0, ids.shape[1]:].tolist()
    async with make_kernel(model=str(model_dir), dtype="float32") as kernel:
        assert type(kernel.runner.model).__name__ == "ToyForCausalLM"
        done = await kernel.complete(prompt_token_ids=PROMPTS[0], max_tokens=MAX_TOKENS, temperature=0,
                                     ignore_eos=True)
    assert done.token_ids == ref


def test_what_the_kernel_cannot_compute_is_refused_at_load_with_the_reason(tmp_path, demo_model_dir):
    from test_runner import make_runner

    model_dir = build_family("gemma3", str(tmp_path / "g"), demo_model_dir, use_bidirectional_attention=True)
    with pytest.raises(Exception, match="does not implement bidirectional attention"):
        make_runner(model_dir)


async def test_a_stray_sliding_window_key_in_a_family_that_ignores_it_frees_nothing(tmp_path, demo_model_dir,
                                                                                    make_kernel):
    """Llama's attention does not read `sliding_window`; a config.json carrying one must not make the KV
    policy free blocks its layers still read (windows are observed from the model's own attention calls).

    NOTE: the reference is generate(use_cache=False), the model's own forward: transformers' DynamicCache
    does read the stray key and makes sliding cache layers, so its cached generate disagrees with its own
    uncached forward here (seen with transformers 5.24)."""
    import json

    import torch
    from transformers import AutoModelForCausalLM

    model_dir = build_family("llama3", str(tmp_path / "m"), demo_model_dir, sliding_window=4)
    assert json.load(open(os.path.join(model_dir, "config.json")))["sliding_window"] == 4
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=torch.float32).eval()
    ids = torch.tensor([PROMPTS[0]])
    ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_TOKENS, do_sample=False,
                         eos_token_id=None, pad_token_id=0, use_cache=False)[0, ids.shape[1]:].tolist()
    async with make_kernel(model=model_dir, dtype="float32", block_size=4) as kernel:
        assert kernel.spec.layer_windows == (0, 0, 0) and kernel.kv.group_windows == (0,)
        done = await kernel.complete(prompt_token_ids=PROMPTS[0], max_tokens=MAX_TOKENS, temperature=0,
                                     ignore_eos=True)
    assert done.token_ids == ref


def test_a_prefix_hit_needs_only_the_window_blocks_of_a_sliding_group():
    """A sliding group's blocks before the window may be reused by others: the hit still counts (as
    vLLM's hybrid allocator does), with those entries RELEASED; a full group needs every block."""
    from modelcall.core import Request, SamplingParams
    from modelcall.plugins.kv_cache import PagedKVCache
    from modelcall.plugins.kv_cache.policy import RELEASED

    prompt = list(range(100, 141))   # 41 tokens: 10 full blocks of 4
    for windows, want in (((8,), 40), ((0, 8), 0)):
        kv = PagedKVCache(64, 4, group_windows=windows, max_chunk=8)
        first = Request("a", prompt, SamplingParams(), max_tokens=1)
        while first.num_computed_tokens < len(prompt):
            n = min(8, len(prompt) - first.num_computed_tokens)
            assert kv.allocate(first, n)
            first.num_computed_tokens += n
            kv.commit(first)
        kv.free(first)
        evicted = kv.pool.block_hash[:]
        filler = Request("f", list(range(500, 600)), SamplingParams(), max_tokens=1)
        while kv.pool.lookup(first.block_hashes[0]) is not None:   # reuse blocks until the first is gone
            assert kv.allocate(filler, 4)
            filler.num_computed_tokens += 4
        assert evicted != kv.pool.block_hash
        again = Request("b", prompt, SamplingParams(), max_tokens=1)
        hit = kv.match_prefix(again)
        if windows == (8,):
            assert hit == want and again.block_table[0] == RELEASED and RELEASED not in again.block_table[-2:]
        else:
            assert hit == want   # the full group lost block 0: no hit at all
        kv.free(again)
        kv.free(filler)
        assert kv.num_free_blocks() == 64
