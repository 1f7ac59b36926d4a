"""The aiohttp middleware that makes every route but the open ones (`/health`, `/ready`) need a key.

It only authenticates: 401 without a valid (known, enabled, unexpired) key, else the caller is
put on the request's `Exchange` (`request[EXCHANGE]`, made by the front end for each request),
which the front end hands to the kernel. What the key may do — model, tools, priority, cache
scope, quota — is decided by the kernel's entry pipeline (`modelcall.core.entry`), not here.

Every 401 is published as `RequestRejected(status=401, step="auth", client=address)`: /metrics
counts each one, the ledger writes at most one row per client address per minute.
"""
from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from aiohttp import web

from modelcall.core.errors import Unauthenticated
from modelcall.core.metering import EXCHANGE_KEY
from modelcall.events import RequestRejected
from modelcall.plugins.auth.keys import KeyRing, KeyStore, presented_key

log = logging.getLogger("modelcall.auth")
OPEN_PATHS = frozenset({"/health", "/ready"})

_WHY = {"disabled": "the API key has been disabled", "expired": "the API key has expired",
        "unknown": "the API key is not valid"}


def auth_middleware(keys: KeyRing | KeyStore, open_paths: Iterable[str] = OPEN_PATHS,
                    publish: Callable[[Any], None] | None = None) -> Callable[..., Any]:
    """`publish(event)`, when given, receives a RequestRejected for every 401 (metrics, ledger, log)."""
    open_set = frozenset(open_paths)

    @web.middleware
    async def api_keys(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                       ) -> web.StreamResponse:
        if request.path in open_set:
            return await handler(request)
        key = presented_key(request.headers)
        caller, state = keys.check(key)
        if caller is None or state != "active":
            # NOTE: never log or echo the presented key, not even a prefix.
            log.info("refused %s %s: %s API key", request.method, request.path, state if key else "no")
            error = Unauthenticated("a valid API key is required: send `Authorization: Bearer <key>` or "
                                    "`x-api-key: <key>`" if not key else _WHY[state])
            ex = request.get(EXCHANGE_KEY)
            if ex is not None:
                ex.refused = True
            if publish is not None:
                publish(RequestRejected(request_id=f"http-{uuid.uuid4().hex[:16]}", status=401,
                                        error_type=error.error_type, message=str(error),
                                        caller=caller.name if caller is not None else None, step="auth",
                                        client=request.remote))
            raise error
        ex = request.get(EXCHANGE_KEY)
        if ex is not None:
            ex.caller = caller
        return await handler(request)

    return api_keys
