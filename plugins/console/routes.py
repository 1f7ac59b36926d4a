"""The console's HTTP routes: the static page and the `/-/events` server-sent-events feed."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

import msgspec
from aiohttp import web

from modelcall.core.errors import Unauthenticated
from modelcall.events import REQUEST_EVENTS, StepDone, to_json
from modelcall.plugins.console.hub import ANYONE, ConsoleHub, Viewer

_TYPES = frozenset(t.__name__ for t in (*REQUEST_EVENTS, StepDone))
_FILES = {"/console": ("console.html", "text/html"), "/console/console.js": ("console.js", "text/javascript"),
          "/console/console.css": ("console.css", "text/css")}
# NOTE: the page may talk to this server only: nothing is fetched from, or sent to, anywhere else.
_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
_HEARTBEAT_S = 1.0


def _read(name: str) -> bytes:
    return resources.files("modelcall.plugins.console").joinpath("static", name).read_bytes()


async def page(request: web.Request) -> web.Response:
    """The live console page (static files, no data)."""
    name, ctype = _FILES[request.path]
    return web.Response(body=_read(name), content_type=ctype,
                        headers={"Content-Security-Policy": _CSP, "Cache-Control": "no-cache",
                                 "X-Content-Type-Options": "nosniff"})


def open_page_middleware() -> Callable[..., Any]:
    @web.middleware
    async def console_page(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                           ) -> web.StreamResponse:
        if request.method == "GET" and request.path in _FILES:
            return await page(request)
        return await handler(request)

    return console_page


def caller_name(request: web.Request) -> tuple[bool, str | None]:
    """(known, name): the authenticated caller of this HTTP request, as the key check left it."""
    from modelcall.core import metering

    key = getattr(metering, "EXCHANGE_KEY", None)  # the entry contract: the caller is on request[EXCHANGE_KEY]
    ex = request.get(key) if key is not None else None
    caller = getattr(ex, "caller", None)
    if caller is None and hasattr(metering, "current_caller"):  # earlier front ends: a context variable
        caller = metering.current_caller()
    return caller is not None, getattr(caller, "name", None)


def routes(hub: ConsoleHub, kernel: Any, keys: bool) -> list[tuple[str, str, Any]]:
    async def events(request: web.Request) -> web.StreamResponse:
        """Server-sent events of this caller's requests and the engine's steps (the console's feed)."""
        known, name = caller_name(request)
        if keys and not known:  # NOTE: never fall back to showing everyone's requests
            raise Unauthenticated("a valid API key is required to read /-/events")
        wanted = request.query.get("types")
        types = None
        if wanted:
            types = frozenset(t.strip() for t in wanted.split(",") if t.strip())
            bad = sorted(types - _TYPES)
            if bad:
                from modelcall.core.errors import InvalidRequest

                raise InvalidRequest(f"unknown event type(s) {', '.join(bad)} in ?types=; known: "
                                     f"{', '.join(sorted(_TYPES))}")
        viewer = Viewer(name if keys else ANYONE, types)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                           "X-Accel-Buffering": "no"})
        await resp.prepare(request)
        hub.connect(viewer)
        try:
            await resp.write(_frame(b"snapshot", msgspec.json.encode(_snapshot(hub, kernel, viewer.caller))))
            await _pump(hub, kernel, viewer, resp)
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            hub.disconnect(viewer)
        return resp

    # NOTE: not in /openapi.json: an endless stream, which fuzzers and generated clients would wait on forever
    events.openapi = False  # type: ignore[attr-defined]
    return [("GET", "/console", page), ("GET", "/console/console.js", page), ("GET", "/console/console.css", page),
            ("GET", "/-/events", events)]


async def _pump(hub: ConsoleHub, kernel: Any, viewer: Viewer, resp: web.StreamResponse) -> None:
    # NOTE: a quiet second writes a comment line: aiohttp only learns that a client left when a write
    # fails, and a feed nobody reads must not hold a server's shutdown or drain.
    while not getattr(hub, "closed", False) and kernel.engine is not None and not kernel.draining:
        try:
            await asyncio.wait_for(viewer.wake.wait(), _HEARTBEAT_S)
        except TimeoutError:
            await resp.write(b":\n\n")
            continue
        viewer.wake.clear()
        q = viewer.queue
        frames = [b"data: " + to_json(q.popleft()) + b"\n\n" for _ in range(len(q))]
        if viewer.dropped:
            frames.append(_frame(b"dropped", str(viewer.dropped).encode()))
            viewer.dropped = 0
        await resp.write(b"".join(frames))


def _frame(event: bytes, data: bytes) -> bytes:
    return b"event: " + event + b"\ndata: " + data + b"\n\n"


def _snapshot(hub: ConsoleHub, kernel: Any, caller: Any) -> dict[str, Any]:
    from modelcall.events import now

    # NOTE: only the pool's use: the engine-wide prefix hit rate would tell one key about others' prompts;
    # the page computes the hit rate of the viewer's own requests from their events.
    stats = kernel.kv.stats() if kernel.engine is not None else {}
    kv = {k: stats[k] for k in ("usage", "num_blocks") if k in stats}
    return {"server_now": now(), "wall_now": time.time(), "model": kernel.model_name,
            "max_model_len": kernel.window, "kv": kv, **hub.snapshot(caller)}
