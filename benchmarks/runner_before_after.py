"""W1 through the kernel with the torch runner of an earlier commit and with today's, in one process,
runs alternating (A B A B ...), so machine noise hits both alike. Prints each median and the ratio.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/runner_before_after.py [--base 77f8ef9] [--runs 3]
        [--threads 1] [--model DIR --dataset W1.jsonl]   (default: builds ../shared/bench's w1 model)
        [--prompt-len 1920 --requests 4 --new-tokens 16]    (instead of the dataset: seeded random prompts of
                                                             that length, fresh ones every run; W3-like)
        [--base worktree --base-runner-config '{"lean": false}']  (both sides today's runner, the base with other
                                                             runner settings: one switch A/B)

On a shared machine the wall figures swing with the neighbours' load; tokens per process CPU-second
are printed too (threads waiting for a core cost wall time, not CPU time).

The earlier runner is `git show BASE:plugins/runner/*.py` copied into a private package (imports and
the attention name rewritten), served through a plugin that provides it when `runner = "base"`.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
from modelcall.core import hookimpl  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE_PKG = "mc_base_runner"


def install_base_runner(commit: str, into: str) -> None:
    pkg = os.path.join(into, BASE_PKG)
    os.makedirs(pkg)
    names = subprocess.run(["git", "ls-tree", "--name-only", f"{commit}:plugins/runner"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.split()
    for name in names:
        if not name.endswith(".py"):
            continue
        src = subprocess.run(["git", "show", f"{commit}:plugins/runner/{name}"], cwd=REPO, capture_output=True,
                             text=True, check=True).stdout
        src = src.replace("modelcall.plugins.runner", BASE_PKG).replace('NAME = "modelcall_paged"',
                                                                          'NAME = "modelcall_paged_base"')
        with open(os.path.join(pkg, name), "w") as f:
            f.write(src)
    sys.path.insert(0, into)


class BaseRunnerPlugin:
    modelcall_plugin_name = "base-runner"

    def __init__(self, worktree: bool) -> None:
        self.worktree = worktree

    @hookimpl(tryfirst=True)
    def provide_model_runner(self, config, model_dir, sampler):
        if config.runner != "base":
            return None
        if self.worktree:
            from modelcall.plugins.runner.runner import TorchModelRunner
        else:
            from mc_base_runner.runner import TorchModelRunner
        return TorchModelRunner(config, model_dir, sampler)


async def w1_once(kernel, rows) -> tuple[float, float]:
    """(output tok/s of wall time, output tok per second of process CPU time)."""
    import anyio

    t0, c0 = time.perf_counter(), time.process_time()
    async with anyio.create_task_group() as tg:
        for row in rows:
            tg.start_soon(lambda r=row: kernel.complete(prompt_token_ids=r["prompt_token_ids"],
                                                        max_tokens=r.get("max_tokens", 128), temperature=0,
                                                        ignore_eos=True))
    tokens = sum(r.get("max_tokens", 128) for r in rows)
    return tokens / (time.perf_counter() - t0), tokens / (time.process_time() - c0)


async def main() -> None:
    from modelcall.core import Kernel, KernelConfig

    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default="77f8ef9")
    ap.add_argument("--runs", type=int, default=3)
    # NOTE: bf16 as the W1/W3 scripts (auto lets a load-time probe pick fp32: no packed GEMMs, no lean stack)
    ap.add_argument("--dtype", default="bfloat16", help="both sides' compute dtype (auto: the loader's probe)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--model")
    ap.add_argument("--dataset")
    ap.add_argument("--prompt-len", type=int)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--base-runner-config", default="{}", help="JSON: the base side's runner plugin settings")
    ap.add_argument("--runner-config", default="{}", help="JSON: today's side's runner plugin settings")
    args = ap.parse_args()
    scratch = tempfile.mkdtemp()
    if not args.model:
        subprocess.run([sys.executable, os.path.join(REPO, "..", "shared", "bench", "make_reference_model.py"),
                        scratch, "--size", "w1"], check=True, capture_output=True)
        args.model, args.dataset = os.path.join(scratch, "model"), os.path.join(scratch, "w1.jsonl")
    worktree = args.base == "worktree"
    if not worktree:
        install_base_runner(args.base, scratch)
    with open(args.dataset) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    if args.prompt_len:
        import random

        def fresh_rows(seed: int) -> list[dict]:
            rng = random.Random(seed)
            return [{"prompt_token_ids": [rng.randrange(9, 32000) for _ in range(args.prompt_len)],
                     "max_tokens": args.new_tokens} for _ in range(args.requests)]
    else:
        def fresh_rows(seed: int) -> list[dict]:
            return rows
    figures: dict[str, list[float]] = {"base": [], "torch": []}
    per_cpu: dict[str, list[float]] = {"base": [], "torch": []}
    kernels = {}
    async with contextlib.AsyncExitStack() as stack:
        for name in ("base", "torch"):
            extra = json.loads(args.base_runner_config if name == "base" else args.runner_config)
            cfg = KernelConfig(model=args.model, runner=name, threads=args.threads, kv_cache_memory_gb=2.0,
                               dtype=args.dtype, plugin_config={"runner": {"cpu_bind": "auto", **extra}})
            kernels[name] = await stack.enter_async_context(Kernel(cfg, plugins=[BaseRunnerPlugin(worktree)]))
            await w1_once(kernels[name], fresh_rows(0))   # warm-up (kernel build, oneDNN packing, caches)
        for r in range(args.runs):
            for name in ("base", "torch"):
                kernels[name].kv.reset_prefix_cache()
                wall, cpu = await w1_once(kernels[name], fresh_rows(r + 1))
                figures[name].append(wall)
                per_cpu[name].append(cpu)
                print(f"{name:5s} W1 {wall:.1f} tok/s ({cpu:.1f} tok per CPU-second)", flush=True)
    b, n = statistics.median(figures["base"]), statistics.median(figures["torch"])
    print(f"runner at {args.base}: {b:.1f} tok/s; today's runner: {n:.1f} tok/s; ratio today/base {n / b:.3f} "
          f"(medians of {args.runs}, threads {args.threads})")
    bc, nc = statistics.median(per_cpu["base"]), statistics.median(per_cpu["torch"])
    print(f"per CPU-second (less sensitive to a busy machine): base {bc:.1f}, today {nc:.1f}, ratio {nc / bc:.3f}")

if __name__ == "__main__":
    import anyio
    anyio.run(main)
