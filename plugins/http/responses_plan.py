"""What one POST /v1/responses asks for, decided before any compute: the conversation, the tools
offered (the client's functions and the hosted tools this request enables), tool choice, output
format and sampling. Every refusal is a 4xx naming the field."""
from __future__ import annotations

import hashlib
from typing import Any

import msgspec

from modelcall.core.errors import PermissionDenied
from modelcall.core.metering import Caller
from modelcall.core.tools import ServerToolbox, ServerToolInfo
from modelcall.plugins.http.errors import ApiError
from modelcall.plugins.http.openai_common import sampling_fields
from modelcall.plugins.http.responses_items import new_id, normalize_input, to_messages
from modelcall.plugins.http.schemas_responses import (
    AllowedToolsChoice, FunctionTool, McpTool, McpToolFilter, NamedFunctionChoice, NamedMcpChoice, ResponsesRequest,
    ServerToolRef,
)

DEFAULT_MAX_TOOL_CALLS = 8  # hosted calls one response may run when the request names no max_tool_calls


class Plan(msgspec.Struct, kw_only=True):
    response_id: str
    input: list[dict[str, Any]]
    history: list[dict[str, Any]]
    messages: list[dict[str, Any]]
    functions: list[dict[str, Any]]             # the client's function tools, chat-shaped
    hosted: dict[str, ServerToolInfo]           # qualified name -> hosted tool enabled for this request
    tool_choice: Any
    parallel_tool_calls: bool | None
    response_format: dict[str, Any] | None
    fields: dict[str, Any]                      # SamplingParams fields (max_tokens: the whole response's budget)
    max_tool_calls: int
    list_labels: list[str] = []                 # MCP servers to list (an mcp_list_tools item) before the first pass

    @property
    def forced(self) -> bool:
        return self.tool_choice not in (None, "auto", "none")


def response_id_for(owner: str, idempotency_key: str | None) -> str:
    """A fresh id, or one derived from the client's Idempotency-Key (a retry is the same response,
    so hosted tools that change the world are not run twice)."""
    if not idempotency_key:
        return new_id("resp")
    return "resp_" + hashlib.sha256(f"{owner}\0{idempotency_key}".encode()).hexdigest()[:32]


def plan_of(body: ResponsesRequest, response_id: str, history: list[dict[str, Any]],
            toolbox: ServerToolbox | None, caller: Caller | None) -> Plan:
    items = normalize_input(body.input)
    if not items and not history:
        raise ApiError(400, "input is required (text or a list of items)", param="input")
    functions, hosted, mcp_labels = _tools(body, toolbox, caller)
    listed = {it.get("server_label") for it in history if it.get("type") == "mcp_list_tools"}
    choice = _choice(body.tool_choice, functions, hosted)
    fmt = body.text.format if body.text is not None else None
    response_format = None
    if fmt is not None and fmt.type == "json_schema":
        if fmt.schema is None:
            raise ApiError(400, "text.format json_schema needs a schema", param="text.format.schema")
        response_format = {"type": "json_schema", "json_schema": {"name": fmt.name or "response", "schema": fmt.schema,
                                                                  "strict": fmt.strict}}
    elif fmt is not None and fmt.type == "json_object":
        response_format = {"type": "json_object"}
    return Plan(response_id=response_id, input=items, history=history,
                messages=to_messages([*history, *items], body.instructions), functions=functions, hosted=hosted,
                tool_choice=choice, parallel_tool_calls=body.parallel_tool_calls, response_format=response_format,
                fields=sampling_fields(_NoStops(body), max_tokens=body.max_output_tokens, logprobs=None),
                max_tool_calls=body.max_tool_calls or DEFAULT_MAX_TOOL_CALLS,
                list_labels=[label for label in mcp_labels if label not in listed])


