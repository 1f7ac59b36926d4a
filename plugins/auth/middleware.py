"""The aiohttp middleware that makes every route but the open ones (`/health`, `/ready`) need a key.

401 without a valid key, 403 for a model or tool the key may not use (read from the JSON
body before the handler runs), and the caller set for the rest of the request so the
kernel's meters charge it at admission (429 with Retry-After over a limit). Errors are core
errors; the front end's error middleware answers them in the route's protocol shape.
"""
from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import msgspec
from aiohttp import web

from modelcall.core.errors import PermissionDenied, Unauthenticated
from modelcall.core.metering import acting_as, tool_names
from modelcall.events import RequestRejected
from modelcall.plugins.auth.keys import KeyStore, presented_key

log = logging.getLogger("modelcall.auth")
OPEN_PATHS = frozenset({"/health", "/ready"})


def _body_fields(raw: bytes) -> tuple[Any, tuple[str, ...]]:
    try:
        body = msgspec.json.decode(raw) if raw else None
    except (msgspec.DecodeError, RecursionError):
        return None, ()  # the route answers malformed bodies itself
    if not isinstance(body, dict):
        return None, ()
    tools = body.get("tools")
    return body.get("model"), tool_names(tools if isinstance(tools, list) else None)


def auth_middleware(store: KeyStore, open_paths: Iterable[str] = OPEN_PATHS,
                    publish: Callable[[Any], None] | None = None) -> Callable[..., Any]:
    """`publish(event)`, when given, receives a RequestRejected for every 401 and 403 (metrics, ledger, log)."""
    open_set = frozenset(open_paths)

    def refuse(error: Exception, caller: str | None = None) -> Exception:
        if publish is not None:
            publish(RequestRejected(request_id=f"http-{uuid.uuid4().hex[:16]}", status=error.status,  # type: ignore[attr-defined]
                                    error_type=error.error_type, message=str(error), caller=caller))  # type: ignore[attr-defined]
        return error

    @web.middleware
    async def api_keys(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                       ) -> web.StreamResponse:
        if request.path in open_set:
            return await handler(request)
        key = presented_key(request.headers)
        caller = store.verify(key)
        if caller is None:
            # NOTE: never log or echo the presented key, not even a prefix.
            log.info("refused %s %s: %s API key", request.method, request.path, "invalid" if key else "no")
            raise refuse(Unauthenticated("a valid API key is required: send `Authorization: Bearer <key>` or "
                                         "`x-api-key: <key>`" if not key else "the API key is not valid"))
        if request.can_read_body:
            # NOTE: whatever the Content-Type says: the routes decode any body as JSON.
            model, tools = _body_fields(await request.read())
            if isinstance(model, str) and not caller.may_use_model(model):
                raise refuse(PermissionDenied(f"the key {caller.name!r} may not use model {model!r}", field="model"),
                             caller.name)
            bad = caller.forbidden_tools(list(tools))
            if bad:
                raise refuse(PermissionDenied(f"the key {caller.name!r} may not use tool(s) {', '.join(bad)}",
                                              field="tools"), caller.name)
        with acting_as(caller):
            return await handler(request)

    return api_keys
