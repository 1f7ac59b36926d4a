"""A live `modelcall serve` app on loopback, in the test's own event loop, with an aiohttp client."""
from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from modelcall.core import Kernel
from modelcall.testing.kernels import kernel_for_test


@dataclass
class LiveServer:
    kernel: Kernel
    url: str          # http://127.0.0.1:PORT
    client: Any       # an aiohttp.ClientSession whose base_url is `url`: `await client.get("/health")`


@asynccontextmanager
async def serve_kernel(kernel: Kernel) -> AsyncIterator[LiveServer]:
    """`kernel` (already started) served by the built-in HTTP front end on a free loopback port.

    Routes and middlewares come from the plugins' `register_routes` / `register_middlewares`,
    exactly as under `modelcall serve`.
    """
    from aiohttp import ClientSession, web

    from modelcall.plugins.http.app import create_app
    from modelcall.plugins.http.settings import ServerSettings

    runner = web.AppRunner(create_app(kernel, ServerSettings(port=0)), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        url = f"http://{host}:{port}"
        async with ClientSession(base_url=url) as client:
            yield LiveServer(kernel, url, client)
    finally:
        await runner.cleanup()


@asynccontextmanager
async def server_for_test(plugins: Iterable[Any] = (), **kwargs: Any) -> AsyncIterator[LiveServer]:
    """A started kernel (see `kernel_for_test`) served on a free loopback port (see `serve_kernel`)."""
    async with kernel_for_test(plugins, **kwargs) as kernel, serve_kernel(kernel) as server:
        yield server
