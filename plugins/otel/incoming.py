"""What the front end knew about the HTTP exchange a request came from, for its span.

A middleware sets it for the handler's task; the RequestAdmitted observer, which runs inline in
`Kernel.submit` (so in that task), reads it. Reading a context variable costs tens of
nanoseconds; everything else (parsing the body, the traceparent) happens on the tracer's worker.
"""
from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple


class Incoming(NamedTuple):
    """The raw parts of one HTTP exchange; decoded only on the worker thread."""

    path: str
    traceparent: str | None
    tracestate: str | None
    host: str | None
    body: bytes


current: contextvars.ContextVar[Incoming | None] = contextvars.ContextVar("modelcall_otel_incoming", default=None)


def trace_middleware() -> Callable[..., Any]:
    from aiohttp import web  # only where served

    @web.middleware
    async def incoming(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                       ) -> web.StreamResponse:
        if request.method != "POST":
            return await handler(request)
        # NOTE: body_exists, not can_read_body: an outer middleware may have read (and cached) it already
        body = await request.read() if request.body_exists else b""
        h = request.headers
        token = current.set(Incoming(request.path, h.get("traceparent"), h.get("tracestate"), request.host, body))
        try:
            return await handler(request)
        finally:
            current.reset(token)

    return incoming
