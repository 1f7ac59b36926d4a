"""A/B of test cost: the test files issue 20 mended, as they were at the base commit vs as they are now.

    .venv/bin/python scripts/test_time_ab.py                    # 2 rounds, A B A B, in /tmp/modelcall-test-ab
    .venv/bin/python scripts/test_time_ab.py --rounds 3 --dir /tmp/ab --files tests/test_agent.py
    .venv/bin/python scripts/test_time_ab.py --suite --json /tmp/suite.json   # the whole suite once, costliest first

Both sides run in one scratch copy of the working tree (scripts/scratch_copy.sh; the main venv imports
the copy's code), so they test the same code: the base version of each file is saved beside the
current one as tests/<name>_atbase.py. Sides alternate (base, mended, base, mended...) so that a busy
spell of the shared machine hits both. Per run it reports wall seconds and CPU seconds (user+sys of the
pytest process tree, from getrusage(RUSAGE_CHILDREN) around the run): CPU time is the figure that
survives a loaded machine, wall time is what a developer waits for. Per file it reports each side's
test time (setup+call+teardown, from scripts/pytest_test_times.py). Files with no base version (new
in the issue) run on the mended side only and are reported apart, next to the total with and without them.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BASE = "77f8ef9"
# The test files issue 20 changed (git diff --stat 77f8ef9 -- tests/ at the end of its first session).
FILES = ["tests/test_packing.py", "tests/test_agent.py", "tests/test_safety_filters.py", "tests/test_demo_model.py",
         "tests/test_plugin_listing.py", "tests/test_plugin_docs.py", "tests/test_http_api.py",
         "tests/test_prefix_ttft.py", "tests/test_metrics.py", "tests/test_http_load.py",
         "tests/test_unit_contracts.py"]


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def prepare(scratch: Path, base: str, files: list[str]) -> tuple[list[str], list[str], dict[str, str]]:
    """The copy, with base versions beside the current ones; returns (base files, mended files, base->mended)."""
    if scratch.exists():
        shutil.rmtree(scratch)
    subprocess.run(["bash", str(REPO / "scripts/scratch_copy.sh"), str(scratch)], check=True, stdout=subprocess.DEVNULL)
    base_files, pairs = [], {}
    for f in files:
        old = subprocess.run(["git", "-C", str(REPO), "show", f"{base}:{f}"], capture_output=True)
        if old.returncode == 0:
            at_base = f[:-3] + "_atbase.py"
            (scratch / at_base).write_bytes(old.stdout)
            base_files.append(at_base)
            pairs[at_base] = f
    return base_files, list(files), pairs


def run_side(scratch: Path, files: list[str], json_out: Path, pytest_args: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": f"{scratch / '_ns'}{os.pathsep}{REPO / 'scripts'}",
           "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", "TEST_TIMES_JSON": str(json_out)}
    cmd = [str(REPO / ".venv/bin/python"), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "pytest_test_times",
           *pytest_args, *files]
    load = os.getloadavg()[0]
    cpu0, t0 = children_cpu(), time.perf_counter()
    done = subprocess.run(cmd, cwd=scratch, env=env, capture_output=True, text=True)
    wall, cpu = time.perf_counter() - t0, children_cpu() - cpu0
    json_out.with_suffix(".out").write_text(done.stdout + done.stderr)   # the failures' details
    lines = [ln for ln in done.stdout.strip().splitlines() if ln.strip()]
    return {"wall_s": wall, "cpu_s": cpu, "load_before": load, "load_after": os.getloadavg()[0],
            "rc": done.returncode, "summary": lines[-1] if lines else done.stderr[-300:],
            "failed": [ln for ln in lines if ln.startswith("FAILED") or ln.startswith("ERROR")],
            "tests": json.loads(json_out.read_text()) if json_out.exists() else {}}


def per_file(tests: dict) -> dict[str, tuple[float, float]]:
    out: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for nodeid, t in tests.items():
        f = nodeid.split("::")[0]
        out[f][0] += t["wall_s"]
        out[f][1] += t["cpu_s"]
    return {f: (w, c) for f, (w, c) in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default=BASE)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--dir", default="/tmp/modelcall-test-ab")
    ap.add_argument("--files", nargs="*", default=FILES)
    ap.add_argument("--json", help="write every run's figures here")
    ap.add_argument("--pytest-arg", action="append", default=[], help="an extra pytest argument (repeatable)")
    ap.add_argument("--suite", action="store_true", help="run the whole suite once (what `make test` runs) in the copy")
    ap.add_argument("--top", type=int, default=40, help="with --suite: how many of the costliest tests to list")
    a = ap.parse_args()
    scratch = Path(a.dir)
    if a.suite:
        return suite(scratch, a)
    base_files, mended_files, pairs = prepare(scratch, a.base, a.files)
    runs: dict[str, list[dict]] = {"base": [], "mended": []}
    for r in range(a.rounds):
        for side, files in (("base", base_files), ("mended", mended_files)):
            res = run_side(scratch, files, scratch / f"times-{side}-{r}.json", a.pytest_arg)
            runs[side].append(res)
            print(f"round {r + 1} {side:6s} wall {res['wall_s']:7.1f} s  cpu {res['cpu_s']:7.1f} s  "
                  f"load {res['load_before']:.1f}->{res['load_after']:.1f}  {res['summary']}", flush=True)
            for line in res["failed"]:
                print("   ", line)

    def med(side: str, key: str) -> float:
        return statistics.median(x[key] for x in runs[side])

    new_only = [f for f in mended_files if f not in pairs.values()]
    print(f"\nmedian of {a.rounds} rounds: base wall {med('base', 'wall_s'):.1f} s cpu {med('base', 'cpu_s'):.1f} s; "
          f"mended wall {med('mended', 'wall_s'):.1f} s cpu {med('mended', 'cpu_s'):.1f} s")
    print(f"ratio mended/base (whole pytest runs, mended incl. new files {new_only}): "
          f"wall {med('mended', 'wall_s') / med('base', 'wall_s'):.3f}  cpu {med('mended', 'cpu_s') / med('base', 'cpu_s'):.3f}")
    # per file: each side's test time, median over rounds
    files_b = [per_file(x["tests"]) for x in runs["base"]]
    files_m = [per_file(x["tests"]) for x in runs["mended"]]

    def fmed(rows: list[dict], f: str, i: int) -> float:
        return statistics.median(row.get(f, (0.0, 0.0))[i] for row in rows)

    print(f"\n{'file (test time, median)':34s} {'base cpu':>9s} {'mended cpu':>10s} {'ratio':>6s} "
          f"{'base wall':>9s} {'mended wall':>11s}")
    tot = [0.0, 0.0, 0.0, 0.0]
    for b, m in pairs.items():
        bc, mc, bw, mw = fmed(files_b, b, 1), fmed(files_m, m, 1), fmed(files_b, b, 0), fmed(files_m, m, 0)
        tot = [tot[0] + bc, tot[1] + mc, tot[2] + bw, tot[3] + mw]
        print(f"{m:34s} {bc:9.1f} {mc:10.1f} {mc / max(bc, 1e-9):6.2f} {bw:9.1f} {mw:11.1f}")
    print(f"{'files with a base version':34s} {tot[0]:9.1f} {tot[1]:10.1f} {tot[1] / max(tot[0], 1e-9):6.2f} "
          f"{tot[2]:9.1f} {tot[3]:11.1f}")
    for f in new_only:
        print(f"{f + ' (new)':34s} {'':9s} {fmed(files_m, f, 1):10.1f} {'':6s} {'':9s} {fmed(files_m, f, 0):11.1f}")
    if a.json:
        Path(a.json).write_text(json.dumps(runs, indent=1))


def suite(scratch: Path, a: argparse.Namespace) -> None:
    prepare(scratch, a.base, [])
    res = run_side(scratch, [], scratch / "times-suite.json", a.pytest_arg)
    print(f"whole suite: wall {res['wall_s']:.1f} s  cpu {res['cpu_s']:.1f} s  "
          f"load {res['load_before']:.1f}->{res['load_after']:.1f}  {res['summary']}")
    for line in res["failed"]:
        print("   ", line)
    tests = res["tests"]
    print(f"\nthe {a.top} costliest tests by CPU (s; setup+call+teardown)\n{'cpu':>7s} {'wall':>7s}")
    for nodeid, t in sorted(tests.items(), key=lambda kv: -kv[1]["cpu_s"])[:a.top]:
        print(f"{t['cpu_s']:7.1f} {t['wall_s']:7.1f}  {nodeid}")
    files = sorted(per_file(tests).items(), key=lambda kv: -kv[1][1])
    print(f"\nper file (cpu, wall; sum of its tests)")
    for f, (w, c) in files:
        print(f"{c:7.1f} {w:7.1f}  {f}")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    sys.exit(main())
