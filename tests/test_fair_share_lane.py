"""The newcomers' fast lane of `--scheduling fair` (core/policies.py NewcomerTerms), driven step by step
as the engine drives it (no model): a light tenant's request that arrives while a heavy tenant's
requests run gets a step of its own, finds KV room kept for it, and does not wait behind a long
prefill step; the running requests still advance at least every other step."""
from __future__ import annotations

from test_fair_share import Sim

from modelcall.core import KernelConfig, NewcomerTerms, Request, SamplingParams, SchedulePlan
from modelcall.plugins.fair_share import plugin as fair_plugin
from modelcall.plugins.fair_share.queue import FairQueue


def tokens_of(plan: SchedulePlan, tenant_prefix: str) -> int:
    return sum(c.num_new_tokens for c in plan.chunks if c.request.request_id.startswith(tenant_prefix))


def heavy_prefilling(sim: Sim) -> None:
    """Step until some of the heavy tenant's requests decode and another is mid-prefill."""
    for _ in range(200):
        running = list(sim.sched.running.values())
        if any(r.num_output_tokens for r in running) and any(r.num_uncomputed_tokens > 1 for r in running):
            return
        sim.step()
    raise AssertionError("the heavy tenant never had decodes and a prefill at once")


def light_arrival_step(terms: NewcomerTerms | None) -> tuple[SchedulePlan, SchedulePlan, int]:
    sim = Sim("fair", num_blocks=512, terms=terms, max_num_seqs=8, max_num_batched_tokens=64)
    for _ in range(8):
        sim.add("heavy", 96, 16)
    heavy_prefilling(sim)
    light = sim.add("light", 12, 4)
    first, second = sim.step(), sim.step()
    assert light.request_id in sim.first_scheduled
    return first, second, sim.first_scheduled[light.request_id]


def test_the_step_after_a_newcomer_arrives_holds_its_prefill_and_at_most_step_tokens_of_the_others():
    first, second, _ = light_arrival_step(NewcomerTerms(step_tokens=2))
    assert tokens_of(first, "light") == 12            # its whole prompt, at once
    assert tokens_of(first, "heavy") <= 2              # the heavy tenant's prefill chunk waits a step
    assert tokens_of(second, "heavy") > 2              # the next step is an ordinary one again
    alone, _, _ = light_arrival_step(NewcomerTerms(step_tokens=0))
    assert [c.request.request_id[:5] for c in alone.chunks] == ["light"]
    # Without the lane the running requests take the step's budget first: it waits behind a full chunk.
    plain, _, _ = light_arrival_step(None)
    assert tokens_of(plain, "light") == 0 and tokens_of(plain, "heavy") == 64


def light_after(steps: int, reserve_tokens: int, budget: int) -> tuple[int, int]:
    """A heavy backlog on a pool of 12 blocks of 16 tokens (a heavy request: 3 blocks, 40 + 8 tokens, so
    four fill the pool); after `steps`, a light request (1 block). Its wait for its first step, and the
    fewest blocks free after a step before it came."""
    sim = Sim("fair", num_blocks=12, block_size=16, max_num_seqs=16, max_num_batched_tokens=budget,
              terms=NewcomerTerms(step_tokens=0, reserve_tokens=reserve_tokens))
    for _ in range(30):
        sim.add("heavy", 40, 8)
    fewest_free = sim.kv.num_blocks
    for _ in range(steps):
        sim.step()
        fewest_free = min(fewest_free, sim.kv.num_free_blocks())
    light = sim.add("light", 8, 4)
    arrived = sim.steps
    while light.request_id not in sim.first_scheduled:
        sim.step()
    return sim.first_scheduled[light.request_id] - arrived, fewest_free


