"""W1 offline through one Kernel with async scheduling on and off, alternating run by run.

The engine reads `async_scheduling` each time it starts stepping, so one kernel (same weights, same
warm caches) switches between runs. W1: 32 requests x 128 prompt tokens, 128 new, greedy, EOS
ignored, all at once; the prefix cache is reset before each run (every prompt computed). Prints
output tok/s and process CPU ms per output token, median of NRUNS pairs, and on/off ratios.

    python benchmarks/overlap_w1.py [MODEL_DIR W1_JSONL]   (default: builds the W1 reference model)
Environment: THREADS=1, NRUNS=3.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import anyio  # noqa: E402

from modelcall.core import Kernel, SamplingParams  # noqa: E402


async def one_run(kernel: Kernel, rows: list[dict], overlap: bool) -> tuple[float, float]:
    kernel.engine.async_scheduling = overlap
    kernel.kv.reset_prefix_cache()
    params = SamplingParams.create(max_tokens=rows[0]["max_tokens"], temperature=0, ignore_eos=True)
    made = 0

    async def one(row: dict) -> None:
        nonlocal made
        done = await kernel.complete(prompt_token_ids=row["prompt_token_ids"], params=params)
        made += len(done.token_ids)

    cpu, t = time.process_time(), time.perf_counter()
    async with anyio.create_task_group() as tg:
        for row in rows:
            tg.start_soon(one, row)
    wall, cpu = time.perf_counter() - t, time.process_time() - cpu
    return made / wall, 1000 * cpu / made


async def main(model: str, workload: str) -> None:
    rows = [json.loads(line) for line in open(workload, encoding="utf-8") if line.strip()]
    threads = int(os.environ.get("THREADS", "1"))
    runs = int(os.environ.get("NRUNS", "3"))
    async with Kernel(model=model, threads=threads, max_num_seqs=len(rows)) as kernel:
        await one_run(kernel, rows[:2], True)
        await one_run(kernel, rows[:2], False)
        figs: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
        for i in range(runs):
            for overlap in ((True, False) if i % 2 == 0 else (False, True)):
                figs[overlap].append(await one_run(kernel, rows, overlap))
                tok_s, cpu = figs[overlap][-1]
                print(f"run {i + 1} async scheduling {'on ' if overlap else 'off'}: {tok_s:7.1f} tok/s, "
                      f"{cpu:.2f} CPU ms per token", flush=True)
    med = {k: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v)) for k, v in figs.items()}
    print(f"W1 (threads {threads}) async scheduling on: {med[True][0]:.1f} tok/s ({med[True][1]:.2f} CPU ms/token); "
          f"off: {med[False][0]:.1f} tok/s ({med[False][1]:.2f} CPU ms/token)")
    print(f"ratio on/off: {med[True][0] / med[False][0]:.3f}x tok/s, {med[True][1] / med[False][1]:.3f}x CPU per token")


if __name__ == "__main__":
    if len(sys.argv) == 3:
        anyio.run(main, sys.argv[1], sys.argv[2])
    else:
        here = os.path.dirname(os.path.abspath(__file__))
        with tempfile.TemporaryDirectory() as d:
            subprocess.run([sys.executable, os.path.join(here, "..", "..", "shared", "bench", "make_reference_model.py"),
                            d, "--size", "w1"], check=True, capture_output=True)
            anyio.run(main, os.path.join(d, "model"), os.path.join(d, "w1.jsonl"))
