"""`modelcall bench throughput`: offline throughput of a JSONL workload through a Kernel.

Rows are {"prompt_token_ids": [...], "max_tokens": N}; all are submitted at once, greedy,
end-of-sequence ignored. The figure is output tokens per wall second of the whole batch,
prefill included, median of the runs after a warm-up (the W1 protocol of shared/bench, whose vLLM peer
keeps its prefix cache across runs; `--cold` resets ours before each run).
"""
from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass
from typing import Any

import anyio

from modelcall.core import Kernel, SamplingParams, hookimpl
from modelcall.events import StepDone
from modelcall.plugins.bench.workload import load_rows


@dataclass
class RunFigures:
    tokens: int
    wall_s: float
    steps: int
    step_s: float     # sum of StepDone.step_s
    forward_s: float  # sum of StepDone.forward_s (the runner's execute: inputs, model, sampling)
    cpu_s: float      # process CPU time (all threads): on a shared machine, wall >> cpu means we were waiting

    @property
    def tok_s(self) -> float:
        return self.tokens / self.wall_s

    @property
    def non_forward_step_share(self) -> float:
        return (self.step_s - self.forward_s) / self.step_s if self.step_s else 0.0

    @property
    def non_forward_wall_share(self) -> float:
        return (self.wall_s - self.forward_s) / self.wall_s

    def line(self) -> str:
        return (f"{self.tokens} tokens in {self.wall_s:.2f} s = {self.tok_s:.1f} tok/s; {self.steps} steps; "
                f"outside the forward: {100 * self.non_forward_step_share:.1f}% of step time, "
                f"{100 * self.non_forward_wall_share:.1f}% of wall time; process CPU {self.cpu_s:.1f} s")


class StepMeter:
    """An observer plugin summing the engine's StepDone figures."""

    modelcall_plugin_name = "bench-step-meter"

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.steps, self.step_s, self.forward_s = 0, 0.0, 0.0

    def on_step(self, ev: StepDone) -> None:
        self.steps += ev.num_steps   # forwards: a decode burst's each count
        self.step_s += ev.step_s
        self.forward_s += ev.forward_s

    @hookimpl
    def register_observers(self, register: Any) -> None:
        register(StepDone, self.on_step, "bench-step-meter")


def widen(rows: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """`n` rows cycling through `rows`; copies are rotated so no two prompts share a cached prefix."""
    out = []
    for i in range(n):
        row = rows[i % len(rows)]
        k = i // len(rows)
        ids = row["prompt_token_ids"]
        out.append({**row, "prompt_token_ids": ids[k % len(ids):] + ids[:k % len(ids)] if k else ids})
    return out


async def run_once(kernel: Kernel, meter: StepMeter, rows: list[dict[str, Any]], max_tokens: int | None = None,
                   cold: bool = False) -> RunFigures:
    if cold:  # prompts repeat across runs: without this, later runs find their prefixes cached
        kernel.kv.reset_prefix_cache()
    meter.reset()
    counts: list[int] = []

    async def one(row: dict[str, Any]) -> None:
        params = SamplingParams(max_tokens=max_tokens or row["max_tokens"], temperature=0.0, ignore_eos=True)
        done = await kernel.complete(prompt_token_ids=row["prompt_token_ids"], params=params)
        counts.append(done.usage.completion_tokens)

    t0, c0 = time.perf_counter(), time.process_time()
    async with anyio.create_task_group() as tg:
        for row in rows:
            tg.start_soon(one, row)
    wall = time.perf_counter() - t0
    return RunFigures(sum(counts), wall, meter.steps, meter.step_s, meter.forward_s, time.process_time() - c0)


async def bench(args: argparse.Namespace) -> float:
    rows = load_rows(args.dataset)
    levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    meter = StepMeter()
    config: dict[str, Any] = {"model": args.model, "max_num_seqs": max([len(rows), *levels, 1]),
                              "max_num_batched_tokens": args.max_batched_tokens,
                              "kv_cache_memory_gb": args.kv_cache_gb}
    if args.threads:
        config["threads"] = args.threads
    if args.dtype:
        config["dtype"] = args.dtype
    if getattr(args, "async_scheduling", None) is not None:
        config["async_scheduling"] = args.async_scheduling
    if getattr(args, "num_scheduler_steps", None) is not None:
        config["num_scheduler_steps"] = args.num_scheduler_steps
    if args.cpu_bind != "off":
        config["plugin_config"] = {"runner": {"cpu_bind": args.cpu_bind}}
    async with Kernel(plugins=[meter], **config) as kernel:
        spec = kernel.spec
        print(f"model {args.model}: {spec.num_layers} layers, vocab {spec.vocab_size}, {spec.device} {spec.dtype}; "
              f"{len(rows)} rows; threads {args.threads or 'default'} (CPU binding: {args.cpu_bind}); prefix cache "
              f"{'reset before each run' if args.cold else 'kept across runs (as the vllm peer)'}", flush=True)
        # NOTE: the same warm-up as shared/bench/vllm_w1.py (two rows, 8 tokens) and, by default, the same
        # prefix-cache state: vLLM keeps its cache across runs, so later runs hit the prompts' prefixes.
        warm = await run_once(kernel, meter, rows[:2], max_tokens=8)
        print(f"warm-up: {warm.line()}", flush=True)
        rates = []
        for i in range(args.runs):
            fig = await run_once(kernel, meter, rows, cold=args.cold)
            rates.append(fig.tok_s)
            print(f"run {i + 1}: {fig.line()}", flush=True)
        for n in levels:
            fig = await run_once(kernel, meter, widen(rows, n), cold=True)
            print(f"concurrency {n}: {fig.line()}", flush=True)
    result = statistics.median(rates)
    print(f"output tok/s: {result:.1f}", flush=True)
    return result


def configure(parser: argparse.ArgumentParser) -> None:
    p = parser
    p.add_argument("--model", required=True, help="a Hugging Face model directory")
    p.add_argument("--dataset", required=True, help='JSONL rows {"prompt_token_ids": [...], "max_tokens": N}')
    p.add_argument("--runs", type=int, default=3, help="timed runs after the warm-up (median reported)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--dtype", default=None, help="compute dtype (default: auto)")
    p.add_argument("--concurrency", default="", help="also run the rows widened to these counts, e.g. 64,128")
    p.add_argument("--max-batched-tokens", type=int, default=2048, help="token budget of one engine step")
    p.add_argument("--kv-cache-gb", type=float, default=1.0)
    p.add_argument("--cpu-bind", default="auto",
                   help='pin compute threads: "auto" (first N CPUs, as vLLM\'s CPU backend does), "off", or "0,1"')
    p.add_argument("--cold", action="store_true", help="reset the prefix cache before each run (every prompt computed)")
    p.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
                   help="post-process step N while step N+1's forward runs (default: the kernel's)")
    p.add_argument("--num-scheduler-steps", type=int, default=None, metavar="N",
                   help="decode bursts of up to N steps, 1: off (default: the kernel's)")


def run(args: argparse.Namespace) -> int:
    anyio.run(bench, args)
    return 0
