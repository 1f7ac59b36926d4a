"""API keys: with a key file, no route but /health and /ready answers without a valid key.

The key file holds only sha256 digests; keys come as `Authorization: Bearer` or `x-api-key`;
a key may be limited to models and tools (403); errors come in the route's protocol shape.
"""
from __future__ import annotations

import hashlib
import json

import httpx2 as httpx
import pytest
from http_server import ServerThread
from keys_util import write_keys

from modelcall.core.errors import ConfigError
from modelcall.plugins.auth.keys import KeyStore, presented_key

FULL, LIMITED = "mc-full-key-0123456789", "mc-limited-key-abcdef"
# the console's page files hold no data (a browser cannot send a key when it opens a page); its feed,
# /-/events, needs a key like every other route
OPEN = {"/health", "/ready", "/console", "/console/console.js", "/console/console.css"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    keys = write_keys(tmp_path_factory.mktemp("keys") / "keys.toml", {
        FULL: {"name": "full"},
        LIMITED: {"name": "limited", "models": ["some-other-model"], "tools": ["search"]},
    })
    with ServerThread(plugin_config={"auth": {"api_keys": str(keys)}}) as s:
        yield s


def _routes(server) -> list[tuple[str, str]]:
    """Every (method, path) of the app `modelcall serve` builds for this kernel, read from its router."""
    from modelcall.plugins.http.app import create_app

    def table():
        app = create_app(server.kernel)
        return [(r.method, r.resource.canonical) for r in app.router.routes() if r.method != "HEAD"]
    return server.call(table)


def test_every_route_but_health_and_ready_refuses_a_request_without_a_key(server):
    routes = _routes(server)
    paths = {p for _, p in routes}
    assert {"/v1/chat/completions", "/v1/messages", "/v1/completions", "/v1/models", "/metrics"} <= paths
    for method, path in routes:
        for headers in ({}, {"Authorization": "Bearer wrong-key"}, {"x-api-key": "wrong"}, {"Authorization": "Basic x"}):
            r = httpx.request(method, server.base_url + path, headers=headers, json={"model": "x", "messages": []})
            if path in OPEN:
                assert r.status_code in (200, 503), (method, path)
            else:
                assert r.status_code == 401, (method, path, headers, r.status_code, r.text)
                assert FULL not in r.text and "wrong" not in r.text
    for path in OPEN:
        assert httpx.get(server.base_url + path).status_code == 200


def test_a_valid_key_opens_every_route_by_bearer_or_x_api_key(server):
    for headers in ({"Authorization": f"Bearer {FULL}"}, {"x-api-key": FULL}):
        r = httpx.get(server.base_url + "/v1/models", headers=headers)
        assert r.status_code == 200
        model = r.json()["data"][0]["id"]
        r = httpx.post(server.base_url + "/v1/chat/completions", headers=headers,
                       json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert r.status_code == 200, r.text
        assert httpx.get(server.base_url + "/metrics", headers=headers).status_code == 200


def test_refusals_are_counted_in_the_metrics(server):
    import re

    h = {"x-api-key": FULL}
    def count(status: str) -> float:
        text = httpx.get(server.base_url + "/metrics", headers=h).text
        m = re.search(r'modelcall:request_rejected_total\{model_name="[^"]*",status="%s"\} (\S+)' % status, text)
        return float(m.group(1)) if m else 0.0
    before = count("401")
    for _ in range(3):
        httpx.post(server.base_url + "/v1/chat/completions", json={"model": "m", "messages": []},
                   headers={"x-api-key": "nope"})
    assert count("401") == before + 3


def test_refusals_come_in_each_protocols_shape(server):
    r = httpx.post(server.base_url + "/v1/chat/completions", json={"model": "m", "messages": []})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    r = httpx.post(server.base_url + "/v1/messages", json={"model": "m", "messages": [], "max_tokens": 1})
    body = r.json()
    assert r.status_code == 401 and body["type"] == "error" and body["error"]["type"] == "authentication_error"


def test_a_key_limited_to_other_models_or_tools_gets_403(server):
    model = httpx.get(server.base_url + "/v1/models", headers={"x-api-key": FULL}).json()["data"][0]["id"]
    h = {"x-api-key": LIMITED}
    r = httpx.post(server.base_url + "/v1/chat/completions", headers=h,
                   json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
    r = httpx.post(server.base_url + "/v1/messages", headers=h,
                   json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
    import json as _json

    for ctype in ("text/plain", "application/x-www-form-urlencoded", ""):  # no way around it by Content-Type
        r = httpx.post(server.base_url + "/v1/chat/completions", headers={**h, "Content-Type": ctype},
                       content=_json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}],
                                            "max_tokens": 2}))
        assert r.status_code == 403, (ctype, r.status_code)
    # Leaving `model` out changes nothing: the allowlist applies to the model being served.
    r = httpx.post(server.base_url + "/v1/chat/completions", headers=h,
                   json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert r.status_code == 403 and r.json()["error"]["param"] == "model"


def test_the_key_file_holds_digests_only_and_is_checked_at_load(tmp_path):
    path = write_keys(tmp_path / "k.toml", {"secret-1": {"name": "a", "rpm": 5}})
    assert "secret-1" not in path.read_text()
    store = KeyStore.load(path)
    assert store.verify("secret-1").name == "a" and store.verify("secret-1").limits.rpm == 5
    assert store.verify("secret-2") is None and store.verify("") is None and store.verify(None) is None
    bad = tmp_path / "bad.toml"
    for text, why in (('[[keys]]\nname = "a"\nsha256 = "abc"\n', "64 hex"),
                      ('[[keys]]\nname = "a"\nsha256 = "%s"\nkey = "plain"\n' % ("0" * 64), "unknown field"),
                      ('[[keys]]\nname = "a"\nsha256 = "%s"\n[[keys]]\nname = "a"\nsha256 = "%s"\n' % ("0" * 64, "1" * 64),
                       "twice"),
                      ('[[keys]]\nname = "a"\nsha256 = "%s"\nrpm = 0\n' % ("0" * 64), "rpm")):
        bad.write_text(text)
        with pytest.raises(ConfigError, match=why):
            KeyStore.load(bad)


def test_keys_are_read_from_bearer_or_x_api_key():
    assert presented_key({"Authorization": "Bearer abc"}) == "abc"
    assert presented_key({"Authorization": "bearer  abc "}) == "abc"
    assert presented_key({"x-api-key": "xyz"}) == "xyz"
    assert presented_key({"Authorization": "Basic abc"}) is None
    assert presented_key({}) is None


def test_verification_compares_every_digest_in_constant_time(monkeypatch):
    import hmac

    from modelcall.plugins.auth import keys as keys_mod

    calls = []
    real = hmac.compare_digest
    monkeypatch.setattr(keys_mod.hmac, "compare_digest", lambda a, b: calls.append((a, b)) or real(a, b))
    entries = [keys_mod.KeyEntry(name=f"k{i}", sha256=hashlib.sha256(f"key{i}".encode()).hexdigest()) for i in range(5)]
    store = KeyStore(entries)
    assert store.verify("key0").name == "k0"
    assert len(calls) == 5  # no early exit on the first match
    assert all(len(a) == len(b) == 32 for a, b in calls)


def test_keys_new_prints_an_entry_whose_digest_matches_the_key_shown_once(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    out = subprocess.run([str(Path(sys.executable).parent / "modelcall"), "keys", "new", "ci", "--rpm", "60",
                          "--models", "demo-model-1"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    key = out.stderr.strip().rsplit(" ", 1)[-1]
    assert key not in out.stdout
    (tmp_path / "k.toml").write_text(out.stdout)
    caller = KeyStore.load(tmp_path / "k.toml").verify(key)
    assert caller.name == "ci" and caller.limits.rpm == 60 and caller.models == frozenset({"demo-model-1"})
