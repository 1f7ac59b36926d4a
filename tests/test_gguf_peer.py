"""benchmarks/gguf_peer.py and the W0/W4 entries of benchmarks/run.py: the floor's byte count of a GGUF file, the
percentiles, the clear failure when the llama.cpp peer is not built, and the README rows from the scripts' summary
lines. The benchmarks themselves never run here (they need the peer and minutes of a quiet machine)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import gguf_peer as gp  # noqa: E402
import workloads  # noqa: E402


def write_gguf(path: Path, *, tied: bool) -> None:
    """A two-layer llama-shaped file: vocab 64, hidden 32, 4 heads of 8, 2 KV heads."""
    import gguf
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.add_embedding_length(32)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_tensor("token_embd.weight", np.zeros((64, 32), np.float32))       # 8,192 bytes, 128 a row
    if not tied:
        w.add_tensor("output.weight", np.zeros((64, 32), np.float16))      # 4,096 bytes
    for i in range(2):
        w.add_tensor(f"blk.{i}.attn_q.weight", np.zeros((32, 32), np.float16))  # 2,048 bytes each
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_floor_reads_a_tied_embedding_whole_and_one_row_of_an_untied_one(tmp_path):
    write_gguf(tmp_path / "tied.gguf", tied=True)
    write_gguf(tmp_path / "untied.gguf", tied=False)
    tied, untied = gp.file_shape(tmp_path / "tied.gguf"), gp.file_shape(tmp_path / "untied.gguf")
    assert tied.weight_bytes == 8192 + 2 * 2048
    assert untied.weight_bytes == 128 + 4096 + 2 * 2048
    assert tied.weight_type == "F32" and untied.weight_type == "F16"
    # K and V, 2 layers x 2 KV heads x head_dim 8 (hidden / heads) at 2 bytes
    assert tied.kv_bytes_per_position == 2 * 2 * 2 * 8 * 2
    # 1 GB/s: 12,288 bytes of weights + 100 positions x 128 bytes = 25,088 bytes -> 0.025088 ms
    assert gp.floor_ms(tied, 100, 1.0) == pytest.approx(25088 / 1e6)


def test_percentiles_are_nearest_rank():
    xs = [float(i) for i in range(16, 0, -1)]
    assert gp.percentile(xs, 99) == 16.0     # p99 of 16 streams is the slowest
    assert gp.percentile(xs, 50) == 8.0
    assert gp.median([3.0, 1.0, 2.0, 10.0]) == 2.5


def test_an_unbuilt_peer_names_the_build_command(tmp_path):
    for what in ("python", "server"):
        out = subprocess.run(["bash", str(REPO / "benchmarks" / "llama_cpp_peer.sh"), what], capture_output=True,
                             text=True, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
                                             "MODELCALL_BENCH_CACHE": str(tmp_path / "bench")})
        assert out.returncode == 3
        assert "benchmarks/llama_cpp_peer.sh build" in out.stderr and out.stdout == ""


def summary_w0(chat: bool = False) -> str:
    engines = {"llama.cpp": {"decode_tok_s": 80.0, "ttft_ms": 40.0, "runs_tok_s": [80.0], "ms_per_token": 12.5},
               "modelcall (PASSIVE)": {"decode_tok_s": 100.0, "ttft_ms": 30.0, "runs_tok_s": [100.0],
                                       "ms_per_token": 10.0},
               "modelcall (OMP unset)": {"decode_tok_s": 90.0, "ttft_ms": 35.0, "runs_tok_s": [90.0],
                                         "ms_per_token": 11.111}}
    return json.dumps({"summary": "w0-chat" if chat else "w0", "model": "smollm2", "kind": "Q8_0",
                       "weight_type": "Q8_0", "threads": 2, "floor_ms_per_token": 6.5, "engines": engines})


def test_w0_rows_take_modelcalls_better_environment_over_llama_cpp():
    text = "# noise\n" + summary_w0() + "\n" + summary_w0(chat=True) + "\n| a table | that is not parsed |\n"
    rows = workloads.w0_rows(workloads.gguf_parse(text))
    assert len(rows) == 2
    assert rows[0].startswith("| W0 one stream in process, smollm2 Q8_0 (Q8_0), 2 threads | 100.0 tok/s (PASSIVE 100.0,")
    assert "floor 6.50" in rows[0] and rows[0].endswith("| 1.25× tok/s, 0.75× TTFT |")
    assert rows[1].startswith("| W0 one stream through HTTP")


def test_w4_rows_ratio_is_modelcall_over_llama_server():
    engines = {"llama.cpp": {"tok_s": 200.0, "runs_tok_s": [190.0, 200.0], "ttft_p50_ms": 300.0, "ttft_p99_ms": 900.0},
               "modelcall (PASSIVE)": {"tok_s": 500.0, "runs_tok_s": [500.0, 510.0], "ttft_p50_ms": 100.0,
                                       "ttft_p99_ms": 450.0},
               "modelcall (OMP unset)": {"tok_s": 400.0, "runs_tok_s": [400.0], "ttft_p50_ms": 90.0,
                                         "ttft_p99_ms": 300.0}}
    line = json.dumps({"summary": "w4", "model": "gemma3-270m", "kind": "shipped", "weight_type": "Q8_0",
                       "threads": 1, "streams": 16, "engines": engines})
    rows = workloads.w4_rows(workloads.gguf_parse(line))
    assert rows == ["| W4 16 streams, gemma3-270m shipped (Q8_0), 1 thread | 500.0 tok/s (500.0, 510.0), TTFT p50 100 "
                    "/ p99 450 ms | 200.0 (190.0, 200.0), 300 / 900 ms | 2.50× tok/s, 0.50× TTFT p99 |"]


def test_w0_and_w4_take_threads_and_runs_only():
    for name in ("w0", "w4"):
        argv, env = workloads.WORKLOADS[name].command(workloads.Flags(threads=1, runs=2, extra=("--models", "smollm2")))
        assert argv == ["--runs", "2", "--threads", "1", "--models", "smollm2"] and env == {}
        assert workloads.WORKLOADS[name].takes == frozenset({"threads", "runs"})
