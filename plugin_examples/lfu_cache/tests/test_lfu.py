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


def test_the_order_is_fewest_hits_first_then_least_recently_freed():
    from modelcall.core import EvictionPolicy

    q = modelcall_lfu.LFUEvictionPolicy(4)  # 0 1 2 3 free, no hits
    assert isinstance(q, EvictionPolicy) and len(q) == 4
    assert [q.pop(), q.pop(), q.pop()] == [0, 1, 2]
    q.hit(1)  # a request holding 1 shares it with another (a hit on a held block)
    q.push(2), q.push(1), q.push(0)
    q.remove(0), q.hit(0), q.hit(0)  # a prefix hit revives free block 0
    q.push(0)
    assert len(q) == 4 and [q.pop() for _ in range(4)] == [3, 2, 1, 0]
    q.push(0)  # 0 was handed out: its hits started over
    q.push(1)
    assert q.pop() == 0


@pytest.mark.anyio
async def test_the_builtin_kv_policy_in_lfu_order_keeps_the_shared_prefix_that_lru_loses(make_kernel):
    cached = {}
    for name, plugins in (("lfu", [modelcall_lfu]), ("builtin", [])):
        async with make_kernel(plugins=plugins, num_kv_blocks=12, block_size=BS) as kernel:
            kv = kernel.kv
            cached[name] = [run_through(kv, p) for _, p in workload(kernel.spec.vocab_size)]
            assert kv.num_free_blocks() == 12 and kv.stats()["evictions"] > 0
    assert cached["lfu"] == [0, 2 * BS, 0, 0, 2 * BS]
    assert cached["builtin"] == [0, 2 * BS, 0, 0, 0]


@pytest.mark.anyio
async def test_in_a_kernel_lfu_raises_the_hit_rate_over_the_builtin(make_kernel):
    results = {}
    for name, plugins in (("lfu", [modelcall_lfu]), ("builtin", [])):
        async with make_kernel(plugins=plugins, num_kv_blocks=12, block_size=BS) as kernel:
            cached = []
            for rid, prompt in workload(kernel.spec.vocab_size):
                done = await kernel.complete(prompt_token_ids=prompt, request_id=f"{name}-{rid}", max_tokens=1)
                cached.append(done.usage.cached_tokens)
            results[name] = (cached, kernel.kv.stats()["hits"], kernel.host.providers["eviction_policy"])
    assert results["lfu"][2] == "modelcall_lfu" and results["builtin"][2] != "modelcall_lfu"
    assert results["lfu"][0] == [0, 2 * BS, 0, 0, 2 * BS]
    assert results["builtin"][0][-1] == 0  # LRU evicted the system prompt for the documents
    assert results["lfu"][1] > results["builtin"][1]


@pytest.mark.anyio
async def test_lfu_declines_when_another_eviction_policy_is_named(make_kernel):
    async with make_kernel(plugins=[modelcall_lfu], eviction_policy="lru") as kernel:
        assert kernel.host.providers["eviction_policy"] != "modelcall_lfu"
