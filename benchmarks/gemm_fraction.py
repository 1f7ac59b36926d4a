"""The ceiling of the decode step: which fraction of a batch-32 decode step of the W1 model is GEMM time.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/gemm_fraction.py [--threads 1] [--profile-steps 6]
        [--model DIR --dataset W1.jsonl]   (default: builds ../shared/bench's w1 model)
        [--runner-config '{"lean": false}']  (runner plugin settings: e.g. transformers' modules instead of the lean stack)
        [--dtype bfloat16]  (auto: let the loader's probe choose)
        [--kv-cache-dtype fp8]  (the cache's element type: fp8 halves the K/V bytes attention reads)
        [--block-size 64]  (tokens per KV block; on a Zen 3 64 vs the default 16 moved nothing: 0.799/0.810 vs 0.795/0.809)

W1 runs through the kernel (32 requests, 128 new tokens, greedy, pinned threads). In every decode step with all
32 requests in the batch, each packed GEMM (packing.gemm: q/k/v, o, gate/up, down, lm_head; in fp32 also
packing.gemm_add, the o and down GEMMs whose post-op does the residual add, so that add counts as GEMM time there;
--runner-config '{"lean_epilogues": false}' times the adds apart) and each attention call (in the lean stack's plain
decode steps one call per layer that also makes the rope and the K/V write: plain_decode.py) is timed, wall and
CPU time of the compute thread, beside the whole step (runner.execute). Printed: the GEMM and attention fractions
of the step, medians over the steps. With one thread the CPU-time fraction is the one to read (a neighbour taking
the core stretches wall time, not CPU time); with two, the OpenMP worker's CPU time is not the calling thread's,
so wall fractions are printed.

The ceiling is printed beside it: each timed step's K/V bytes (every request's context x layers x K and V x KV
heads x head size x the cache's element size) over the sequential read rate of this machine, measured in the same
run (the best of a few sums over a 256 MB bf16 tensor on the same threads), is the least time attention can take;
GEMMs / (GEMMs + that floor) bounds the GEMM fraction of a step with nothing else in it.

Then --profile-steps of them run under torch.profiler (CPU): the GEMM ops' share of all ops' self time and the
top ops. NOTE: on this machine the profiler itself stretched a step ~3x (every op is recorded), so its fraction
over the profiled step's wall undercounts; it is printed for the op table, not as the figure.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
from modelcall.plugins.cli.main import compute_thread_defaults  # noqa: E402

compute_thread_defaults(os.environ)   # what the modelcall command sets before torch loads

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GEMM_OPS = ("mkldnn::_linear_pointwise", "aten::mm", "aten::addmm", "aten::bmm", "aten::linear")


class Clock:
    """Wall and thread-CPU seconds spent inside a wrapped function, since the last reset."""

    def __init__(self, fn) -> None:
        self.fn, self.wall, self.cpu = fn, 0.0, 0.0

    def __call__(self, *a, **kw):
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return self.fn(*a, **kw)
        finally:
            self.wall += time.perf_counter() - t0
            self.cpu += time.thread_time() - c0

    def wrap(self, fn):
        """`fn` timed on this clock (several functions can share one)."""
        def timed(*a, **kw):
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                return fn(*a, **kw)
            finally:
                self.wall += time.perf_counter() - t0
                self.cpu += time.thread_time() - c0
        return timed

    def take(self) -> tuple[float, float]:
        out = (self.wall, self.cpu)
        self.wall = self.cpu = 0.0
        return out


def reference_model(scratch: str) -> tuple[str, str]:
    subprocess.run([sys.executable, os.path.join(REPO, "..", "shared", "bench", "make_reference_model.py"),
                    scratch, "--size", "w1"], check=True, capture_output=True)
    return os.path.join(scratch, "model"), os.path.join(scratch, "w1.jsonl")


class StepProbe:
    """Wraps runner.execute: per full-batch decode step, the step's and its GEMMs' and attention's time."""

    def __init__(self, runner, batch: int, skip: int, profile_steps: int) -> None:
        from modelcall.plugins.runner import attention, cpu_kernel, fused_ops, packing, plain_decode
        from modelcall.plugins.runner import runner as runner_mod

        self.inner, self.batch, self.skip, self.left = runner.execute, batch, skip, profile_steps
        self.gemm = packing.gemm = Clock(packing.gemm)
        packing.gemm_add = self.gemm.wrap(packing.gemm_add)   # fp32 o/down GEMMs with the residual add
        self.attn = cpu_kernel.paged_attention = Clock(cpu_kernel.paged_attention)
        # the lean stack's plain decode steps: rope, K/V write and attention in one call, timed as attention
        plain_decode.DecodeAttention.attend = self.attn.wrap(plain_decode.DecodeAttention.attend)
        self.chunk = attention._chunk_attention = Clock(attention._chunk_attention)
        self.build = runner_mod.build_step = Clock(runner_mod.build_step)   # the step's tensors from the plan
        self.sample = Clock(runner.sampler.sample)
        self.fused = Clock(None)   # the lean stack's fused ops (add_rmsnorm, rope, silu_mul), one clock for the three
        for name in ("add_rmsnorm", "rope", "silu_mul"):
            setattr(fused_ops, name, self.fused.wrap(getattr(fused_ops, name)))
        runner.sampler.sample = self.sample
        self.rows: list[dict[str, float]] = []
        self.kv_per_token = (runner.spec.num_layers * 2 * runner.spec.num_kv_heads * runner.spec.head_dim
                             * runner.placement.kv_dtype.itemsize)   # bytes one context token's K and V take
        self.prof_gemm = self.prof_ops = 0.0
        self.prof_steps = 0
        self.table: dict[str, float] = {}

    def __call__(self, plan):
        import torch

        decode = len(plan.chunks) == self.batch and all(c.num_new_tokens == 1 for c in plan.chunks)
        if not decode or self.skip > 0:   # the first decode steps warm caches
            self.skip -= decode
            return self.inner(plan)
        if self.left > 0 and len(self.rows) % 4 == 3:   # every fourth step under the profiler
            self.left -= 1
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                out = self.inner(plan)
            self.prof_steps += 1
            for ev in prof.key_averages():
                self.table[ev.key] = self.table.get(ev.key, 0.0) + ev.self_cpu_time_total / 1e6
                self.prof_ops += ev.self_cpu_time_total / 1e6
                if ev.key in GEMM_OPS:
                    self.prof_gemm += ev.self_cpu_time_total / 1e6
            self.gemm.take(), self.attn.take(), self.chunk.take(), self.build.take(), self.sample.take(), self.fused.take()
            self.rows.append({})
            return out
        self.gemm.take(), self.attn.take(), self.chunk.take(), self.build.take(), self.sample.take(), self.fused.take()
        t0, c0 = time.perf_counter(), time.thread_time()
        out = self.inner(plan)
        wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
        (gw, gc), (aw, ac), (cw, cc) = self.gemm.take(), self.attn.take(), self.chunk.take()
        (bw, bc), (sw, sc), (fw, fc) = self.build.take(), self.sample.take(), self.fused.take()
        kv = sum(c.request.num_computed_tokens + c.num_new_tokens for c in plan.chunks) * self.kv_per_token
        self.rows.append({"kv_bytes": kv, "wall": wall, "cpu": cpu, "gemm_wall": gw, "gemm_cpu": gc, "attn_wall": aw + cw,
                          "attn_cpu": ac + cc, "build_wall": bw, "build_cpu": bc, "sample_wall": sw, "sample_cpu": sc,
                          "fused_wall": fw, "fused_cpu": fc})
        return out


