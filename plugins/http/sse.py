"""Server-sent events over an aiohttp StreamResponse: whole frames per write, optional keep-alive pings."""
from __future__ import annotations

import asyncio
import contextlib
import time

from aiohttp import web

from modelcall.core.metering import EXCHANGE_KEY

DONE = b"data: [DONE]\n\n"
STREAM: web.RequestKey[SSEWriter] = web.RequestKey("modelcall.sse", object)  # type: ignore[arg-type]


def data_frame(payload: bytes) -> bytes:
    return b"data: " + payload + b"\n\n"


def event_frame(name: bytes, payload: bytes) -> bytes:
    return b"event: " + name + b"\ndata: " + payload + b"\n\n"


class SSEWriter:
    """One SSE response. `send` writes frames in one transport write; a closed client raises
    ConnectionResetError, which the handler lets propagate so its request is aborted."""

    def __init__(self, request: web.Request) -> None:
        self.request = request
        self.response = web.StreamResponse(headers={
            "Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.last_write = time.monotonic()
        self._pinger: asyncio.Task | None = None

    async def prepare(self, headers: dict[str, str] | None = None) -> None:
        self.response.headers.update(headers or {})
        ex = self.request.get(EXCHANGE_KEY)
        if ex is not None:  # e.g. what a context policy dropped
            self.response.headers.update(ex.response_headers())
        await self.response.prepare(self.request)
        self.request[STREAM] = self  # the error middleware can still end a failed stream properly

    async def send(self, *frames: bytes) -> None:
        self.last_write = time.monotonic()
        await self.response.write(frames[0] if len(frames) == 1 else b"".join(frames))

    def start_pings(self, interval_s: float, frame: bytes) -> None:
        """Write `frame` whenever nothing was written for `interval_s` (proxies close idle streams)."""
        async def loop() -> None:
            while True:
                await asyncio.sleep(max(0.05, self.last_write + interval_s - time.monotonic()))
                if time.monotonic() - self.last_write >= interval_s:
                    await self.send(frame)
        self._pinger = asyncio.get_running_loop().create_task(loop())

    async def close(self) -> None:
        """Stop pinging and end the response (a gone client is not an error here)."""
        if self._pinger is not None:
            self._pinger.cancel()
            with contextlib.suppress(BaseException):
                await self._pinger
            self._pinger = None
        with contextlib.suppress(ConnectionError, RuntimeError):
            await self.response.write_eof()
