"""The built-in scheduler: token budget, chunked prefill, FCFS/priority, prefix matching at admission,
preemption by recompute; and a fake-runner simulation proving every request finishes with the
right tokens and no block leaks, even when the pool is small enough to force preemption."""
from __future__ import annotations

import itertools

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from kv_invariants import check_pool, check_whole

from modelcall.core import KernelConfig, Request, SamplingParams, Status
from modelcall.plugins.kv_cache import PagedKVCache
from modelcall.plugins.scheduler import DefaultScheduler
from modelcall.plugins.scheduler import plugin as sched_plugin

_ids = itertools.count()


def make_request(prompt, *, max_tokens=8, priority=0, arrival=0.0, salt=None) -> Request:
    return Request(f"r{next(_ids)}", list(prompt), SamplingParams(), max_tokens=max_tokens, priority=priority,
                   arrival=arrival, cache_salt=salt)


def make(num_blocks=64, block_size=4, **kw) -> tuple[DefaultScheduler, PagedKVCache]:
    kv = PagedKVCache(num_blocks, block_size)
    kw.setdefault("watermark", 0.0)
    return DefaultScheduler(kv, **kw), kv


def apply(sched: DefaultScheduler, plan, token: int = 7) -> None:
    """What the engine does with a step's output: advance, commit, append a sampled token."""
    for chunk in plan.chunks:
        chunk.request.num_computed_tokens += chunk.num_new_tokens
        sched.kv.commit(chunk.request)
        if chunk.sample:
            chunk.request.all_token_ids.append(token)


def sizes(plan) -> dict[str, tuple[int, bool]]:
    return {c.request.request_id: (c.num_new_tokens, c.sample) for c in plan.chunks}


def test_a_long_prompt_is_split_across_steps_and_samples_only_at_its_end():
    sched, _ = make(max_num_batched_tokens=16)
    sched.add(req := make_request(range(40)))
    plans = []
    for _ in range(4):
        plans.append(plan := sched.schedule())
        apply(sched, plan)
    assert [sizes(p)[req.request_id] for p in plans] == [(16, False), (16, False), (8, True), (1, True)]
    assert plans[0].newly_scheduled == [req] and not any(p.newly_scheduled for p in plans[1:])
    assert req.status is Status.RUNNING and req.num_tokens == 42


def test_decodes_come_first_and_new_prompts_share_what_is_left_of_the_budget():
    sched, _ = make(max_num_batched_tokens=10)
    a, b = make_request(range(3)), make_request(range(3))
    sched.add(a)
    sched.add(b)
    apply(sched, sched.schedule())  # both prefilled: 6 tokens
    sched.add(c := make_request(range(50)))
    plan = sched.schedule()
    assert sizes(plan) == {a.request_id: (1, True), b.request_id: (1, True), c.request_id: (8, False)}
    assert plan.num_tokens == 10


def test_max_num_seqs_caps_the_running_requests():
    sched, _ = make(max_num_seqs=2)
    reqs = [make_request(range(5)) for _ in range(3)]
    for r in reqs:
        sched.add(r)
    plan = sched.schedule()
    assert [c.request for c in plan.chunks] == reqs[:2]
    assert sched.num_running == 2 and sched.num_waiting == 1
    sched.finish(reqs[0])
    assert [c.request for c in sched.schedule().chunks] == [reqs[1], reqs[2]]


def test_fcfs_admits_in_arrival_order():
    sched, _ = make(max_num_seqs=1)
    reqs = [make_request(range(3), priority=p) for p in (5, 0, 3)]
    for r in reqs:
        sched.add(r)
    order = []
    while sched.has_work():
        plan = sched.schedule()
        order.append(plan.chunks[0].request)
        sched.finish(plan.chunks[0].request)
    assert order == reqs


