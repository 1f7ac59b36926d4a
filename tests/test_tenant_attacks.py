"""Tenants cannot reach each other: each attack that once worked against `--api-keys` is refused (or
neutralised) by the kernel's entry pipeline, and the refusal shows in the ledger and in /metrics.

One real server on loopback (keys, ledger, blocklist, small entry caps), real HTTP clients.
"""
from __future__ import annotations

import json
import re
import sqlite3
import time

import httpx2 as httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from http_server import ServerThread
from keys_util import write_keys

from modelcall.events import RequestAdmitted
from modelcall.plugins.ledger.plugin import ledger_of
from modelcall.testing.collector import EventCollector

ALPHA, BETA, TEAM1, TEAM2 = "mc-alpha-0001", "mc-beta-0002", "mc-team-0003", "mc-team-0004"
NARROW, SLOW, COUNTER, H1, H2 = "mc-narrow-005", "mc-slow-0006", "mc-counter-07", "mc-hyp-one-08", "mc-hyp-two-09"
TOKENIZER_COUNTER = "mc-tok-counter-10"
BLOCKED = "forbidden phrase"
CAPS = {"max_messages": 6, "max_tools": 2, "max_stop_strings": 2, "max_stop_length": 12, "max_sequences_per_call": 4}
KEY_PRIORITY = {"slow": 5, "hyp-one": 0, "hyp-two": 3}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("tenants")
    keys = write_keys(d / "keys.toml", {
        ALPHA: {"name": "alpha"}, BETA: {"name": "beta"},
        TEAM1: {"name": "team-1", "cache_group": "team"}, TEAM2: {"name": "team-2", "cache_group": "team"},
        NARROW: {"name": "narrow", "models": ["some-other-model"]},
        SLOW: {"name": "slow", "priority": KEY_PRIORITY["slow"]},
        COUNTER: {"name": "counter", "rpm": 2},
        TOKENIZER_COUNTER: {"name": "tok-counter", "rpm": 2},
        H1: {"name": "hyp-one", "priority": KEY_PRIORITY["hyp-one"]},
        H2: {"name": "hyp-two", "priority": KEY_PRIORITY["hyp-two"]},
    })
    collector = EventCollector()
    db = d / "ledger.sqlite3"
    cfg = {"auth": {"api_keys": str(keys)}, "ledger": {"path": str(db)}, "safety": {"blocklist": [BLOCKED]}}
    with ServerThread(plugins=(collector,), plugin_config=cfg, **CAPS) as s:
        s.db, s.events = db, collector
        s.model = httpx.get(s.base_url + "/v1/models", headers=auth(ALPHA)).json()["data"][0]["id"]
        yield s


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def post(server, path: str, key: str | None, body: dict) -> httpx.Response:
    return httpx.post(server.base_url + path, headers=auth(key) if key else {}, json=body, timeout=60)


def refused(server, step: str, status: int) -> float:
    """modelcall:entry_refused_total for one entry step and status, read from /metrics."""
    text = httpx.get(server.base_url + "/metrics", headers=auth(ALPHA)).text
    for labels, value in re.findall(r"^modelcall:entry_refused_total\{(.*)\} (\S+)$", text, re.M):
        got = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if got.get("step") == step and got.get("status") == str(status):
            return float(value)
    return 0.0


def prefix_hits(server) -> float:
    m = re.search(r"^modelcall:prefix_cache_hits_total\{[^}]*\} (\S+)$",
                  httpx.get(server.base_url + "/metrics", headers=auth(ALPHA)).text, re.M)
    assert m, "no prefix_cache_hits in /metrics"
    return float(m.group(1))


def ledger_rows(server, where: str, args: tuple = ()) -> list[dict]:
    observer, _ = ledger_of(server.kernel)
    observer.flush()
    conn = sqlite3.connect(server.db)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute(f"SELECT * FROM requests WHERE {where}", args)]
    finally:
        conn.close()


def long_prompt(tag: str, words: int = 60) -> str:
    return f"{tag} " + " ".join(f"w{(i * 7) % 50}" for i in range(words))


