"""Speed of the quantized-weight matmul (plugins/runner/quant.py) against a bf16 torch linear of the same shape.

    taskset -c 1 .venv/bin/python benchmarks/quant_matmul.py [--batch 1 8] [--types Q4_1 Q8_0] [--seconds 0.3]
    taskset -c 1 .venv/bin/python benchmarks/quant_matmul.py --crossover     # QuantLinear's dense threshold
    taskset -c 1 .venv/bin/python benchmarks/quant_matmul.py --against REV [--types Q8_0] [--batch 1 16 128]
        # the r16 kernels of commit REV against the working tree's, alternated in one process

Per type and shape (N, K): microseconds per call and GB/s of weight bytes read; with int8=True beside it where built (x as Q8_0); SmolLM2-135M's shapes for the
32-weight formats, Gemma 3 270M's for the K formats (K a multiple of 256). One thread; a short loop, the median
of 5 rounds, timed by the calling thread's CPU time (every call runs on it: one thread), so that time the thread
spends descheduled on a shared machine is not counted (--wall: the wall clock); still, expect 10-20 % noise.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time

import numpy as np
import torch

from modelcall.plugins.runner import quant as Q

SMOL = [(576, 576), (192, 576), (1536, 576), (576, 1536), (49152, 576)]
GEMMA = [(640, 1024), (640, 2048), (2048, 640)]   # (N, K); the last is for the 32-weight formats only


CLOCK = time.thread_time


def timed(fn, seconds: float) -> float:
    """Median seconds per call over 5 rounds of about seconds / 5 each, on CLOCK."""
    fn()
    t0 = CLOCK()
    fn()
    once = max(CLOCK() - t0, 1e-7)
    reps = max(1, int(seconds / 5 / once))
    rounds = []
    for _ in range(5):
        t0 = CLOCK()
        for _ in range(reps):
            fn()
        rounds.append((CLOCK() - t0) / reps)
    return statistics.median(rounds)


def weight(name: str, n: int, k: int) -> Q.QWeight:
    w = torch.randn(n, k) * 0.05
    qt = Q.GGML_TYPES[name]
    if qt in Q.QUANTIZABLE:
        return Q.quantize(w, qt)
    import gguf
    raw = gguf.quants.quantize(w.numpy(), gguf.GGMLQuantizationType(qt)) if name not in ("Q4_K", "Q5_K", "Q6_K") \
        else np.random.default_rng(0).integers(0, 256, (n, Q.row_bytes(qt, k)), dtype=np.uint8)
    if name in ("Q4_K", "Q5_K", "Q6_K"):   # random bytes with small finite fp16 scales (speed does not read them)
        blocks = raw.reshape(-1, Q.block_info(qt)[1])
        at = (208,) if name == "Q6_K" else (0, 2)
        for o in at:
            blocks[:, o:o + 2] = np.full((len(blocks), 1), 0.001, np.float16).view(np.uint8)
    return Q.qweight_from_bytes(raw, qt, n, k)


def speed(types: list[str], batches: list[int], seconds: float) -> None:
    int8 = Q.int8_available()
    print(f"{'type':6} {'N x K':>12} {'B':>2} {'us/call':>9} {'GB/s':>6} {'bf16 us':>9} {'bf16 GB/s':>9} {'x bf16':>7}"
          + (f" {'int8 us':>8} {'int8 GB/s':>9}" if int8 else ""))
    for name in types:
        k_type = name.endswith("_K")
        for n, k in (GEMMA[:2] if k_type else SMOL + GEMMA[2:]):
            w = weight(name, n, k)
            dense = torch.randn(n, k).to(torch.bfloat16)
            for b in batches:
                x = torch.randn(b, k)
                xb = x.to(torch.bfloat16)
                out = torch.empty(b, n)
                tq = timed(lambda: Q.qmatmul(x, w, out=out), seconds)
                tb = timed(lambda: torch.nn.functional.linear(xb, dense), seconds)
                line = (f"{name:6} {f'{n}x{k}':>12} {b:>2} {tq * 1e6:9.1f} {w.nbytes / tq / 1e9:6.1f} "
                        f"{tb * 1e6:9.1f} {n * k * 2 / tb / 1e9:9.1f} {tb / tq:7.2f}")
                if int8:
                    ti = timed(lambda: Q.qmatmul(x, w, out=out, int8=True), seconds)
                    line += f" {ti * 1e6:8.1f} {w.nbytes / ti / 1e9:9.1f}"
                print(line, flush=True)


def crossover(seconds: float) -> None:
    """qmatmul against dequantize-per-call + torch linear (bf16 and fp32) by token count."""
    print(f"{'type':6} {'N x K':>12} {'tokens':>6} {'qmatmul us':>10} {'deq+bf16 us':>11} {'deq+fp32 us':>11}")
    for name, (n, k) in (("Q4_1", (1536, 576)), ("Q4_1", (576, 576)), ("Q4_K", (640, 2048))):
        w = weight(name, n, k)
        for t in (8, 16, 32, 64, 128, 256):
            x = torch.randn(t, k)
            xb = x.to(torch.bfloat16)
            tq = timed(lambda: Q.qmatmul(x, w), seconds)
            tdb = timed(lambda: torch.nn.functional.linear(xb, w.dequantize(torch.bfloat16)), seconds)
            tdf = timed(lambda: torch.nn.functional.linear(x, w.dequantize()), seconds)
            print(f"{name:6} {f'{n}x{k}':>12} {t:>6} {tq * 1e6:10.1f} {tdb * 1e6:11.1f} {tdf * 1e6:11.1f}", flush=True)


# one SmolLM2 decode token's matrices: q|k|v, o, gate|up, down x 30 layers (distinct weights: read from memory, as
# in a model), and the tied output projection; Gemma-like shapes for the K formats (K a multiple of 256)
LAYER = {"32": [(960, 576), (576, 576), (3072, 576), (576, 1536)], "K": [(1024, 1024), (640, 2048), (2048, 1024)]}
HEAD = {"32": (49152, 576), "K": (16384, 1024)}


def built_at(rev: str):
    """The quantized kernels' library as commit `rev`'s sources build it."""
    from modelcall.core import native
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parts = [f"/* ---- {name} ---- */\n" + subprocess.run(
        ["git", "show", f"{rev}:plugins/runner/csrc/{name}"], cwd=repo, capture_output=True, text=True,
        check=True).stdout for name in Q._FILES]
    lib = native.compile_library(f"quant_at_{rev}", "\n".join(parts))
    Q._declare(lib)
    return lib


def against(rev: str, types: list[str], batches: list[int], layers: int = 30) -> None:
    """r16 weights' matmuls with `rev`'s kernels (A) and the working tree's (B), alternated call for call: ms per
    token step (min of 7 rounds) and A / B, per part (the layers, the output projection)."""
    libs = {"A": built_at(rev), "B": Q.load()}
    print(f"A = {rev}, B = the working tree; r16 weights, x fp32, one thread")
    for name in types:
        fam = "K" if name.endswith("_K") else "32"
        parts = {"layers": [Q.repack_r16(weight(name, n, k)) for n, k in LAYER[fam] * layers],
                 "head": [Q.repack_r16(weight(name, *HEAD[fam]))]}
        for b in batches:
            xs = {k: torch.randn(b, k) for k in {w.shape[1] for ws in parts.values() for w in ws}}
            for part, ws in parts.items():
                outs = [torch.empty(b, w.shape[0]) for w in ws]

                def step(lib, ws=ws, outs=outs) -> None:
                    for w, o in zip(ws, outs):
                        n, k = w.shape
                        rc = lib.quant_qmatmul(w.qtype, w.data.data_ptr(), w.data.shape[1], n, k, xs[k].data_ptr(),
                                               0, k, b, o.data_ptr(), 0, n, None, 1)
                        assert rc == 0, rc

                best = {"A": float("inf"), "B": float("inf")}
                for _ in range(7):
                    for side, lib in libs.items():
                        t0 = CLOCK()
                        step(lib)
                        best[side] = min(best[side], CLOCK() - t0)
                macs = sum(w.shape[0] * w.shape[1] for w in ws) * b
                a, bt = best["A"], best["B"]
                print(f"{name:6} {part:6} {b:>4} rows: A {a * 1e3:8.2f} ms ({macs / a / 1e9:5.1f} GMAC/s)  "
                      f"B {bt * 1e3:8.2f} ms ({macs / bt / 1e9:5.1f})  A / B {a / bt:.2f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--types", nargs="+", default=["Q4_1", "Q8_0", "Q4_0", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"])
    ap.add_argument("--batch", nargs="+", type=int, default=[1, 8])
    ap.add_argument("--seconds", type=float, default=0.3)
    ap.add_argument("--crossover", action="store_true")
    ap.add_argument("--against", metavar="REV", help="r16 kernels: commit REV's against the working tree's")
    ap.add_argument("--wall", action="store_true", help="time by the wall clock, not the thread's CPU time")
    args = ap.parse_args()
    global CLOCK
    CLOCK = time.perf_counter if args.wall else time.thread_time
    torch.set_num_threads(1)
    print(f"kernel path: {['portable C', 'AVX-512', 'AVX2'][Q.load().quant_path()]}, torch {torch.__version__}")
    if args.against:
        against(args.against, args.types, args.batch)
    elif args.crossover:
        crossover(args.seconds)
    else:
        speed(args.types, args.batch, args.seconds)


if __name__ == "__main__":
    main()
