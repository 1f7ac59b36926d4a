"""LFU eviction keeps a shared system prompt cached through a stream of one-off prompts; LRU loses it."""
import random

import pytest

import modelcall_lfu
from modelcall.core import Request, SamplingParams

BS = 16


def tokens(seed: int, n: int, vocab: int = 200) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, vocab) for _ in range(n)]


SYSTEM = tokens(0, 2 * BS)  # two full blocks every "chat" request shares


def workload(vocab: int) -> list[tuple[str, list[int]]]:
    """Two chats sharing SYSTEM, two one-off documents of eight blocks each, then a third chat."""
    def chat(i):
        return SYSTEM[:] + tokens(100 + i, 8, vocab)
    return [("chat-1", chat(1)), ("chat-2", chat(2)), ("doc-1", tokens(201, 8 * BS, vocab)),
            ("doc-2", tokens(202, 8 * BS, vocab)), ("chat-3", chat(3))]


def run_through(kv, prompt: list[int]) -> int:
    """What a scheduler and runner do with one request that computes its prompt and stops."""
    req = Request("r", prompt, SamplingParams.create(), max_tokens=1)
    req.num_computed_tokens = req.num_cached_tokens = kv.match_prefix(req)
    assert kv.allocate(req, req.num_uncomputed_tokens)
    req.num_computed_tokens = req.num_tokens
    kv.commit(req)
    kv.free(req)
    return req.num_cached_tokens


def test_lfu_keeps_the_shared_prefix_that_one_off_prompts_would_evict():
    kv = modelcall_lfu.LFUKVCache(12, BS, identity="m")
    cached = [run_through(kv, p) for _, p in workload(200)]
    assert cached == [0, 2 * BS, 0, 0, 2 * BS]
    assert kv.num_free_blocks() == 12 and kv.stats()["evictions"] > 0


def test_prefixes_are_keyed_by_cache_salt_and_never_cover_the_last_token():
    kv = modelcall_lfu.LFUKVCache(8, BS, identity="m")
    prompt = tokens(7, 2 * BS)
    run_through(kv, prompt)
    assert run_through(kv, prompt) == BS  # the last prompt token is always computed
    req = Request("salted", prompt + [5], SamplingParams.create(), max_tokens=1, cache_salt="tenant-b")
    assert kv.match_prefix(req) == 0
    kv.free(req)


def test_allocation_fails_without_changing_anything_when_blocks_run_out():
    kv = modelcall_lfu.LFUKVCache(2, BS)
    req = Request("big", tokens(9, 3 * BS), SamplingParams.create(), max_tokens=1)
    assert not kv.allocate(req, 3 * BS)
    assert req.block_table == [] and kv.num_free_blocks() == 2


@pytest.mark.anyio
async def test_in_a_kernel_lfu_raises_the_hit_rate_over_the_builtin(make_kernel):
    results = {}
    for name, plugins in (("lfu", [modelcall_lfu]), ("builtin", [])):
        async with make_kernel(plugins=plugins, num_kv_blocks=12, block_size=BS) as kernel:
            cached = []
            for rid, prompt in workload(kernel.spec.vocab_size):
                done = await kernel.complete(prompt_token_ids=prompt, request_id=f"{name}-{rid}", max_tokens=1)
                cached.append(done.usage.cached_tokens)
            results[name] = (cached, kernel.kv.stats()["hits"], type(kernel.kv))
    assert results["lfu"][2] is modelcall_lfu.LFUKVCache and results["builtin"][2] is not modelcall_lfu.LFUKVCache
    assert results["lfu"][0] == [0, 2 * BS, 0, 0, 2 * BS]
    assert results["builtin"][0][-1] == 0  # LRU evicted the system prompt for the documents
    assert results["lfu"][1] > results["builtin"][1]
