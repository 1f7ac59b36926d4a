"""Four `modelcall serve` processes (two fail closed, two fail open) sharing one real redis-server,
stormed by 8 clients at 10x a key's requests per minute: the key's limits hold over all of them
together, every refusal is a 429 with Retry-After; Redis killed mid-run: fail-closed answers 503,
fail-open serves and warns on /metrics; Redis restarted: the counters it kept are in force again.

Several serve processes on loopback rather than Ray Serve replicas: each process is a whole kernel
behind its own front end, which is what a load balancer in front of N servers gives, and it starts
in seconds; the Ray path hands the same store setting to every replica with the kernel config.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx2 as httpx
import pytest
from keys_util import write_keys
from redis_server import redis_server  # noqa: F401 (the module-scoped fixture)

from modelcall.plugins.auth.keys_cli import run_revoke

pytestmark = pytest.mark.slow

STORM, BUDGET, OTHER = "mc-storm-key", "mc-budget-key", "mc-other-key"
R = 10            # the storm key's requests per minute
B = 150           # the budget key's tokens per UTC day
MAX_TOKENS = 8
FAILS = ("closed", "closed", "open", "open")


def _start(args: list[str]) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "modelcall.plugins.http.serve", "--port", "0", "--max-model-len", "256",
           "--kv-cache-gb", "0.0625", "--ledger", "off", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.stdout is not None
    for line in proc.stdout:
        if "serving" in line and "http://" in line:
            threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep its pipe drained
            return proc, line.strip().rsplit(" ", 1)[-1]
    raise AssertionError(f"server exited with {proc.wait()}")


@pytest.fixture(scope="module")
def keys_file(tmp_path_factory):
    return write_keys(tmp_path_factory.mktemp("keys") / "keys.toml", {
        STORM: {"name": "storm", "rpm": R}, BUDGET: {"name": "budget", "daily_tokens": B}, OTHER: {"name": "other"}})


@pytest.fixture(scope="module")
def servers(redis_server, keys_file):  # noqa: F811
    keys = keys_file
    with ThreadPoolExecutor(len(FAILS)) as pool:  # started together: ~1 start's wall time
        started = list(pool.map(lambda fail: _start(["--api-keys", str(keys), "--quota-store", redis_server.url,
                                                      "--quota-store-fail", fail]), FAILS))
    yield [url for _, url in started]
    for proc, _ in started:
        proc.kill()   # nothing in flight to drain
    for proc, _ in started:
        proc.wait(30)


def _ask(url: str, key: str) -> httpx.Response:
    return httpx.post(url + "/v1/completions", headers={"Authorization": f"Bearer {key}"}, timeout=60,
                      json={"model": "demo-model-1", "prompt": "a storm of requests", "max_tokens": MAX_TOKENS,
                            "temperature": 0})


def _storm(urls: list[str], key: str, total: int) -> tuple[list[httpx.Response], float]:
    t0 = time.monotonic()
    with ThreadPoolExecutor(8) as clients:  # 8 clients, round robin over every server
        out = list(clients.map(lambda i: _ask(urls[i % len(urls)], key), range(total)))
    return out, time.monotonic() - t0


def _day_tokens(redis_server, name: str) -> int:  # noqa: F811
    keys = redis_server.client().keys(f"modelcall:quota:{name}:day:*")
    return int(redis_server.client().get(keys[0])) if keys else 0


def test_a_storm_over_four_servers_keeps_the_limits_and_outages_fail_as_configured(servers, redis_server):  # noqa: F811
    responses, seconds = _storm(servers, STORM, 10 * R)
    accepted = [r for r in responses if r.status_code == 200]
    refused = [r for r in responses if r.status_code != 200]
    # a bucket of R refills R a minute: over the storm's `seconds` at most R + R * seconds / 60 fit
    assert R - 1 <= len(accepted) <= R + int(R * seconds / 60), (len(accepted), seconds)
    assert {r.status_code for r in refused} == {429}
    assert all(float(r.headers["Retry-After"]) >= 1 for r in refused)
    assert all("requests per minute" in r.json()["error"]["message"] for r in refused)

    responses, _ = _storm(servers, BUDGET, 40)
    charged = sum(r.json()["usage"]["total_tokens"] for r in responses if r.status_code == 200)
    assert {r.status_code for r in responses} == {200, 429}
    assert charged <= B                                   # reserved worst cases never passed B
    deadline = time.monotonic() + 5
    while _day_tokens(redis_server, "budget") != charged and time.monotonic() < deadline:
        time.sleep(0.05)   # settlements: the real usage replaces each reservation
    assert _day_tokens(redis_server, "budget") == charged

    redis_server.kill()
    during = [_ask(url, BUDGET) for url in servers]
    assert [r.status_code for r in during[:2]] == [503, 503]
    assert all("quota store" in r.json()["error"]["message"] for r in during[:2])
    assert [r.status_code for r in during[2:]] == [200, 200]   # counted by each process alone meanwhile
    for url in servers[2:]:
        metrics = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {BUDGET}"}).text
        assert 'modelcall:quota_store_fail_open{model_name="demo-model-1"} 1.0' in metrics

    redis_server.start()
    time.sleep(1.1)   # a server asks the store again a second after its last failure
    after = [_ask(url, BUDGET) for url in servers]
    assert [r.status_code for r in after] == [429] * 4   # the budget spent before the outage still counts
    assert _day_tokens(redis_server, "budget") == charged


def test_a_key_revoked_in_the_file_is_refused_by_every_server_within_a_second(servers, keys_file):
    assert all(_ask(url, OTHER).status_code == 200 for url in servers)
    assert run_revoke(argparse.Namespace(name="other", keys_file=str(keys_file))) == 0  # `modelcall keys revoke`
    changed = time.monotonic()
    refused_after: dict[str, float] = {}
    while len(refused_after) < len(servers) and time.monotonic() - changed < 3:
        for url in servers:
            if url not in refused_after and _ask(url, OTHER).status_code == 401:
                refused_after[url] = time.monotonic() - changed
    assert len(refused_after) == len(servers) and max(refused_after.values()) < 1.0, refused_after
