"""Quotas hold under concurrent bursts: requests and tokens per minute, tokens per day, never over.

Admission reserves the worst case (prompt + max_tokens) before any compute and the end of the
request settles it to the real usage, so no interleaving of admissions and settlements can
let a caller past a limit.
"""
from __future__ import annotations

import asyncio
import json

import httpx2 as httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from http_server import ServerThread
from keys_util import write_keys

from modelcall.core.errors import Overloaded, PermissionDenied
from modelcall.core.metering import Admission, Caller
from modelcall.events import Finished, RequestFailed, RequestRejected, Timings, Usage
from modelcall.plugins.auth.keys import Limits
from modelcall.plugins.auth.quota import WINDOW_S, QuotaBook
from modelcall.plugins.ledger.plugin import ledger_of
from modelcall.plugins.ledger.store import open_readonly


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _adm(rid: str, caller: Caller, prompt: int, max_tokens: int) -> Admission:
    return Admission(request_id=rid, task_id=None, model="m", caller=caller, prompt_tokens=prompt, max_tokens=max_tokens)


def _finished(rid: str, prompt: int, completion: int) -> Finished:
    return Finished(request_id=rid, reason="stop", usage=Usage(prompt_tokens=prompt, completion_tokens=completion),
                    timings=Timings(received=0.0))


ops = st.lists(st.one_of(
    st.tuples(st.just("admit"), st.integers(1, 40), st.integers(1, 40)),       # prompt, max_tokens
    st.tuples(st.just("settle"), st.integers(0, 50), st.floats(0.0, 1.0)),     # which open request, completion share
    st.tuples(st.just("fail"), st.integers(0, 50), st.just(0.0)),
    st.tuples(st.just("reject"), st.integers(0, 50), st.just(0.0)),
    st.tuples(st.just("tick"), st.integers(0, 30), st.just(0.0)),              # seconds pass
), max_size=120)


@settings(max_examples=300, deadline=None)
@given(ops=ops, rpm=st.integers(1, 8), tpm=st.integers(40, 200), daily=st.integers(100, 600))
def test_no_interleaving_of_admissions_and_settlements_breaks_a_limit(ops, rpm, tpm, daily):
    clock = Clock()
    book = QuotaBook(clock=clock, wall=lambda: 86400.0 * 20_000 + clock.t)  # one UTC day throughout
    caller = Caller(name="k", limits=Limits(rpm=rpm, tpm=tpm, daily_tokens=daily))
    open_: dict[str, tuple[int, int]] = {}
    charged: list[tuple[float, int, str]] = []  # (admitted at, tokens charged now, rid) of admitted requests
    n = 0
    for op, a, b in ops:
        if op == "admit":
            rid = f"r{n}"
            n += 1
            try:
                book.reserve(_adm(rid, caller, a, b))
            except Overloaded as e:
                assert e.retry_after >= 1.0
                continue
            open_[rid] = (a, b)
            charged.append((clock.t, a + b, rid))
        elif op in ("settle", "fail", "reject") and open_:
            rid = sorted(open_)[a % len(open_)]
            prompt, max_tokens = open_.pop(rid)
            if op == "settle":
                used = prompt + int(max_tokens * b)
                book.observe(_finished(rid, prompt, int(max_tokens * b)))
            elif op == "fail":
                used = 0
                book.observe(RequestFailed(request_id=rid, error_type="X", message=""))
            else:
                used = None
                book.observe(RequestRejected(request_id=rid, status=429, error_type="x", message=""))
            charged = [(t, used if r == rid else c, r) for t, c, r in charged if not (r == rid and used is None)]
        elif op == "tick":
            clock.t += a
        # The invariants, at every point of the interleaving:
        recent = [(t, c) for t, c, _ in charged if t > clock.t - WINDOW_S]
        assert len(recent) <= rpm
        assert sum(c for _, c in recent) <= tpm
        assert sum(c for _, c, _ in charged) <= daily
        u = book.usage("k")
        assert u["requests_minute"] == len(recent) and u["tokens_minute"] == sum(c for _, c in recent)


