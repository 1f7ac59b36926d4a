"""W1 through HTTP streaming vs offline, on one warm kernel: the only difference is the front end.

One kernel serves the `modelcall serve` app on loopback. Runs alternate: offline (all rows through
`Kernel.complete`, the `modelcall bench throughput` protocol) and HTTP (`modelcall bench serve
--concurrency 32` in a subprocess, streaming /v1/completions). Prints each run, the engine's
forward time (so a slow run can be told apart from a slow front end), the medians and their ratio.

    python benchmarks/http_vs_offline.py MODEL_DIR W1_JSONL [--pairs 4] [--threads 2]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time

from aiohttp import web

from modelcall.core import Kernel
from modelcall.plugins.bench.throughput import StepMeter, load_rows, run_once
from modelcall.plugins.http.app import create_app

# the random-weight demo model when no --model is given, as these figures were measured (issue 19)
os.environ.setdefault("MODELCALL_DEMO_MODEL", "random")


async def http_run(url: str, model: str, dataset: str, meter: StepMeter, max_tokens: int | None = None) -> float:
    meter.reset()
    cmd = [os.path.join(os.path.dirname(sys.executable), "modelcall"), "bench", "serve", "--base-url", url,
           "--model", model, "--dataset", dataset, "--concurrency", "32", "--no-progress"]
    if max_tokens:
        cmd += ["--max-tokens", str(max_tokens)]
    proc = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.PIPE)
    out = (await proc.communicate())[0].decode()
    if proc.returncode:
        raise SystemExit(f"bench serve failed:\n{out}")
    lines = {line.split(":")[0]: line for line in out.splitlines()}
    print(f"  HTTP    {lines['output token throughput']}; forward {meter.forward_s:.2f} s in {meter.steps} steps;"
          f" {lines['ttft_ms']}; {lines['itl_ms']}", flush=True)
    return float(lines["output token throughput"].split()[3])


async def main(args: argparse.Namespace) -> None:
    rows = load_rows(args.dataset)
    meter = StepMeter()
    async with Kernel(model=args.model, threads=args.threads, max_num_seqs=len(rows), plugins=[meter],
                      enable_prefix_caching=False) as kernel:
        runner = web.AppRunner(create_app(kernel), handler_cancellation=True, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        print(f"W1: {len(rows)} rows; model {args.model}; threads {args.threads}; serving on {url}", flush=True)
        await run_once(kernel, meter, rows, max_tokens=8)
        await http_run(url, kernel.model_name, args.dataset, meter, max_tokens=8)
        offline, http = [], []
        for i in range(args.pairs):
            for kind in (("offline", "http") if i % 2 == 0 else ("http", "offline")):  # load drifts: alternate
                if kind == "offline":
                    fig = await run_once(kernel, meter, rows)
                    print(f"  offline {fig.line()}", flush=True)
                    offline.append(fig.tok_s)
                else:
                    http.append(await http_run(url, kernel.model_name, args.dataset, meter))
        await runner.cleanup()
    off, htp = statistics.median(offline), statistics.median(http)
    print(f"offline W1 tok/s (median of {len(offline)}): {off:.1f}")
    print(f"HTTP streaming W1 tok/s, 32 clients (median of {len(http)}): {htp:.1f}")
    print(f"ratio HTTP/offline: {htp / off:.2f}x (target >= 0.90); per pair: "
          + ", ".join(f"{h / o:.2f}" for h, o in zip(http, offline)))


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("dataset")
    p.add_argument("--pairs", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    t0 = time.perf_counter()
    asyncio.run(main(p.parse_args()))
    print(f"({time.perf_counter() - t0:.0f} s)")