async def run(args) -> None:
    import anyio

    from modelcall.core import Kernel, KernelConfig

    with open(args.dataset) as f:
        rows = [json.loads(line) for line in f if line.strip()][:args.batch]
    # NOTE: bf16 as the other benchmarks (dtype auto lets loader.faster_cpu_dtype's load-time probe pick fp32)
    cfg = KernelConfig(model=args.model, threads=args.threads, max_num_seqs=args.batch, dtype=args.dtype,
                       kv_cache_dtype=args.kv_cache_dtype, **({"block_size": args.block_size} if args.block_size else {}),
                       plugin_config={"runner": {"cpu_bind": "auto", **json.loads(args.runner_config)}})
    async with Kernel(cfg) as kernel:
        async def w1() -> None:
            async with anyio.create_task_group() as tg:
                for r in rows:
                    tg.start_soon(lambda r=r: kernel.complete(prompt_token_ids=r["prompt_token_ids"],
                                                              max_tokens=args.new_tokens, temperature=0,
                                                              ignore_eos=True))
        await w1()   # warm-up
        probe = StepProbe(kernel.runner, args.batch, skip=4, profile_steps=args.profile_steps)
        kernel.runner.execute = probe
        kernel.kv.reset_prefix_cache()
        await w1()
        kernel_lean = getattr(kernel.runner, "lean", None) is not None
        kernel_plain = kernel_lean and kernel.runner.lean.plain is not None
    rows = [r for r in probe.rows if r]
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    frac = {k: statistics.median(r[k] / r[k.split("_")[1]] for r in rows) for k in rows[0] if "_" in k and k != "kv_bytes"}
    print(f"W1 decode steps at batch {args.batch}, threads {args.threads}: {len(rows)} timed")
    print(f"  step        {med['wall'] * 1e3:7.2f} ms wall  {med['cpu'] * 1e3:7.2f} ms CPU (compute thread)")
    print(f"  GEMMs       {med['gemm_wall'] * 1e3:7.2f} ms wall  {med['gemm_cpu'] * 1e3:7.2f} ms CPU")
    print(f"  attention   {med['attn_wall'] * 1e3:7.2f} ms wall  {med['attn_cpu'] * 1e3:7.2f} ms CPU"
          f"{' (+ rope, K/V write: plain_decode)' if kernel_plain else ''}")
    print(f"  build_step  {med['build_wall'] * 1e3:7.2f} ms wall  {med['build_cpu'] * 1e3:7.2f} ms CPU")
    print(f"  sampler     {med['sample_wall'] * 1e3:7.2f} ms wall  {med['sample_cpu'] * 1e3:7.2f} ms CPU")
    print(f"  fused ops   {med['fused_wall'] * 1e3:7.2f} ms wall  {med['fused_cpu'] * 1e3:7.2f} ms CPU (lean stack)")
    rest = med['cpu'] - sum(med[k + '_cpu'] for k in ('gemm', 'attn', 'build', 'sample', 'fused'))
    print(f"  the rest    {rest * 1e3:7.2f} ms CPU (Python, small ops, HF modules)   lean stack: {kernel_lean}")
    print(f"GEMM fraction of the decode step (wall): {frac['gemm_wall']:.3f}")
    print(f"GEMM fraction of the decode step (CPU time; read this one with 1 thread): {frac['gemm_cpu']:.3f}")
    print(f"attention fraction (wall): {frac['attn_wall']:.3f}, (CPU): {frac['attn_cpu']:.3f}")
    rate = read_rate(args.threads)
    floor = med["kv_bytes"] / rate
    gemm = med["gemm_cpu"] if args.threads == 1 else med["gemm_wall"]
    print(f"ceiling: K/V {med['kv_bytes'] / 1e6:.1f} MB per step at the sequential read rate {rate / 1e9:.1f} GB/s "
          f"(measured now) = attention >= {floor * 1e3:.2f} ms; GEMM fraction <= {gemm / (gemm + floor):.3f} with "
          f"nothing else in the step")
    if probe.prof_steps:
        n = probe.prof_steps
        print(f"torch.profiler, {n} steps: GEMM ops {probe.prof_gemm / n * 1e3:.2f} ms of {probe.prof_ops / n * 1e3:.2f} "
              f"ms self time of all ops ({probe.prof_gemm / probe.prof_ops:.3f}); top ops (ms per step):")
        for key, sec in sorted(probe.table.items(), key=lambda kv: -kv[1])[:10]:
            print(f"  {sec / n * 1e3:8.3f}  {key}")


def read_rate(threads: int) -> float:
    """Bytes per second of a plain sequential read on `threads` threads: the best of five sums of 256 MB."""
    import torch

    torch.set_num_threads(threads)
    x = torch.ones(128 * 2**20, dtype=torch.bfloat16)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t0)
    return x.numel() * x.element_size() / best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--profile-steps", type=int, default=6)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--model")
    ap.add_argument("--dataset")
    ap.add_argument("--dtype", default="bfloat16", help="the kernel's compute dtype (auto: the loader's probe picks)")
    ap.add_argument("--runner-config", default="{}", help="JSON merged into the runner plugin's settings")
    ap.add_argument("--kv-cache-dtype", default="auto", help="auto, bfloat16, fp8 (E4M3), fp8_e5m2, ...")
    ap.add_argument("--block-size", type=int, default=0, help="tokens per KV block (0: the kernel's default)")
    args = ap.parse_args()
    if not args.model:
        args.model, args.dataset = reference_model(tempfile.mkdtemp())
    import anyio
    anyio.run(run, args)


if __name__ == "__main__":
    main()