def test_priority_admits_lower_values_first_and_ties_by_arrival():
    sched, _ = make(max_num_seqs=1, policy="priority")
    reqs = [make_request(range(3), priority=p, arrival=t) for p, t in ((5, 0.0), (0, 2.0), (3, 1.0), (0, 1.5))]
    for r in reqs:
        sched.add(r)
    order = []
    while sched.has_work():
        req = sched.schedule().chunks[0].request
        order.append(req)
        sched.finish(req)
    assert order == [reqs[3], reqs[1], reqs[2], reqs[0]]


def test_first_scheduling_reads_the_prefix_cache():
    sched, kv = make()
    sched.add(a := make_request(range(10)))
    apply(sched, sched.schedule())
    sched.finish(a)
    sched.add(b := make_request(list(range(10)) + [3, 3]))
    plan = sched.schedule()
    assert b.num_cached_tokens == 8 and sizes(plan)[b.request_id] == (4, True)
    assert plan.newly_scheduled == [b]
    sched.finish(b)
    check_whole(kv)


def test_running_out_of_blocks_preempts_the_latest_request_which_recomputes_later():
    sched, kv = make(num_blocks=4, block_size=4)
    a, b = make_request(range(7), max_tokens=8), make_request(range(100, 107), max_tokens=8)
    sched.add(a)
    sched.add(b)
    apply(sched, sched.schedule())  # 2 blocks each, the pool is full
    apply(sched, sched.schedule())  # 8 tokens each: still fits
    plan = sched.schedule()         # a needs a 3rd block: b goes
    assert plan.preempted == [b] and [c.request for c in plan.chunks] == [a]
    assert b.status is Status.PREEMPTED and b.num_preemptions == 1 and b.num_computed_tokens == 0
    assert not b.block_table and sched.waiting.peek() is b and sched.num_running == 1
    check_pool(kv, [a])
    apply(sched, plan)
    sched.finish(a)
    plan = sched.schedule()
    assert plan.chunks[0].request is b and not plan.newly_scheduled
    # b's tail block (freed first, so evicted first) went to a; its first block is still cached
    assert b.num_computed_tokens == 4
    assert b.num_cached_tokens == 0    # usage counts the cache only at first scheduling
    sched.finish(b)
    check_whole(kv)


def test_priority_preempts_the_least_urgent_request():
    sched, kv = make(num_blocks=4, block_size=4, policy="priority")
    lazy = make_request(range(7), priority=9, arrival=0.0)
    urgent = make_request(range(100, 107), priority=0, arrival=1.0)
    sched.add(lazy)
    sched.add(urgent)
    apply(sched, sched.schedule())
    apply(sched, sched.schedule())
    plan = sched.schedule()
    assert plan.preempted == [lazy] and [c.request for c in plan.chunks] == [urgent]


def test_an_urgent_arrival_preempts_a_less_urgent_running_request_under_priority():
    sched, kv = make(num_blocks=64, max_num_seqs=1, policy="priority")
    sched.add(lazy := make_request(range(7), priority=5, arrival=0.0))
    apply(sched, sched.schedule())
    sched.add(urgent := make_request(range(9), priority=1, arrival=1.0))
    plan = sched.schedule()
    assert plan.preempted == [lazy] and [c.request for c in plan.chunks] == [urgent]
    sched.add(same := make_request(range(9), priority=1, arrival=2.0))  # not more urgent: waits
    plan = sched.schedule()
    assert not plan.preempted and [c.request for c in plan.chunks] == [urgent]


def test_fcfs_never_preempts_for_a_waiting_request():
    sched, _ = make(max_num_seqs=1)
    sched.add(first := make_request(range(7), priority=5))
    apply(sched, sched.schedule())
    sched.add(make_request(range(9), priority=0))
    plan = sched.schedule()
    assert not plan.preempted and [c.request for c in plan.chunks] == [first]


