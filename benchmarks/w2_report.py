"""The figures of benchmarks/w2_serve_vs_vllm.sh: per server, the median over rounds of what
`modelcall bench serve --json` wrote, and the ratios of each modelcall server against vllm serve.

    python benchmarks/w2_report.py DIR ROUNDS NAME...     (reads DIR/rROUND-NAME.json)
"""
from __future__ import annotations

import json
import statistics
import sys


def figures(path: str) -> dict[str, float]:
    with open(path, encoding="utf-8") as f:
        d = json.load(f)
    return {"tok_s": d["output_tok_per_s"], "ttft_p50": d["ttft_ms"]["p50"], "ttft_p99": d["ttft_ms"]["p99"],
            "itl_p50": d["itl_ms"]["p50"], "cpu_ms_tok": d.get("server_cpu_ms_per_token", float("nan")),
            "wall_s": d["wall_s"], "failed": d["failed"]}


def main(folder: str, rounds: int, names: list[str]) -> None:
    runs = {n: [figures(f"{folder}/r{r}-{n}.json") for r in range(1, rounds + 1)] for n in names}
    med = {n: {k: statistics.median(x[k] for x in rs) for k in rs[0]} for n, rs in runs.items()}
    print(f"W2 through HTTP, 64 requests, 32 streaming clients, median of {rounds} interleaved rounds")
    print(f"{'server':<24}{'out tok/s':>10}{'TTFT p50':>10}{'TTFT p99':>10}{'ITL p50':>9}"
          f"{'CPU ms/tok':>11}{'wall s':>8}   per-round tok/s")
    for n, m in med.items():
        per = " ".join(f"{x['tok_s']:.0f}" for x in runs[n])
        print(f"{n:<24}{m['tok_s']:>10.1f}{m['ttft_p50']:>10.0f}{m['ttft_p99']:>10.0f}{m['itl_p50']:>9.1f}"
              f"{m['cpu_ms_tok']:>11.2f}{m['wall_s']:>8.1f}   {per}")
    if any(m["failed"] for m in med.values()):
        print("WARNING: some requests failed (see the .json.txt files)")
    peer = med.get("vllm")
    if peer is None:
        return
    for n, m in med.items():
        if n == "vllm":
            continue
        print(f"{n} / vllm serve: output tok/s {m['tok_s'] / peer['tok_s']:.2f}x (must be >= 1.5), "
              f"TTFT p50 {m['ttft_p50'] / peer['ttft_p50']:.2f}x (must be <= 0.5), "
              f"TTFT p99 {m['ttft_p99'] / peer['ttft_p99']:.2f}x, "
              f"CPU per output token {m['cpu_ms_tok'] / peer['cpu_ms_tok']:.2f}x")
    for n in med:  # each on/off pair (same spin)
        if n.startswith("modelcall-overlap-on"):
            on, off = med[n], med.get(n.replace("-overlap-on", "-overlap-off", 1))
            if off:
                print(f"async scheduling on / off{n[len('modelcall-overlap-on'):]}: output tok/s "
                      f"{on['tok_s'] / off['tok_s']:.2f}x, TTFT p50 {on['ttft_p50'] / off['ttft_p50']:.2f}x, "
                      f"CPU per token {on['cpu_ms_tok'] / off['cpu_ms_tok']:.2f}x")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3:])
