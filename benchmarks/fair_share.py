"""Fair share (issue 41): a heavy tenant's burst against a light tenant's trickle, FCFS against
`--scheduling fair`, in one run (ratios of one run on one machine).

    A: `a_requests` requests of `a_prompt` prompt tokens at once (`a_output` output tokens each)
    B: one `b_prompt`-token request every `b_every_s` seconds (`b_output` output tokens) while A's burst lasts

Reports B's TTFT p50 on an idle engine, under FCFS and under fair (medians of `--repeat` rounds,
idle, FCFS and fair in turn); A's throughput (its prompt and
output tokens over the time its burst took) under both; and, in a third phase, two tenants that
stay backlogged (C: long prompts, D: short prompts, long outputs) under fair: the largest
difference of their weighted service while both wait, against the paper's bound 2U,
U = max(w_in * L_input, w_out * M) (M: the tokens the KV cache holds). Service is counted from
the requests' own events (RequestScheduled: the prompt; TokensEmitted: the output), not from the
scheduler's counters.

The engine is sized so that the KV cache, not the sequence cap, holds A's burst back (the paper's
setting): `kv_requests` of A's requests fit at once. Issue sizes: --a-requests 64 --a-prompt 1024.

    taskset -c 0 .venv/bin/python benchmarks/fair_share.py --threads 1
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from typing import Any

from modelcall.core import Kernel
from modelcall.core.metering import Caller
from modelcall.events import RequestAdmitted, RequestScheduled, TokensEmitted

W_IN, W_OUT = 1.0, 2.0


def prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(10, 2000) for _ in range(n)]


class Run:
    """One engine; every request's events, by tenant, as they happened."""

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        self.events: list[tuple[float, str, Any]] = []
        self.ttft: dict[str, list[tuple[float, float]]] = {}   # (received, ttft)
        self.queue: dict[str, list[float]] = {}
        self.finished_at: dict[str, list[float]] = {}
        self.tokens: dict[str, int] = {}
        self.prompt_len: dict[str, int] = {}

    async def one(self, tenant: str, ids: list[int], max_tokens: int) -> None:
        handle = await self.kernel.submit(prompt_token_ids=ids, max_tokens=max_tokens, temperature=0, ignore_eos=True,
                                          caller=Caller(name=tenant))
        self.prompt_len[handle.request_id] = len(ids)
        async for ev in handle:
            self.events.append((ev.ts, tenant, ev))
            if type(ev).__name__ == "Finished":
                self.ttft.setdefault(tenant, []).append((ev.timings.received, ev.timings.ttft_s))
                self.queue.setdefault(tenant, []).append(ev.timings.queue_s)
                self.finished_at.setdefault(tenant, []).append(time.monotonic())
                self.tokens[tenant] = self.tokens.get(tenant, 0) + ev.usage.prompt_tokens + ev.usage.completion_tokens

    def max_service_gap(self, pair: tuple[str, str]) -> tuple[float, float]:
        """The largest |W_x - W_y| while both have a request admitted and not yet scheduled, and W at the end."""
        service = dict.fromkeys(pair, 0.0)
        waiting = dict.fromkeys(pair, 0)
        worst = 0.0
        for _ts, tenant, ev in sorted(self.events, key=lambda e: e[0]):
            if isinstance(ev, RequestAdmitted):
                waiting[tenant] += 1
            elif isinstance(ev, RequestScheduled):
                waiting[tenant] -= 1
                service[tenant] += W_IN * self.prompt_len[ev.request_id]
            elif isinstance(ev, TokensEmitted):
                service[tenant] += W_OUT * len(ev.token_ids)
            if all(waiting.values()):
                worst = max(worst, abs(service[pair[0]] - service[pair[1]]))
        return worst, sum(service.values())