def test_a_victim_already_scheduled_this_step_gives_back_its_tokens():
    sched, kv = make(num_blocks=4, block_size=4, policy="priority", max_num_batched_tokens=8)
    lazy = make_request(range(7), priority=9)
    urgent = make_request(range(100, 108), priority=0)
    sched.add(lazy)
    apply(sched, sched.schedule())    # lazy: 7 tokens, 2 blocks
    sched.add(urgent)
    apply(sched, sched.schedule())    # lazy decodes 1, urgent prefills 7: pool full
    assert urgent.num_computed_tokens == 7 and len(urgent.block_table) == 2
    plan = sched.schedule()           # lazy first in running order gets 1 token; urgent needs a 3rd block
    assert plan.preempted == [lazy] and sizes(plan) == {urgent.request_id: (1, True)}
    check_pool(kv, [urgent])


def test_finish_drops_a_request_wherever_it_is_and_frees_its_blocks():
    sched, kv = make(max_num_seqs=1)
    sched.add(a := make_request(range(9)))
    sched.add(b := make_request(range(9)))
    sched.schedule()
    assert sched.get(a.request_id) is a and sched.get(b.request_id) is b
    sched.finish(b)  # waiting
    sched.finish(a)  # running, blocks allocated
    assert not sched.has_work() and sched.get(a.request_id) is None
    check_whole(kv)


def test_the_watermark_holds_back_new_requests_while_others_run():
    sched, kv = make(num_blocks=10, block_size=4, watermark=0.3)
    sched.add(a := make_request(range(20)))   # 5 blocks: admitted, nothing else runs
    sched.add(b := make_request(range(50, 58)))  # 2 more would leave 3 free: ok
    sched.add(c := make_request(range(60, 68)))  # 2 more would leave 1 < 3: held back
    plan = sched.schedule()
    assert [ch.request for ch in plan.chunks] == [a, b] and sched.waiting.peek() is c


def test_plugin_builds_from_config_and_declines_when_another_is_named():
    kv = PagedKVCache(100, 16)
    cfg = KernelConfig(max_num_seqs=3, max_num_batched_tokens=64, scheduling_policy="priority",
                       plugin_config={"scheduler": {"watermark": 0.05}})
    sched = sched_plugin.provide_scheduler(cfg, kv)
    assert (sched.max_num_seqs, sched.max_num_batched_tokens, sched.policy, sched.watermark_blocks) == \
        (3, 64, "priority", 5)
    assert sched_plugin.provide_scheduler(KernelConfig(scheduler="other"), kv) is None
    from importlib import metadata
    eps = {ep.name: ep.value for ep in metadata.entry_points(group="modelcall")}
    assert eps.get("scheduler") == "modelcall.plugins.scheduler.plugin"


# ---- the whole loop with a fake runner --------------------------------------------------------

