"""guidellm's benchmark CLI against a live server: 12 streamed chat requests at concurrency 4 from its
synthetic data (64 prompt tokens, 16 output tokens, the demo model's tokenizer), every one successful,
each with exactly the 16 output tokens it asked for (guidellm sends ignore_eos and max_completion_tokens,
reads usage from stream_options.include_usage) and a first-token time.

NOTE: guidellm is not in the test extra: 0.8.1 pins click~=8.4.0 and brings sanic, whose multidict<7
moves aiohttp's multidict back from 7.2 in the serving stack's own test environment, and it pulls
torch/datasets/uvloop/faker. It runs in a virtualenv of its own, `make test-clients` (.venv-clients: the
project, instructor and guidellm; CI's last step), where MODELCALL_REQUIRE_CLIENTS=1 makes a missing
guidellm an error; elsewhere the file skips."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from http_server import ServerThread

if os.environ.get("MODELCALL_REQUIRE_CLIENTS"):
    import guidellm  # noqa: F401  (make test-clients: missing is an error)
else:
    pytest.importorskip("guidellm", reason="not in the test extra (its pins conflict): make test-clients")

REQUESTS, OUTPUT_TOKENS, PROMPT_TOKENS = 12, 16, 64


@pytest.fixture(scope="module")
def server(demo_model_dir):
    with ServerThread(dtype="float32", max_model_len=1024, num_kv_blocks=256) as s:
        yield s


def test_guidellm_benchmark_completes_every_request(server, demo_model_dir, tmp_path):
    out = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "guidellm", "run", "--backend", f"kind=openai_http,target={server.base_url}",
           "--profile", "kind=concurrent,streams=4", "--constraint", f"kind=max_requests,count={REQUESTS}",
           "--tokenizer", f"kind=hf_auto,model={demo_model_dir}",
           "--data", f"kind=synthetic_text,prompt_tokens={PROMPT_TOKENS},output_tokens={OUTPUT_TOKENS}",
           "--output", f"kind=json,path={out}"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    (bench,) = json.loads(out.read_text())["benchmarks"]
    requests = bench["requests"]
    assert len(requests["successful"]) == REQUESTS and not requests["errored"] and not requests["incomplete"]
    for r in requests["successful"]:
        assert r["output_tokens"] == OUTPUT_TOKENS  # from the server's usage chunk
        assert r["prompt_tokens"] >= PROMPT_TOKENS and r["time_to_first_token_ms"] > 0
        assert r["response_id"].startswith("chatcmpl-") and r["output"]
        assert json.loads(r["request_args"])["body"]["stream"] is True
