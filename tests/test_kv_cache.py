"""The built-in paged KV policy: block allocation, reference counts, prefix caching, lazy LRU eviction."""
from __future__ import annotations

import itertools

import msgspec
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from kv_invariants import check_pool, check_whole

from modelcall.core import KernelConfig, ModelSpec, Request, SamplingParams
from modelcall.core.lora import LoraRef
from modelcall.plugins.kv_cache import PagedKVCache
from modelcall.plugins.kv_cache import plugin as kv_plugin
from modelcall.plugins.kv_cache.free_queue import LRUFreeQueue

_ids = itertools.count()


def make_request(prompt: list[int], *, salt: str | None = None, adapter: str | None = None) -> Request:
    req = Request(f"r{next(_ids)}", list(prompt), SamplingParams(), max_tokens=64, cache_salt=salt)
    if adapter is not None:   # as the entry sets it: the adapter's name and the key of its load
        req.lora = LoraRef(name=adapter, key=f"{adapter}@1")
    return req


def compute(kv: PagedKVCache, req: Request, n: int | None = None) -> None:
    """What scheduler + engine do for one chunk: allocate, advance computed tokens, commit."""
    n = req.num_uncomputed_tokens if n is None else n
    assert kv.allocate(req, n)
    req.num_computed_tokens += n
    kv.commit(req)


def run_prompt(kv: PagedKVCache, prompt: list[int], **kw) -> Request:
    req = make_request(prompt, **kw)
    req.num_computed_tokens = kv.match_prefix(req)
    compute(kv, req)
    return req


def test_allocate_grows_the_table_to_whole_blocks_and_fails_without_change():
    kv = PagedKVCache(4, 4)
    req = make_request(list(range(10)))
    assert kv.allocate(req, 5) and len(req.block_table) == 2
    assert kv.allocate(req, 8) and len(req.block_table) == 2  # 8 tokens still fit in 2 blocks
    req.num_computed_tokens = 8
    assert not kv.allocate(req, 9)  # 17 tokens need 5 blocks; the pool has 4
    assert len(req.block_table) == 2 and kv.num_free_blocks() == 2
    kv.free(req)
    check_whole(kv)


def test_a_cached_prefix_is_whole_blocks_and_never_the_last_prompt_token():
    kv = PagedKVCache(16, 4)
    kv.free(run_prompt(kv, list(range(10))))
    assert kv.match_prefix(b := make_request(list(range(10)))) == 8
    kv.free(b)
    # 8 tokens are two full cached blocks, but the second holds the last prompt token
    assert kv.match_prefix(c := make_request(list(range(8)))) == 4
    kv.free(c)
    assert kv.match_prefix(d := make_request(list(range(4)) + [99] * 6)) == 4
    kv.free(d)
    assert kv.match_prefix(e := make_request([99] + list(range(1, 10)))) == 0
    kv.free(e)
    stats = kv.stats()
    assert stats["queries"] == 10 + 10 + 8 + 10 + 10 and stats["hits"] == 8 + 4 + 4
    check_whole(kv)


def test_live_requests_share_cached_blocks_by_reference_count():
    kv = PagedKVCache(16, 4)
    a = run_prompt(kv, list(range(12)))
    b = make_request(list(range(12)) + [50, 51])
    assert kv.match_prefix(b) == 12
    assert b.block_table == a.block_table[:3]
    assert all(kv.pool.ref_cnt[x] == 2 for x in b.block_table)
    check_pool(kv, [a, b])
    kv.free(a)
    assert all(kv.pool.ref_cnt[x] == 1 for x in b.block_table)
    kv.free(b)
    check_whole(kv)


@pytest.mark.parametrize("other", [{"salt": "tenant-b"}, {"adapter": "lora-2"}])
def test_salted_or_adapted_requests_never_share_blocks(other):
    kv = PagedKVCache(16, 4)
    kv.free(run_prompt(kv, list(range(12)), salt="tenant-a", adapter="lora-1"))
    same = {"salt": "tenant-a", "adapter": "lora-1"}
    req = make_request(list(range(12)), **(same | other))
    assert kv.match_prefix(req) == 0
    kv.free(req)
    req = make_request(list(range(12)), **same)
    assert kv.match_prefix(req) == 8
    kv.free(req)


