"""The hosted tools of one kernel (`modelcall.core.tools.ServerToolbox`): Python tools from
plugins and the tools of the configured MCP servers, and the one way any of them is executed:
validate the arguments, authorize the caller, claim (tools that change the world), run under a
timeout, settle, and record ToolExecuted / ToolFailed with the duration measured around the tool."""
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import jsonschema

from modelcall.core.tools import ServerToolInfo, ToolOutcome
from modelcall.core.tools import Tool
from modelcall.events import ToolExecuted, ToolFailed
from modelcall.plugins.server_tools.claims import Claims

Runner = Callable[[dict[str, Any]], Awaitable[str]]
PREVIEW = 200


class Toolbox:
    def __init__(self, publish: Callable[[list[Any]], None], claims: Claims) -> None:
        self._publish = publish
        self.claims = claims
        self._tools: dict[str, tuple[ServerToolInfo, Runner]] = {}
        self._labels: list[str] = []

    # ---- registry ----------------------------------------------------------------------------

    def add(self, info: ServerToolInfo, run: Runner) -> None:
        if info.qualified in self._tools:
            raise ValueError(f"hosted tool {info.qualified!r} is registered twice")
        jsonschema.Draft202012Validator.check_schema(info.parameters)
        self._tools[info.qualified] = (info, run)
        if info.server_label not in self._labels:
            self._labels.append(info.server_label)

    def add_python(self, tool: Tool, server_label: str) -> None:
        """A typed Python tool (the agent runtime's `Tool`) hosted under `server_label`."""
        async def run(arguments: dict[str, Any]) -> str:
            if tool.is_async:
                value = await tool.fn(**arguments)
            else:
                # NOTE: a sync tool runs in a worker thread; on timeout the thread is abandoned, not killed
                value = await anyio.to_thread.run_sync(lambda: tool.fn(**arguments), abandon_on_cancel=True)
            return value if isinstance(value, str) else json.dumps(value, default=str)

        self.add(ServerToolInfo(server_label=server_label, name=tool.name, description=tool.description,
                                parameters=tool.parameters, changes_world=tool.changes_world,
                                timeout_s=tool.timeout_s), run)

    def tools(self) -> list[ServerToolInfo]:
        return [info for info, _ in self._tools.values()]

    def labels(self) -> list[str]:
        return list(self._labels)

    # ---- execution ---------------------------------------------------------------------------

    async def execute(self, info: ServerToolInfo, *, call_id: str, arguments: str, request_id: str,
                      task_id: str | None, idempotency_key: str, caller: Any = None) -> ToolOutcome:
        def failed(error: str, duration_s: float = 0.0) -> ToolOutcome:
            self._publish([ToolFailed(request_id=request_id, task_id=task_id, call_id=call_id, name=info.qualified,
                                      error=error, duration_s=duration_s)])
            return ToolOutcome(call_id=call_id, ok=False, error=error, duration_s=duration_s)

        entry = self._tools.get(info.qualified)
        if entry is None:
            return failed(f"no hosted tool named {info.qualified!r}")
        if caller is not None and caller.forbidden_tools([info.qualified]):
            return failed(f"refused: the key {caller.name!r} may not use {info.qualified}")
        try:
            args = json.loads(arguments or "{}")
            if not isinstance(args, dict):
                raise ValueError("the arguments are not a JSON object")
            jsonschema.validate(args, info.parameters)
        except (ValueError, jsonschema.ValidationError) as e:
            message = e.message if isinstance(e, jsonschema.ValidationError) else str(e)
            return failed(f"invalid arguments for {info.qualified}: {message}")
        if info.changes_world:
            record = self.claims.claim(idempotency_key, info.qualified, arguments)
            if record is not None:
                return self._replay(info, record, call_id, request_id, task_id)
        _, run = entry
        t0 = time.monotonic()
        try:
            with anyio.fail_after(info.timeout_s):
                output = await run(args)
        except TimeoutError:
            outcome = failed(f"{info.qualified} did not finish within its timeout of {info.timeout_s:g} s",
                             time.monotonic() - t0)
        except asyncio.CancelledError:
            raise  # the request went away: the claim stays "started" (outcome unknown), never rerun
        except Exception as e:  # noqa: BLE001 - the tool's own failure goes back to the model
            outcome = failed(f"{info.qualified} failed: {type(e).__name__}: {e}", time.monotonic() - t0)
        else:
            duration = time.monotonic() - t0
            self._publish([ToolExecuted(request_id=request_id, task_id=task_id, call_id=call_id, name=info.qualified,
                                        duration_s=duration, result_preview=output[:PREVIEW])])
            outcome = ToolOutcome(call_id=call_id, ok=True, output=output, duration_s=duration)
        if info.changes_world:
            self.claims.settle(idempotency_key, outcome.ok, outcome.output, outcome.error)
        return outcome

    def _replay(self, info: ServerToolInfo, record: dict[str, Any], call_id: str, request_id: str,
                task_id: str | None) -> ToolOutcome:
        """A world-changing call that ran before under this key: never again; tell what is known."""
        if record["state"] == "done":
            self._publish([ToolExecuted(request_id=request_id, task_id=task_id, call_id=call_id, name=info.qualified,
                                        duration_s=0.0, result_preview=(record["output"] or "")[:PREVIEW])])
            return ToolOutcome(call_id=call_id, ok=True, output=record["output"] or "", replayed=True)
        error = record["error"] if record["state"] == "failed" else (
            f"{info.qualified} was started before under this response and its outcome is unknown; "
            "it changes the world, so it is not run again")
        self._publish([ToolFailed(request_id=request_id, task_id=task_id, call_id=call_id, name=info.qualified,
                                  error=error)])
        return ToolOutcome(call_id=call_id, ok=False, error=error, replayed=True)
