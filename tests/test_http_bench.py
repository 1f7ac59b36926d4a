"""`modelcall bench serve`: a streaming load generator that counts exactly what the server made."""
from __future__ import annotations

import argparse
import asyncio
import json

import pytest
from http_server import ServerThread

from modelcall.plugins.bench import serve as bench_serve


def test_bench_serve_measures_a_live_server(tmp_path):
    rows = [{"prompt_token_ids": list(range(10 + i, 40 + i)), "max_tokens": 12} for i in range(8)]
    rows.append({"prompt": "some text prompt", "max_tokens": 12})
    dataset = tmp_path / "rows.jsonl"
    dataset.write_text("\n".join(json.dumps(r) for r in rows))
    with ServerThread() as server:
        model = server.kernel.model_name
        args = argparse.Namespace(base_url=server.base_url, model=model, dataset=str(dataset), concurrency=4,
                                  num_requests=None, max_tokens=None, warmup=2, api_key=None, json_out=None,
                                  no_progress=True)
        figures = asyncio.run(bench_serve.bench(args))
    assert figures["failed"] == 0 and figures["requests"] == 9
    assert figures["output_tokens"] == 9 * 12  # ignore_eos + min_tokens: every request makes all its tokens
    assert figures["ttft_ms"]["p50"] > 0 and figures["itl_ms"]["p99"] >= figures["itl_ms"]["p50"]
    assert figures["server"]["engine_steps"] >= 12
    # the three first-token moments, apart: the engine's (server clock) and the client's two
    assert figures["engine_requests"] == 9
    assert 0 < figures["engine_ttft_ms"]["p50"] and figures["engine_itl_ms"]["p50"] > 0
    assert figures["first_event_ms"]["p50"] <= figures["ttft_ms"]["p50"]
    text = bench_serve.render(figures)
    assert "output token throughput" in text and "server (modelcall)" in text
    for label in ("engine first token", "client first event", "client first content text",
                  "engine inter-token latency", "client inter-event gap"):
        assert label in text


def test_bench_is_a_group_with_serve_and_throughput(capsys):
    from modelcall.plugins.cli.main import main

    with pytest.raises(SystemExit) as done:
        main(["bench", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "serve" in out and "throughput" in out
    with pytest.raises(SystemExit):
        main(["bench", "serve", "--help"])
    assert "--concurrency" in capsys.readouterr().out
