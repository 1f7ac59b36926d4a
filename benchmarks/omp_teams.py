"""The decode step's GEMMs on two threads with one OpenMP team in the process, against two teams.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/omp_teams.py [--steps 30]

The eight layers' packed bf16 GEMMs of the W1 model at batch 32 (q/k/v, o, gate/up, down), run in a step thread
as the engine runs them, in one process: first while the main thread still leads the OpenMP team it made
packing the weights (as a loading thread does), then after it freed that team (plugins/runner/omp_team.py).
libgomp stops spinning when it manages more workers than the process has CPUs, so with two teams each GEMM
pays a wake-up of its second thread. Prints both times and their ratio; GOMP_SPINCOUNT is the command line's
default unless given (set before torch loads).
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from modelcall.plugins.cli.main import compute_thread_defaults  # noqa: E402

compute_thread_defaults(os.environ)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from modelcall.plugins.runner import omp_team  # noqa: E402

SHAPES = ((512, 1536), (512, 512), (512, 2816), (1408, 512))   # (in, out) of W1's q/k/v, o, gate/up, down


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    torch.set_num_threads(2)
    layers = [[torch.ops.mkldnn._reorder_linear_weight(torch.randn(n, k).to(torch.bfloat16), 32) for k, n in SHAPES]
              for _ in range(8)]
    x = torch.randn(32, 512).to(torch.bfloat16)

    def step() -> None:
        h = x
        for qkv, o, gate_up, down in layers:
            a = torch.ops.mkldnn._linear_pointwise(h, qkv, None, "none", [], "")
            b = torch.ops.mkldnn._linear_pointwise(a[:, :512].contiguous(), o, None, "none", [], "")
            c = torch.ops.mkldnn._linear_pointwise(b, gate_up, None, "none", [], "")
            h = torch.ops.mkldnn._linear_pointwise(c[:, :1408].contiguous(), down, None, "none", [], "")

    def timed() -> float:
        out: list[float] = []

        def run() -> None:
            for _ in range(3):
                step()
            t0 = time.perf_counter()
            for _ in range(args.steps):
                step()
            out.append((time.perf_counter() - t0) / args.steps * 1e3)
        t = threading.Thread(target=run, name="step")
        t.start()
        t.join()
        return out[0]

    step()                                    # the main thread leads a team, as the loading thread did
    two = timed()
    released = omp_team.release_thread_team()
    one = timed()
    print(f"GOMP_SPINCOUNT={os.environ.get('GOMP_SPINCOUNT')} OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}")
    print(f"8 layers' GEMMs, batch 32, two threads: {two:.2f} ms with two OpenMP teams, {one:.2f} ms with one"
          f" (released: {released}); ratio {two / one:.2f}x")


if __name__ == "__main__":
    main()
