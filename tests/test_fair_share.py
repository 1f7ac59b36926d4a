"""`--scheduling fair`: the built-in scheduler over a FairQueue (Virtual Token Counter per tenant),
driven step by step as the engine drives it (no model): a light tenant is not stuck behind a heavy
one's backlog, two backlogged tenants stay within the paper's bound, weights buy shares, priority
comes first, idleness is not banked, and preemption takes from the tenant served the most."""
from __future__ import annotations

import itertools

import pytest
from kv_invariants import check_pool

from modelcall.core import KernelConfig, NewcomerTerms, Request, SamplingParams, SchedulePlan, Status
from modelcall.plugins.fair_share import plugin as fair_plugin
from modelcall.plugins.fair_share.counters import VirtualTokenCounter
from modelcall.plugins.fair_share.queue import FairQueue
from modelcall.plugins.kv_cache import PagedKVCache
from modelcall.plugins.scheduler import DefaultScheduler
from modelcall.plugins.scheduler import plugin as sched_plugin

_ids = itertools.count()
W_IN, W_OUT = 1.0, 2.0


class Sim:
    """A scheduler, its pool and queue, and the engine's part: apply each plan, end finished requests,
    and count each tenant's service from the plans themselves (not from the queue's counters)."""

    def __init__(self, policy: str = "fair", num_blocks: int = 256, block_size: int = 4,
                 terms: NewcomerTerms | None = None, **kw) -> None:
        self.kv = PagedKVCache(num_blocks, block_size, enable_prefix_caching=False)
        self.queue = FairQueue(VirtualTokenCounter(W_IN, W_OUT), terms) if policy == "fair" else None
        self.sched = DefaultScheduler(self.kv, policy=policy, watermark=0.0, waiting=self.queue, **kw)
        self.tenant: dict[str, str] = {}
        self.service: dict[str, float] = {}
        self.weights: dict[str, float] = {}
        self.first_scheduled: dict[str, int] = {}
        self.finished: list[Request] = []
        self.steps = 0

    def add(self, tenant: str, prompt_len: int, max_tokens: int, priority: int = 0, weight: float = 1.0) -> Request:
        r = Request(f"{tenant}{next(_ids)}", [1 + i % 5 for i in range(prompt_len)], SamplingParams(),
                    max_tokens=max_tokens, priority=priority, arrival=float(self.steps))
        self.tenant[r.request_id] = tenant
        self.weights[tenant] = weight
        if self.queue is not None:
            self.queue.tag(r.request_id, tenant, weight)  # what the TenantTags meter does at admission
        self.sched.add(r)
        return r

    def step(self) -> SchedulePlan:
        plan = self.sched.schedule()
        for r in plan.newly_scheduled:
            self.first_scheduled[r.request_id] = self.steps
            self._serve(r, W_IN * r.num_prompt_tokens)
        for c in plan.chunks:
            r = c.request
            r.num_computed_tokens += c.num_new_tokens
            self.kv.commit(r)
            if c.sample:
                r.all_token_ids.append(3)
                self._serve(r, W_OUT)
                if r.num_output_tokens >= r.max_tokens:
                    self.sched.finish(r)
                    r.status = Status.FINISHED
                    self.finished.append(r)
                    if self.queue is not None:
                        self.queue.finished(r.request_id)
        self.steps += 1
        return plan

    def _serve(self, r: Request, cost: float) -> None:
        t = self.tenant[r.request_id]
        self.service[t] = self.service.get(t, 0.0) + cost


def test_a_light_tenant_is_admitted_at_the_first_free_slot_not_behind_the_heavy_backlog():
    admitted_at = {}
    for policy in ("fcfs", "fair"):
        sim = Sim(policy, max_num_seqs=2, max_num_batched_tokens=64)
        for _ in range(12):
            sim.add("heavy", 32, 8)
        sim.step()
        light = sim.add("light", 8, 4)
        while light.request_id not in sim.first_scheduled:
            sim.step()
        admitted_at[policy] = sum(1 for r in sim.first_scheduled if r.startswith("heavy"))
    assert admitted_at["fcfs"] == 12          # behind the whole backlog
    assert admitted_at["fair"] <= 3            # the first slot that frees up after it arrived