def test_refusal_says_when_to_retry_and_a_request_bigger_than_the_minute_is_told_so():
    clock = Clock()
    book = QuotaBook(clock=clock)
    caller = Caller(name="k", limits=Limits(rpm=2, tpm=100))
    book.reserve(_adm("a", caller, 10, 10))
    clock.t += 20
    book.reserve(_adm("b", caller, 10, 10))
    with pytest.raises(Overloaded, match="2 requests per minute") as e:
        book.reserve(_adm("c", caller, 10, 10))
    assert e.value.retry_after == pytest.approx(40.0)
    with pytest.raises(Overloaded, match="lower max_tokens"):
        book.reserve(_adm("d", caller, 50, 60))
    clock.t += 41
    book.reserve(_adm("e", caller, 10, 10))


def test_tools_a_key_may_not_use_are_refused_by_the_entry_permission_step():
    from modelcall.core.permissions import check_tools

    caller = Caller(name="k", tools=frozenset({"search"}))
    check_tools(caller, ("search",))
    with pytest.raises(PermissionDenied, match="shell"):
        check_tools(caller, ("search", "shell"))


# ---- a real server under a concurrent burst ---------------------------------------------------

BURST_KEY, TOKENS_KEY = "mc-burst-key", "mc-tokens-key"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    keys = write_keys(tmp_path_factory.mktemp("keys") / "keys.toml", {
        BURST_KEY: {"name": "burst", "rpm": 5},
        TOKENS_KEY: {"name": "tokens", "tpm": 400},
    })
    db = keys.parent / "ledger.sqlite3"
    with ServerThread(plugin_config={"auth": {"api_keys": str(keys)}, "ledger": {"path": str(db)}}) as s:
        s.ledger = db
        yield s


async def _burst(base: str, key: str, n: int, max_tokens: int) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        body = {"model": "x", "messages": [{"role": "user", "content": "Count to ten."}], "max_tokens": max_tokens}
        model = (await client.get("/v1/models", headers={"x-api-key": key})).json()["data"][0]["id"]
        body["model"] = model
        return await asyncio.gather(*[client.post("/v1/chat/completions", json=body, headers={"x-api-key": key})
                                      for _ in range(n)])


def test_a_concurrent_burst_gets_exactly_the_requests_per_minute_and_429_with_retry_after(server):
    rs = asyncio.run(_burst(server.base_url, BURST_KEY, 12, 4))
    ok = [r for r in rs if r.status_code == 200]
    refused = [r for r in rs if r.status_code == 429]
    assert len(ok) == 5 and len(refused) == 7
    for r in refused:
        assert int(r.headers["Retry-After"]) >= 1
        assert r.json()["error"]["type"] == "rate_limit_error"
    # The refusals are in the ledger under the key's name, before any compute (no tokens).
    observer, _ = ledger_of(server.kernel)
    observer.flush()
    with open_readonly(server.ledger) as conn:
        rows = conn.execute("SELECT status, COUNT(*), SUM(completion_tokens) FROM requests WHERE key_name = 'burst' "
                            "GROUP BY status ORDER BY status").fetchall()
    (s1, n1, t1), (s2, n2, t2) = [tuple(r) for r in rows]
    assert (s1, n1, s2, n2, t2) == (200, 5, 429, 7, 0) and 0 < t1 <= 20


def test_a_concurrent_burst_never_spends_more_tokens_per_minute_than_allowed(server):
    rs = asyncio.run(_burst(server.base_url, TOKENS_KEY, 10, 64))
    ok = [r.json() for r in rs if r.status_code == 200]
    assert ok and len(ok) < 10
    assert sum(b["usage"]["total_tokens"] for b in ok) <= 400
    assert all(r.status_code in (200, 429) for r in rs)
