"""Multi-LoRA output parity: adapters built by PEFT itself on a tiny checkpoint, served together on one base model.

For every adapter (and the base), the greedy output through the kernel equals transformers' `generate` on PEFT's
`merge_and_unload()` model, fp32, while requests of 4 adapters and the base share steps under chunked prefill,
prefix-cache hits and preemption; through transformers' modules and through the lean stack. The prefix cache
never shares blocks across adapters.
"""
from __future__ import annotations

import random

import anyio
import pytest

from family_models import build_family
from kv_invariants import check_whole
from lora_adapters import ADAPTERS, build_adapters, reference_outputs
from modelcall.core import Kernel
from modelcall.events import Preempted

pytestmark = pytest.mark.anyio

MAX_TOKENS = 16
_rng = random.Random(39)
_PREFIX = [_rng.randrange(10, 2048) for _ in range(20)]   # five full blocks of 4: prefix-cache hits
PROMPTS = [_PREFIX + [_rng.randrange(10, 2048) for _ in range(_rng.randrange(1, 9))] for _ in range(2)] + [
    [_rng.randrange(10, 2048) for _ in range(_rng.randrange(3, 30))]]
NAMES = [None, *ADAPTERS]


@pytest.fixture(scope="module")
def served(tmp_path_factory, demo_model_dir) -> tuple[str, dict[str, str], dict]:
    """(base dir, adapter dirs, reference continuations by adapter name (None: the base) and prompt)."""
    root = tmp_path_factory.mktemp("lora")
    base = build_family("llama3", str(root / "base"), demo_model_dir)
    adapters = build_adapters(base, str(root))
    refs = {name: reference_outputs(base, adapters.get(name), PROMPTS, MAX_TOKENS) for name in NAMES}
    for name in ADAPTERS:   # every adapter changes the output, or the comparison would prove nothing
        assert refs[name] != refs[None], name
    return base, adapters, refs


async def _run_all(kernel: Kernel, jobs: list[tuple[str | None, int]]) -> dict[tuple[str | None, int], object]:
    results: dict[tuple[str | None, int], object] = {}

    async def one(name: str | None, i: int) -> None:
        results[(name, i)] = await kernel.complete(prompt_token_ids=PROMPTS[i], lora=name, max_tokens=MAX_TOKENS,
                                                   temperature=0, ignore_eos=True)

    with anyio.fail_after(120):
        async with anyio.create_task_group() as tg:
            for name, i in jobs:
                tg.start_soon(one, name, i)
    return results


@pytest.mark.parametrize("lean", [False, True], ids=["hf_modules", "lean_stack"])
async def test_mixed_adapter_batches_equal_peft_merged_generate(served, lean, make_kernel, events):
    base, adapters, refs = served
    runner = {"runner": {"lean": lean}}
    # 64 blocks of 4 hold the first wave (5 requests of at most 11 blocks), so its 5 prefixes stay cached for the
    # second; a 12-token step budget cuts every prompt into chunks
    async with make_kernel(model=base, dtype="float32", block_size=4, num_kv_blocks=64, max_num_batched_tokens=12,
                           lora_modules=adapters, plugin_config=runner) as kernel:
        mixes = _record_mixes(kernel)
        first = await _run_all(kernel, [(name, 0) for name in NAMES])   # each adapter's prefix into the cache
        hits = [await _run_all(kernel, [(name, 1)]) for name in NAMES]  # one at a time: each finds its own prefix
        check_whole(kernel.kv)
    # 20 blocks hold about two requests: 15 at once wait, and those running are preempted as they grow
    async with make_kernel(model=base, dtype="float32", block_size=4, num_kv_blocks=20, max_num_batched_tokens=12,
                           lora_modules=adapters, plugin_config=runner) as kernel:
        mixes += _record_mixes(kernel)
        crowd = await _run_all(kernel, [(name, i) for i in range(len(PROMPTS)) for name in NAMES])
        check_whole(kernel.kv)
    for (name, i), result in [*first.items(), *(kv for h in hits for kv in h.items()), *crowd.items()]:
        assert result.token_ids == refs[name][i], f"adapter {name}, prompt {i}"
    assert all(result.usage.cached_tokens >= 16 for h in hits for result in h.values()), "a prefix was not hit"
    assert events.of(Preempted), "the pool was meant to force preemption"
    assert max(m[:2] for m in mixes) == (4, True), "no step mixed the 4 adapters and the base"
    assert {m[2] for m in mixes if m[0] > 1} == {True, False}, "both the batched and the per-adapter path ran"


def _record_mixes(kernel: Kernel) -> list[tuple[int, bool, bool]]:
    """Per step of `kernel`'s runner: (adapters among its rows, whether base-model rows were there too, whether the
    adapters were done at once: lora_delta.Batched)."""
    lora = kernel.runner.lora
    begin, mixes = lora.begin, []

    def recording(plan, step):
        begin(plan, step)
        mixes.append((len(lora.ctx.groups), any(c.request.lora is None for c in plan.chunks),
                      lora.ctx.batched is not None))

    lora.begin = recording
    return mixes


async def test_a_prefix_is_never_shared_across_adapters(served, make_kernel):
    base, adapters, _ = served
    prompt = _PREFIX * 2
    async with make_kernel(model=base, dtype="float32", block_size=4, lora_modules=adapters) as kernel:
        async def cached(name: str | None) -> int:
            done = await kernel.complete(prompt_token_ids=prompt, lora=name, max_tokens=1, temperature=0)
            return done.usage.cached_tokens

        assert await cached("qv8") == 0
        assert await cached("all16") == 0       # the same prompt on another adapter: nothing cached
        assert await cached(None) == 0          # nor on the base model
        assert await cached("qv8") == 36        # on the first one again: its 9 full blocks before the last token
        assert await cached("all16") == 36


