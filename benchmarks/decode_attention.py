"""Decode attention as the lean stack calls it (`attention.paged_attention` on [1, H, T, D] views of one packed QKV
buffer, K/V cache writes included), today's code against attention.py + cpu_kernel.py at an earlier commit, loaded
side by side (as benchmarks/runner_before_after.py loads an earlier runner), steps alternating (A B A B ...) in one process.

    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE taskset -c 0 .venv/bin/python benchmarks/decode_attention.py
        [--base c41cbb6] [--threads 1] [--steps 12] [--shape 32x192 --shape 16x2048 --shape 4x4096] [--q-dtype float32]

Shapes are rows x context: W1's decode (32 x ~192), W3's decode (16 x 2,048) and 4 long private rows (4 x 4,096);
W1's attention (8 layers, 8 heads x 64, MHA, bf16 cache in blocks of 16 (--block-size) scattered over the pool, one cache per
layer so the K/V comes from memory as in a real step). Per shape: median wall and process-CPU ms per step of all
layers for each side, their ratios (on more than one thread also today's code with a few rows' keys split across
threads, cpu_kernel.MIN_SPLIT 256: "split"; off by default), and the K/V bytes read per step over the wall time (GB/s), next to a plain
sequential read of 256 MB on the same threads (torch's sum over bf16).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
from modelcall.plugins.cli.main import compute_thread_defaults  # noqa: E402

compute_thread_defaults(os.environ)   # what `modelcall serve` gets (GOMP_SPINCOUNT), before torch loads
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

import runner_before_after as rba  # noqa: E402
from modelcall.plugins.runner import attention, cpu_kernel  # noqa: E402
from modelcall.plugins.runner.batch import StepBatch, _context_slots  # noqa: E402

class Layer:
    """What paged_attention reads of the HF attention module."""

    def __init__(self, i: int) -> None:
        self.layer_idx = i


def make(rows: int, ctx: int, layers: int, heads: int, kv_heads: int, d: int, bs: int = 16, in_order: bool = False,
         seed: int = 0, q_dtype: torch.dtype = torch.bfloat16):
    """(call(fn) -> output of the last layer, K/V bytes read per step): one decode step of `rows` rows at context
    `ctx` (positions ctx - 1), each layer through fn = some attention.paged_attention."""
    g = torch.Generator().manual_seed(seed)
    nb = -(-ctx // bs)
    pool = rows * nb + 1
    # scattered: every block anywhere in the pool; in order: each row's blocks one after another (what a fresh
    # prompt's prefill gets from the LRU free queue; the blocks decode adds later sit elsewhere)
    table = (torch.arange(rows * nb) if in_order else torch.randperm(pool, generator=g)[:rows * nb]).view(rows, nb)
    slots = _context_slots(table, torch.arange(ctx), bs)
    caches = [(torch.randn(pool * bs, kv_heads, d, generator=g).bfloat16(),
               torch.randn(pool * bs, kv_heads, d, generator=g).bfloat16()) for _ in range(layers)]
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * d, generator=g).to(q_dtype)
    pos = torch.full((rows,), ctx - 1)
    slot_mapping = slots[torch.arange(rows), pos].contiguous()
    q = qkv[:, :heads * d].view(rows, heads, d).transpose(0, 1).unsqueeze(0)
    k = qkv[:, heads * d:(heads + kv_heads) * d].view(rows, kv_heads, d).transpose(0, 1).unsqueeze(0)
    v = qkv[:, (heads + kv_heads) * d:].view(rows, kv_heads, d).transpose(0, 1).unsqueeze(0)
    mods = [Layer(i) for i in range(layers)]

    def call(fn) -> torch.Tensor:
        step = StepBatch(input_ids=None, positions=None, slot_mapping=slot_mapping, sample_rows=None, num_sampled=0,
                         num_paged=rows, paged_token_seq=torch.arange(rows), paged_token_pos=pos, paged_slots=slots,
                         paged_ctx_lens=[ctx] * rows, paged_q_lens=[1] * rows, kv=caches)
        for m in mods:
            o, _ = fn(m, q, k, v, None, scaling=d ** -0.5, sliding_window=None, modelcall_step=step)
        return o

    return call, rows * ctx * layers * 2 * kv_heads * d * 2


def sequential_gbs() -> float:
    x = torch.randn(128 * 2 ** 20).bfloat16()   # 256 MB
    best = float("inf")
    for _ in range(4):
        t0 = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t0)
    return x.numel() * 2 / best / 1e9


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default="c41cbb6")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--shape", action="append", help="ROWSxCTX (default: 32x192, 16x2048, 4x4096)")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--block-size", type=int, default=16, help="tokens per cache block (the engine's default: 16)")
    ap.add_argument("--q-dtype", default="bfloat16", choices=("bfloat16", "float32"),
                    help="the queries' dtype: the model's compute dtype (float32 where the loader picks fp32 compute)")
    ap.add_argument("--in-order", action="store_true", help="each row's blocks consecutive in the pool (default: scattered)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    scratch = tempfile.mkdtemp(prefix="decode_attention_")
    rba.install_base_runner(args.base, scratch)
    import importlib

    old = importlib.import_module(f"{rba.BASE_PKG}.attention").paged_attention
    new = attention.paged_attention

    def split_rows(*a, **k):   # today's kernel with a few rows' keys split across threads (parts of >= 256 keys)
        default, cpu_kernel.MIN_SPLIT = cpu_kernel.MIN_SPLIT, 256
        try:
            return new(*a, **k)
        finally:
            cpu_kernel.MIN_SPLIT = default

    sides = [("old", old), ("new", new)] + ([("split", split_rows)] if args.threads > 1 else [])
    print(f"threads {args.threads}, base {args.base}, block size {args.block_size}, "
          f"{'blocks in order' if args.in_order else 'blocks scattered'}; sequential read {sequential_gbs():.1f} GB/s; load average "
          f"{os.getloadavg()[0]:.1f}")
    for shape in args.shape or ["32x192", "16x2048", "4x4096"]:
        rows, ctx = (int(x) for x in shape.split("x"))
        call, nbytes = make(rows, ctx, args.layers, args.heads, args.kv_heads, args.head_dim, args.block_size,
                            args.in_order, q_dtype=getattr(torch, args.q_dtype))
        err = (call(old).float() - call(new).float()).abs().max().item()
        wall: dict[str, list[float]] = {name: [] for name, _ in sides}
        cpu: dict[str, list[float]] = {name: [] for name, _ in sides}
        for _ in range(args.steps):
            for name, fn in sides:
                c0, t0 = time.process_time(), time.perf_counter()
                call(fn)
                cpu[name].append((time.process_time() - c0) * 1e3)
                wall[name].append((time.perf_counter() - t0) * 1e3)
        w = {n: statistics.median(x) for n, x in wall.items()}
        c = {n: statistics.median(x) for n, x in cpu.items()}
        print(f"{rows:3d} x {ctx:5d}: old {w['old']:7.2f} ms wall {c['old']:7.2f} CPU ({nbytes / w['old'] / 1e6:5.1f} GB/s)"
              f" | new {w['new']:7.2f} wall {c['new']:7.2f} CPU ({nbytes / w['new'] / 1e6:5.1f} GB/s) | old/new wall "
              f"{w['old'] / w['new']:.2f}x CPU {c['old'] / c['new']:.2f}x | max |old - new| {err:.2e} "
              f"| K/V {nbytes / 1e6:.0f} MB per step")
        if "split" in w:
            print(f"{'':14s}new with a row's keys split across threads {w['split']:7.2f} ms wall {c['split']:7.2f} CPU: "
                  f"whole/split wall {w['new'] / w['split']:.2f}x (> 1: the split is faster)")


if __name__ == "__main__":
    main()
