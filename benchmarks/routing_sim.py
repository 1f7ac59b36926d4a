"""Routing policies for kernel replicas, simulated: prefix-cache hit rate and load imbalance.

    .venv/bin/python benchmarks/routing_sim.py [--requests 6000] [--plot docs/scale_routing.png]

A trace of multi-turn conversations that share system prompts (Zipf-popular, as agents and apps
do) is replayed against 1-64 replicas, each with an LRU prefix cache of KV blocks and a FIFO
server whose service time is its uncached prompt tokens (prefill) plus its output tokens (decode).
Policies: random, round robin, power of two choices (by queue length), least loaded, and
prefix-aware (plugins/scale/ranking.py, the ranking the Ray Serve router runs). Printed per
replica count: hit rate (cached / prompt tokens), load imbalance (busiest replica's work over the
mean), and p50 queue wait, with each policy's hit rate as a ratio to round robin's in the same run.
Pure Python, seeded: the figures are the same on any machine.
"""
from __future__ import annotations

import argparse
import heapq
import random
from collections import OrderedDict
from dataclasses import dataclass, field

from modelcall.core.prefix_keys import prefix_block_keys, root_key
from modelcall.plugins.scale.ranking import PrefixTable, rank

BLOCK = 16
ROUTE_BLOCKS = 8  # as plugins/scale/remote.py


@dataclass
class Req:
    t: float
    ids: list[int]
    out: int
    keys: tuple[bytes, ...] = ()
    blocks: list[bytes] = field(default_factory=list)


def trace(n: int, rng: random.Random, systems: int = 48, sys_tokens: int = 512) -> list[Req]:
    """Conversations (2-8 turns) on Zipf-chosen system prompts; turns of a conversation follow each
    other, conversations interleave. Arrival times are filled in by the caller's rate."""
    prompts = [[rng.randrange(50_000) for _ in range(sys_tokens)] for _ in range(systems)]
    weights = [1 / (k + 1) ** 1.1 for k in range(systems)]
    root = root_key("sim")
    reqs: list[Req] = []
    live: list[list[int]] = []
    while len(reqs) < n:
        if len(live) < 64 or rng.random() < 0.3:
            s = rng.choices(range(systems), weights)[0]
            live.append(list(prompts[s]) + [rng.randrange(50_000) for _ in range(rng.randint(20, 200))])
            turns_left = rng.randint(2, 8)
            live[-1].append(-turns_left)  # marker, removed below
        conv = rng.choice(live)
        turns_left = -conv.pop()
        ids = list(conv)
        out = rng.randint(32, 256)
        reqs.append(Req(0.0, ids, out))
        conv.extend(rng.randrange(50_000) for _ in range(out + rng.randint(10, 120)))  # answer + next question
        if turns_left > 1:
            conv.append(-(turns_left - 1))
        else:
            live.remove(conv)
    for r in reqs:
        full = (len(r.ids) - 1) // BLOCK
        r.blocks = prefix_block_keys(r.ids, BLOCK, root, full)
        r.keys = tuple(r.blocks[:ROUTE_BLOCKS])
    return reqs


class Replica:
    def __init__(self, capacity_blocks: int) -> None:
        self.cache: OrderedDict[bytes, None] = OrderedDict()
        self.capacity = capacity_blocks
        self.free_at = 0.0
        self.ends: list[float] = []  # finish times of accepted requests (queue length = those ahead)
        self.work = 0.0

    def queue_len(self, now: float) -> int:
        while self.ends and self.ends[0] <= now:
            heapq.heappop(self.ends)
        return len(self.ends)

    def serve(self, r: Req, now: float) -> tuple[int, float]:
        hit = 0
        for k in r.blocks:
            if k not in self.cache:
                break
            hit += 1
        for k in r.blocks:  # the request's blocks are now the most recent
            self.cache[k] = None
            self.cache.move_to_end(k)
        while len(self.cache) > self.capacity:
            self.cache.popitem(last=False)
        cached = hit * BLOCK
        cost = (len(r.ids) - cached) * 0.0002 + r.out * 0.01  # prefill per token << decode per token
        start = max(now, self.free_at)
        self.free_at = start + cost
        heapq.heappush(self.ends, self.free_at)
        self.work += cost
        return cached, start - now


