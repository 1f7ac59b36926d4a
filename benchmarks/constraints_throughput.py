"""Throughput cost of constrained decoding on a W1-sized batch: 32 requests x 128 prompt tokens,
128 new tokens each, greedy, all submitted at once; unconstrained vs JSON-schema-constrained.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/constraints_throughput.py \\
        [--model DIR --workload w1.jsonl] [--runs 3] [--threads 1]

Without --workload, prompts are 128 random token ids per request. The schemas cannot complete
within 128 tokens, so every token of every request is sampled under its grammar mask. Figure:
output tokens per wall second of the whole batch (prefill included), median of --runs after one
warm-up, and its ratio to the unconstrained baseline measured in the same run.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time

import anyio

from modelcall.core import Kernel

# the random demo model without --model (the trained one's 2,526-token vocabulary and short answers
# are not what this batch was sized for)
os.environ.setdefault("MODELCALL_DEMO_MODEL", "random")

MODES = {
    "none": None,
    # ~1-2 tokens per item: the grammar advances every token, many masks per second
    "json_digits": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 999}, "minItems": 400},
    # long strings: the mask is mostly "any string character", the cheap case for the lexer
    "json_strings": {"type": "array", "items": {"type": "string", "maxLength": 64}, "minItems": 400},
}


async def one_run(kernel: Kernel, prompts: list[list[int]], schema: dict | None, new_tokens: int) -> tuple[int, float]:
    fmt = None if schema is None else {"type": "json_schema", "json_schema": {"name": "b", "schema": schema}}
    tokens = 0

    async def go(ids: list[int]) -> None:
        nonlocal tokens
        c = await kernel.complete(prompt_token_ids=ids, max_tokens=new_tokens, temperature=0, ignore_eos=schema is None,
                                  response_format=fmt)
        tokens += c.usage.completion_tokens
    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for ids in prompts:
            tg.start_soon(go, ids)
    return tokens, time.perf_counter() - t0


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="model directory (default: the built-in demo model)")
    ap.add_argument("--workload", help="W1 JSONL rows {prompt_token_ids, max_tokens}")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()
    async with Kernel(model=args.model, dtype=args.dtype, threads=args.threads, num_kv_blocks=2048) as kernel:
        while not kernel.ready:
            await anyio.sleep(0.01)
        if args.workload:
            rows = [json.loads(line) for line in open(args.workload)]
            prompts, new_tokens = [r["prompt_token_ids"] for r in rows], rows[0]["max_tokens"]
        else:
            rng = random.Random(0)
            prompts, new_tokens = [[rng.randrange(100, kernel.spec.vocab_size - 100) for _ in range(128)]
                                   for _ in range(32)], 128
        print(f"{len(prompts)} requests x {len(prompts[0])} prompt tokens, {new_tokens} new tokens, "
              f"model {kernel.model_name}, {args.threads} thread(s)")
        figures: dict[str, list[float]] = {mode: [] for mode in MODES}
        for schema in MODES.values():
            await one_run(kernel, prompts, schema, new_tokens)  # warm-up
        # NOTE: modes take turns within each round, so a noisy neighbour slows them alike.
        for _ in range(args.runs):
            for mode, schema in MODES.items():
                tokens, wall = await one_run(kernel, prompts, schema, new_tokens)
                assert tokens == len(prompts) * new_tokens, tokens
                figures[mode].append(tokens / wall)
        base = statistics.median(figures["none"])
        for mode, runs in figures.items():
            tok_s = statistics.median(runs)
            print(f"{mode:>13}: {tok_s:7.1f} tok/s  ({tok_s / base:.3f} of unconstrained; runs "
                  f"{', '.join(f'{x:.0f}' for x in runs)})", flush=True)


if __name__ == "__main__":
    anyio.run(main)
