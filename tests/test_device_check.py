"""scripts/device_check.sh --dry-run: the GPU machine's one prepared run, on CPU with tiny sizes (issue 16).

It must run its stages (install skipped without wheels, the gpu-marked tests, the figures) and write
every figure key as JSON, so a session lent a GPU spends its minutes measuring, not debugging the
script. transformers' generate_batch is skipped here (tens of seconds on CPU); it runs on the GPU.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIGURE_KEYS = ("device", "model", "bandwidth", "attention", "decode", "transformers_decode", "ttft", "cuda_graphs",
               "parity_fp32", "parity_bf16")


def test_dry_run_writes_every_figure(tmp_path):
    env = dict(os.environ, FIGURES_ARGS="--skip transformers", PYTHON=sys.executable, OMP_NUM_THREADS="1")
    proc = subprocess.run(["bash", os.path.join(ROOT, "scripts", "device_check.sh"), "--dry-run", str(tmp_path),
                           str(tmp_path / "no-wheels")], env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    stages = json.loads((tmp_path / "stages.json").read_text())
    assert stages["dry_run"] is True
    assert [s["name"] for s in stages["stages"]] == ["install", "tests", "figures"]
    assert all(s["rc"] == 0 for s in stages["stages"]), stages
    assert (tmp_path / "gpu_tests.xml").exists()
    fig = json.loads((tmp_path / "figures.json").read_text())
    assert set(FIGURE_KEYS) <= set(fig), set(FIGURE_KEYS) - set(fig)
    errors = {k: v["error"] for k, v in fig.items() if isinstance(v, dict) and "error" in v}
    assert not errors, errors
    assert fig["device"]["type"] == "cpu" and fig["dry_run"] is True
    assert fig["bandwidth"]["bytes_per_s"] > 0
    decode = fig["decode"]
    assert decode["output_tokens"] == decode["concurrency"] * decode["decode_tokens"]
    assert decode["full_decode_steps"] > 0 and 0 < decode["fraction_of_bandwidth"]
    assert fig["ttft"]["requests"] > 0 and 0 < fig["ttft"]["min_s"] <= fig["ttft"]["median_s"] <= fig["ttft"]["max_s"]
    att = fig["attention"]
    assert set(att["candidates"]) == {"torch", "triton"} and att["chosen"] == "torch"   # the interpreter is never chosen
    for case in ("decode", "prefill"):
        for name in att["candidates"]:
            assert att[case][name]["ok"] is True, (case, name, att[case][name])
    assert att["decode"]["triton"]["interpreted"] is True and decode["attention"] == "torch"
    graphs = fig["cuda_graphs"]
    assert graphs["status"] == "measured" and graphs["mode"].startswith("eager") and graphs["capture_error"] is None
    assert graphs["static_steps"] >= graphs["full_decode_steps"] > 0   # the decode steps ran through static batches
    assert graphs["identical_greedy_outputs"] == graphs["requests"] == decode["concurrency"]
    assert graphs["on_median_step_s"] > 0 and graphs["off_median_step_s"] == decode["median_step_s"]
    assert graphs["same_attention_as_off"] is True
    assert fig["parity_fp32"]["pass"] is True and fig["parity_fp32"]["identical"] == fig["parity_fp32"]["prompts"]
    assert fig["parity_bf16"]["pass"] is True
    assert fig["transformers_decode"] == {"status": "skipped"}
