"""Per-request entry time: `Kernel.submit` called → handle returned (the whole entry stage: validate,
render, tokenize, budget, filters, permissions, quota, admit), on the demo model, sequential requests.

    PYTHONPATH=<tree>/_ns python benchmarks/entry_overhead.py [N]     # prints one JSON line

Run by benchmarks/entry_overhead.sh on two trees (this one and a baseline commit) in one run. Each
request is awaited to its end before the next is submitted, so the engine loop is idle while
`submit` is timed; only the time inside `submit` is counted: wall time (median, p10) and the
process's CPU time (all its threads: the event loop and the tokenizing worker), which other
processes on a loaded machine disturb far less than wall time. Plugins are given explicitly (no entry
points) so two trees with different installed plugins run the same set.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

# both trees on the random demo model (a tree from before issue 19's default change serves it anyway)
os.environ.setdefault("MODELCALL_DEMO_MODEL", "random")
PLUGINS = ["modelcall.plugins.kv_cache.plugin", "modelcall.plugins.scheduler.plugin",
           "modelcall.plugins.demo_model.plugin", "modelcall.plugins.tokenizer_hf.plugin",
           "modelcall.plugins.runner.plugin", "modelcall.plugins.sampler.plugin",
           "modelcall.plugins.tool_parsers.plugin", "modelcall.plugins.structured.plugin",
           "modelcall.plugins.auth.plugin", "modelcall.plugins.safety.plugin"]
MESSAGES = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Name three rivers and one sea, please, in one line."}]
TEXT = "Name three rivers and one sea, please, in one line. " * 3


async def measure(n: int) -> dict:
    import modelcall.core as core
    from modelcall.core import Kernel
    from modelcall.core.metering import Caller
    from modelcall.plugins.auth.keys import Limits

    keys = Path(tempfile.mkdtemp()) / "keys.toml"
    keys.write_text(f'[[keys]]\nname = "bench"\nsha256 = "{hashlib.sha256(b"k").hexdigest()}"\nrpm = 1000000\n')
    cfg = {"auth": {"api_keys": str(keys)}, "safety": {"blocklist": ["forbidden phrase"]}}
    caller = Caller(name="bench", limits=Limits(rpm=10**6, tpm=10**9))
    out: dict = {"tree": str(Path(core.__file__).resolve().parent.parent)}
    model = os.environ.get("MODEL_DIR")  # one model directory for both trees (their demo models may differ)
    plugins = [p for p in PLUGINS if not (model and p.endswith("demo_model.plugin"))]
    async with Kernel(plugins=plugins, load_entrypoints=False, max_model_len=256, plugin_config=cfg,
                      model=model) as kernel:
        ids = kernel.tokenizer.encode(TEXT)
        forms = {"text": {"prompt": TEXT}, "messages": {"messages": MESSAGES}, "token_ids": {"prompt_token_ids": ids}}
        for _ in range(20):  # warm up (threads, caches, first-call costs)
            h = await kernel.submit(**forms["messages"], max_tokens=1, caller=caller)
            await h.result()
        for name, form in forms.items():
            times, cpu = [], []
            for i in range(n):
                c0, t0 = time.process_time(), time.perf_counter()
                h = await kernel.submit(**form, max_tokens=1, temperature=0, caller=caller)
                times.append(time.perf_counter() - t0)
                cpu.append(time.process_time() - c0)
                await h.result()
            times.sort()
            out[name] = {"median_us": round(statistics.median(times) * 1e6, 1),
                         "p10_us": round(times[int(0.1 * len(times))] * 1e6, 1),
                         "cpu_median_us": round(statistics.median(cpu) * 1e6, 1)}
    return out


if __name__ == "__main__":
    print(json.dumps(asyncio.run(measure(int(sys.argv[1]) if len(sys.argv) > 1 else 200))))
