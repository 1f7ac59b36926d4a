"""Server-hosted tools: the contract between the front end that runs the provider-side tool loop
(the Responses API) and the plugin that hosts the tools (Python tools from plugins, MCP servers).

The front end never imports the hosting plugin: it finds the toolbox with `toolbox_of(kernel)`
and talks to it only through `ServerToolbox`. One request's loop is

    generate -> complete call -> toolbox.execute(...) -> result or explicit failure into the
    context -> generate again (up to max_tool_calls)

and everything between "complete call" and "result" (argument validation, authorization,
timeout, at-most-once for tools that change the world, the ToolExecuted / ToolFailed records
with durations measured where the tool ran) is the toolbox's job.
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import msgspec

TOOLBOX_KEY = "server_tools"  # the slot in `kernel.plugin_state` where the hosting plugin puts its toolbox
SEPARATOR = "__"              # model-facing names are `<server_label>__<tool>` (OpenAI names allow [A-Za-z0-9_-])


def qualified_name(server_label: str, tool: str) -> str:
    return f"{server_label}{SEPARATOR}{tool}"


class ServerToolInfo(msgspec.Struct, frozen=True, kw_only=True):
    """One hosted tool as the model and the client see it."""

    server_label: str            # the MCP server's label, or the label a plugin registered under
    name: str                    # the tool's own name on that server
    description: str = ""
    parameters: dict[str, Any] = msgspec.field(default_factory=lambda: {"type": "object", "properties": {}})
    changes_world: bool = False  # runs at most once per (response, call), across retries and resumes
    timeout_s: float = 30.0

    @property
    def qualified(self) -> str:
        return qualified_name(self.server_label, self.name)

    def openai(self) -> dict[str, Any]:
        """The function definition the chat template and the grammar get (the model-facing name)."""
        return {"type": "function", "function": {"name": self.qualified, "description": self.description,
                                                 "parameters": self.parameters}}


class ToolOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """What one execution gave: `output` on success, else `error` (fed back to the model as is)."""

    call_id: str
    ok: bool
    output: str = ""
    error: str | None = None
    duration_s: float = 0.0
    replayed: bool = False  # the call had run before under the same key: its recorded outcome, not a new run


@runtime_checkable
class ServerToolbox(Protocol):
    """The hosted tools of one kernel. Implemented by the plugin that hosts them."""

    def tools(self) -> list[ServerToolInfo]:
        """Every hosted tool (all servers), in a stable order."""
        ...

    def labels(self) -> list[str]:
        """The configured server labels (MCP servers and plugin tool groups)."""
        ...

    async def execute(self, info: ServerToolInfo, *, call_id: str, arguments: str, request_id: str,
                      task_id: str | None, idempotency_key: str, caller: Any = None) -> ToolOutcome:
        """Run one complete call and return its outcome; never raises for the tool's own failures.

        Promises: `arguments` is validated against `info.parameters` before anything runs (a
        refusal is an outcome with `error`); the call is authorized for `caller` (its `tools`);
        the tool runs under `info.timeout_s` (a hang is an outcome with `error`); a tool with
        `changes_world` runs at most once per `idempotency_key` — a second execute with the same
        key returns the recorded outcome (`replayed`) or, when the first run's outcome is
        unknown, an error saying so. Publishes ToolExecuted or ToolFailed on the kernel's bus
        with `request_id` (the model request that proposed the call) and the duration measured
        around the tool itself."""
        ...


def toolbox_of(kernel: Any) -> ServerToolbox | None:
    """The kernel's hosted tools, or None when no plugin hosts any."""
    state = getattr(kernel, "plugin_state", None) or {}
    box = state.get(TOOLBOX_KEY)
    return box if isinstance(box, ServerToolbox) else None
