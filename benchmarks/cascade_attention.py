"""Decode attention at W2's shape, row by row (the C kernel alone) against the shared-prefix path
(plugins/runner/cascade.py), alternating in one process: CPU ms (and wall ms) per decode step of all layers.

    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE taskset -c 0 .venv/bin/python benchmarks/cascade_attention.py
        [--rows 32] [--shared 1024] [--own 128] [--layers 8] [--heads 8 --kv-heads 8 --head-dim 64] [--steps 20]

Each row holds the `--shared` tokens' blocks (as prefix-cache hits do) and `--own` tokens of its own (W2: a
64-token user turn and on average ~64 generated tokens), bf16 cache, one distinct cache per layer (so the K/V
comes from memory as in a real step, not from the last layer's cache lines).
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import torch  # noqa: E402

from modelcall.plugins.runner import attention, cpu_kernel  # noqa: E402
from modelcall.plugins.runner.batch import StepBatch, _context_slots  # noqa: E402

BS = 16


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--shared", type=int, default=1024)
    ap.add_argument("--own", type=int, default=128)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    g = torch.Generator().manual_seed(0)
    n_shared, n_own = args.shared // BS, -(-(args.own + 1) // BS)
    pool = n_shared + args.rows * n_own + 1
    perm = torch.randperm(pool, generator=g)
    shared = perm[:n_shared]
    table = torch.stack([torch.cat([shared, perm[n_shared + r * n_own:n_shared + (r + 1) * n_own]])
                         for r in range(args.rows)])
    ctx = [args.shared + args.own + 1] * args.rows
    slots = _context_slots(table, torch.arange(max(ctx)), BS)
    caches = [(torch.randn(pool * BS, args.kv_heads, args.head_dim, generator=g).bfloat16(),
               torch.randn(pool * BS, args.kv_heads, args.head_dim, generator=g).bfloat16()) for _ in range(args.layers)]
    q = torch.randn(args.rows, args.heads, args.head_dim, generator=g).bfloat16()
    var = attention.Variant(args.head_dim ** -0.5)

    def step() -> StepBatch:
        return StepBatch(input_ids=None, positions=None, slot_mapping=None, sample_rows=None, num_sampled=0,
                         num_paged=args.rows, paged_token_seq=torch.arange(args.rows),
                         paged_token_pos=torch.tensor(ctx) - 1, paged_slots=slots, paged_ctx_lens=ctx,
                         paged_q_lens=[1] * args.rows)

    def row_by_row() -> torch.Tensor:
        s = step()
        return [cpu_kernel.paged_attention(q, kc, vc, s, var.scale) for kc, vc in caches][-1]

    def shared_prefix() -> torch.Tensor:
        s = step()   # a fresh step: the per-step plan is built once and every layer reuses it, as in a forward
        return [attention._paged(q, kc, vc, s, var, args.heads != args.kv_heads) for kc, vc in caches][-1]

    err = (row_by_row().float() - shared_prefix().float()).abs().max().item()
    cpu: dict[str, list[float]] = {"row by row": [], "shared prefix": []}
    wall: dict[str, list[float]] = {"row by row": [], "shared prefix": []}
    for _ in range(args.steps):
        for name, fn in (("row by row", row_by_row), ("shared prefix", shared_prefix)):
            c0, t0 = time.thread_time(), time.perf_counter()
            fn()
            cpu[name].append((time.thread_time() - c0) * 1e3)
            wall[name].append((time.perf_counter() - t0) * 1e3)
    for name in cpu:
        print(f"{name:13s}: {statistics.median(cpu[name]):7.2f} ms CPU, {statistics.median(wall[name]):7.2f} ms wall "
              f"per step ({args.layers} layers, {args.rows} rows x ({args.shared} shared + {args.own + 1} own))")
    a, b = statistics.median(cpu["row by row"]), statistics.median(cpu["shared prefix"])
    print(f"CPU ratio row-by-row / shared-prefix {a / b:.2f}x; wall ratio "
          f"{statistics.median(wall['row by row']) / statistics.median(wall['shared prefix']):.2f}x; "
          f"max |difference| {err:.2e} (bf16 outputs)")


if __name__ == "__main__":
    main()