def _tools(body: ResponsesRequest, toolbox: ServerToolbox | None, caller: Caller | None
           ) -> tuple[list[dict[str, Any]], dict[str, ServerToolInfo], list[str]]:
    functions: list[dict[str, Any]] = []
    hosted: dict[str, ServerToolInfo] = {}
    mcp_labels: list[str] = []
    available = {t.qualified: t for t in toolbox.tools()} if toolbox is not None else {}
    labels = set(toolbox.labels()) if toolbox is not None else set()
    for i, t in enumerate(body.tools or ()):
        if type(t) is FunctionTool:
            fn: dict[str, Any] = {"name": t.name, "description": t.description or "",
                                  "parameters": t.parameters or {"type": "object", "properties": {}}}
            functions.append({"type": "function", "function": fn})
        elif type(t) is McpTool:
            if t.server_label not in labels:
                raise ApiError(400, f"no MCP server labelled {t.server_label!r} is configured on this server "
                                    f"(configured: {sorted(labels) or 'none'}; see modelcall serve --tools-config)",
                               param=f"tools[{i}].server_label")
            if t.require_approval not in (None, "never"):
                raise ApiError(400, "approvals are not supported: send require_approval 'never'",
                               param=f"tools[{i}].require_approval")
            allowed = t.allowed_tools.tool_names if isinstance(t.allowed_tools, McpToolFilter) else t.allowed_tools
            mcp_labels.append(t.server_label)
            of_server = {x.name: x for x in available.values() if x.server_label == t.server_label}
            for name in allowed if allowed is not None else sorted(of_server):
                if name not in of_server:
                    raise ApiError(400, f"MCP server {t.server_label!r} has no tool {name!r} "
                                        f"(it has: {sorted(of_server)})", param=f"tools[{i}].allowed_tools")
                hosted[of_server[name].qualified] = of_server[name]
        elif type(t) is ServerToolRef:
            if t.name not in available:
                raise ApiError(400, f"no hosted tool named {t.name!r} (have: {sorted(available)})",
                               param=f"tools[{i}].name")
            hosted[t.name] = available[t.name]
    clash = sorted({f["function"]["name"] for f in functions} & hosted.keys())
    if clash:
        raise ApiError(400, f"function tool names {clash} clash with hosted tools", param="tools")
    if caller is not None:
        bad = caller.forbidden_tools(sorted(hosted))
        if bad:
            raise PermissionDenied(f"the key {caller.name!r} may not use tool(s) {', '.join(bad)}", field="tools")
    return functions, hosted, mcp_labels


def _choice(choice: Any, functions: list[dict[str, Any]], hosted: dict[str, ServerToolInfo]) -> Any:
    names = {f["function"]["name"] for f in functions} | hosted.keys()
    if choice is None or isinstance(choice, str):
        if choice in ("required",) and not names:
            raise ApiError(400, "tool_choice 'required' needs at least one tool", param="tool_choice")
        return choice
    if type(choice) is NamedFunctionChoice:
        if choice.name not in names:
            raise ApiError(400, f"tool_choice names {choice.name!r}, which is not among the tools", param="tool_choice")
        return {"type": "function", "function": {"name": choice.name}}
    if type(choice) is NamedMcpChoice:
        of_server = sorted(n for n, t in hosted.items() if t.server_label == choice.server_label)
        if choice.name is None:
            if not of_server:
                raise ApiError(400, f"tool_choice names MCP server {choice.server_label!r}, which the request does "
                                    "not enable", param="tool_choice")
            return {"type": "function", "function": {"name": of_server[0]}} if len(of_server) == 1 else "required"
        q = next((n for n in of_server if hosted[n].name == choice.name), None)
        if q is None:
            raise ApiError(400, f"tool_choice names {choice.server_label}/{choice.name}, which the request does "
                                "not enable", param="tool_choice")
        return {"type": "function", "function": {"name": q}}
    if type(choice) is AllowedToolsChoice:
        return choice.mode
    return choice


class _NoStops:
    """A Responses body as chat's sampling helper reads it (the Responses API has no stop or logit_bias)."""

    def __init__(self, body: ResponsesRequest) -> None:
        self._body = body

    def __getattr__(self, name: str) -> Any:
        return None if name in ("stop", "logit_bias") else getattr(self._body, name)
