"""The aiohttp application of `modelcall serve`: routes, the error middleware, and extension points.

    app = create_app(kernel, ServerSettings(), middlewares=[...], routes=[...])

Other plugins extend it through hooks: `register_routes(register, config, kernel)` adds routes and
`register_middlewares(register, config, kernel)` adds aiohttp middlewares (inside the error middleware,
so an `ApiError` they raise is answered in the route's protocol shape). Each request carries
`request[RECEIVED]` (monotonic time the front end saw it) for timing.
"""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import msgspec
from aiohttp import web

from modelcall.core import Kernel, ModelcallError
from modelcall.core.metering import EXCHANGE_KEY, Exchange
from modelcall.events import RequestRejected
from modelcall.plugins.http import anthropic_messages, openai_chat, openai_completions, openapi
from modelcall.plugins.http import embeddings, lora_routes, rerank, responses
from modelcall.plugins.http.embeddings import EmbeddingRequest
from modelcall.plugins.http.schemas_responses import ResponsesRequest
from modelcall.plugins.http import schemas_anthropic as A
from modelcall.plugins.http import schemas_openai as O
from modelcall.plugins.http.errors import ApiError, error_response, is_anthropic, sse_error_payload
from modelcall.plugins.http.service import ServingContext
from modelcall.plugins.http.settings import ServerSettings
from modelcall.plugins.http.sse import DONE, STREAM
from modelcall.plugins.http.tokenize import routes as tokenizer_routes

log = logging.getLogger("modelcall.http")

CONTEXT = web.AppKey("modelcall.context", ServingContext)
KERNEL = web.AppKey("modelcall.kernel", Kernel)
INFLIGHT = web.AppKey("modelcall.inflight", dict)
RECEIVED = web.RequestKey("modelcall.received", float)  # monotonic time the front end saw the request

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
RouteSpec = tuple[str, str, Handler]


def create_app(kernel: Kernel, settings: ServerSettings | None = None, *, middlewares: Iterable[Any] = (),
               routes: Iterable[RouteSpec] = ()) -> web.Application:
    """The app serving `kernel` (already started). Extra `middlewares`/`routes` come after those from hooks."""
    settings = settings or ServerSettings()
    ctx = ServingContext(kernel, settings)
    kernel.model_aliases = tuple(n for n in settings.served_model_names if n != kernel.model_name)
    hook_mw, hook_routes = _from_hooks(kernel)
    app = web.Application(middlewares=[errors_middleware, *hook_mw, *middlewares],
                          client_max_size=settings.max_body_bytes)
    app[CONTEXT] = ctx
    app[KERNEL] = kernel
    app[INFLIGHT] = {"count": 0}
    add = app.router.add_route
    add("POST", "/v1/chat/completions", _json_route(O.ChatCompletionRequest, openai_chat.handle))
    add("POST", "/v1/completions", _json_route(O.CompletionRequest, openai_completions.handle))
    add("POST", "/v1/messages", _json_route(A.MessagesRequest, anthropic_messages.handle))
    add("POST", "/v1/messages/count_tokens", _json_route(A.CountTokensRequest, anthropic_messages.count_tokens))
    responses.setup(app, kernel)
    add("POST", "/v1/responses", _json_route(ResponsesRequest, responses.create))
    add("GET", "/v1/responses/{response_id}", responses.retrieve)
    add("DELETE", "/v1/responses/{response_id}", responses.delete)
    add("POST", "/v1/responses/{response_id}/cancel", responses.cancel)
    add("GET", "/v1/responses/{response_id}/input_items", responses.input_items)
    add("GET", "/v1/models", models)
    add("POST", "/v1/embeddings", _json_route(EmbeddingRequest, embeddings.handle))
    for path in ("/v1/rerank", "/rerank", "/v2/rerank"):
        add("POST", path, _json_route(rerank.RerankRequest, rerank.rerank))
    for path in ("/v1/score", "/score"):
        add("POST", path, _json_route(rerank.ScoreRequest, rerank.score))
    add("GET", "/health", health)
    add("GET", "/ready", ready)
    add("GET", "/-/stats", stats)
    extra = [*tokenizer_routes(ctx), *lora_routes.routes(_json_route), *hook_routes, *routes]  # vLLM's /tokenize, ...
    for method, path, handler in extra:
        add(method, path, handler)
    doc = msgspec.json.encode(openapi.document(extra_paths=_extra_paths(extra)))

    async def openapi_json(_request: web.Request) -> web.Response:
        return _json_bytes(doc)

    add("GET", "/openapi.json", openapi_json)
    return app


def _from_hooks(kernel: Kernel) -> tuple[list[Any], list[RouteSpec]]:
    host = kernel.host
    if host is None:
        return [], []
    routes = [tuple(args[:3]) for _plugin, args, _kw in host.collect("register_routes", config=kernel.config, kernel=kernel)]
    mws: list[tuple[int, Any]] = []
    if hasattr(host.pm.hook, "register_middlewares"):
        for _plugin, args, kw in host.collect("register_middlewares", config=kernel.config, kernel=kernel):
            mws.append((kw.get("order", args[1] if len(args) > 1 else 0), args[0]))
    return [m for _, m in sorted(mws, key=lambda x: x[0])], routes  # type: ignore[misc]


def _extra_paths(routes: list[RouteSpec]) -> dict[str, dict[str, Any]]:
    paths: dict[str, dict[str, Any]] = {}
    for method, path, handler in routes:
        if getattr(handler, "openapi", True) is False:  # e.g. an endless event stream a generated client would hang on
            continue
        doc = (getattr(handler, "__doc__", None) or path).strip().splitlines()[0]
        paths.setdefault(path, {})[method.lower()] = {"summary": doc, "responses": {"200": {"description": "OK"}}}
    return paths


