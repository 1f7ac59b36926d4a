"""Throughput with the records on (ledger, metrics, request log) against all off, in one run.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/observer_overhead.py [--model DIR] [--rounds 3]

W1-style: 32 requests of 128 prompt token ids, 128 new tokens each, greedy, end-of-sequence
ignored, all submitted at once; output tokens per wall second. The two kernels run in
alternation (off, on, off, on, ...) so machine noise hits both; the figure is the ratio of
the medians, for throughput and for process CPU time per output token (less sensitive to
other load on a shared machine). The demo model by default (a tiny model makes per-token observer cost look
largest); --model takes the W1 reference model.
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import anyio

from modelcall.core import Kernel, SamplingParams

# the random-weight demo model when no --model is given, as these figures were measured (issue 19)
os.environ.setdefault("MODELCALL_DEMO_MODEL", "random")

RECORDS = ("ledger", "metrics", "request_log", "api_keys", "safety")


async def run_once(kernel: Kernel, prompts: list[list[int]], max_tokens: int) -> tuple[float, float]:
    """(output tokens per wall second, process CPU microseconds per output token)."""
    kernel.kv.reset_prefix_cache()
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    tokens = []

    async def one(ids: list[int]) -> None:
        done = await kernel.complete(prompt_token_ids=ids, params=params)
        tokens.append(done.usage.completion_tokens)

    t0, c0 = time.perf_counter(), time.process_time()
    async with anyio.create_task_group() as tg:
        for ids in prompts:
            tg.start_soon(one, ids)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return sum(tokens) / wall, 1e6 * cpu / sum(tokens)


async def main(args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="modelcall-bench-"))
    common = {"model": args.model, "dtype": args.dtype, "threads": args.threads, "max_num_seqs": args.requests,
              "num_kv_blocks": args.requests * ((args.prompt + args.max_tokens) // 16 + 2)}
    common = {k: v for k, v in common.items() if v is not None}
    off = Kernel(blocked=RECORDS, **common)
    on = Kernel(plugin_config={"ledger": {"path": str(tmp / "ledger.sqlite3")},
                               "request_log": {"path": str(tmp / "requests.jsonl")}}, **common)
    async with off, on:
        for k in (off, on):
            while not k.ready:
                await anyio.sleep(0.001)
        rng = random.Random(0)
        vocab = off.spec.vocab_size
        prompts = [[rng.randrange(3, vocab) for _ in range(args.prompt)] for _ in range(args.requests)]
        names = {id(off): "off", id(on): "on"}
        print(f"{off.model_name}: {args.requests} requests x {args.prompt} prompt + {args.max_tokens} new tokens; "
              f"observers on: {sorted({lbl for _t, _f, lbl in on.bus._registered})}", flush=True)
        for k in (off, on):
            await run_once(k, prompts[:4], 8)  # warm-up
        rates: dict[str, list[float]] = {"off": [], "on": []}
        cpus: dict[str, list[float]] = {"off": [], "on": []}
        for r in range(args.rounds):
            order = (off, on) if r % 2 == 0 else (on, off)
            for k in order:
                rate, cpu = await run_once(k, prompts, args.max_tokens)
                rates[names[id(k)]].append(rate)
                cpus[names[id(k)]].append(cpu)
                print(f"round {r + 1} {names[id(k)]:>3}: {rate:8.1f} tok/s, {cpu:7.1f} CPU µs per token",
                      flush=True)
        stats = on.bus.observer_stats()
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(f"median tok/s: off {med['off']:.1f}, on {med['on']:.1f}; on/off = {med['on'] / med['off']:.3f} "
          f"({100 * (med['on'] / med['off'] - 1):+.1f}%)")
    cpu = {k: statistics.median(v) for k, v in cpus.items()}
    print(f"median CPU µs per output token: off {cpu['off']:.1f}, on {cpu['on']:.1f}; "
          f"on/off = {cpu['on'] / cpu['off']:.3f} ({100 * (cpu['on'] / cpu['off'] - 1):+.1f}%)")
    print(f"observer drops/errors: {stats}")
    import sqlite3
    rows = sqlite3.connect(tmp / "ledger.sqlite3").execute("SELECT COUNT(*) FROM requests").fetchone()[0]
    lines = sum(1 for _ in open(tmp / "requests.jsonl"))
    print(f"ledger rows: {rows}, request log lines: {lines} (tmp dir {tmp})")


if __name__ == "__main__":
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="model directory (default: the demo model)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    anyio.run(main, p.parse_args())
