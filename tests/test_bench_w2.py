"""`modelcall bench serve --workload w2`: the W2 rows (a 1,024-token system turn shared by all, a
64-token user turn each, 128 new tokens) on a model's own tokenizer, sent to a live server, and the
server's CPU time measured from /proc."""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import time

from http_server import ServerThread

from modelcall.plugins.bench import serve as bench_serve
from modelcall.plugins.bench import w2


def test_w2_rows_share_exactly_the_system_turn_on_the_models_tokenizer(demo_model_dir):
    encode = w2.tokenizer_encoder(demo_model_dir)
    rows = w2.make_rows(encode)
    assert len(rows) == 64 and all(r["max_tokens"] == 128 for r in rows)
    start, end = encode("<|im_start|>"), encode("<|im_end|>")
    assert len(start) == len(end) == 1  # the chat markers are single special tokens
    assistant = encode("<|im_start|>assistant\n")
    for r in rows:
        ids = r["prompt_token_ids"]
        assert len(ids) == 1024 + 64 + len(assistant)
        assert ids[:1024] == rows[0]["prompt_token_ids"][:1024]           # the shared system turn
        assert ids[0] == start[0] and ids[1022] == end[0]                  # ... closed by <|im_end|>\n
        assert ids[1024] == start[0] and ids[1024 + 62] == end[0]          # its own 64-token user turn
        assert ids[-len(assistant):] == assistant
    users = {tuple(r["prompt_token_ids"][1024:1088]) for r in rows}
    assert len(users) == 64                                                # no two user turns alike
    # deterministic: the same rows every time (both servers of a run, and runs on different days)
    assert w2.make_rows(encode) == rows


def test_bench_serve_runs_w2_against_a_live_server_and_counts_its_cpu(tmp_path, demo_model_dir):
    out = tmp_path / "w2.jsonl"
    with ServerThread(max_model_len=2048, num_kv_blocks=512) as server:  # W2's prompts are 1,093 tokens
        args = argparse.Namespace(base_url=server.base_url, model=server.kernel.model_name, dataset=None,
                                  workload="w2", tokenizer=demo_model_dir, write_dataset=str(out),
                                  server_pid=os.getpid(), concurrency=4, num_requests=4, max_tokens=4, warmup=1,
                                  api_key=None, json_out=None, no_progress=True, no_engine_events=True)
        figures = asyncio.run(bench_serve.bench(args))
    assert figures["failed"] == 0 and figures["output_tokens"] == 4 * 4
    assert figures["ttft_ms"]["p99"] >= figures["ttft_ms"]["p50"] > 0
    assert figures["server_cpu_s"] > 0 and figures["server_cpu_ms_per_token"] > 0
    assert figures["server"]["prefix_cache_hit_rate"] > 0  # the warm-up computed the system turn; the rest hit it
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows == w2.make_rows(w2.tokenizer_encoder(demo_model_dir))
    assert "server CPU:" in bench_serve.render(figures)


def test_tree_cpu_seconds_counts_a_busy_child(tmp_path):
    import subprocess
    import sys

    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; subprocess.run([sys.executable, '-c', "
                               "'import time\\nt=time.process_time()\\nwhile time.process_time()-t<0.6: pass\\n"
                               "time.sleep(30)'])"], start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while bench_serve.tree_cpu_seconds(parent.pid) < 0.5 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert bench_serve.tree_cpu_seconds(parent.pid) >= 0.5  # the grandchild's spin counts for the parent
    finally:
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()
