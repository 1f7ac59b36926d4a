"""W2 through HTTP, modelcall against modelcall: A/B of `modelcall serve` settings (or builds), rounds interleaved.

Each config is one `modelcall serve` (its own environment, flags and, optionally, source tree), all up at once;
every round runs `modelcall bench serve --workload w2` against each in turn, so a busy machine hits all alike.
Beside the client's figures it reports each server's CPU per output token split by thread: the event loop
(main thread), the engine's step thread, OpenMP workers and the rest, read from /proc/PID/task/*/stat around
the timed run (threads named through `py-spy dump` when py-spy is found, else by role guessed from CPU).

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/w2_ab.py --model DIR --threads 2 --rounds 3 \\
        --config 'off;;--no-async-scheduling' --config 'on;;--async-scheduling' \\
        --config 'spin0;GOMP_SPINCOUNT=0;--no-async-scheduling' [--config 'base;TREE=/tmp/old;...']

A config is 'NAME;ENV=V ENV=V;serve flags'. TREE=DIR in its environment serves the `modelcall` package found
in DIR (PYTHONPATH=DIR: a folder holding modelcall/{core,events,plugins,testing}, e.g. an older commit's);
CLIENT_TREE=DIR runs that config's `bench serve` client from DIR too.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MC = os.path.join(REPO, ".venv", "bin", "modelcall")
TICK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds of each thread of `pid`."""
    out: dict[int, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                raw = f.read()
        except OSError:
            continue
        fields = raw[raw.rindex(b")") + 2:].split()
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / TICK
    return out


def python_thread_names(pid: int) -> dict[int, str]:
    """tid -> Python thread name, from `py-spy dump` (threads it does not list run no Python: OpenMP's)."""
    spy = os.environ.get("PYSPY") or shutil.which("py-spy")
    if not spy:
        return {}
    try:
        text = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    names = {}
    for line in text.splitlines():
        if line.startswith("Thread "):  # Thread 31472 (idle): "MainThread"
            parts = line.split()
            tid = int(parts[1], 0)
            names[tid] = line.split('"')[1] if '"' in line else "?"
    return names


def role(tid: int, pid: int, names: dict[int, str]) -> str:
    if tid == pid:
        return "loop"
    name = names.get(tid)
    if name is None:
        return "omp" if names else "other"
    return "step" if name.startswith("modelcall-step") else "other-py"


class Server:
    def __init__(self, name: str, env: dict[str, str], flags: list[str], args: argparse.Namespace, log_dir: str):
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        full = dict(os.environ)
        tree = env.pop("TREE", None)
        client_tree = env.pop("CLIENT_TREE", None)
        self.client_env = None
        if client_tree:  # the bench client from another tree too
            self.client_env = {**os.environ, "PYTHONPATH": client_tree}
        if tree:
            full["PYTHONPATH"] = tree + (os.pathsep + full["PYTHONPATH"] if full.get("PYTHONPATH") else "")
        full.update(env)
        cmd = [MC, "serve", "--model", args.model, "--served-model-name", "w1", "--dtype", "bfloat16",
               "--max-model-len", "2048", "--threads", str(args.threads), "--host", "127.0.0.1",
               "--port", str(self.port), *flags]
        self.log = open(os.path.join(log_dir, f"{name}.log"), "w")
        self.proc = subprocess.Popen(cmd, env=full, stdout=self.log, stderr=subprocess.STDOUT)
        self.names: dict[int, str] = {}
        self.rounds: list[dict] = []

    def wait_up(self) -> None:
        for _ in range(600):
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.name} died, see its log")
            try:
                urllib.request.urlopen(self.url + "/v1/models", timeout=2).read()
                return
            except OSError:
                time.sleep(1)
        raise SystemExit(f"{self.name} did not come up")

    def bench(self, args: argparse.Namespace, out: str, num: int | None) -> dict:
        cmd = [MC, "bench", "serve", "--base-url", self.url, "--model", "w1", "--workload", "w2", "--tokenizer",
               args.model, "--concurrency", str(args.concurrency), "--server-pid", str(self.proc.pid),
               "--no-progress", "--no-engine-events", "--json", out]
        if num:
            cmd += ["--num-requests", str(num)]
        before = thread_cpu(self.proc.pid)
        subprocess.run(cmd, check=True, capture_output=True, env=self.client_env)
        after = thread_cpu(self.proc.pid)
        with open(out, encoding="utf-8") as f:
            d = json.load(f)
        split: dict[str, float] = {}
        for tid, s in after.items():
            r = role(tid, self.proc.pid, self.names)
            split[r] = split.get(r, 0.0) + s - before.get(tid, 0.0)
        d["threads_cpu_s"] = split
        return d

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def parse_config(text: str) -> tuple[str, dict[str, str], list[str]]:
    name, env, flags = (text.split(";") + ["", ""])[:3]
    return name, dict(kv.split("=", 1) for kv in shlex.split(env)), shlex.split(flags)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--config", action="append", required=True)
    ap.add_argument("--out", default=None, help="folder for logs and JSON (default: a temporary one)")
    args = ap.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    out = args.out or subprocess.run(["mktemp", "-d"], capture_output=True, text=True).stdout.strip()
    os.makedirs(out, exist_ok=True)
    servers = [Server(*parse_config(c), args=args, log_dir=out) for c in args.config]
    try:
        for s in servers:
            s.wait_up()
        print(f"servers up; load average {open('/proc/loadavg').read().split()[:3]}", file=sys.stderr)
        for s in servers:  # warm-up: the system prompt into each prefix cache
            s.bench(args, os.path.join(out, f"warm-{s.name}.json"), 32)
            s.names = python_thread_names(s.proc.pid)
        for r in range(1, args.rounds + 1):
            for s in servers:
                d = s.bench(args, os.path.join(out, f"r{r}-{s.name}.json"), None)
                s.rounds.append(d)
                th = d["threads_cpu_s"]
                per = {k: 1000 * v / d["output_tokens"] for k, v in sorted(th.items())}
                print(f"round {r} {s.name}: {d['output_tok_per_s']:.1f} tok/s, TTFT p50 {d['ttft_ms']['p50']:.0f} ms, "
                      f"server {d['server_cpu_ms_per_token']:.2f} CPU-ms/tok ("
                      + ", ".join(f"{k} {v:.2f}" for k, v in per.items())
                      + f"), client {1000 * d['client_cpu_s'] / d['output_tokens']:.2f}", file=sys.stderr)
    finally:
        for s in servers:
            s.stop()
    print(f"load average after {open('/proc/loadavg').read().split()[:3]}; figures in {out}")
    print(f"{'config':<14}{'tok/s':>8}{'wall ms/tok':>12}{'CPU ms/tok':>11}{'loop':>7}{'step':>7}{'omp':>7}"
          f"{'other':>7}{'client':>8}{'TTFT p50':>9}   per-round tok/s")
    base = None
    for s in servers:
        def med(f) -> float:
            return statistics.median(f(d) for d in s.rounds)
        tok = med(lambda d: d["output_tok_per_s"])
        cpu = med(lambda d: d["server_cpu_ms_per_token"])
        th = {k: med(lambda d, k=k: 1000 * d["threads_cpu_s"].get(k, 0.0) / d["output_tokens"])
              for k in ("loop", "step", "omp")}
        other = med(lambda d: 1000 * sum(v for k, v in d["threads_cpu_s"].items() if k not in ("loop", "step", "omp"))
                    / d["output_tokens"])
        client = med(lambda d: 1000 * d["client_cpu_s"] / d["output_tokens"])
        ttft = med(lambda d: d["ttft_ms"]["p50"])
        per = " ".join(f"{d['output_tok_per_s']:.0f}" for d in s.rounds)
        ratio = "" if base is None else f"  ({tok / base[0]:.2f}x tok/s, {cpu / base[1]:.2f}x CPU/tok vs {servers[0].name})"
        base = base or (tok, cpu)
        print(f"{s.name:<14}{tok:>8.1f}{1000 / tok:>12.2f}{cpu:>11.2f}{th['loop']:>7.2f}{th['step']:>7.2f}"
              f"{th['omp']:>7.2f}{other:>7.2f}{client:>8.2f}{ttft:>9.0f}   {per}{ratio}")


if __name__ == "__main__":
    main()
