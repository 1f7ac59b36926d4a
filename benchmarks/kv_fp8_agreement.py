"""How far an fp8 KV cache moves greedy decoding: the same prompts through one kernel per cache type, tokens
compared with the bf16 cache's run (the reference).

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/kv_fp8_agreement.py --model DIR --dataset W1.jsonl
        [--prompts 16] [--new-tokens 64] [--threads 1]

Printed per cache type (float32 too: how far the bf16 cache's own rounding moves it, for scale): how many of each request's tokens match the reference before the first difference
(median and mean over requests), and the share of all positions that match. Greedy decoding forks at the first
changed token, so the first figure is the one to read. NOTE: the reference models of ../shared/bench are
randomly initialised; a trained model's attention is not what theirs is, so read this as a check, not as the
accuracy cost on a real checkpoint.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


async def run(args) -> None:
    import anyio

    from modelcall.core import Kernel, KernelConfig

    with open(args.dataset) as f:
        rows = [json.loads(line) for line in f if line.strip()][:args.prompts]
    outs = {}
    for kv in ("bfloat16", "float32", "fp8_e4m3", "fp8_e5m2"):
        cfg = KernelConfig(model=args.model, threads=args.threads, dtype=args.dtype, kv_cache_dtype=kv)
        async with Kernel(cfg) as kernel:
            got: dict[int, list[int]] = {}

            async def one(i: int, r: dict) -> None:
                done = await kernel.complete(prompt_token_ids=r["prompt_token_ids"], max_tokens=args.new_tokens,
                                             temperature=0, ignore_eos=True)
                got[i] = list(done.token_ids)

            async with anyio.create_task_group() as tg:
                for i, r in enumerate(rows):
                    tg.start_soon(one, i, r)
            outs[kv] = [got[i] for i in range(len(rows))]
    ref = outs["bfloat16"]
    for kv in ("float32", "fp8_e4m3", "fp8_e5m2"):   # float32: what bf16's own rounding moves, for scale
        prefix = []
        for a, b in zip(outs[kv], ref):
            n = 0
            while n < min(len(a), len(b)) and a[n] == b[n]:
                n += 1
            prefix.append(n)
        same = sum(x == y for a, b in zip(outs[kv], ref) for x, y in zip(a, b))
        total = sum(len(b) for b in ref)
        print(f"{kv}: tokens equal to the bf16 cache's before the first difference: median "
              f"{statistics.median(prefix):.0f}, mean {statistics.mean(prefix):.1f} of {args.new_tokens}; "
              f"positions equal {same / total:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args()
    import anyio
    anyio.run(run, args)


if __name__ == "__main__":
    main()