def test_different_models_never_share_keys():
    a, b = PagedKVCache(8, 4, identity="model-a"), PagedKVCache(8, 4, identity="model-b")
    ra, rb = run_prompt(a, list(range(9))), run_prompt(b, list(range(9)))
    assert ra.block_hashes and set(ra.block_hashes).isdisjoint(rb.block_hashes)


def test_freed_blocks_stay_findable_until_reused_then_lru_evicts_the_oldest_first():
    kv = PagedKVCache(4, 4)
    first = run_prompt(kv, [1] * 4 + [2])   # blocks: [1111] cached, [2]
    kv.free(first)
    second = run_prompt(kv, [3] * 4 + [4])  # takes the two never-used blocks
    kv.free(second)
    assert kv.stats()["num_cached_blocks"] == 2 and kv.stats()["evictions"] == 0
    # Least recently freed first: the two of `first` (its tail before its cached block)
    filler = make_request([5] * 5)
    compute(kv, filler, 1)
    compute(kv, filler, 4)
    assert kv.stats()["evictions"] == 1  # the [1111] block went; [3333] is still there
    assert kv.match_prefix(probe := make_request([1] * 4 + [2])) == 0
    assert kv.match_prefix(hit := make_request([3] * 4 + [4])) == 4
    for r in (filler, probe, hit):
        kv.free(r)
    check_whole(kv)


def test_prefix_caching_off_never_keys_or_matches():
    kv = PagedKVCache(8, 4, enable_prefix_caching=False)
    kv.free(run_prompt(kv, list(range(12))))
    req = make_request(list(range(12)))
    assert kv.match_prefix(req) == 0 and not req.block_table
    assert kv.stats()["num_cached_blocks"] == 0 and not req.block_hashes


def test_reset_forgets_cached_prefixes_including_blocks_in_use():
    kv = PagedKVCache(8, 4)
    kv.free(run_prompt(kv, list(range(9))))
    live = run_prompt(kv, [7] * 9)
    kv.reset_prefix_cache()
    assert kv.stats()["num_cached_blocks"] == 0
    kv.free(live)  # computed before the reset: must not come back
    for prompt in (list(range(9)), [7] * 9):
        assert kv.match_prefix(r := make_request(prompt)) == 0
        kv.free(r)
    check_whole(kv)


def test_a_preempted_request_rematches_its_prompt_and_output_tokens():
    kv = PagedKVCache(16, 4)
    req = run_prompt(kv, list(range(6)))
    for token in range(100, 106):  # decode six tokens, one per step
        req.all_token_ids.append(token)
        compute(kv, req, 1)
    req.all_token_ids.append(106)  # 13 known tokens, 12 computed
    kv.free(req)                   # preempted
    req.num_computed_tokens = 0
    assert kv.match_prefix(req) == 12  # three full blocks; the last known token is recomputed
    kv.free(req)
    check_whole(kv)


def test_the_eviction_order_is_pluggable():
    class MRUFreeQueue(LRUFreeQueue):
        def pop(self) -> int:
            return self._order.popitem(last=True)[0]

    kv = PagedKVCache(4, 4, free_queue=MRUFreeQueue(range(4)))
    kv.free(run_prompt(kv, [1] * 4 + [2]))
    req = make_request([5] * 4)
    compute(kv, req, 4)
    assert kv.stats()["evictions"] == 1  # the most recently freed ([1111]) went first
    kv.free(req)


def test_stats_report_usage_and_free_blocks():
    kv = PagedKVCache(10, 4)
    req = run_prompt(kv, list(range(10)))
    stats = kv.stats()
    assert stats["usage"] == pytest.approx(0.3) and stats["num_free_blocks"] == 7
    kv.free(req)


