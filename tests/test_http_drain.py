"""SIGTERM drains `modelcall serve`: new requests get 503, running ones finish, the process exits 0."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx2 as httpx


def start_server(*args: str) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "modelcall.plugins.http.serve", "--port", "0", "--max-model-len", "2048",
           "--kv-cache-gb", "0.0625", *args]  # not 1 GB: ~0.5 s to zero, as much to free
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.stdout is not None
    deadline = time.monotonic() + 120
    for line in proc.stdout:
        if "serving" in line and "http://" in line:
            return proc, line.strip().rsplit(" ", 1)[-1]
        assert time.monotonic() < deadline, "server did not start"
    raise AssertionError(f"server exited with {proc.wait()}")


def stream(url: str, out: list, started: threading.Event) -> None:
    # NOTE: long enough to outlast the refused request and the /ready check after SIGTERM: at 200 tokens the
    # demo model's streams once finished, and the server exited, before /ready was asked (a whole-suite run).
    body = {"messages": [{"role": "user", "content": "drain me"}], "max_tokens": 1000, "temperature": 0, "ignore_eos": True,
            "stream": True}
    lines = []
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line:
                lines.append(line)
                if len(lines) == 3:
                    started.set()
    out.append(lines)


def test_sigterm_drains_in_flight_requests_refuses_new_ones_and_exits_0():
    proc, url = start_server("--drain-timeout", "30")
    try:
        results: list = []
        started = [threading.Event() for _ in range(3)]
        threads = [threading.Thread(target=stream, args=(url, results, e)) for e in started]
        for t in threads:
            t.start()
        assert all(e.wait(60) for e in started)
        proc.send_signal(signal.SIGTERM)
        # event order, not a sleep: once /ready says 503 the server is draining (the streams still run)
        deadline = time.monotonic() + 30
        while httpx.get(url + "/ready").status_code != 503:
            assert time.monotonic() < deadline, "the server never started draining after SIGTERM"
            time.sleep(0.02)
        refused = httpx.post(url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
        assert refused.status_code == 503 and int(refused.headers["Retry-After"]) >= 1
        assert refused.json()["error"]["message"]
        assert httpx.get(url + "/ready").status_code == 503
        assert httpx.get(url + "/health").status_code == 200
        for t in threads:
            t.join(60)
        assert len(results) == 3
        for lines in results:
            assert lines[-1] == "data: [DONE]"
            finish = [json.loads(x[6:])["choices"][0]["finish_reason"] for x in lines[:-1]]
            assert finish[-1] == "length"
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