def cached(r: httpx.Response) -> int:
    assert r.status_code == 200, r.text
    return (r.json()["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)


def chat(content: str, **extra) -> dict:
    return {"messages": [{"role": "user", "content": content}], "max_tokens": 1, **extra}


# ---- the attacks ----------------------------------------------------------------------------------

def test_leaving_model_out_does_not_bypass_the_model_allowlist(server):
    before = refused(server, "permissions", 403)
    for path, body in (("/v1/chat/completions", chat("hi")), ("/v1/completions", {"prompt": "hi", "max_tokens": 1}),
                       ("/v1/messages", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
                                         "model": server.model})):
        r = post(server, path, NARROW, body)
        assert r.status_code == 403, (path, r.status_code, r.text)
    assert refused(server, "permissions", 403) == before + 3
    rows = ledger_rows(server, "key_name = 'narrow' AND status = 403")
    assert len(rows) == 3 and all("may not use model" in r["error"] for r in rows)


def test_a_body_priority_never_runs_sooner_than_the_key_allows(server):
    r = post(server, "/v1/chat/completions", SLOW, chat("urgent!", priority=-1000))
    assert r.status_code == 200
    rid = r.json()["id"].removeprefix("chatcmpl-")
    [row] = ledger_rows(server, "request_id = ?", (rid,))
    assert row["priority"] == KEY_PRIORITY["slow"]  # the less urgent of -1000 and the key's 5
    r = post(server, "/v1/chat/completions", SLOW, chat("later is fine", priority=50))
    [row] = ledger_rows(server, "request_id = ?", (r.json()["id"].removeprefix("chatcmpl-"),))
    assert row["priority"] == 50


def test_one_key_never_hits_another_keys_prefix_cache_unless_they_share_a_group(server):
    prompt = long_prompt("cache-attack")
    assert cached(post(server, "/v1/completions", ALPHA, {"prompt": prompt, "max_tokens": 1})) == 0
    assert cached(post(server, "/v1/completions", ALPHA, {"prompt": prompt, "max_tokens": 1})) > 0  # own: cached
    hits = prefix_hits(server)
    r = post(server, "/v1/completions", BETA, {"prompt": prompt, "max_tokens": 1})
    assert cached(r) == 0 and prefix_hits(server) == hits  # the other tenant learns nothing
    [row] = ledger_rows(server, "request_id = ?", (r.json()["id"].removeprefix("cmpl-"),))
    assert row["key_name"] == "beta" and row["cached_tokens"] == 0
    # Keys of one cache_group share on purpose.
    shared = long_prompt("cache-group")
    assert cached(post(server, "/v1/completions", TEAM1, {"prompt": shared, "max_tokens": 1})) == 0
    assert cached(post(server, "/v1/completions", TEAM2, {"prompt": shared, "max_tokens": 1})) > 0


def test_without_keys_the_prefix_cache_is_shared_as_before():
    with ServerThread() as s:
        prompt = long_prompt("no-keys")
        model = httpx.get(s.base_url + "/v1/models").json()["data"][0]["id"]
        first = httpx.post(s.base_url + "/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": 1})
        again = httpx.post(s.base_url + "/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": 1})
        assert cached(first) == 0 and cached(again) > 0


def test_a_blocked_term_sent_as_token_ids_is_refused(server):
    ids = server.call(lambda: server.kernel.tokenizer.encode(f"please say {BLOCKED} now"))
    before = refused(server, "input filters", 400)
    r = post(server, "/v1/completions", ALPHA, {"prompt": ids, "max_tokens": 1})
    assert r.status_code == 400 and "blocklist" in r.text, r.text
    r = post(server, "/v1/completions", ALPHA, {"prompt": [ids, ids], "max_tokens": 1})
    assert r.status_code == 400
    assert refused(server, "input filters", 400) == before + 2
    rows = ledger_rows(server, "key_name = 'alpha' AND status = 400 AND error LIKE '%blocklist%'")
    assert len(rows) >= 2


def test_count_tokens_counts_against_the_keys_requests_per_minute(server):
    body = {"model": server.model, "messages": [{"role": "user", "content": "count me"}]}
    before = refused(server, "quota", 429)
    assert post(server, "/v1/messages/count_tokens", COUNTER, body).status_code == 200
    assert post(server, "/v1/messages/count_tokens", COUNTER, body).status_code == 200
    r = post(server, "/v1/messages/count_tokens", COUNTER, body)
    assert r.status_code == 429 and r.headers.get("retry-after"), r.text
    r = post(server, "/v1/chat/completions", COUNTER, chat("and now a real one"))
    assert r.status_code == 429
    assert refused(server, "quota", 429) == before + 2
    assert len(ledger_rows(server, "key_name = 'counter' AND status = 429")) == 2


