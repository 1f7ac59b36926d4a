"""The server_tools plugin: at start-up, collect `register_server_tools` and connect the configured
MCP servers; the toolbox goes into `kernel.plugin_state[TOOLBOX_KEY]` for the front end's loop.

A plugin hosts a Python tool with

    @hookimpl
    def register_server_tools(register):
        register(get_time)                                  # a typed function (label "local")
        register(tool(write_note, changes_world=True), server_label="notes")
"""
from __future__ import annotations

import logging
from typing import Any

from modelcall.core import hookimpl
from modelcall.core.tools import TOOLBOX_KEY, ServerToolInfo
from modelcall.core.tools import Tool

log = logging.getLogger("modelcall.server_tools")
CONNECTIONS = "server_tools.connections"  # this plugin's own state: the open MCP connections


@hookimpl(trylast=True)
async def startup(kernel: Any) -> None:
    from modelcall.plugins.server_tools.claims import Claims
    from modelcall.plugins.server_tools.config import load
    from modelcall.plugins.server_tools.toolbox import Toolbox

    cfg = load(kernel.config.plugin_config)
    registered = list(kernel.host.collect("register_server_tools", config=kernel.config, kernel=kernel)) \
        if hasattr(kernel.host.pm.hook, "register_server_tools") else []
    if not cfg.servers and not registered:
        return
    box = Toolbox(kernel.bus.publish, Claims(cfg.claims_path))
    for _plugin, args, kw in registered:
        fn = args[0]
        label = kw.get("server_label") or (args[1] if len(args) > 1 else "local")
        box.add_python(fn if isinstance(fn, Tool) else Tool(fn), label)
    connections = []
    kernel.plugin_state[CONNECTIONS] = connections
    for server in cfg.servers:
        connections.append(await _connect(box, server))
    kernel.plugin_state[TOOLBOX_KEY] = box
    log.info("hosted tools: %s", ", ".join(t.qualified for t in box.tools()) or "none")


async def _connect(box: Any, server: Any) -> Any:
    from modelcall.plugins.server_tools.mcp_client import McpConnection

    conn = McpConnection(server)
    await conn.start()
    for t in conn.tools:
        schema = getattr(t, "input_schema", None) or getattr(t, "inputSchema", None) or {"type": "object"}
        schema = {"properties": {}, **schema}
        info = ServerToolInfo(server_label=server.label, name=t.name, description=t.description or "",
                              parameters=schema, changes_world=t.name in server.changes_world,
                              timeout_s=server.tool_timeouts.get(t.name, server.timeout_s))

        async def run(arguments: dict[str, Any], _name: str = t.name) -> str:
            return await conn.call(_name, arguments)

        box.add(info, run)
    return conn


@hookimpl(trylast=True)
async def shutdown(kernel: Any) -> None:
    for conn in kernel.plugin_state.pop(CONNECTIONS, None) or ():
        await conn.close()
    box = kernel.plugin_state.pop(TOOLBOX_KEY, None)
    if box is not None:
        box.claims.close()