class FakeRunner:
    """Writes a fingerprint of each position's prefix into its KV slot and, before computing a
    chunk, checks that every earlier slot the chunk attends to holds the request's own prefix:
    a wrong block table, a bad prefix hit or a lost token shows up as a wrong slot."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.slots: dict[int, tuple] = {}

    def truth(self, req: Request, pos: int) -> tuple:
        return req.cache_salt, tuple(req.all_token_ids[:pos + 1])

    def slot(self, req: Request, pos: int) -> int:
        return req.block_table[pos // self.block_size] * self.block_size + pos % self.block_size

    def execute(self, plan) -> list[int | None]:
        out = []
        for chunk in plan.chunks:
            req, start = chunk.request, chunk.request.num_computed_tokens
            assert len(req.block_table) * self.block_size >= start + chunk.num_new_tokens
            for pos in range(start):
                assert self.slots.get(self.slot(req, pos)) == self.truth(req, pos), (req, pos)
            for pos in range(start, start + chunk.num_new_tokens):
                self.slots[self.slot(req, pos)] = self.truth(req, pos)
            out.append(next_token(req.all_token_ids) if chunk.sample else None)
        return out


def next_token(tokens: list[int]) -> int:
    return hash(tuple(tokens)) % 3  # a tiny vocabulary: prompts and outputs share prefixes


workloads = st.lists(
    st.tuples(st.integers(0, 6),                                # arrival step
              st.lists(st.integers(0, 2), min_size=1, max_size=20),  # prompt
              st.integers(1, 12),                               # max_tokens
              st.integers(0, 2),                                # priority
              st.sampled_from([None, "tenant"])),               # cache salt
    min_size=1, max_size=8)


@settings(max_examples=200, deadline=None)
@given(workload=workloads, block_size=st.sampled_from([1, 2, 4]), spare_blocks=st.integers(0, 4),
       budget=st.integers(1, 24), max_num_seqs=st.integers(1, 4), policy=st.sampled_from(["fcfs", "priority"]),
       prefix_caching=st.booleans(), watermark=st.sampled_from([0.0, 0.01, 0.2]),
       abort_steps=st.sets(st.integers(0, 40), max_size=3))
def test_every_request_finishes_correctly_and_the_pool_is_whole_again(
        workload, block_size, spare_blocks, budget, max_num_seqs, policy, prefix_caching, watermark, abort_steps):
    # The kernel admits a request only when it fits the pool alone; give the pool no more than that.
    need = max(-(-(len(p) + m) // block_size) for _, p, m, _, _ in workload)
    kv = PagedKVCache(need + spare_blocks, block_size, enable_prefix_caching=prefix_caching)
    sched = DefaultScheduler(kv, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, policy=policy,
                             watermark=watermark)
    runner = FakeRunner(block_size)
    reqs = [make_request(p, max_tokens=m, priority=prio, arrival=float(t), salt=s) for t, p, m, prio, s in workload]
    arrivals = sorted(zip((w[0] for w in workload), range(len(reqs))))
    finished: list[Request] = []
    aborted: list[Request] = []
    for step in range(5000):
        while arrivals and arrivals[0][0] <= step:
            sched.add(reqs[arrivals.pop(0)[1]])
        if not arrivals and not sched.has_work():
            break
        if step in abort_steps and sched.has_work():  # a running one, or the last waiting one on odd steps
            waiting = list(sched.waiting)
            victim = waiting[-1] if waiting and (step % 2 or not sched.running) else next(iter(sched.running.values()))
            sched.finish(victim)
            victim.status = Status.FINISHED
            aborted.append(victim)
        plan = sched.schedule()
        assert plan.num_tokens <= budget and len(plan.chunks) <= max_num_seqs
        assert len({id(c.request) for c in plan.chunks}) == len(plan.chunks)
        assert all(c.num_new_tokens >= 1 for c in plan.chunks)
        assert sched.num_running <= max_num_seqs
        for c in plan.chunks:
            r = c.request
            assert c.sample == (r.num_computed_tokens + c.num_new_tokens == r.num_tokens)
            assert r.num_cached_tokens % block_size == 0 and r.num_cached_tokens < r.num_prompt_tokens
        check_pool(kv, list(sched.running.values()))
        assert all(not r.block_table for r in sched.waiting)
        tokens = runner.execute(plan)
        for c, tok in zip(plan.chunks, tokens):
            r = c.request
            r.num_computed_tokens += c.num_new_tokens
            kv.commit(r)
            if tok is not None:
                r.all_token_ids.append(tok)
                if r.num_output_tokens == r.max_tokens:
                    sched.finish(r)
                    r.status = Status.FINISHED
                    finished.append(r)
    else:
        pytest.fail(f"not done after 5000 steps: {sched.num_running} running, {sched.num_waiting} waiting")
    assert len(finished) + len(aborted) == len(reqs)
    event("preempted" if any(r.num_preemptions for r in reqs) else "no preemption")
    event("prefix hit" if any(r.num_cached_tokens for r in reqs) else "no prefix hit")
    for r in finished:  # nothing lost, nothing repeated: each output token follows from its prefix
        for i in range(r.num_prompt_tokens, r.num_tokens):
            assert r.all_token_ids[i] == next_token(r.all_token_ids[:i])
    assert sched.num_running == 0 and sched.num_waiting == 0
    check_whole(kv)