# ---- request decoding and errors -------------------------------------------------------------

def _json_route(body_type: type, fn: Callable[..., Awaitable[web.StreamResponse]]) -> Handler:
    decoder = msgspec.json.Decoder(body_type)

    async def route(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        if not raw:
            raise ApiError(400, "the request body is empty; send a JSON object", code="invalid_json")
        try:
            body = decoder.decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            raise ApiError.from_decode(e) from None
        except RecursionError:
            raise ApiError(400, "the JSON body is nested too deeply", code="invalid_json") from None
        return await fn(request, request.app[CONTEXT].bind(request), body)  # bound: caller, task, client

    route.__name__ = fn.__module__.rsplit(".", 1)[-1]
    return route


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Outermost: count in-flight requests, time them, and answer every error in the route's shape.
    Each request gets its Exchange here (the auth and records middlewares fill it; the bound
    ServingContext hands it to the kernel's entry pipeline)."""
    request[RECEIVED] = time.monotonic()
    request[EXCHANGE_KEY] = Exchange(client=request.remote)
    inflight = request.app[INFLIGHT]
    inflight["count"] += 1
    try:
        return await handler(request)
    except ApiError as e:
        return await _answer(request, e)
    except ModelcallError as e:
        return await _answer(request, ApiError.from_kernel(e))
    except web.HTTPException as e:
        if e.status < 400:
            raise
        return await _answer(request, _http_error(request, e))
    except (asyncio.CancelledError, ConnectionError):
        raise
    except Exception as e:  # a bug, not the client's fault: log it, answer 500 in the protocol's shape
        log.exception("unhandled error on %s %s", request.method, request.path)
        return await _answer(request, ApiError(500, f"internal server error ({type(e).__name__}); see the server log",
                                               error_type="api_error"))
    finally:
        inflight["count"] -= 1


async def _answer(request: web.Request, error: ApiError) -> web.StreamResponse:
    _record_refusal(request, error)
    stream = request.get(STREAM)
    if stream is None:
        return error_response(error, request.path)
    # The stream's headers are gone already: end it with an error event instead.
    anthropic = is_anthropic(request.path)
    await stream.send(sse_error_payload(error, anthropic), *(() if anthropic else (DONE,)))
    await stream.close()
    return stream.response


def _record_refusal(request: web.Request, error: ApiError) -> None:
    """A call refused before the kernel's entry saw it (a body that does not decode, a bad sampling
    field, too large): published like the entry's own refusals, so the ledger and /metrics see it."""
    ex = request.get(EXCHANGE_KEY)
    if (ex is None or ex.refused or ex.handles or request.method != "POST" or not 400 <= error.status < 500
            or error.status in (404, 405)):
        return
    ex.refused = True
    caller = ex.caller
    request.app[KERNEL].bus.publish((RequestRejected(
        request_id=f"http-{uuid.uuid4().hex[:16]}", task_id=ex.task_id, status=error.status,
        error_type=error.error_type, message=error.message, caller=caller.name if caller is not None else None,
        step="front end", client=ex.client),))


def _http_error(request: web.Request, e: web.HTTPException) -> ApiError:
    if e.status == 404:
        return ApiError(404, f"no route {request.method} {request.path}", error_type="not_found_error",
                        code="not_found")
    if e.status == 405:
        allowed = getattr(e, "allowed_methods", None) or ()
        return ApiError(405, f"method {request.method} is not allowed on {request.path}; allowed: "
                             f"{', '.join(sorted(allowed))}", code="method_not_allowed")
    if e.status == 413:
        limit = request.app._client_max_size  # noqa: SLF001 - aiohttp keeps no public accessor
        return ApiError(413, f"the request body is larger than the limit of {limit} bytes "
                             "(modelcall serve --max-body-bytes)", code="request_too_large")
    return ApiError(e.status, e.text or e.reason or "HTTP error")


# ---- small routes -------------------------------------------------------------------------------

def _json_bytes(body: bytes, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=body, status=status, content_type="application/json", headers=headers)


async def models(request: web.Request) -> web.Response:
    ctx = request.app[CONTEXT]
    created = int(time.time() - time.monotonic() + (ctx.kernel.started_at or time.monotonic()))
    task = getattr(ctx.kernel, "task", None)
    cards = [O.ModelCard(id=name, created=created, max_model_len=ctx.kernel.window, task=task)
             for name in ctx.model_names]
    loras = ctx.kernel.loras
    if loras is not None:   # the adapters this caller may use (one private to another key is never listed)
        caller = request.get(EXCHANGE_KEY).caller if request.get(EXCHANGE_KEY) is not None else None
        for name in loras.names():
            info = loras.info(name)
            if info is not None and (caller is None or caller.may_use_lora(name)):
                cards.append(O.ModelCard(id=name, created=created, max_model_len=ctx.kernel.window, task="generate",
                                         parent=ctx.model_name, root=info.path))
    return _json_bytes(O.encoder.encode(O.ModelList(data=cards)))


async def health(request: web.Request) -> web.Response:
    return _json_bytes(b'{"status":"ok"}')


async def ready(request: web.Request) -> web.Response:
    kernel = request.app[KERNEL]
    if kernel.ready:
        return _json_bytes(b'{"status":"ready"}')
    state = b"draining" if kernel.draining else b"starting"
    return _json_bytes(b'{"status":"' + state + b'"}', 503, {"Retry-After": "5"})


async def stats(request: web.Request) -> web.Response:
    kernel = request.app[KERNEL]
    return _json_bytes(msgspec.json.encode({**kernel.stats(), "model": kernel.model_name,
                                            "http_inflight": request.app[INFLIGHT]["count"]}))
