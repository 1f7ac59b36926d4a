"""One MCP server connection through the official `mcp` SDK: stdio (a child process) or streamable HTTP.

The SDK's client is an async context manager whose cancel scopes must be entered and left in one
task, so each connection lives in its own task for the kernel's lifetime; tool calls from request
handlers go through the open session.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from modelcall.core.errors import ConfigError
from modelcall.plugins.server_tools.config import ServerConfig

log = logging.getLogger("modelcall.server_tools")


class McpToolError(Exception):
    """The server answered the call with an error (isError), or the call could not be made."""


class McpConnection:
    def __init__(self, cfg: ServerConfig) -> None:
        self.cfg = cfg
        self.client: Any = None
        self.tools: list[Any] = []  # mcp Tool objects (name, description, inputSchema)
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._error: BaseException | None = None

    def _target(self) -> Any:
        if self.cfg.url is not None:
            return self.cfg.url
        from mcp import StdioServerParameters

        command = self.cfg.command or []
        return StdioServerParameters(command=command[0], args=command[1:], env=self.cfg.env, cwd=self.cfg.cwd)

    async def start(self) -> None:
        """Connect and list the server's tools; a server that cannot be reached is a ConfigError."""
        self._task = asyncio.get_running_loop().create_task(self._hold(), name=f"mcp:{self.cfg.label}")
        try:
            await asyncio.wait_for(self._ready.wait(), self.cfg.connect_timeout_s)
        except TimeoutError:
            await self.close(wait_s=0)
            raise ConfigError(f"MCP server {self.cfg.label!r} did not answer within {self.cfg.connect_timeout_s} s") \
                from None
        if self._error is not None:
            await self.close()
            raise ConfigError(f"MCP server {self.cfg.label!r} could not be started: "
                              f"{type(self._error).__name__}: {self._error}") from self._error

    async def _hold(self) -> None:
        from mcp import Client

        try:
            async with Client(self._target(), mode="legacy") as client:
                self.client = client
                listed = await client.list_tools()
                self.tools = list(listed.tools)
                self._ready.set()
                await self._stop.wait()
        except Exception as e:  # noqa: BLE001 - reported by start(), or logged when it drops later
            self._error = e
            if self._ready.is_set():
                log.error("MCP server %r connection ended: %s: %s", self.cfg.label, type(e).__name__, e)
        finally:
            self.client = None
            self._ready.set()

    async def call(self, name: str, arguments: dict[str, Any]) -> str:
        """The tool's text result; raises McpToolError for an error result or a lost connection."""
        client = self.client
        if client is None:
            raise McpToolError(f"MCP server {self.cfg.label!r} is not connected")
        result = await client.call_tool(name, arguments)
        text = "\n".join(getattr(c, "text", "") or "" for c in result.content or ())
        if not text and getattr(result, "structured_content", None) is not None:
            import json

            text = json.dumps(result.structured_content)
        if result.is_error:
            raise McpToolError(text or "the tool reported an error")
        return text

    async def close(self, wait_s: float = 10.0) -> None:
        """End the session (the child process exits); after `wait_s` the connection task is cancelled."""
        self._stop.set()
        task, self._task = self._task, None
        if task is not None:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(task, wait_s)  # NOTE: wait_for cancels the task when time is up
