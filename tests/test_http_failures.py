"""A request that fails after its stream began ends with an error event in the protocol's shape
(the status line was already sent); before that, it is an ordinary error response."""
from __future__ import annotations

import json

import httpx2 as httpx
import pytest
from http_server import ServerThread

from modelcall.core import hookimpl


class FailingSampler:
    """Greedy, but the step fails once a request has `fail_at` output tokens."""

    modelcall_plugin_name = "test-failing-sampler"
    fail_at = 3

    @hookimpl(tryfirst=True)
    def provide_sampler(self):
        return self

    def sample(self, logits, chunks):
        if any(c.request.num_output_tokens >= self.fail_at for c in chunks):
            raise RuntimeError("the accelerator caught fire")
        return [int(row.argmax()) for row in logits], None


@pytest.fixture(scope="module")
def server():
    with ServerThread(plugins=(FailingSampler(),)) as s:
        yield s


def test_openai_stream_that_fails_ends_with_an_error_chunk_and_done(server):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 20, "stream": True}
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", json=body, timeout=60) as r:
        lines = [line for line in r.iter_lines() if line]
    assert r.status_code == 200 and lines[-1] == "data: [DONE]"
    error = json.loads(lines[-2][6:])["error"]
    assert error["type"] == "api_error" and "caught fire" in error["message"]


def test_anthropic_stream_that_fails_ends_with_an_error_event(server):
    body = {"model": server.kernel.model_name, "max_tokens": 20, "stream": True,
            "messages": [{"role": "user", "content": "hi"}]}
    with httpx.stream("POST", server.base_url + "/v1/messages", json=body, timeout=60) as r:
        lines = [line for line in r.iter_lines() if line]
    assert lines[-2] == "event: error"
    payload = json.loads(lines[-1][6:])
    assert payload["type"] == "error" and payload["error"]["type"] == "api_error"


def test_a_whole_request_that_fails_is_a_500_in_shape_and_the_server_goes_on(server):
    r = httpx.post(server.base_url + "/v1/chat/completions", timeout=60,
                   json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 20})
    assert r.status_code == 500 and "caught fire" in r.json()["error"]["message"]
    ok = httpx.post(server.base_url + "/v1/chat/completions", timeout=60,
                    json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert ok.status_code == 200
    assert httpx.get(server.base_url + "/ready").status_code == 200
