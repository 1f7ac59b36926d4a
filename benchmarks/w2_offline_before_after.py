"""W2 through the kernel (no HTTP), today's runner with the attention of an earlier commit (attention.py and
cpu_kernel.py at BASE, every other runner file as today) against today's, in one process, runs alternating
(A B A B ...): 64 requests sharing a 1,024-token system prompt, each with its own 64-token user turn, 128 new
tokens, 32 at a time, greedy, EOS ignored. Prints output tok/s (wall) and tok per process CPU-second per side, their
medians and the ratios.

    OMP_WAIT_POLICY=PASSIVE taskset -c 0 .venv/bin/python benchmarks/w2_offline_before_after.py --base COMMIT
        [--runs 3] [--threads 1] [--model DIR] [--concurrency 32]
        [--prompt-len 4032 --requests 4 --new-tokens 1]   (instead of W2: seeded random prompts, fresh each run)

W2's prefix caches stay warm between runs (one warm-up pass each fills them with the system prompt), as in W2
through HTTP (benchmarks/w2_serve_vs_vllm.sh); the earlier files are loaded as benchmarks/runner_before_after.py
loads a whole earlier runner.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import runner_before_after as rba  # noqa: E402

from modelcall.plugins.bench import w2  # noqa: E402


async def once(kernel, rows, concurrency: int) -> tuple[float, float]:
    """(output tok/s of wall time, output tok per process CPU-second) of one pass over `rows`."""
    import anyio

    limit = anyio.CapacityLimiter(concurrency)

    async def one(row) -> None:
        async with limit:
            await kernel.complete(prompt_token_ids=row["prompt_token_ids"], max_tokens=row["max_tokens"],
                                  temperature=0, ignore_eos=True)

    t0, c0 = time.perf_counter(), time.process_time()
    async with anyio.create_task_group() as tg:
        for row in rows:
            tg.start_soon(one, row)
    tokens = sum(r["max_tokens"] for r in rows)
    return tokens / (time.perf_counter() - t0), tokens / (time.process_time() - c0)


async def main() -> None:
    from modelcall.core import Kernel, KernelConfig

    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--model")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--prompt-len", type=int)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=1)
    args = ap.parse_args()
    scratch = tempfile.mkdtemp()
    if not args.model:
        subprocess.run([sys.executable, os.path.join(rba.REPO, "..", "shared", "bench", "make_reference_model.py"),
                        scratch, "--size", "w1"], check=True, capture_output=True)
        args.model = os.path.join(scratch, "model")
    rba.install_base_runner("HEAD", scratch)
    for name in ("attention.py", "cpu_kernel.py"):   # the earlier attention in today's runner
        src = subprocess.run(["git", "show", f"{args.base}:plugins/runner/{name}"], cwd=rba.REPO, capture_output=True,
                             text=True, check=True).stdout
        src = src.replace("modelcall.plugins.runner", rba.BASE_PKG).replace('NAME = "modelcall_paged"',
                                                                              'NAME = "modelcall_paged_base"')
        with open(os.path.join(scratch, rba.BASE_PKG, name), "w") as f:
            f.write(src)
    if args.prompt_len:
        import long_context

        def fresh_rows(seed: int) -> list[dict]:
            return [{"prompt_token_ids": p, "max_tokens": args.new_tokens}
                    for p in long_context.prompts(args.requests, args.prompt_len, 32000, seed)]
    else:
        w2_rows = w2.make_rows(w2.tokenizer_encoder(args.model))

        def fresh_rows(seed: int) -> list[dict]:
            return w2_rows
    try:
        plugin = rba.BaseRunnerPlugin(False)
    except TypeError:   # the plugin's older signature
        plugin = rba.BaseRunnerPlugin()
    wall: dict[str, list[float]] = {"base": [], "torch": []}
    cpu: dict[str, list[float]] = {"base": [], "torch": []}
    kernels = {}
    async with contextlib.AsyncExitStack() as stack:
        for name in ("base", "torch"):
            cfg = KernelConfig(model=args.model, runner=name, threads=args.threads, kv_cache_memory_gb=2.0,
                               plugin_config={"runner": {"cpu_bind": "auto"}})
            kernels[name] = await stack.enter_async_context(Kernel(cfg, plugins=[plugin]))
            await once(kernels[name], fresh_rows(0)[:args.concurrency], args.concurrency)   # kernel build, prefix cache
        for r in range(args.runs):
            for name in ("base", "torch"):
                w, c = await once(kernels[name], fresh_rows(r + 1), args.concurrency)
                wall[name].append(w)
                cpu[name].append(c)
                tokens = sum(row["max_tokens"] for row in fresh_rows(r + 1))
                print(f"{name:5s} {w:.1f} tok/s ({c:.1f} tok per CPU-second; pass {tokens / w:.2f} s wall, "
                      f"{tokens / c:.2f} s CPU)", flush=True)
    b, n = statistics.median(wall["base"]), statistics.median(wall["torch"])
    bc, nc = statistics.median(cpu["base"]), statistics.median(cpu["torch"])
    what = f"{args.requests} x {args.prompt_len} prompt, {args.new_tokens} new" if args.prompt_len else "W2 offline"
    print(f"{what}, threads {args.threads}, medians of {args.runs}: runner at {args.base} {b:.1f} tok/s, today "
          f"{n:.1f} tok/s (wall ratio {n / b:.3f}); per CPU-second {bc:.1f} vs {nc:.1f} (ratio {nc / bc:.3f})")


if __name__ == "__main__":
    import anyio
    anyio.run(main)
