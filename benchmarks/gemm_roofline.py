"""What this CPU allows W1 at most: the W1 model's GEMMs alone, packed as the runner packs them, no attention, no
Python around them.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/gemm_roofline.py [--threads 1] [--model DIR]

Prints, per thread count: GFLOP/s of a large square bf16 GEMM (the machine's practical peak), of one W1 decode
step's GEMMs at batch 32 (q/k/v fused, o, gate/up, down per layer; lm_head), and of W1's prefill GEMMs (4,096
prompt tokens in steps of 2,048 rows, lm_head on the 32 last rows only); then the W1 ceiling these give:
4,096 output tokens / (prefill GEMMs + 128 decode steps of GEMMs). Best of 5 repeats, wall and CPU time of the
process (CPU time is what a busy neighbour cannot stretch).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def best(fn, repeats: int = 5) -> tuple[float, float]:
    """(best wall seconds, best CPU seconds) of `fn()`, after one warm-up."""
    fn()
    walls, cpus = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return min(walls), min(cpus)


def model_shapes(model_dir: str | None) -> dict:
    if model_dir is None:
        scratch = tempfile.mkdtemp()
        subprocess.run([sys.executable, os.path.join(REPO, "..", "shared", "bench", "make_reference_model.py"),
                        scratch, "--size", "w1"], check=True, capture_output=True)
        model_dir = os.path.join(scratch, "model")
    with open(os.path.join(model_dir, "config.json")) as f:
        return json.load(f)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--model")
    args = ap.parse_args()
    from modelcall.plugins.runner.packing import gemm

    cfg = model_shapes(args.model)
    h, inter, vocab, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    kv = cfg["num_key_value_heads"] * cfg.get("head_dim", h // cfg["num_attention_heads"])
    per_layer = [(h, h + 2 * kv), (h, h), (h, 2 * inter), (inter, h)]   # (in, out): qkv, o, gate+up, down
    gen = torch.Generator().manual_seed(0)

    def pack(k: int, n: int, hint: int) -> torch.Tensor:
        w = (torch.randn(n, k, generator=gen) * 0.02).to(torch.bfloat16)
        return torch.ops.mkldnn._reorder_linear_weight(w, hint)

    layer_w = [[pack(k, n, 32) for k, n in per_layer] for _ in range(layers)]   # distinct weights: as in a step
    head_w = pack(h, vocab, 32)
    macs_layer = sum(k * n for k, n in per_layer)
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        with torch.inference_mode():
            big = torch.randn(2048, 2048).to(torch.bfloat16)
            wb = pack(2048, 2048, 2048)
            pw, pc = best(lambda: gemm(big, wb, None))
            peak = 2 * 2048 ** 3

            def decode_step(rows: int = 32) -> None:
                x = torch.randn(1, rows, h).to(torch.bfloat16)
                xi = torch.randn(1, rows, inter).to(torch.bfloat16)
                for ws in layer_w:
                    gemm(x, ws[0], None), gemm(x, ws[1], None), gemm(x, ws[2], None), gemm(xi, ws[3], None)
                gemm(x, head_w, None)

            def prefill(rows: int = 2048, steps: int = 2) -> None:
                x = torch.randn(1, rows, h).to(torch.bfloat16)
                xi = torch.randn(1, rows, inter).to(torch.bfloat16)
                for _ in range(steps):
                    for ws in layer_w:
                        gemm(x, ws[0], None), gemm(x, ws[1], None), gemm(x, ws[2], None), gemm(xi, ws[3], None)
                    gemm(x[:, :16], head_w, None)

            dw, dc = best(decode_step)
            fw, fc = best(prefill, repeats=3)
        d_flop = 2 * 32 * (layers * macs_layer + h * vocab)
        f_flop = 2 * (4096 * layers * macs_layer + 32 * h * vocab)
        w1_wall, w1_cpu = fw + 128 * dw, fc + 128 * dc
        print(f"threads {threads}:")
        print(f"  2048^3 bf16 GEMM: {peak / pw / 1e9:7.1f} GFLOP/s wall, {peak / pc / 1e9:7.1f} per CPU-second")
        print(f"  W1 decode step GEMMs (batch 32): {dw * 1e3:6.2f} ms wall, {dc * 1e3:6.2f} ms CPU = "
              f"{d_flop / dw / 1e9:6.1f} GFLOP/s ({32 / dw:.0f} tok/s of decode alone)")
        print(f"  W1 prefill GEMMs (4,096 tokens): {fw * 1e3:6.1f} ms wall, {fc * 1e3:6.1f} ms CPU = "
              f"{f_flop / fw / 1e9:6.1f} GFLOP/s")
        print(f"  W1 ceiling from GEMMs alone: {4096 / w1_wall:.0f} tok/s wall ({4096 / w1_cpu * threads:.0f} "
              f"if every thread had a whole core: CPU-time bound x threads)")


if __name__ == "__main__":
    main()
