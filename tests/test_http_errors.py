"""Every error the front end gives: its status, the protocol's own shape, the field it names — and
never a 5xx for bad input (schemathesis against /openapi.json, valid and invalid bodies)."""
from __future__ import annotations

import json

import httpx2 as httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from http_server import ServerThread
from schemathesis import GenerationMode

from modelcall.plugins.http import openapi
from modelcall.plugins.http.settings import ServerSettings

MAX_BODY = 64 * 1024
WINDOW = 256
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server():
    with ServerThread(ServerSettings(port=0, max_body_bytes=MAX_BODY), max_model_len=WINDOW) as s:
        yield s


def post(server, path: str, body: bytes | dict | None = None, **kw) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode() if body is not None else b""
    return httpx.post(server.base_url + path, content=content, headers={"content-type": "application/json"},
                      timeout=60, **kw)


def openai_error(r: httpx.Response, status: int, param: str | None = "*") -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"], err
    if param != "*":
        assert err["param"] == param, err
    return err


def anthropic_error(r: httpx.Response, status: int, error_type: str) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
    assert body["error"]["type"] == error_type and body["error"]["message"]
    return body["error"]


CHAT = "/v1/chat/completions"
BAD_CHAT_BODIES = [  # (body, the param the error names)
    (b"{", None),
    (b"", None),
    (b"\xff\xfe garbage", None),
    (b'{"messages": [{"role": "user", "content": "\\ud800"}]}', None),
    (b"[" * 30_000 + b"]" * 30_000, None),
    (b'{"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"a": ' + b"[" * 30_000
     + b"]" * 30_000 + b"}}", None),
    (b"[1, 2]", None),
    ({"messages": []}, "messages"),
    ({"messages": "hello"}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user"}]}, "messages[0]"),
    ({"messages": USER, "max_tokens": "ten"}, "max_tokens"),
    ({"messages": USER, "max_tokens": 10**40}, "max_tokens"),
    ({"messages": USER, "max_tokens": 0}, "max_tokens"),
    ({"messages": USER, "temperature": -1}, "temperature"),
    ({"messages": USER, "temperature": 1e400}, None),
    ({"messages": USER, "n": 0}, "n"),
    ({"messages": USER, "seed": -5}, "seed"),
    ({"messages": USER, "top_p": 0}, "top_p"),
    ({"messages": USER, "stop": ["x"] * 17}, "stop"),
    ({"messages": USER, "stop": [""]}, "stop"),
    ({"messages": USER, "top_logprobs": 3}, "top_logprobs"),
    ({"messages": USER, "logprobs": True, "top_logprobs": 50}, "top_logprobs"),
    ({"messages": USER, "min_tokens": 10, "max_tokens": 5}, "min_tokens"),
    ({"messages": USER, "logit_bias": {"5": 3}}, "logit_bias"),
    ({"messages": USER, "chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content"),
    ({"messages": [{"role": "user", "content": "\x00\x01\u202e\U0010ffff" * 10}], "max_tokens": 2}, "ok"),
]


@pytest.mark.parametrize("body,param", BAD_CHAT_BODIES, ids=range(len(BAD_CHAT_BODIES)))
def test_bad_chat_bodies_get_400_naming_the_field(server, body, param):
    r = post(server, CHAT, body)
    if param == "ok":  # odd but valid text is served, not refused
        assert r.status_code == 200, r.text
        return
    openai_error(r, 400, param if param is not None else "*")


def test_context_overflow_gives_the_token_counts(server):
    r = post(server, CHAT, {"messages": [{"role": "user", "content": "word " * 300}], "max_tokens": 10})
    err = openai_error(r, 400, "messages")
    assert err["code"] == "context_length_exceeded"
    assert f"context window is {WINDOW} tokens" in err["message"] and "10 output tokens" in err["message"]
    r = post(server, CHAT, {"messages": USER, "max_tokens": WINDOW})
    assert "requested" in openai_error(r, 400)["message"]
    r = post(server, "/v1/messages", {"model": _model(server), "max_tokens": WINDOW * 2, "messages": USER})
    assert f"{WINDOW}" in anthropic_error(r, 400, "invalid_request_error")["message"]


def _model(server) -> str:
    return httpx.get(server.base_url + "/v1/models").json()["data"][0]["id"]


def test_unknown_model_and_route_are_404(server):
    err = openai_error(post(server, CHAT, {"model": "gpt-7", "messages": USER}), 404, "model")
    assert err["code"] == "model_not_found" and _model(server) in err["message"]
    openai_error(post(server, "/v1/nothing", {}), 404)
    anthropic_error(post(server, "/v1/messages", {"model": "claude-9", "max_tokens": 5, "messages": USER}), 404,
                    "not_found_error")


def test_wrong_method_is_405(server):
    r = httpx.get(server.base_url + CHAT)
    assert "POST" in openai_error(r, 405)["message"]
    anthropic_error(httpx.get(server.base_url + "/v1/messages"), 405, "invalid_request_error")


def test_body_over_the_limit_is_413(server):
    big = {"messages": [{"role": "user", "content": "x" * (MAX_BODY + 10)}]}
    assert str(MAX_BODY) in openai_error(post(server, CHAT, big), 413)["message"]
    anthropic_error(post(server, "/v1/messages", {"model": "m", "max_tokens": 1, **big}), 413, "request_too_large")


ANTHROPIC_BAD = [
    {"messages": USER},                                                     # no model, no max_tokens
    {"model": "m", "messages": USER},                                       # no max_tokens
    {"model": "m", "max_tokens": 5, "messages": []},
    {"model": "m", "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]},
    {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "bogus"}]}]},
    {"model": "m", "max_tokens": -1, "messages": USER},
    {"model": "m", "max_tokens": 5, "messages": USER, "temperature": "hot"},
    {"model": "m", "max_tokens": 5, "messages": USER, "stop_sequences": ["a"] * 17},
]