def kernel_for(args: argparse.Namespace, policy: str) -> Kernel:
    blocks = args.kv_requests * -(-(args.a_prompt + args.a_output) // args.block_size) + 16
    lane = {"fast_lane": args.fast_lane == "on", "newcomer_step_tokens": args.newcomer_step_tokens,
            "reserve_tokens": args.reserve_tokens, "chunk_tokens": args.chunk_tokens}
    return Kernel(model=args.model, scheduling_policy=policy, threads=args.threads, dtype="float32",
                  max_model_len=max(args.a_prompt, args.c_prompt) + 256, num_kv_blocks=blocks,
                  block_size=args.block_size, max_num_seqs=args.max_num_seqs,
                  max_num_batched_tokens=args.max_num_batched_tokens, enable_prefix_caching=False,
                  plugin_config={"fair_share": lane})


async def burst_and_trickle(args: argparse.Namespace, policy: str | None) -> dict[str, Any]:
    """policy None: B alone (the idle engine, run under fcfs)."""
    rng = random.Random(0)
    async with kernel_for(args, policy or "fcfs") as kernel:
        run = Run(kernel)
        await run.one("warm", prompt(rng, args.b_prompt), 2)
        t0 = time.monotonic()
        burst = [asyncio.create_task(run.one("A", prompt(rng, args.a_prompt), args.a_output))
                 for _ in range(args.a_requests if policy else 0)]
        trickle = []
        for _ in range(args.b_requests):
            trickle.append(asyncio.create_task(run.one("B", prompt(rng, args.b_prompt), args.b_output)))
            await asyncio.sleep(args.b_every_s)
        await asyncio.gather(*burst, *trickle)
        a_time = (max(run.finished_at["A"]) - t0) if policy else 0.0
    # NOTE: only B's requests that arrived while A's burst was still being served (an idle engine's are the baseline)
    end = t0 + a_time if policy else float("inf")
    b = [ttft for received, ttft in run.ttft["B"] if received < end] or [float("nan")]
    return {"b_ttft_p50_s": statistics.median(b), "b_ttft_max_s": max(b), "b_during_burst": len(b),
            "b_queue_p50_s": statistics.median(run.queue["B"]),
            "a_tokens_per_s": run.tokens.get("A", 0) / a_time if a_time else 0.0, "a_seconds": a_time}


async def backlogged(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(1)
    async with kernel_for(args, "fair") as kernel:
        run = Run(kernel)
        jobs = [asyncio.create_task(run.one(tenant, prompt(rng, n), out)) for _ in range(args.c_requests)
                for tenant, n, out in (("C", args.c_prompt, args.c_output), ("D", args.d_prompt, args.d_output))]
        await asyncio.gather(*jobs)
        worst, total = run.max_service_gap(("C", "D"))
        m = kernel.kv.num_blocks * args.block_size
    bound = 2 * max(W_IN * args.c_prompt, W_OUT * m)
    return {"max_service_gap": worst, "bound_2U": bound, "L_input": args.c_prompt, "M_tokens": m,
            "service_total": total}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    runs: dict[str | None, list[dict[str, Any]]] = {None: [], "fcfs": [], "fair": []}
    for _ in range(args.repeat):  # idle, fcfs, fair in turn, so a change of the machine's load falls on all
        for policy in runs:
            runs[policy].append(await burst_and_trickle(args, policy))
    med = {policy: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for policy, rs in runs.items()}
    bound = await backlogged(args)
    idle = med[None]["b_ttft_p50_s"]
    return {
        "b_ttft_idle_p50_s": idle, "fcfs": med["fcfs"], "fair": med["fair"],
        "b_ttft_fair_over_idle": med["fair"]["b_ttft_p50_s"] / idle,
        "b_ttft_fcfs_over_idle": med["fcfs"]["b_ttft_p50_s"] / idle,
        "b_ttft_fair_over_idle_each_round": [f["b_ttft_p50_s"] / i["b_ttft_p50_s"]
                                             for f, i in zip(runs["fair"], runs[None])],
        "a_throughput_fair_over_fcfs": med["fair"]["a_tokens_per_s"] / med["fcfs"]["a_tokens_per_s"],
        "a_throughput_ratio_each_round": [f["a_tokens_per_s"] / c["a_tokens_per_s"]
                                          for f, c in zip(runs["fair"], runs["fcfs"])],
        "backlogged": bound, "sizes": vars(args),
    }


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="random", help="default: the random demo model")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--a-requests", type=int, default=64)
    p.add_argument("--a-prompt", type=int, default=1024)
    p.add_argument("--a-output", type=int, default=32)
    p.add_argument("--b-prompt", type=int, default=64)
    p.add_argument("--b-output", type=int, default=16)
    p.add_argument("--b-every-s", type=float, default=0.5)
    p.add_argument("--b-requests", type=int, default=12, help="how many B sends (every --b-every-s)")
    p.add_argument("--c-requests", type=int, default=24, help="requests of each backlogged tenant (C and D)")
    p.add_argument("--c-prompt", type=int, default=1024)
    p.add_argument("--c-output", type=int, default=16)
    p.add_argument("--d-prompt", type=int, default=64)
    p.add_argument("--d-output", type=int, default=128)
    p.add_argument("--kv-requests", type=int, default=8, help="A's requests the KV cache holds at once")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--fast-lane", choices=("on", "off"), default="on",
                   help="fair: the newcomers' fast lane (plugins/fair_share, core/policies.py NewcomerTerms)")
    p.add_argument("--newcomer-step-tokens", type=int, default=0,
                   help="fair: the most tokens running requests add to a newcomer's step")
    p.add_argument("--reserve-tokens", type=int, default=128, help="fair: KV room kept for newcomers")
    p.add_argument("--chunk-tokens", type=int, default=256,
                   help="fair: the most prefill tokens of a step while several tenants are active (0: no cap)")
    p.add_argument("--repeat", type=int, default=3, help="rounds of fcfs then fair (medians reported)")
    p.add_argument("--json", metavar="PATH", help="also write the figures here")
    return p.parse_args(argv)


if __name__ == "__main__":
    a = parse()
    out = asyncio.run(main(a))
    text = json.dumps(out, indent=2)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")
