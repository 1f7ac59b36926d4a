"""KV cache behaviours a hand-run mutation pass (docs/mutation.md) found no fast test for: a
sliding-window prefix hit holds only the blocks the next query reads."""
from __future__ import annotations

from kv_invariants import check_whole

from modelcall.core import Request, SamplingParams
from modelcall.plugins.kv_cache import PagedKVCache


def _request(rid: str, prompt: list[int]) -> Request:
    return Request(rid, list(prompt), SamplingParams(), max_tokens=8)


def _compute(kv: PagedKVCache, req: Request) -> None:
    """What scheduler + engine do for a whole prompt: match, allocate, compute, commit."""
    req.num_computed_tokens = kv.match_prefix(req)
    n = req.num_uncomputed_tokens
    assert kv.allocate(req, n)
    req.num_computed_tokens += n
    kv.commit(req)


def test_a_sliding_window_hit_holds_only_the_blocks_the_next_query_reads():
    # window 5, block size 4: a hit of 3 blocks puts the next query at position 12, which reads
    # keys 8..12: block 2 only. Blocks 0 and 1 are still findable in the pool but must not be held.
    kv = PagedKVCache(16, 4, group_windows=(5,))
    prompt = list(range(13))
    a = _request("a", prompt)
    _compute(kv, a)
    kv.free(a)
    b = _request("b", prompt)
    assert kv.match_prefix(b) == 12
    assert kv.blocks_held(b) == 1
    assert kv.num_free_blocks() == 15
    kv.free(b)
    check_whole(kv)