def test_tokenizer_routes_pass_the_entry_like_count_tokens(server):
    """/tokenize and /detokenize answer only what the key may do through the generating routes:
    the served model's allowlist, the input filters, and one request against its rpm each."""
    for path, body in (("/tokenize", {"prompt": "hi"}), ("/tokenize", {"messages": [{"role": "user", "content": "hi"}]}),
                       ("/detokenize", {"tokens": [5, 6, 7]})):
        r = post(server, path, NARROW, body)
        assert r.status_code == 403, (path, r.status_code, r.text)
    assert post(server, "/tokenize", ALPHA, {"prompt": f"say {BLOCKED} now"}).status_code == 400
    ok = {"prompt": "count me"}
    assert post(server, "/tokenize", TOKENIZER_COUNTER, ok).status_code == 200
    assert post(server, "/detokenize", TOKENIZER_COUNTER, {"tokens": [5, 6]}).status_code == 200
    r = post(server, "/tokenize", TOKENIZER_COUNTER, ok)
    assert r.status_code == 429 and r.headers.get("retry-after"), r.text
    assert len(ledger_rows(server, "key_name = 'tok-counter' AND status = 429")) == 1


@pytest.mark.parametrize("what, path, body, param", [
    ("messages", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}] * 7, "max_tokens": 1},
     "messages"),
    ("tools", "/v1/chat/completions", chat("x", tools=[
        {"type": "function", "function": {"name": f"t{i}", "parameters": {"type": "object"}}} for i in range(3)]),
     "tools"),
    ("stop strings", "/v1/completions", {"prompt": "x", "max_tokens": 1, "stop": ["a", "b", "c"]}, "stop"),
    ("stop length", "/v1/completions", {"prompt": "x", "max_tokens": 1, "stop": ["s" * 13]}, "stop"),
    ("prompts x n", "/v1/completions", {"prompt": ["a", "b", "c"], "n": 2, "max_tokens": 1}, "n"),
    ("anthropic messages", "/v1/messages", {"messages": [{"role": "user", "content": "x"}] * 7, "max_tokens": 1},
     None),
])
def test_one_call_cannot_exceed_the_entry_caps(server, what, path, body, param):
    before = refused(server, "validate", 400)
    body = {"model": server.model, **body}
    r = post(server, path, ALPHA, body)
    assert r.status_code == 400, (what, r.status_code, r.text)
    err = r.json()["error"]
    assert re.search(r"max_(messages|tools|stop_strings|stop_length|sequences_per_call)", err["message"]), err
    if param is not None:
        assert err["param"] == param
    assert refused(server, "validate", 400) == before + 1
    assert ledger_rows(server, "key_name = 'alpha' AND status = 400 AND error LIKE ?", (f"%{err['message'][:40]}%",))


def test_a_call_refused_before_the_entry_step_is_recorded_once_too(server):
    before_front, before_validate = refused(server, "front end", 400), refused(server, "validate", 400)
    r = post(server, "/v1/chat/completions", ALPHA, chat("x", temperature=500))  # SamplingParams refuses it
    assert r.status_code == 400 and r.json()["error"]["param"] == "temperature"
    r = httpx.post(server.base_url + "/v1/chat/completions", headers=auth(ALPHA), content=b"{not json")
    assert r.status_code == 400
    assert refused(server, "front end", 400) == before_front + 2
    assert refused(server, "validate", 400) == before_validate  # not counted twice
    assert len(ledger_rows(server, "key_name = 'alpha' AND status = 400 AND error LIKE '%temperature%'")) == 1


def test_every_401_is_counted_but_the_ledger_writes_one_per_address_per_minute(server):
    before, rows_before = refused(server, "auth", 401), len(ledger_rows(server, "status = 401"))
    start = time.monotonic()
    for i in range(25):
        key = None if i % 2 else f"wrong-key-{i}"
        assert post(server, "/v1/chat/completions", key, chat("hi")).status_code == 401
    burst_s = time.monotonic() - start
    assert refused(server, "auth", 401) == before + 25
    rows = ledger_rows(server, "status = 401")
    # NOTE: every request comes from 127.0.0.1, and a row passes once per 60 s window of that address: the
    # burst (about a second) writes at most one row per window it spans, none when an earlier test's 401
    # opened the window; at least one row exists once any 401 was seen.
    assert len(rows) >= 1
    assert len(rows) - rows_before <= 1 + int(burst_s // 60), (len(rows), rows_before, burst_s)


# ---- interleaved tenants (hypothesis) -------------------------------------------------------------

SENT: set[tuple[str, int]] = set()  # (key name, prompt) pairs sent so far, across examples
PROMPTS = [long_prompt(f"interleave-{i}") for i in range(3)]


@settings(max_examples=12, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.tuples(st.sampled_from([("hyp-one", H1), ("hyp-two", H2)]), st.integers(0, len(PROMPTS) - 1),
                          st.one_of(st.none(), st.integers(-2000, 2000))), min_size=1, max_size=4))
