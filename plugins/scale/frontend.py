"""Front-end plugin of a replicated server (loaded by RemoteKernel only): appends every replica's
labelled series to the one /metrics."""
from __future__ import annotations

from typing import Any

from modelcall.core import hookimpl


@hookimpl
def register_middlewares(register: Any, kernel: Any) -> None:
    from aiohttp import web  # only where served

    series = getattr(kernel, "series", None)
    if series is None:
        return

    @web.middleware
    async def replica_metrics(request: web.Request, handler: Any) -> web.StreamResponse:
        response = await handler(request)
        if request.path == "/metrics" and isinstance(response, web.Response) and response.status == 200:
            gauges = await kernel.replica_stats()
            response.body = bytes(response.body or b"") + series.exposition(kernel.model_name, gauges)
        return response

    register(replica_metrics, order=50)