def test_a_newcomer_never_waits_for_blocks_while_the_reserve_exists():
    with_reserve = [light_after(t, 16, 64) for t in range(1, 40)]
    assert max(wait for wait, _ in with_reserve) == 0          # scheduled in the step right after it came
    assert min(free for _, free in with_reserve) >= 1          # the reserve (one block) was never taken
    without = [light_after(t, 0, 64) for t in range(1, 40)]
    assert sum(1 for wait, _ in without if wait) > 10          # behind the heavy prompts that fill the pool
    # Prompts chunked over several steps (16-token budget): admission counts a heavy request's whole
    # prompt, so its later chunks do not grow into the reserve.
    chunked = [light_after(t, 16, 16) for t in range(1, 40)]
    assert min(free for _, free in chunked) >= 1, chunked


def test_steps_are_short_while_two_tenants_are_active_and_whole_budget_for_one():
    terms = NewcomerTerms(step_tokens=0, chunk_tokens=8)
    sim = Sim("fair", num_blocks=512, terms=terms, max_num_seqs=8, max_num_batched_tokens=64)
    for _ in range(6):
        sim.add("heavy", 96, 16)
    alone = [sum(c.num_new_tokens for c in sim.step().chunks) for _ in range(4)]
    assert alone == [64, 64, 64, 64]                   # one tenant: the whole step budget
    sim.add("light", 12, 4)
    shared = []
    for _ in range(12):
        running = len(sim.sched.running)
        plan = sim.step()
        shared.append(sum(c.num_new_tokens for c in plan.chunks if not c.request.request_id.startswith("light")))
        assert shared[-1] <= 8 + running, (shared, running)   # chunk_tokens + one decode per running request
    assert max(shared) > 0


def test_newcomers_every_step_still_let_the_running_requests_advance_every_other_step():
    sim = Sim("fair", num_blocks=1024, terms=NewcomerTerms(step_tokens=0), max_num_seqs=64,
              max_num_batched_tokens=64)
    heavy = sim.add("heavy", 2000, 4)
    sim.step()
    progress = []
    for i in range(20):
        sim.add(f"guest{i}-", 4, 1)           # a new tenant every step, each a newcomer
        before = heavy.num_computed_tokens
        sim.step()
        progress.append(heavy.num_computed_tokens > before)
    assert all(a or b for a, b in zip(progress, progress[1:])), progress
    assert sum(progress) >= 10


def test_a_tenant_is_a_newcomer_again_once_nothing_of_it_runs():
    queue = FairQueue(newcomer_terms=NewcomerTerms())

    def request(rid: str) -> Request:
        r = Request(rid, [1] * 8, SamplingParams(), max_tokens=4)
        queue.tag(rid, "light", 1.0)
        queue.push(r)
        return r

    first = request("l1")
    assert queue.newcomer(first)
    assert queue.pop() is first and not queue.newcomer(first)        # it runs now
    second = request("l2")
    assert not queue.newcomer(second)                                # its first request still runs
    queue.push_front(first)                                          # preempted: nothing of it runs
    assert queue.newcomer(second)
    assert queue.pop() is first and not queue.newcomer(second)
    queue.finished("l1")                                             # ended: a newcomer again
    assert queue.newcomer(second)


def test_the_plugin_gives_the_queue_its_lane_and_fast_lane_false_takes_it_away():
    queue = fair_plugin.provide_waiting_queue(KernelConfig(scheduling_policy="fair"))
    assert queue.newcomer_terms == NewcomerTerms(step_tokens=0, reserve_tokens=128, chunk_tokens=256)
    queue = fair_plugin.provide_waiting_queue(KernelConfig(scheduling_policy="fair", plugin_config={"fair_share": {
        "newcomer_step_tokens": 16, "reserve_tokens": 0, "chunk_tokens": 0, "active_window_s": 2}}))
    assert queue.newcomer_terms == NewcomerTerms(step_tokens=16) and queue.active_window_s == 2.0
    off = fair_plugin.provide_waiting_queue(KernelConfig(scheduling_policy="fair",
                                                         plugin_config={"fair_share": {"fast_lane": False}}))
    assert off.newcomer_terms is None
