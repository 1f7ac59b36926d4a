"""Paged KV, continuous batching, chunked prefill, preemption and prefix caching change nothing in
what the model says: every greedy output equals transformers' `generate` on the prompt alone.

Requests arrive at random times into a tiny token budget (prompts are split across steps) and a
KV pool a few requests overflow (preemption and recompute happen); after each test the pool is
whole again.
"""
from __future__ import annotations

import random

import anyio
import pytest
from greedy_refs import greedy_continuations
from kv_invariants import check_whole

from modelcall.events import Preempted, TokensEmitted

pytestmark = pytest.mark.anyio

MAX_TOKENS = 16
_rng = random.Random(1234)
_PREFIX = [_rng.randrange(10, 2048) for _ in range(40)]  # ids 0..8 are special tokens
PROMPTS = ([_PREFIX + [_rng.randrange(10, 2048) for _ in range(_rng.randrange(1, 30))] for _ in range(5)]
           + [[_rng.randrange(10, 2048) for _ in range(_rng.randrange(1, 70))] for _ in range(5)])


@pytest.fixture(scope="module")
def references(demo_model_dir) -> list[list[int]]:
    return greedy_continuations(demo_model_dir, PROMPTS, MAX_TOKENS)


async def _complete(kernel, i: int, delay: float = 0.0, priority: int = 0) -> tuple[int, object]:
    await anyio.sleep(delay)
    done = await kernel.complete(prompt_token_ids=PROMPTS[i], max_tokens=MAX_TOKENS, temperature=0,
                                 ignore_eos=True, priority=priority)
    return i, done


async def _complete_all(kernel, order: list[int], *, seed: int | None = None) -> dict[int, object]:
    """All prompts concurrently; with `seed`, each arrives after a random delay with a random priority."""
    rng = random.Random(seed)
    results: dict[int, object] = {}

    async def one(i: int) -> None:
        delay, prio = (rng.uniform(0, 0.05), rng.randrange(3)) if seed is not None else (0.0, 0)
        _, results[i] = await _complete(kernel, i, delay, prio)

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            for i in order:
                tg.start_soon(one, i)
    return results


def _assert_whole(kernel) -> None:
    check_whole(kernel.kv)
    assert kernel.scheduler.num_running == 0 and kernel.scheduler.num_waiting == 0


@pytest.mark.parametrize("policy,block_size,num_kv_blocks", [("fcfs", 16, 7), ("priority", 4, 24)])
async def test_outputs_match_generate_under_chunked_prefill_and_preemption(
        make_kernel, events, references, demo_model_dir, policy, block_size, num_kv_blocks):
    # The longest request (69 + 16 tokens) needs 6 blocks of 16 (22 of 4): the pool holds barely one.
    async with make_kernel(model=demo_model_dir, scheduling_policy=policy, block_size=block_size,
                           num_kv_blocks=num_kv_blocks, max_num_batched_tokens=16) as kernel:
        results = await _complete_all(kernel, list(range(len(PROMPTS))), seed=7)
        _assert_whole(kernel)
    for i, done in results.items():
        assert done.token_ids == references[i], f"prompt {i} ({len(PROMPTS[i])} tokens)"
        assert done.finish_reason == "length"
    assert events.of(Preempted), "the pool was meant to force preemption"


@pytest.mark.parametrize("prefix_caching", [True, False])
async def test_prefix_caching_changes_no_output_and_hits_when_on(
        make_kernel, references, demo_model_dir, prefix_caching):
    async with make_kernel(model=demo_model_dir, enable_prefix_caching=prefix_caching, block_size=16,
                           num_kv_blocks=64, max_num_batched_tokens=32) as kernel:
        _, first = await _complete(kernel, 0)             # puts the shared 40-token prefix in the cache
        results = await _complete_all(kernel, list(range(1, len(PROMPTS))))
        results[0] = first
        stats = kernel.kv.stats()
        _assert_whole(kernel)
    for i, done in results.items():
        assert done.token_ids == references[i], f"prompt {i}"
    cached = [results[i].usage.cached_tokens for i in range(1, 5)]
    if prefix_caching:
        assert stats["hits"] > 0 and all(c == 32 for c in cached), cached  # two full blocks of the prefix
    else:
        assert stats["hits"] == 0 and cached == [0, 0, 0, 0]


async def test_tenants_with_different_cache_salts_never_share_cached_prefixes(make_kernel, references, demo_model_dir):
    async with make_kernel(model=demo_model_dir, block_size=16, num_kv_blocks=64) as kernel:
        runs = []
        for salt in ("tenant-a", "tenant-b", "tenant-a", None):
            runs.append(await kernel.complete(prompt_token_ids=PROMPTS[0], max_tokens=MAX_TOKENS, temperature=0,
                                              ignore_eos=True, cache_salt=salt))
        _assert_whole(kernel)
    # 48 prompt tokens are 3 full blocks, but the third holds the last prompt token: 2 are read
    assert [r.usage.cached_tokens for r in runs] == [0, 0, 32, 0]
    assert all(r.token_ids == references[0] for r in runs)


async def test_aborted_requests_give_back_every_block(make_kernel, references, demo_model_dir):
    """Aborts land while requests wait, prefill in chunks, decode or sit preempted (request i aborts
    after its (i // 2)-th token); the survivors' outputs are untouched and no block stays held."""
    # NOTE: single steps: a decode burst (core/burst.py) may finish a request before an abort sent mid-burst lands
    # (test_decode_bursts.py checks aborts under bursts)
    async with make_kernel(model=demo_model_dir, block_size=16, num_kv_blocks=7, max_num_batched_tokens=16,
                           num_scheduler_steps=1) as kernel:
        handles = [await kernel.submit(prompt_token_ids=p, max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
                   for p in PROMPTS]
        done: dict[int, object] = {}

        async def read(i: int) -> None:
            if i % 2:
                seen = 0
                while seen < i // 2:
                    seen += isinstance(await handles[i].__anext__(), TokensEmitted)
                handles[i].abort()
            done[i] = await handles[i].result()

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for i in range(len(PROMPTS)):
                    tg.start_soon(read, i)
        _assert_whole(kernel)
    for i, c in done.items():
        if i % 2:
            assert c.finish_reason == "abort"
        else:
            assert c.token_ids == references[i] and c.finish_reason == "length"