def simulate(policy: str, reqs: list[Req], n_rep: int, seed: int, cache_blocks: int) -> dict[str, float]:
    rng = random.Random(seed)
    reps = [Replica(cache_blocks) for _ in range(n_rep)]
    names = [f"r{i}" for i in range(n_rep)]
    table = PrefixTable()
    rr = 0
    cached = prompt = 0
    waits: list[float] = []
    for r in reqs:
        loads = {names[i]: reps[i].queue_len(r.t) for i in range(n_rep)}
        if policy == "random":
            i = rng.randrange(n_rep)
        elif policy == "round robin":
            i, rr = rr % n_rep, rr + 1
        elif policy == "power of two":
            a, b = rng.randrange(n_rep), rng.randrange(n_rep)
            i = a if loads[names[a]] <= loads[names[b]] else b
        elif policy == "least loaded":
            low = min(loads.values())
            i = rng.choice([j for j in range(n_rep) if loads[names[j]] == low])
        else:
            best = rank(r.keys, loads, table)[0]
            i = names.index(best[0])
            table.add(r.keys, names[i])
        c, w = reps[i].serve(r, r.t)
        cached += c
        prompt += len(r.ids)
        waits.append(w)
    work = [x.work for x in reps]
    waits.sort()
    return {"hit": cached / prompt, "imbalance": max(work) / (sum(work) / n_rep), "wait_p50": waits[len(waits) // 2]}


POLICIES = ("random", "round robin", "power of two", "least loaded", "prefix-aware")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=6000)
    ap.add_argument("--replicas", default="1,2,4,8,16,32,64")
    ap.add_argument("--cache-blocks", type=int, default=2048, help="KV blocks per replica (16 tokens each)")
    ap.add_argument("--load", type=float, default=0.7, help="offered load per replica (1.0: every replica busy)")
    ap.add_argument("--plot", default=None, help="write a PNG (needs matplotlib: the bench extra)")
    ap.add_argument("--seed", type=int, default=17)
    args = ap.parse_args()
    reps = [int(x) for x in args.replicas.split(",")]
    base = trace(args.requests, random.Random(args.seed))
    mean_cost = sum(len(r.ids) * 0.0002 * 0.5 + r.out * 0.01 for r in base) / len(base)
    results: dict[str, dict[int, dict[str, float]]] = {p: {} for p in POLICIES}
    print(f"{'replicas':>8} {'policy':>13} {'hit rate':>9} {'vs rr':>6} {'imbalance':>10} {'wait p50 s':>10}")
    for n in reps:
        rng = random.Random(args.seed + n)
        t = 0.0
        for r in base:  # Poisson arrivals at `load` of n replicas' capacity
            t += rng.expovariate(n * args.load / mean_cost)
            r.t = t
        for p in POLICIES:
            results[p][n] = simulate(p, base, n, args.seed, args.cache_blocks)
        for p in POLICIES:
            m = results[p][n]
            print(f"{n:>8} {p:>13} {m['hit']:>9.3f} {m['hit'] / results['round robin'][n]['hit']:>5.2f}x "
                  f"{m['imbalance']:>10.2f} {m['wait_p50']:>10.3f}")
    if args.plot:
        plot(results, reps, args.plot)


def plot(results: dict, reps: list[int], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    for p in POLICIES:
        a.plot(reps, [results[p][n]["hit"] for n in reps], marker="o", label=p)
        b.plot(reps, [results[p][n]["imbalance"] for n in reps], marker="o", label=p)
    for ax, title, ylabel in ((a, "prefix-cache hit rate", "cached / prompt tokens"),
                              (b, "load imbalance", "busiest replica's work / mean")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(reps, [str(n) for n in reps])
        ax.set_xlabel("replicas")
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    a.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