def test_plugin_provides_the_paged_policy_unless_another_is_named():
    spec = ModelSpec(name="m", max_model_len=64, vocab_size=10, num_layers=1, num_kv_heads=1, head_dim=4,
                     dtype="float32", device="cpu", identity="m@1")
    kv = kv_plugin.provide_kv_cache(KernelConfig(block_size=8), spec, 12)
    assert isinstance(kv, PagedKVCache) and (kv.num_blocks, kv.block_size, kv.identity) == (12, 8, "m@1")
    assert kv_plugin.provide_kv_cache(KernelConfig(kv_cache="paged", enable_prefix_caching=False), spec, 4) \
        .enable_prefix_caching is False
    assert kv_plugin.provide_kv_cache(KernelConfig(kv_cache="other"), spec, 12) is None


def test_plugin_is_an_entry_point():
    from importlib import metadata
    eps = {ep.name: ep.value for ep in metadata.entry_points(group="modelcall")}
    assert eps.get("paged_kv") == "modelcall.plugins.kv_cache.plugin"


# ---- stateful property test -----------------------------------------------------------------

BLOCK = 4


class KVPoolMachine(RuleBasedStateMachine):
    """Random requests over a tiny vocabulary (so prefixes collide) and two tenants, computing in
    random chunks, decoding, being preempted and re-matched, finishing, with cache resets.

    `written[b]` is what the fake runner wrote into block b: (tenant, the tokens of the whole
    prefix up to the end of b). A prefix hit must hand out blocks holding exactly the request's own
    prefix under its own tenant.
    """

    @initialize(num_blocks=st.integers(4, 24))
    def setup(self, num_blocks):
        self.kv = PagedKVCache(num_blocks, BLOCK)
        self.live: list[Request] = []
        self.written: dict[int, tuple] = {}

    def _check_hit(self, req: Request, hit: int) -> None:
        assert hit % BLOCK == 0 and hit < req.num_tokens and hit == len(req.block_table) * BLOCK
        for i, b in enumerate(req.block_table):
            assert self.written.get(b) == (req.cache_salt, tuple(req.all_token_ids[:(i + 1) * BLOCK]))

    @rule(prompt=st.lists(st.integers(0, 2), min_size=1, max_size=14), salt=st.sampled_from([None, "t2"]))
    def arrive(self, prompt, salt):
        req = make_request(prompt, salt=salt)
        hit = self.kv.match_prefix(req)
        self._check_hit(req, hit)
        req.num_computed_tokens = hit
        self.live.append(req)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def step(self, data):
        req = data.draw(st.sampled_from(self.live))
        n = data.draw(st.integers(1, req.num_uncomputed_tokens))
        before = list(req.block_table)
        if not self.kv.allocate(req, n):
            assert req.block_table == before
            return
        fresh = req.block_table[len(before):]
        for b in fresh:
            self.written.pop(b, None)  # a reused block holds garbage until written
        req.num_computed_tokens += n
        for i in range(req.num_computed_tokens // BLOCK):
            self.written[req.block_table[i]] = (req.cache_salt, tuple(req.all_token_ids[:(i + 1) * BLOCK]))
        self.kv.commit(req)
        if req.num_computed_tokens == req.num_tokens:
            req.all_token_ids.append(data.draw(st.integers(0, 2)))  # sampled

    @precondition(lambda self: self.live)
    @rule(data=st.data(), rematch=st.booleans())
    def free(self, data, rematch):
        req = data.draw(st.sampled_from(self.live))
        self.kv.free(req)
        req.num_computed_tokens = 0
        if rematch:  # preempted and readmitted: known tokens include its output
            hit = self.kv.match_prefix(req)
            self._check_hit(req, hit)
            req.num_computed_tokens = hit
        else:
            self.live.remove(req)

    @rule()
    def reset(self):
        self.kv.reset_prefix_cache()

    @invariant()
    def pool_is_consistent(self):
        if hasattr(self, "kv"):
            check_pool(self.kv, self.live)

    def teardown(self):
        if hasattr(self, "kv"):
            for req in self.live:
                self.kv.free(req)
            check_whole(self.kv)


TestKVPoolMachine = KVPoolMachine.TestCase
TestKVPoolMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