async def test_a_wrong_scale_is_caught(served, make_kernel, monkeypatch):
    """The deliberate break the parity test exists for: one adapter's scale off by 10% changes its output."""
    from lora_adapters import break_adapter

    base, adapters, refs = served

    def off_scale(w) -> None:
        w.pairs = {k: (a, b * 1.1) for k, (a, b) in w.pairs.items()}

    break_adapter(monkeypatch, "all16", off_scale)
    async with make_kernel(model=base, dtype="float32", lora_modules=adapters) as kernel:
        done = await _run_all(kernel, [(name, i) for name in ("all16", "qv8") for i in range(len(PROMPTS))])
    assert [done[("all16", i)].token_ids for i in range(len(PROMPTS))] != refs["all16"]
    assert [done[("qv8", i)].token_ids for i in range(len(PROMPTS))] == refs["qv8"]


async def test_max_loras_bounds_the_adapters_of_a_step(served, make_kernel):
    base, adapters, refs = served
    async with make_kernel(model=base, dtype="float32", lora_modules=adapters, max_loras=2) as kernel:
        mixes = _record_mixes(kernel)
        done = await _run_all(kernel, [(name, i) for name in NAMES for i in range(len(PROMPTS))])
    assert max(m[0] for m in mixes) == 2
    for (name, i), result in done.items():
        assert result.token_ids == refs[name][i], f"adapter {name}, prompt {i}"


async def test_quantized_base_steps_with_adapters_leave_the_fast_decode_paths(served, make_kernel):
    """q8_0 weights take the lean stack with its one-call decode paths (plain attention, the all-layers C stack);
    a step with adapter rows must not: its output equals the output with those paths turned off, and differs from
    the base model's."""
    base, adapters, _ = served
    jobs = [(name, i) for name in ("all16", None) for i in range(len(PROMPTS))]
    outs = []
    for fast in (True, False):
        runner = {"lean_plain_decode": fast, "lean_decode_stack": fast}
        async with make_kernel(model=base, dtype="float32", quantization="q8_0", lora_modules={"all16": adapters["all16"]},
                               plugin_config={"runner": runner}) as kernel:
            lean = kernel.runner.lean
            assert lean is not None and (lean.plain is not None) == fast and (lean.cstack is not None) == fast
            outs.append(await _run_all(kernel, jobs))
    fast_out, slow_out = outs
    assert {k: v.token_ids for k, v in fast_out.items()} == {k: v.token_ids for k, v in slow_out.items()}
    assert [fast_out[("all16", i)].token_ids for i in range(len(PROMPTS))] != \
        [fast_out[(None, i)].token_ids for i in range(len(PROMPTS))]


async def test_prompt_logprobs_and_speculation_on_an_adapter(served, make_kernel):
    """Prompt logprobs on an adapter are the merged model's (chunked prefill); speculation on an adapter keeps its
    greedy output (suffix decoding: a retry is proposed its first output, verified through the adapter's forward)."""
    import torch

    from lora_adapters import merged_model
    from modelcall.events import PromptLogprobs

    base, adapters, refs = served
    ids = PROMPTS[0] * 2
    with torch.no_grad():
        logits = merged_model(base, adapters["mlp8"])(torch.tensor([ids])).logits[0].float()
    want = torch.log_softmax(logits, -1)[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].tolist()
    spec = {"method": "suffix", "num_speculative_tokens": 4}
    async with make_kernel(model=base, dtype="float32", lora_modules=adapters, max_num_batched_tokens=16,
                           speculative_config=spec) as kernel:
        scored = None
        async for ev in kernel.generate(prompt_token_ids=ids, lora="mlp8", max_tokens=1, temperature=0,
                                        prompt_logprobs=1):
            if type(ev) is PromptLogprobs:
                scored = ev
        spoken = [await kernel.complete(prompt_token_ids=ids, lora="all16", max_tokens=MAX_TOKENS, temperature=0,
                                        ignore_eos=True) for _ in range(2)]   # the second: a retry
        accepted = kernel.speculator.num_accepted_tokens
    got = [p.logprob for p in scored.logprobs[1:]]
    assert max(abs(a - b) for a, b in zip(got, want)) < 1e-4
    want = reference_outputs(base, adapters["all16"], [ids], MAX_TOKENS)[0]
    assert [s.token_ids for s in spoken] == [want, want]
    assert accepted >= MAX_TOKENS // 2, "the retry's drafts were meant to be accepted"


async def test_a_tied_embeddings_family_with_qk_norms(tmp_path, demo_model_dir, make_kernel):
    """Qwen3 with tied embeddings (and per-head q/k norms): an adapter on every projection equals PEFT's merge."""
    from lora_adapters import build_adapter

    base = build_family("qwen3", str(tmp_path / "qwen3"), demo_model_dir, tie_word_embeddings=True)
    adapter = build_adapter(base, str(tmp_path / "ad"), seed=5, **ADAPTERS["all16"])
    want = reference_outputs(base, adapter, PROMPTS, MAX_TOKENS)
    async with make_kernel(model=base, dtype="float32", lora_modules={"all16": adapter}) as kernel:
        done = await _run_all(kernel, [("all16", i) for i in range(len(PROMPTS))] + [(None, 0)])
    assert [done[("all16", i)].token_ids for i in range(len(PROMPTS))] == want
    assert done[(None, 0)].token_ids != want[0]
