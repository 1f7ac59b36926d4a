"""One decode token's matvecs over SmolLM2-135M-shaped weights on 4 KiB pages against the same weights moved onto
2 MiB pages (plugins/runner/huge_pages.rehome), alternated in one process; best of 10 each, in thread CPU time (the machine
is shared: time slices lost to other processes are not counted; memory stalls are).

    python benchmarks/huge_pages.py [FORMAT ...]      # F16, BF16, Q8_0, Q4_0 (default: F16 Q8_0)

Quantized formats are repacked to their r16 layout where this CPU has it, as the runner does.
"""
from __future__ import annotations

import sys
import time

import torch

from modelcall.plugins.runner import huge_pages
from modelcall.plugins.runner import quant

# SmolLM2-135M: 30 layers of q|k|v (960 x 576), o (576 x 576), gate|up (3072 x 576), down (576 x 1536); the tied
# embedding as the output projection (49,152 x 576)
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30 + [(49152, 576)]


def weights(fmt: str) -> list[quant.QWeight]:
    out = []
    for n, k in SHAPES:
        w = torch.randn(n, k) * 0.05
        if fmt in ("F16", "BF16"):
            half = w.half() if fmt == "F16" else w.bfloat16()
            data = half.view(torch.int16).view(torch.uint8).reshape(n, -1).clone()
            out.append(quant.qweight_from_bytes(data, quant.GGML_TYPES[fmt], n, k))
        else:
            q = quant.quantize(w, quant.GGML_TYPES[fmt])
            out.append(quant.repack_r16(q) or q)
    return out


def main(formats: list[str]) -> None:
    torch.set_num_threads(1)
    for fmt in formats:
        small, huge = weights(fmt), weights(fmt)
        moved = huge_pages.rehome([w.data for w in huge])
        xs = {k: torch.randn(1, k) for k in (576, 1536)}
        nbytes = sum(w.data.numel() for w in small)
        best = {"4 KiB": float("inf"), "2 MiB": float("inf")}
        for _ in range(10):
            for name, ws in (("4 KiB", small), ("2 MiB", huge)):
                t = time.thread_time()
                for (_, k), w in zip(SHAPES, ws):
                    quant.qmatmul(xs[k], w, None)
                best[name] = min(best[name], time.thread_time() - t)
        print(f"{fmt}: {nbytes / 1e6:.0f} MB a token; " + ", ".join(
            f"{name} {v * 1e3:.2f} ms ({nbytes / v / 1e9:.1f} GB/s)" for name, v in best.items()) +
            f"; ratio {best['4 KiB'] / best['2 MiB']:.2f} ({moved.huge_bytes / 1e6 if moved else 0:.0f} MB on 2 MiB pages)")


if __name__ == "__main__":
    main(sys.argv[1:] or ["F16", "Q8_0"])
