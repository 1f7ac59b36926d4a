"""Server-hosted tools: Python tools from plugins (`register_server_tools`) and MCP servers (stdio and
streamable HTTP, through the official `mcp` SDK) configured by the operator, run inside one
request by the Responses API's provider-side loop. See docs/server-tools.md."""
