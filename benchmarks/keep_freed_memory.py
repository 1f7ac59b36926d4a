"""W3 through the kernel with the runner's `keep_freed_memory` off and on (plugins/runner/heap.py), each run in its
own process (the setting is process-wide, so one process cannot hold both sides), runs alternating so machine
noise hits both alike. Prints per side the median wall, and per prefill step the page faults and system time.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/keep_freed_memory.py [--threads 2] [--pairs 3]
        [--model DIR]   (default: builds ../shared/bench's w1 model)   [--requests 16 --prompt-len 1920 --new 128]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ONE_RUN = r"""
import json, os, random, resource, sys, time
from modelcall.plugins.cli.main import compute_thread_defaults
compute_thread_defaults(os.environ)
import anyio
from modelcall.core import Kernel, KernelConfig
model, threads, keep, requests, prompt_len, new = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", *map(int, sys.argv[4:7])
rng = random.Random(0)
prompts = [[rng.randrange(9, 32000) for _ in range(prompt_len)] for _ in range(requests)]
steps = {"prefill": [0, 0, 0.0], "decode": [0, 0, 0.0]}

async def main():
    cfg = KernelConfig(model=model, threads=threads, kv_cache_memory_gb=2.0, dtype="bfloat16",
                       plugin_config={"runner": {"cpu_bind": "auto", "keep_freed_memory": keep}})
    async with Kernel(cfg) as kernel:
        runner, execute = kernel.runner, kernel.runner.execute
        def timed(plan):
            kind = "prefill" if any(c.num_new_tokens > 1 for c in plan.chunks) else "decode"
            before = resource.getrusage(resource.RUSAGE_SELF)
            out = execute(plan)
            after = resource.getrusage(resource.RUSAGE_SELF)
            s = steps[kind]
            s[0] += 1; s[1] += after.ru_minflt - before.ru_minflt; s[2] += after.ru_stime - before.ru_stime
            return out
        await kernel.complete(prompt_token_ids=prompts[0][:64], max_tokens=2, temperature=0, ignore_eos=True)
        runner.execute = timed
        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for p in prompts:
                tg.start_soon(lambda p=p: kernel.complete(prompt_token_ids=p, max_tokens=new, temperature=0,
                                                          ignore_eos=True))
        wall = time.perf_counter() - t0
    n, faults, sys_s = steps["prefill"]
    print(json.dumps({"wall": wall, "tok_s": requests * new / wall, "prefill_steps": n,
                      "faults": faults / max(n, 1), "sys_ms": sys_s / max(n, 1) * 1e3}))

anyio.run(main)
"""


def one(args: argparse.Namespace, keep: bool) -> dict:
    out = subprocess.run([sys.executable, "-c", ONE_RUN, args.model, str(args.threads), "1" if keep else "0",
                          str(args.requests), str(args.prompt_len), str(args.new)],
                         capture_output=True, text=True, check=True, env={**os.environ, "OMP_NUM_THREADS": str(args.threads)})
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--model")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=1920)
    ap.add_argument("--new", type=int, default=128)
    args = ap.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    with tempfile.TemporaryDirectory() as scratch:
        if args.model is None:
            subprocess.run([sys.executable, os.path.join(REPO, "..", "shared", "bench", "make_reference_model.py"),
                            scratch, "--size", "w1"], check=True, capture_output=True)
            args.model = os.path.join(scratch, "model")
        runs: dict[bool, list[dict]] = {False: [], True: []}
        for i in range(args.pairs):
            for keep in (False, True):
                r = one(args, keep)
                runs[keep].append(r)
                print(f"pair {i} keep_freed_memory {str(keep).lower():5s}: {r['tok_s']:6.1f} tok/s, {r['wall']:.2f} s; "
                      f"per prefill step {r['faults']:6.0f} faults, {r['sys_ms']:5.1f} ms system", flush=True)
    med = {k: statistics.median(r["wall"] for r in v) for k, v in runs.items()}
    ratios = [a["wall"] / b["wall"] for a, b in zip(runs[False], runs[True])]
    print(f"{args.requests} x {args.prompt_len} prompt tokens, {args.new} new, {args.threads} threads: median wall "
          f"off {med[False]:.2f} s, on {med[True]:.2f} s: on is {med[False] / med[True]:.2f}x "
          f"(pairs: {', '.join(f'{x:.2f}x' for x in ratios)})")


if __name__ == "__main__":
    main()
