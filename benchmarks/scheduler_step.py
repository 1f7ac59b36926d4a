"""CPU cost of one scheduling step (schedule + commit) per request, against a floor in the same run.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/scheduler_step.py [--running 256] [--steps 2000]

The floor is the least any scheduler does per request per step: build one chunk and advance the
request. The ratio says what the budget, block and prefix-cache bookkeeping cost on top.
Steady-state decode: every request one token behind, a new block every block_size steps.
"""
from __future__ import annotations

import argparse
import time

from modelcall.core import Request, SamplingParams, ScheduledChunk
from modelcall.plugins.kv_cache import PagedKVCache
from modelcall.plugins.scheduler import DefaultScheduler


def make_requests(n: int) -> list[Request]:
    return [Request(f"r{i}", list(range(i, i + 200)), SamplingParams(), max_tokens=10**6) for i in range(n)]


def run_scheduler(n: int, steps: int) -> float:
    kv = PagedKVCache(n * 64, 16)
    sched = DefaultScheduler(kv, max_num_seqs=n, max_num_batched_tokens=200 * n)
    for r in make_requests(n):
        sched.add(r)

    def step() -> None:
        for c in sched.schedule().chunks:
            c.request.num_computed_tokens += c.num_new_tokens
            kv.commit(c.request)
            if c.sample:
                c.request.all_token_ids.append(7)

    step()  # prefill
    t = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - t) / steps


def run_floor(n: int, steps: int) -> float:
    reqs = make_requests(n)
    for r in reqs:
        r.num_computed_tokens = r.num_tokens - 1
    t = time.perf_counter()
    for _ in range(steps):
        chunks = [ScheduledChunk(r, 1, True) for r in reqs]
        for c in chunks:
            c.request.num_computed_tokens += 1
            c.request.all_token_ids.append(7)
    return (time.perf_counter() - t) / steps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--running", type=int, default=256)
    ap.add_argument("--steps", type=int, default=2000)
    a = ap.parse_args()
    floor, sched = run_floor(a.running, a.steps), run_scheduler(a.running, a.steps)
    print(f"{a.running} running decodes: floor {floor * 1e6:.0f} us/step, scheduler {sched * 1e6:.0f} us/step "
          f"({sched / a.running * 1e9:.0f} ns/request), ratio {sched / floor:.1f}x")


if __name__ == "__main__":
    main()
