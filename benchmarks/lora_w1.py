"""W1 with 8 LoRA adapters (docs/lora.md): multi-LoRA serving against the base model alone and against serving the
same adapters one merged model at a time, in one process, runs alternating (A B C A B C ...); then the time to load
an adapter at run time.

    taskset -c 0 env OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/lora_w1.py [--runs 3] [--rank 16]
        [--threads 1] [--dtype bfloat16] [--model DIR --dataset W1.jsonl]   (default: builds ../shared/bench's w1 model)

- base:   W1's 32 requests on the base model (LoRA off).
- multi:  the same 32 requests, request i on adapter i % 8, one kernel serving the 8 adapters in shared steps.
- merged: for each adapter in turn its 4 requests on a kernel of the adapter merged into the base (PEFT
          merge_and_unload); the 8 kernels are loaded before timing starts (swapping models costs nothing here).
- swap:   the same, one model in memory at a time: each adapter's merged model is started (loaded, packed), serves
          its 4 requests and is stopped, all timed (what one process serving one merged model at a time pays).
Adapters: PEFT-built, random A and B, rank --rank on q/k/v/o/gate/up/down (lora_alpha 2r). Throughput is output
tokens per second of wall time, and per second of this process's CPU time (time.process_time: on a machine other
work loads, CPU time swings less than wall time); the ratios are of medians from the same process.
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

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NUM_ADAPTERS = 8
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def build_adapters(model_dir: str, out: str, rank: int) -> tuple[dict[str, str], dict[str, str]]:
    """(name -> PEFT adapter dir, name -> merged model dir) for NUM_ADAPTERS random adapters."""
    import peft
    import shutil
    import torch
    import transformers

    adapters, merged = {}, {}
    for i in range(NUM_ADAPTERS):
        name = f"ad{i}"
        torch.manual_seed(100 + i)
        model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        pm = peft.get_peft_model(model, peft.LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=TARGETS,
                                                        init_lora_weights=False))
        adapters[name] = os.path.join(out, name)
        pm.save_pretrained(adapters[name])
        merged[name] = os.path.join(out, name + "-merged")
        pm.merge_and_unload().save_pretrained(merged[name])
        for f in os.listdir(model_dir):   # the tokenizer and template beside the merged weights
            if f.startswith(("tokenizer", "chat_template", "special_tokens")):
                shutil.copy(os.path.join(model_dir, f), merged[name])
    return adapters, merged


async def run_rows(jobs: list[tuple[object, dict, str | None]]) -> None:
    import anyio

    async with anyio.create_task_group() as tg:
        for kernel, row, lora in jobs:
            tg.start_soon(lambda k=kernel, r=row, a=lora: k.complete(
                prompt_token_ids=r["prompt_token_ids"], lora=a, max_tokens=r.get("max_tokens", 128), temperature=0,
                ignore_eos=True))


async def main() -> None:
    from modelcall.core import Kernel, KernelConfig

    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--model")
    ap.add_argument("--dataset")
    args = ap.parse_args()
    scratch = tempfile.mkdtemp()
    if not args.model:
        subprocess.run([sys.executable, os.path.join(REPO, "..", "shared", "bench", "make_reference_model.py"),
                        scratch, "--size", "w1"], check=True, capture_output=True)
        args.model, args.dataset = os.path.join(scratch, "model"), os.path.join(scratch, "w1.jsonl")
    with open(args.dataset) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    adapters, merged = build_adapters(args.model, scratch, args.rank)
    names = sorted(adapters)
    tokens = sum(r.get("max_tokens", 128) for r in rows)

    def config(model: str, kv_gb: float = 0.25, **kw) -> KernelConfig:
        # NOTE: W1 needs ~0.13 GB of bf16 KV (32 x 256 tokens); 10 kernels of the default 1 GB ran out of memory
        return KernelConfig(model=model, threads=args.threads, kv_cache_memory_gb=kv_gb, dtype=args.dtype,
                            plugin_config={"runner": {"cpu_bind": "auto"}}, **kw)

    figures: dict[str, list[float]] = {"base": [], "multi": [], "merged": [], "swap": []}
    cpu: dict[str, list[float]] = {m: [] for m in figures}   # output tokens per CPU second
    async with contextlib.AsyncExitStack() as stack:
        base = await stack.enter_async_context(Kernel(config(args.model)))
        multi = await stack.enter_async_context(Kernel(config(args.model, lora_modules=adapters,
                                                              max_loras=NUM_ADAPTERS)))
        singles = {n: await stack.enter_async_context(Kernel(config(merged[n], kv_gb=0.05))) for n in names}
        plans = {
            "base": [[(base, r, None) for r in rows]],
            "multi": [[(multi, r, names[i % NUM_ADAPTERS]) for i, r in enumerate(rows)]],
            "merged": [[(singles[n], r, None) for i, r in enumerate(rows) if names[i % NUM_ADAPTERS] == n]
                       for n in names],   # one adapter's requests at a time
        }
        for plan in plans.values():   # warm-up: oneDNN packing, kernels, caches
            for wave in plan:
                await run_rows(wave)
        for run in range(args.runs):
            for mode, plan in plans.items():
                for k in {id(k): k for wave in plan for k, _, _ in wave}.values():
                    k.kv.reset_prefix_cache()
                t0, c0 = time.perf_counter(), time.process_time()
                for wave in plan:
                    await run_rows(wave)
                figures[mode].append(tokens / (time.perf_counter() - t0))
                cpu[mode].append(tokens / (time.process_time() - c0))
                print(f"run {run + 1} {mode:6s} W1 {figures[mode][-1]:.1f} tok/s, {cpu[mode][-1]:.1f} tok/cpu-s",
                      flush=True)
            t0, c0 = time.perf_counter(), time.process_time()
            for n in names:
                async with Kernel(config(merged[n], kv_gb=0.05)) as one:
                    await run_rows([(one, r, None) for i, r in enumerate(rows) if names[i % NUM_ADAPTERS] == n])
            figures["swap"].append(tokens / (time.perf_counter() - t0))
            cpu["swap"].append(tokens / (time.process_time() - c0))
            print(f"run {run + 1} swap   W1 {figures['swap'][-1]:.1f} tok/s, {cpu['swap'][-1]:.1f} tok/cpu-s",
                  flush=True)
        loads = []
        for i in range(5):   # runtime load of a rank-R adapter on the W1 model (read, checked, cast)
            t0 = time.perf_counter()
            multi.loras.load(f"late{i}", adapters[names[i % NUM_ADAPTERS]])
            loads.append(time.perf_counter() - t0)
    med = {m: statistics.median(v) for m, v in figures.items()}
    print(f"W1 medians of {args.runs} (threads {args.threads}, {args.dtype}, {NUM_ADAPTERS} adapters of rank {args.rank}"
          f" on {', '.join(TARGETS)}): base {med['base']:.1f} tok/s, multi-LoRA {med['multi']:.1f}, merged one at a "
          f"time {med['merged']:.1f} (models preloaded), {med['swap']:.1f} (each model loaded in turn)")
    print(f"multi-LoRA / base: {med['multi'] / med['base']:.2f}x; multi-LoRA / merged one at a time: "
          f"{med['multi'] / med['merged']:.2f}x preloaded, {med['multi'] / med['swap']:.2f}x loaded in turn")
    mc = {m: statistics.median(v) for m, v in cpu.items()}
    print(f"by CPU time (tok/cpu-s medians: base {mc['base']:.1f}, multi {mc['multi']:.1f}, merged {mc['merged']:.1f}, "
          f"swap {mc['swap']:.1f}): multi-LoRA / base {mc['multi'] / mc['base']:.2f}x; multi-LoRA / merged one at a "
          f"time {mc['multi'] / mc['merged']:.2f}x preloaded, {mc['multi'] / mc['swap']:.2f}x loaded in turn")
    print(f"runtime load of a rank-{args.rank} adapter: median {statistics.median(loads) * 1e3:.1f} ms "
          f"(min {min(loads) * 1e3:.1f}, max {max(loads) * 1e3:.1f}, {len(loads)} loads)")


if __name__ == "__main__":
    import anyio

    anyio.run(main)