def test_two_backlogged_tenants_stay_within_the_papers_bound():
    num_blocks, block_size, longest_prompt = 64, 4, 48
    sim = Sim("fair", num_blocks=num_blocks, block_size=block_size, max_num_seqs=4, max_num_batched_tokens=32)
    for _ in range(40):
        sim.add("a", longest_prompt, 8)
        sim.add("b", 12, 16)
    worst = 0.0
    while len(sim.queue.stats()["waiting"]) == 2:  # both backlogged
        sim.step()
        worst = max(worst, abs(sim.service.get("a", 0.0) - sim.service.get("b", 0.0)))
    bound = 2 * max(W_IN * longest_prompt, W_OUT * num_blocks * block_size)  # 2U, U = max(w_in L_input, w_out M)
    assert sim.steps > 100 and worst <= bound, (worst, bound)
    assert worst <= 2 * W_IN * longest_prompt + 8 * W_OUT * 4, worst   # far inside it: about one prompt


def test_a_tenant_with_weight_two_is_served_about_twice_the_tokens():
    sim = Sim("fair", max_num_seqs=4, max_num_batched_tokens=32)
    for _ in range(60):
        sim.add("double", 16, 8, weight=2.0)
        sim.add("single", 16, 8, weight=1.0)
    while len(sim.queue.stats()["waiting"]) == 2:  # while both are backlogged
        sim.step()
    assert sim.steps > 100
    ratio = sim.service["double"] / sim.service["single"]
    assert 1.7 <= ratio <= 2.3, ratio


def test_priority_comes_before_fairness():
    sim = Sim("fair", max_num_seqs=1, max_num_batched_tokens=64)
    first = sim.add("served", 8, 2)
    while first.request_id not in sim.first_scheduled:
        sim.step()
    low = sim.add("fresh", 8, 2, priority=1)      # the least counter, but less urgent
    high = sim.add("served", 8, 2, priority=0)
    while len(sim.first_scheduled) < 3:
        sim.step()
    assert sim.first_scheduled[high.request_id] < sim.first_scheduled[low.request_id]


def test_a_tenant_back_from_idle_is_lifted_to_the_least_backlogged_counter():
    queue = FairQueue(VirtualTokenCounter(W_IN, W_OUT))
    queue.vtc.charge("busy", 1.0, prompt_tokens=1000)
    queue.vtc.charge("idle", 1.0, prompt_tokens=10)
    for name in ("busy", "idle"):
        r = Request(f"{name}-1", [1] * 8, SamplingParams(), max_tokens=4)
        queue.tag(r.request_id, name, 1.0)
        queue.push(r)
    assert queue.vtc["idle"] == 1000.0          # no credit for the time it sent nothing
    assert queue.vtc["busy"] == 1000.0
    alone = FairQueue()
    alone.vtc.charge("x", 1.0, prompt_tokens=5)
    r = Request("x-1", [1] * 8, SamplingParams(), max_tokens=4)
    alone.tag(r.request_id, "x", 1.0)
    alone.push(r)
    assert alone.vtc["x"] == 5.0                 # nobody backlogged: nothing to lift to


def test_preemption_takes_the_tenant_served_most_and_every_request_finishes():
    sim = Sim("fair", num_blocks=24, block_size=4, max_num_seqs=4, max_num_batched_tokens=32)
    reqs = [sim.add("big", 24, 16) for _ in range(3)] + [sim.add("small", 8, 16) for _ in range(3)]
    victims: list[tuple[str, str]] = []   # (victim's tenant, the running tenant served most just before)
    for _ in range(2000):
        if len(sim.finished) == len(reqs):
            break
        before = {r.request_id: r.num_preemptions for r in reqs}
        running = {sim.tenant[rid] for rid in sim.sched.running}
        most = max(running, key=lambda t: sim.queue.vtc[t]) if running else ""
        sim.step()
        victims += [(sim.tenant[r.request_id], most) for r in reqs if r.num_preemptions > before[r.request_id]]
        check_pool(sim.kv, [r for r in reqs if r.status is Status.RUNNING])
    assert len(sim.finished) == len(reqs) and all(r.num_output_tokens == 16 for r in reqs)
    assert victims and victims[0][0] == victims[0][1], victims
    assert sim.kv.num_free_blocks() == 24


def test_the_plugin_provides_the_queue_for_fair_and_the_default_declines():
    fair = KernelConfig(scheduling_policy="fair")
    assert sched_plugin.provide_waiting_queue(fair) is None
    queue = fair_plugin.provide_waiting_queue(KernelConfig(scheduling_policy="fair", plugin_config={
        "fair_share": {"input_weight": 1, "output_weight": 4}}))
    assert isinstance(queue, FairQueue) and queue.vtc.output_weight == 4.0
    assert fair_plugin.provide_waiting_queue(KernelConfig(scheduling_policy="priority")) is None
    with pytest.raises(ValueError, match="fair_share plugin"):
        DefaultScheduler(PagedKVCache(8, 4), policy="fair")   # no queue answered (e.g. -p no:fair_share)
