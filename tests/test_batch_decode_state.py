"""Consecutive decode steps are updated from the last step's batch (runner/batch.py DecodeState), not built
anew: over ragged steps with block appends, requests joining and leaving, preemption, prefix-cache hits,
released (windowed) blocks and copy on write, every step equals the batch built from scratch."""
from __future__ import annotations

import random

import torch

from modelcall.core import Request, SamplingParams, SchedulePlan, ScheduledChunk
from modelcall.plugins.runner.batch import DecodeState, StepBatch, build_step

BS = 4
CPU = torch.device("cpu")


def _fields(b: StepBatch) -> dict:
    return {k: getattr(b, k) for k in StepBatch.__slots__ if k not in ("kv", "scratch")}


def assert_same_batch(got: StepBatch, want: StepBatch) -> None:
    g, w = _fields(got), _fields(want)
    for k, x in w.items():
        y = g[k]
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            assert isinstance(y, torch.Tensor) and isinstance(x, torch.Tensor), k
            assert y.dtype == x.dtype and y.shape == x.shape and torch.equal(y, x), (k, y, x)
            assert y.is_contiguous(), k   # the C kernels read paged_slots with its width as row stride
        else:
            assert y == x, (k, y, x)


class Pool:
    def __init__(self, rng: random.Random) -> None:
        self.free = list(range(1, 400))
        rng.shuffle(self.free)

    def grow(self, req: Request, upto: int) -> None:
        while len(req.block_table) * BS < upto:
            req.block_table.append(self.free.pop())


def test_decode_steps_updated_in_place_equal_fresh_batches_over_ragged_steps():
    rng = random.Random(7)
    pool = Pool(rng)
    shared = [pool.free.pop() for _ in range(3)]   # a cached prefix of 3 blocks (12 tokens)
    prefix = [rng.randrange(100) for _ in range(3 * BS)]
    state = DecodeState()
    running: list[Request] = []
    updated = steps = 0

    def admit(i: int) -> Request:
        hit = rng.random() < 0.5
        prompt = (prefix if hit else []) + [rng.randrange(100) for _ in range(rng.randrange(1, 9))]
        r = Request(f"r{i}", prompt, SamplingParams(temperature=0), max_tokens=50)
        if hit:   # prefix-cache hit: the shared blocks, computed already
            r.block_table = list(shared)
            r.num_computed_tokens = len(prefix)
        return r

    def prefill(reqs: list[Request]) -> SchedulePlan:
        chunks = []
        for r in reqs:
            n = r.num_tokens - r.num_computed_tokens
            pool.grow(r, r.num_tokens)
            chunks.append(ScheduledChunk(r, n, True))
        return SchedulePlan(chunks=chunks)

    def run(plan: SchedulePlan) -> None:
        nonlocal updated, steps
        got = build_step(plan, BS, CPU, 1, state)
        assert_same_batch(got, build_step(plan, BS, CPU))
        steps += 1
        updated += got.paged_token_seq is not None and got.paged_token_seq is state.seq and bool(state.requests)
        for c in plan.chunks:   # what the kernel does after the step
            c.request.num_computed_tokens += c.num_new_tokens
            if c.sample:
                c.request.all_token_ids.append(rng.randrange(100))

    for i in range(6):
        running.append(admit(i))
    run(prefill(running))
    nxt = 6
    for _ in range(120):
        event = rng.random()
        if event < 0.06 and len(running) > 2:        # one finishes
            r = running.pop(rng.randrange(len(running)))
            pool.free.extend(b for b in r.block_table if b not in shared)
        elif event < 0.12:                             # one joins: a mixed step (its prefill with the decodes)
            r = admit(nxt)
            nxt += 1
            plan = prefill([r])
            for d in running:
                pool.grow(d, d.num_computed_tokens + 1)
            plan.chunks = [ScheduledChunk(d, 1, True) for d in running] + plan.chunks
            running.append(r)
            run(plan)
            continue
        elif event < 0.16:                             # preempted and recomputed
            r = rng.choice(running)
            pool.free.extend(b for b in r.block_table if b not in shared)
            r.block_table, r.num_computed_tokens = [], 0
            run(prefill([r]))
            continue
        elif event < 0.19:                             # a window releases a request's first block
            r = rng.choice(running)
            if r.block_table and r.block_table[0] >= 0:
                r.block_table[0] = -1
        elif event < 0.22:                             # copy on write of a request's last block
            r = rng.choice(running)
            r.block_table[-1] = pool.free.pop()
        for d in running:
            pool.grow(d, d.num_computed_tokens + 1)
        run(SchedulePlan(chunks=[ScheduledChunk(d, 1, True) for d in running]))
    assert steps > 100 and updated > 0.6 * steps, (updated, steps)   # most steps took the update path


def test_a_non_decode_step_between_two_decode_steps_is_never_missed():
    r = Request("a", [1, 2, 3, 4, 5], SamplingParams(temperature=0), max_tokens=9)
    r.block_table, r.num_computed_tokens = [3, 8], 5
    r.all_token_ids.append(6)
    state = DecodeState()
    for _ in range(3):
        plan = SchedulePlan(chunks=[ScheduledChunk(r, 1, True)])
        assert_same_batch(build_step(plan, BS, CPU, 1, state), build_step(plan, BS, CPU))
        r.num_computed_tokens += 1
        r.all_token_ids.append(7)
        if r.num_computed_tokens + 1 > len(r.block_table) * BS:
            r.block_table.append(11)
    # a speculative step (draft) runs, then the request is rewound by one: the next decode is built anew
    r.num_computed_tokens -= 1
    plan = SchedulePlan(chunks=[ScheduledChunk(r, 1, True)])
    assert_same_batch(build_step(plan, BS, CPU, 1, state), build_step(plan, BS, CPU))
