"""Contracts of the KV cache, the scheduler and the sampler that scripts/mutation.sh found no unit test
holding: each test here kills mutants that survived the KV, scheduler and sampler unit tests."""
from __future__ import annotations

import itertools

import pytest
import torch

from modelcall.core import Request, SamplingParams, ScheduledChunk
from modelcall.plugins.kv_cache import PagedKVCache
from modelcall.plugins.sampler.sampler import TorchSampler
from modelcall.plugins.scheduler.queues import FCFSQueue, PriorityQueue
from modelcall.plugins.scheduler.scheduler import DefaultScheduler

_ids = itertools.count()


def request(prompt=(1, 2, 3, 4, 5, 6, 7, 8, 9), **params) -> Request:
    return Request(f"u{next(_ids)}", list(prompt), SamplingParams(**params), max_tokens=8)


# ---- KV cache -----------------------------------------------------------------------------------

@pytest.mark.parametrize("tokens, blocks", [(1, 1), (16, 1), (17, 2), (100, 7), (2048, 128)])
def test_a_full_attention_request_needs_one_block_per_started_block_of_tokens(tokens, blocks):
    assert PagedKVCache(512, 16).blocks_needed(tokens) == blocks


def test_a_sliding_window_group_needs_only_its_window_plus_one_chunk():
    # window 32, chunks of at most 64 tokens: ceil((64 + 32 - 1) / 16) + 1 = 7 blocks, never more than the whole
    kv = PagedKVCache(512, 16, group_windows=(0, 32), max_chunk=64)
    assert kv.blocks_needed(1000) == 63 + 7
    assert kv.blocks_needed(40) == 3 + 3            # short: the window group needs no more than the request
    assert kv.blocks_needed(70) == 5 + 5            # the window group: min(whole 5, 7)


def test_stats_report_the_hit_rate_of_prefix_lookups():
    kv = PagedKVCache(64, 4)   # queries and hits count tokens
    assert kv.stats()["hit_rate"] == 0.0 and kv.stats()["num_blocks"] == 64.0
    first = request(range(20, 33))
    assert kv.match_prefix(first) == 0
    kv.allocate(first, first.num_tokens)
    first.num_computed_tokens = first.num_tokens
    kv.commit(first)
    again = request(range(20, 33))
    assert kv.match_prefix(again) == 12           # three full blocks of four; the last token is computed
    s = kv.stats()
    assert (s["queries"], s["hits"]) == (26.0, 12.0) and s["hit_rate"] == pytest.approx(12 / 26)


# ---- scheduler ----------------------------------------------------------------------------------

@pytest.mark.parametrize("queue", [FCFSQueue, PriorityQueue])
def test_a_waiting_queue_says_whether_it_removed_the_request(queue):
    q, a, b = queue(), request(), request()
    q.push(a)
    assert q.remove(b) is False and len(q) == 1
    assert q.remove(a) is True and len(q) == 0 and q.get(a.request_id) is None


def test_a_requeued_request_goes_first_in_arrival_order():
    q, a, b = FCFSQueue(), request(), request()
    q.push(a)
    q.push_front(b)
    assert [r.request_id for r in q] == [b.request_id, a.request_id] and q.pop() is b


def test_a_parent_held_for_its_forks_is_found_and_finished_like_any_request():
    sched = DefaultScheduler(PagedKVCache(64, 4), watermark=0.0)
    parent = request()
    parent.num_forks = 2            # held until both forks arrive
    sched.add(parent)
    assert sched.get(parent.request_id) is parent
    assert not sched.schedule().chunks   # held: not scheduled
    sched.finish(parent)
    assert sched.get(parent.request_id) is None and parent.request_id not in sched.held


# ---- sampler ------------------------------------------------------------------------------------

def _draws(logits_row: list[float], times: int = 300, **params) -> set[int]:
    reqs = [Request(f"s{i}", [1, 2], SamplingParams(temperature=1.0, seed=i, **params), max_tokens=4)
            for i in range(times)]
    logits = torch.tensor([logits_row] * times)
    tokens, _ = TorchSampler().sample(logits, [ScheduledChunk(r, 1, True) for r in reqs])
    return set(tokens)


def test_top_p_keeps_the_smallest_set_that_reaches_it_and_stops_at_an_exact_reach():
    # probabilities 0.5, 0.5 (exactly): the first token alone reaches top_p 0.5, so the second is dropped
    assert len(_draws([0.0, 0.0, float("-inf"), float("-inf")], top_p=0.5)) == 1
    assert _draws([0.0, 0.0, float("-inf"), float("-inf")], top_p=0.6) == {0, 1}
    row = [2.0, 1.5, 1.0, 0.5, 0.0, -0.5]
    assert _draws(row, top_k=3) == {0, 1, 2}
    assert _draws(row, top_k=3, top_p=0.6) == {0, 1}    # within the top 3: p 0.51, 0.31 -> 0.81 reaches 0.6
    assert _draws(row, top_k=3, top_p=0.5) == {0}       # 0.51 alone reaches 0.5
    assert _draws(row) == set(range(6))


def test_logprobs_in_a_mixed_batch_belong_to_the_rows_that_asked():
    reqs = [Request(f"l{i}", [1, 2], SamplingParams(temperature=0.0, logprobs=n), max_tokens=4)
            for i, n in enumerate((None, 0, 2))]
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0]] * 3)
    tokens, lps = TorchSampler().sample(logits, [ScheduledChunk(r, 1, True) for r in reqs])
    assert tokens == [1, 1, 1] and lps[0] is None
    assert lps[1].token_id == 1 and lps[1].top == ()                 # logprobs 0: the chosen token only
    assert [t.token_id for t in lps[2].top] == [1, 3]                 # logprobs 2: the two most likely
    assert lps[2].logprob == pytest.approx(torch.log_softmax(logits[0], -1)[1].item())
