"""What a server does when its shared quota store goes away and comes back, seen by the openai SDK:
fail-closed refuses with 503 and says why; fail-open keeps serving and raises a warning gauge on
/metrics; a restarted Redis is used again with the counters it kept. And a revoked key is refused
within a second of the file changing, with no signal sent."""
from __future__ import annotations

import argparse
import time

import httpx2 as httpx
import openai
import pytest
from http_server import ServerThread
from keys_util import write_keys
from redis_server import redis_server  # noqa: F401 (the module-scoped fixture)

from modelcall.plugins.auth.keys_cli import run_revoke

KEY = "mc-tenant-key"
DAILY = 100_000


@pytest.fixture(scope="module")
def keys_file(tmp_path_factory):
    return write_keys(tmp_path_factory.mktemp("keys") / "keys.toml", {KEY: {"name": "tenant", "daily_tokens": DAILY}})


@pytest.fixture(scope="module")
def servers(redis_server, keys_file):
    def auth(fail: str) -> dict:
        return {"auth": {"api_keys": str(keys_file), "quota_store": redis_server.url, "quota_store_fail": fail}}

    with ServerThread(plugin_config=auth("closed")) as closed, ServerThread(plugin_config=auth("open")) as open_:
        yield closed, open_


def _ask(server, key: str = KEY) -> openai.types.Completion:
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key=key, max_retries=0)
    return client.completions.create(model="demo-model-1", prompt="the quota", max_tokens=4, temperature=0)


def _gauges(server) -> dict[str, float]:
    text = httpx.get(server.base_url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    return {line.split("{")[0].removeprefix("modelcall:"): float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line.startswith("modelcall:quota_store")}


def _day_tokens(redis_server) -> int:
    keys = redis_server.client().keys("modelcall:quota:tenant:day:*")
    return int(redis_server.client().get(keys[0])) if keys else 0


def _settled(redis_server, expected: int) -> None:
    deadline = time.monotonic() + 5  # settlements go through a worker thread
    while _day_tokens(redis_server) != expected and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _day_tokens(redis_server) == expected


def test_fail_closed_refuses_with_503_fail_open_serves_with_a_warning_and_a_restart_resumes(servers, redis_server):
    closed, open_ = servers
    used = sum(c.usage.total_tokens for c in (_ask(closed), _ask(open_)))
    _settled(redis_server, used)  # both charged the one store, their real usage
    assert _gauges(open_) == {"quota_store_up": 1.0, "quota_store_fail_open": 0.0, "quota_store_errors": 0.0}

    redis_server.kill()
    with pytest.raises(openai.APIStatusError) as refused:
        _ask(closed)
    assert refused.value.status_code == 503
    assert "quota store" in refused.value.message and "cannot be reached" in refused.value.message
    assert refused.value.response.headers.get("Retry-After")
    served = _ask(open_)   # counted in that process alone
    assert served.usage.completion_tokens > 0
    gauges = _gauges(open_)
    assert gauges["quota_store_fail_open"] == 1.0 and gauges["quota_store_up"] == 0.0
    assert gauges["quota_store_errors"] >= 1

    redis_server.start()
    time.sleep(1.1)  # the store is not asked again for a second after a failure
    after = sum(c.usage.total_tokens for c in (_ask(closed), _ask(open_)))
    _settled(redis_server, used + after)  # the counters it kept, then the new charges
    assert _gauges(open_)["quota_store_fail_open"] == 0.0


def test_a_revoked_key_is_refused_within_a_second_of_the_file_changing(servers, keys_file):
    closed, open_ = servers
    other = "mc-other-key"
    write_keys(keys_file, {KEY: {"name": "tenant", "daily_tokens": DAILY}, other: {"name": "other"}})
    deadline = time.monotonic() + 2
    while True:  # the new key too arrives by the file alone
        try:
            _ask(closed, other)
            break
        except openai.AuthenticationError:
            assert time.monotonic() < deadline, "a key added to the file was not picked up"
            time.sleep(0.05)
    assert run_revoke(argparse.Namespace(name="other", keys_file=str(keys_file))) == 0  # `modelcall keys revoke`
    changed = time.monotonic()
    refused_at = {}
    while len(refused_at) < 2 and time.monotonic() - changed < 3:
        for name, server in (("closed", closed), ("open", open_)):
            if name in refused_at:
                continue
            try:
                _ask(server, other)
            except openai.AuthenticationError as e:
                assert e.status_code == 401 and "disabled" in e.message
                refused_at[name] = time.monotonic() - changed
        time.sleep(0.02)
    assert set(refused_at) == {"closed", "open"} and max(refused_at.values()) < 1.0, refused_at
    assert _ask(closed).usage.completion_tokens > 0   # the other key is untouched