def _interleave(server, calls):
    for (name, key), p, priority in calls:
        body = {"model": server.model, "prompt": PROMPTS[p], "max_tokens": 1}
        if priority is not None:
            body["priority"] = priority
        r = post(server, "/v1/completions", key, body)
        if (name, p) not in SENT:  # this key never sent it: no block of another key may serve it
            assert cached(r) == 0, (name, p)
        SENT.add((name, p))
        rid = r.json()["id"].removeprefix("cmpl-")
        [adm] = [e for e in server.events.of(RequestAdmitted) if e.request_id == rid]
        want = KEY_PRIORITY[name] if priority is None else max(priority, KEY_PRIORITY[name])
        assert adm.caller == name and adm.priority == want >= KEY_PRIORITY[name]


def test_interleaved_keys_never_share_cache_nor_run_above_their_priority(server):
    _interleave(server)


# ---- schemathesis with keys on -------------------------------------------------------------------

def _check_operation(server, operation, who: str, statuses: list[int]) -> None:
    from schemathesis import GenerationMode

    headers = auth(ALPHA) if who == "key" else {}

    @settings(max_examples=4 if who == "key" else 3, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(operation.as_strategy(generation_mode=GenerationMode.POSITIVE))
    def check(case):
        if isinstance(case.body, dict):  # keep generated requests cheap on CPU
            for k in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
                if isinstance(case.body.get(k), int):
                    case.body[k] = min(case.body[k], 2)
            if "n" in case.body:
                case.body["n"] = 1
        r = case.call(base_url=server.base_url, headers=headers, timeout=60)
        statuses.append(r.status_code)
        assert r.status_code < 500, f"{r.status_code} for {case.method} {case.path} {case.body!r}: {r.text[:300]}"
        if who == "none" and case.path not in OPEN_PATHS:
            assert r.status_code == 401, (case.method, case.path, r.status_code)

    check()


OPEN_PATHS = {"/health", "/ready", "/console", "/console/console.js", "/console/console.css"}  # no data behind them


def test_schemathesis_with_keys_no_5xx_and_no_2xx_without_a_key(server):
    import schemathesis

    doc = httpx.get(server.base_url + "/openapi.json", headers=auth(ALPHA)).json()
    schema = schemathesis.openapi.from_dict(doc)
    statuses: dict[str, list[int]] = {"none": [], "key": []}
    paths = set()
    for op in schema.get_all_operations():
        operation = op.ok()
        paths.add(operation.path)
        for who in ("none", "key"):
            _check_operation(server, operation, who, statuses[who])
    assert {"/v1/chat/completions", "/v1/completions", "/v1/messages"} <= paths
    assert statuses["none"] and statuses["key"] and any(200 <= s < 300 for s in statuses["key"])


# ---- keys: expiry, disabling, revoking on a running server (SIGHUP) -------------------------------

def test_revoked_expired_and_disabled_keys_are_refused_and_sighup_applies_a_revoke_without_restart(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    modelcall = str(Path(sys.executable).parent / "modelcall")
    keys = write_keys(tmp_path / "keys.toml", {
        "mc-live-key": {"name": "live"}, "mc-other-key": {"name": "other"},
        "mc-old-key": {"name": "old"}, "mc-gone-key": {"name": "gone", "disabled": "true"},
    })
    # TOML datetimes and booleans are not strings: write them as such.
    text = keys.read_text().replace('disabled = "true"', "disabled = true")
    keys.write_text(text.replace('name = "old"', 'name = "old"\nexpires_at = 2020-01-01T00:00:00Z'))
    listed = subprocess.run([modelcall, "keys", "list", str(keys)], capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    states = {ln.split()[0]: ln.split()[1] for ln in listed.stdout.splitlines()[1:]}
    assert states == {"live": "active", "other": "active", "old": "expired", "gone": "disabled"}

    proc = subprocess.Popen([modelcall, "serve", "--port", "0", "--api-keys", str(keys), "--ledger", "off",
                             "--max-model-len", "512", "--num-kv-blocks", "256"],  # not 1 GB: ~2 s to zero
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        line = ""
        deadline = time.monotonic() + 120
        while "serving" not in line and time.monotonic() < deadline:
            line = proc.stdout.readline()
        base = re.search(r"http://\S+", line).group(0)
        body = {"prompt": "hello there", "max_tokens": 300, "ignore_eos": True, "stream": True}
        for key, why in (("mc-old-key", "expired"), ("mc-gone-key", "disabled")):
            r = httpx.post(base + "/v1/completions", headers=auth(key), json={"prompt": "x", "max_tokens": 1})
            assert r.status_code == 401 and why in r.json()["error"]["message"], r.text
        with httpx.stream("POST", base + "/v1/completions", headers=auth("mc-live-key"), json=body, timeout=120) as s:
            lines = s.iter_lines()
            first = next(ln for ln in lines if ln.startswith("data: {"))
            assert json.loads(first[6:])["choices"]
            out = subprocess.run([modelcall, "keys", "revoke", "live", str(keys)], capture_output=True, text=True,
                                 timeout=60)
            assert out.returncode == 0 and "SIGHUP" in out.stdout, out.stderr
            os.kill(proc.pid, signal.SIGHUP)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:  # the next request sees the change
                r = httpx.post(base + "/v1/completions", headers=auth("mc-live-key"),
                               json={"prompt": "x", "max_tokens": 1})
                if r.status_code == 401:
                    break
                time.sleep(0.1)
            assert r.status_code == 401 and "disabled" in r.json()["error"]["message"]
            rest = [ln for ln in lines if ln.startswith("data: ")]
        # The request in flight when the key was revoked ran to its end.
        chunks = [json.loads(ln[6:]) for ln in rest if ln != "data: [DONE]"]
        assert rest[-1] == "data: [DONE]" and chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert httpx.post(base + "/v1/completions", headers=auth("mc-other-key"),
                          json={"prompt": "x", "max_tokens": 1}).status_code == 200
        assert "disabled = true" in keys.read_text() and "expires_at = 2020" in keys.read_text()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


# ---- small parts -----------------------------------------------------------------------------------

def test_each_cap_is_a_command_line_setting():
    import argparse

    from modelcall.core.commands import add_kernel_options, config_from_args

    parser = argparse.ArgumentParser()
    add_kernel_options(parser)
    args = parser.parse_args(["--max-messages", "3", "--max-tools", "4", "--max-stop-strings", "2",
                              "--max-stop-length", "9", "--max-sequences-per-call", "5"])
    cfg = config_from_args(args)
    assert (cfg.max_messages, cfg.max_tools, cfg.max_stop_strings, cfg.max_stop_length,
            cfg.max_sequences_per_call) == (3, 4, 2, 9, 5)


def test_the_ledger_keeps_one_401_row_per_address_per_minute_and_says_how_many_it_stood_for():
    from modelcall.events import RequestRejected
    from modelcall.plugins.ledger.throttle import UnauthenticatedThrottle

    now = [0.0]
    rows: list = []
    gate = UnauthenticatedThrottle(rows.append, clock=lambda: now[0])

    def hit(client: str, status: int = 401) -> None:
        gate(RequestRejected(request_id="r", status=status, error_type="authentication_error", message="no key",
                             client=client))

    for _ in range(5):
        hit("10.0.0.1")
    hit("10.0.0.2")
    hit("10.0.0.1", status=403)  # other refusals always pass
    assert [(r.client, r.status) for r in rows] == [("10.0.0.1", 401), ("10.0.0.2", 401), ("10.0.0.1", 403)]
    now[0] = 61.0
    hit("10.0.0.1")
    assert rows[-1].message == "no key (+4 more from this address)" and gate.held_back == 4


def test_revoke_edits_only_the_keys_own_block():
    from modelcall.plugins.auth.keys_cli import revoked_text

    text = ('# our keys\n[[keys]]\nname = "a"  # the CI key\nsha256 = "00"\n\n'
            '[[keys]]\nname = "b"\nsha256 = "11"\ndisabled = false\n')
    out = revoked_text(text, "b")
    assert out == text.replace("disabled = false\n", "").replace('name = "b"\n', 'name = "b"\ndisabled = true\n')
    assert revoked_text(text, "a").startswith('# our keys\n[[keys]]\nname = "a"  # the CI key\ndisabled = true\n')
    with pytest.raises(LookupError):
        revoked_text(text, "c")
