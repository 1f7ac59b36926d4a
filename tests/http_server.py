"""A real `modelcall serve` app on loopback in a background thread, for the HTTP tests.

The server runs its own event loop (kernel + aiohttp, as `modelcall serve` does), so tests can
use the official synchronous SDKs or their own asyncio clients against it.
"""
from __future__ import annotations

import asyncio
import threading
from typing import Any

from aiohttp import web

from modelcall.core import Kernel
from modelcall.plugins.http.app import create_app
from modelcall.plugins.http.settings import ServerSettings


class ServerThread:
    def __init__(self, settings: ServerSettings | None = None, *, plugins: tuple = (), blocked: tuple = (), **kernel_fields: Any) -> None:
        self.settings = settings or ServerSettings(port=0)
        self.plugins = plugins
        self.blocked = blocked
        # NOTE: a 64 MB KV cache, not serve's 1 GB default (65,536 blocks of the demo model): zeroing 1 GB took
        # ~0.4 s of every server's start, and freeing it more; 64 MB still holds max_num_seqs x max_model_len here.
        self.kernel_fields = {"max_model_len": 256, "kv_cache_memory_gb": 1 / 16, **kernel_fields}
        self.kernel: Kernel | None = None
        self.port = 0
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, daemon=True, name="modelcall-test-server")

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ServerThread:
        self._thread.start()
        self._ready.wait(120)
        if self._error is not None:
            raise self._error
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)

    def call(self, fn: Any, *args: Any) -> Any:
        """Run `fn(*args)` on the server's loop (the kernel is not thread-safe) and return its result."""
        assert self._loop is not None
        async def go() -> Any:
            return fn(*args)
        return asyncio.run_coroutine_threadsafe(go(), self._loop).result(10)

    def stats(self) -> dict:
        assert self.kernel is not None
        return self.call(self.kernel.stats)

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as e:  # surfaced by __enter__
            self._error = e
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self.kernel = kernel = Kernel(plugins=self.plugins, blocked=self.blocked, **self.kernel_fields)
        async with kernel:
            while not kernel.ready:
                await asyncio.sleep(0.01)
            runner = web.AppRunner(create_app(kernel, self.settings), handler_cancellation=True, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.port = runner.addresses[0][1]
            self._ready.set()
            await self._stop.wait()
            await runner.cleanup()