@pytest.mark.parametrize("body", ANTHROPIC_BAD, ids=range(len(ANTHROPIC_BAD)))
def test_anthropic_validation_errors_are_in_anthropic_shape(server, body):
    anthropic_error(post(server, "/v1/messages", body), 400, "invalid_request_error")


@pytest.mark.parametrize("body", [b"{not json", b"", {"model": "m"}, {"model": "m", "messages": []},
                                  {"model": "m", "messages": [{"role": "robot", "content": "x"}]}])
def test_count_tokens_validation_errors_are_in_anthropic_shape(server, body):
    anthropic_error(post(server, "/v1/messages/count_tokens", body), 400, "invalid_request_error")


def test_openapi_describes_every_route(server):
    doc = httpx.get(server.base_url + "/openapi.json").json()
    assert doc["openapi"].startswith("3.")
    for route in openapi.ROUTES:
        assert route.method.lower() in doc["paths"][route.path]
    refs = {m for m in json.dumps(doc).split('"#/components/schemas/')[1:]}
    assert all(r.split('"')[0] in doc["components"]["schemas"] for r in refs)
    props = doc["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    assert props["max_tokens"]["anyOf"][0]["maximum"] == 2**31 - 1 and "top_k" in props


SCHEMA = schemathesis.openapi.from_dict(openapi.document())
POSTS = [r.path for r in openapi.ROUTES if r.method == "POST"]


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
@pytest.mark.parametrize("path", POSTS)
def test_schemathesis_finds_no_server_error(server, path, mode):
    operation = SCHEMA[path]["POST"]
    seen: list[int] = []

    @settings(max_examples=25, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(operation.as_strategy(generation_mode=mode))
    def check(case):
        if isinstance(case.body, dict) and mode is GenerationMode.POSITIVE:
            # Keep generated requests cheap on CPU: the window is small, and we do not want to
            # wait for hundreds of tokens per example.
            for key in ("max_tokens", "max_completion_tokens"):
                if isinstance(case.body.get(key), int):
                    case.body[key] = min(case.body[key], 4)
            case.body["n"] = 1 if "n" in case.body else case.body.get("n", 1)
        response = case.call(base_url=server.base_url, timeout=60)
        seen.append(response.status_code)
        assert response.status_code < 500, f"{response.status_code} for {case.body!r}: {response.text[:500]}"

    check()
    assert seen and all(s < 500 for s in seen)
