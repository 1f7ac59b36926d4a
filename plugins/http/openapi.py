"""GET /openapi.json: an OpenAPI 3.1 description of every route, generated from the msgspec schemas."""
from __future__ import annotations

from typing import Any

import msgspec

from modelcall.plugins.http import schemas_anthropic as A
from modelcall.plugins.http import schemas_openai as O
from modelcall.plugins.http import schemas_responses as R


class Route(msgspec.Struct, frozen=True):
    method: str
    path: str
    summary: str
    request: type | None = None
    response: type | None = None
    streams: bool = False       # answers text/event-stream when the body asks for `stream`
    anthropic: bool = False     # errors in Anthropic's shape


class Health(msgspec.Struct):
    status: str


ROUTES = (
    Route("POST", "/v1/chat/completions", "OpenAI chat completion", O.ChatCompletionRequest, O.ChatCompletion, True),
    Route("POST", "/v1/completions", "OpenAI text completion", O.CompletionRequest, O.Completion, True),
    Route("GET", "/v1/models", "The served model", None, O.ModelList),
    Route("POST", "/v1/responses", "OpenAI Responses API: a response, whole, streamed or in the background",
          R.ResponsesRequest, dict, True),
    Route("POST", "/v1/messages", "Anthropic message", A.MessagesRequest, A.MessageResponse, True, True),
    Route("POST", "/v1/messages/count_tokens", "Anthropic token count", A.CountTokensRequest,
          A.CountTokensResponse, anthropic=True),
    Route("GET", "/health", "The process is alive", None, Health),
    Route("GET", "/ready", "The engine loop runs and accepts requests (503 while starting or draining)", None, Health),
    Route("GET", "/-/stats", "The kernel's counters (running, waiting, KV blocks)", None, dict),
)
ERROR_STATUSES = {"400": "invalid request", "404": "unknown model", "413": "body too large",
                  "429": "queue full (see Retry-After)", "503": "not accepting requests (see Retry-After)"}


def document(routes: tuple[Route, ...] = ROUTES, *, title: str = "modelcall", version: str = "0.1.0",
             extra_paths: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    types = {t for r in routes for t in (r.request, r.response) if t not in (None, dict)}
    types |= {O.ErrorResponse, A.AnthropicError}
    order = sorted(types, key=lambda t: t.__name__)
    _, components = msgspec.json.schema_components(order, ref_template="#/components/schemas/{name}")
    paths: dict[str, dict[str, Any]] = {}
    for r in routes:
        paths.setdefault(r.path, {})[r.method.lower()] = _operation(r)
    paths.update(extra_paths or {})
    return {"openapi": "3.1.0", "info": {"title": title, "version": version}, "paths": paths,
            "components": {"schemas": components}}


def _ref(t: type | None) -> dict[str, Any]:
    if t is None or t is dict:
        return {"type": "object"}
    return {"$ref": f"#/components/schemas/{t.__name__}"}


def _operation(r: Route) -> dict[str, Any]:
    ok: dict[str, Any] = {"application/json": {"schema": _ref(r.response)}}
    if r.streams:
        ok["text/event-stream"] = {"schema": {"type": "string"}}
    err = {"application/json": {"schema": _ref(A.AnthropicError if r.anthropic else O.ErrorResponse)}}
    op: dict[str, Any] = {"summary": r.summary, "operationId": _operation_id(r),
                          "responses": {"200": {"description": "OK", "content": ok}}}
    if r.request is not None:
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": _ref(r.request)}}}
        op["responses"].update({s: {"description": d, "content": err} for s, d in ERROR_STATUSES.items()})
    elif r.path == "/ready":
        op["responses"]["503"] = {"description": "starting or draining", "content": ok}
    return op


def _operation_id(r: Route) -> str:
    return r.method.lower() + "_" + "".join(c if c.isalnum() else "_" for c in r.path.strip("/"))
