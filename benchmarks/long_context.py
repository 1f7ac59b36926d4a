"""Long prompts through one engine (modelcall in-process, or vLLM offline in the peer's venv): W3 and the growth
of the time per output token with the context. benchmarks/w3_vs_vllm.sh runs it for both engines and plots.

    python benchmarks/long_context.py --engine modelcall|vllm --model DIR [--threads 2] [--out FILE.json]
        [--w3-runs 2] [--contexts 512,1024,2048,3072,4032] [--growth-batch 8] [--growth-new 32]

W3: 16 requests x 1,920 prompt token ids (seeded random ids, no special tokens), 128 new tokens, greedy, EOS
ignored, all at once; output tokens / wall seconds of the batch, prefill included; median of --w3-runs after a
warm-up. Each run's prompts are fresh (a new seed), so no engine serves them from its prefix cache.
Growth: at each context length, --growth-batch requests of that many prompt tokens run three times, the same
prompts each time: with 1 new token (the prefill, which fills the engine's prefix cache), again with 1 (the prompts
now served from the cache: only their last block is computed) and with 1 + --growth-new (from the cache too); time
per output step = (t_third - t_second) / growth_new. NOTE: the first method timed two batches of different prompts,
one with 1 new token and one with 1 + growth_new: the two prefills, each tens of times the decode steps' time,
did not cancel on a shared machine (negative steps at 3,072 on a Zen 3, 2026-12-01).
4,032 is the longest context here: with 64 generated tokens it fills the model's 4,096 positions.
Both wall time and this process tree's CPU time are recorded (the machine is shared).
--w1 FILE adds W1 (the rows of ../shared/bench's w1.jsonl, all at once, median of --w1-runs after a warm-up; both engines keep
their prefix caches between runs, as w1_vs_vllm.sh does by default) with CPU time beside wall (benchmarks/w1_vs_vllm.sh reports wall only).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

SPECIAL = 9   # ids below this are the reference tokenizer's special tokens


def prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(SPECIAL, vocab) for _ in range(length)] for _ in range(n)]


def cpu_seconds() -> float:
    """CPU time of this process and its live children (vLLM's engine core may run in a child)."""
    try:
        import psutil
    except ImportError:   # modelcall's venv: one process
        return time.process_time()

    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for child in me.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.Error:
            pass
    return total


class VllmEngine:
    def __init__(self, model: str, max_len: int, dtype: str) -> None:
        from vllm import LLM
        self.llm = LLM(model=model, dtype=dtype, max_model_len=max_len, enforce_eager=True)

    def generate(self, batch: list[list[int]], new: int) -> int:
        from vllm import SamplingParams
        params = SamplingParams(temperature=0.0, max_tokens=new, ignore_eos=True)
        outs = self.llm.generate([{"prompt_token_ids": p} for p in batch], params, use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in outs)

    def close(self) -> None:
        pass


class ModelcallEngine:
    def __init__(self, model: str, threads: int, kv_gb: float, dtype: str) -> None:
        import anyio.from_thread

        from modelcall.core import Kernel, KernelConfig
        from modelcall.plugins.cli.main import compute_thread_defaults
        compute_thread_defaults(os.environ)   # what `modelcall serve` sets before torch loads (nothing imported it yet)
        cfg = KernelConfig(model=model, threads=threads, kv_cache_memory_gb=kv_gb, dtype=dtype,
                           plugin_config={"runner": {"cpu_bind": "auto"}})
        self._portal_cm = anyio.from_thread.start_blocking_portal()
        self.portal = self._portal_cm.__enter__()
        self._kernel_cm = self.portal.wrap_async_context_manager(Kernel(cfg))   # entered and left in one task
        self.kernel = self._kernel_cm.__enter__()

    def generate(self, batch: list[list[int]], new: int) -> int:
        async def run() -> int:
            import anyio
            counts: list[int] = []

            async def one(p: list[int]) -> None:
                out = await self.kernel.complete(prompt_token_ids=p, max_tokens=new, temperature=0, ignore_eos=True)
                counts.append(len(out.token_ids))
            async with anyio.create_task_group() as tg:
                for p in batch:
                    tg.start_soon(one, p)
            return sum(counts)
        return self.portal.call(run)

    def close(self) -> None:
        self._kernel_cm.__exit__(None, None, None)
        self._portal_cm.__exit__(None, None, None)


def timed(engine, batch: list[list[int]], new: int) -> tuple[float, float, int]:
    t0, c0 = time.perf_counter(), cpu_seconds()
    n = engine.generate(batch, new)
    return time.perf_counter() - t0, cpu_seconds() - c0, n


def throughput(engine, name: str, key: str, result: dict, batches: list[list[list[int]]], new: int) -> None:
    """One timed run per batch; result[key + "_runs"], and the medians of output tokens per wall second and
    per CPU-second."""
    runs = []
    for r, batch in enumerate(batches):
        wall, cpu, n = timed(engine, batch, new)
        runs.append({"wall_s": wall, "cpu_s": cpu, "tokens": n})
        print(f"{name} {key.upper()} run {r}: {n / wall:.1f} tok/s wall, {n / cpu:.1f} tok per CPU-second",
              file=sys.stderr, flush=True)
    result[f"{key}_runs"] = runs
    result[f"{key}_tok_s"] = statistics.median(x["tokens"] / x["wall_s"] for x in runs)
    result[f"{key}_tok_cpu_s"] = statistics.median(x["tokens"] / x["cpu_s"] for x in runs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", choices=("modelcall", "vllm"), required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out")
    ap.add_argument("--w3-runs", type=int, default=2)
    ap.add_argument("--contexts", default="512,1024,2048,3072,4032")
    ap.add_argument("--growth-batch", type=int, default=8)
    ap.add_argument("--growth-new", type=int, default=32)
    ap.add_argument("--skip", default="", help="comma list of parts to skip: w3, growth")
    ap.add_argument("--w1", help="also W1 from this JSONL (../shared/bench's w1.jsonl), median of --w1-runs")
    ap.add_argument("--w1-runs", type=int, default=3)
    ap.add_argument("--dtype", default="bfloat16",
                    help="both engines' compute dtype (the same for both: benchmarks/cpu_dtype.py picks it per machine)")
    args = ap.parse_args()
    with open(os.path.join(args.model, "config.json")) as f:
        cfg = json.load(f)
    vocab, max_len = int(cfg["vocab_size"]), int(cfg["max_position_embeddings"])
    if args.engine == "vllm":
        engine = VllmEngine(args.model, max_len, args.dtype)
    else:
        engine = ModelcallEngine(args.model, args.threads, kv_gb=2.0, dtype=args.dtype)
    skip = set(args.skip.split(","))
    result: dict = {"engine": args.engine, "threads": args.threads}
    try:
        engine.generate(prompts(2, 64, vocab, 1), 8)   # warm-up
        if args.w1:
            with open(args.w1) as f:
                rows = [json.loads(line) for line in f if line.strip()]
            batch = [r["prompt_token_ids"] for r in rows]
            engine.generate(batch, 8)   # warm-up at the W1 shapes (the peer's vllm_w1.py warms up on 2 prompts)
            throughput(engine, args.engine, "w1", result, [batch] * args.w1_runs, rows[0]["max_tokens"])
        if "w3" not in skip:
            engine.generate(prompts(16, 1920, vocab, 99), 8)   # warm-up at the W3 shapes
            throughput(engine, args.engine, "w3", result,
                       [prompts(16, 1920, vocab, 100 + r) for r in range(args.w3_runs)], 128)
        if "growth" not in skip:
            growth = []
            for i, ctx in enumerate(int(c) for c in args.contexts.split(",")):
                batch = prompts(args.growth_batch, ctx, vocab, 1000 + 2 * i)
                w0, _, _ = timed(engine, batch, 1)                       # the prefill; the prefix cache now holds it
                w1, c1, _ = timed(engine, batch, 1)                      # served from the cache
                w2, c2, _ = timed(engine, batch, 1 + args.growth_new)    # the same, and growth_new decode steps
                row = {"context": ctx, "tpot_ms": (w2 - w1) / args.growth_new * 1e3,
                       "tpot_cpu_ms": (c2 - c1) / args.growth_new * 1e3, "prefill_s": w0, "cached_s": w1}
                growth.append(row)
                print(f"{args.engine} context {ctx}: {row['tpot_ms']:.1f} ms per output step (batch "
                      f"{args.growth_batch}), {row['tpot_cpu_ms']:.1f} CPU-ms; prefill {w0:.2f} s, from the "
                      f"prefix cache {w1:.2f} s",
                      file=sys.stderr, flush=True)
            result["growth"] = growth
            result["growth_batch"] = args.growth_batch
    finally:
        engine.close()
    text = json.dumps(result)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(text)


if __name__ == "__main__":
    main()
