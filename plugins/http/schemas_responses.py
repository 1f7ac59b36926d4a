"""OpenAI Responses API request bodies as msgspec Structs (POST /v1/responses).

Unknown fields are ignored (clients send newer fields than we know); every field we read is
typed and bounded, so bad input is a 400 naming the field. Input items are decoded one by one in
`responses_items` (an easy message may omit its `type`, which a tagged union cannot express).
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

from modelcall.plugins.http.schemas_openai import KernelSampling, Penalty, PosInt, Seed, Temperature, TopP

encoder = msgspec.json.Encoder()


# ---- tools ------------------------------------------------------------------------------------

class FunctionTool(Struct, tag_field="type", tag="function", omit_defaults=True):
    name: Annotated[str, Meta(min_length=1, max_length=256)]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class McpToolFilter(Struct):
    tool_names: list[str] | None = None
    read_only: bool | None = None


class McpTool(Struct, tag_field="type", tag="mcp", omit_defaults=True):
    """A server-hosted MCP server the operator configured (`server_url` is never connected to)."""

    server_label: Annotated[str, Meta(min_length=1, max_length=64)]
    server_url: str | None = None
    allowed_tools: list[str] | McpToolFilter | None = None
    require_approval: Any = None
    server_description: str | None = None
    headers: dict[str, str] | None = None


class ServerToolRef(Struct, tag_field="type", tag="server_tool", omit_defaults=True):
    """A hosted tool enabled by its qualified name (`<server_label>__<tool>`)."""

    name: Annotated[str, Meta(min_length=1, max_length=256)]


RequestTool = FunctionTool | McpTool | ServerToolRef


class NamedFunctionChoice(Struct, tag_field="type", tag="function"):
    name: str


class NamedMcpChoice(Struct, tag_field="type", tag="mcp"):
    server_label: str
    name: str | None = None


class AllowedToolsChoice(Struct, tag_field="type", tag="allowed_tools"):
    mode: Literal["auto", "required"] = "auto"
    tools: list[dict[str, Any]] = []


ToolChoice = Literal["none", "auto", "required"] | NamedFunctionChoice | NamedMcpChoice | AllowedToolsChoice


# ---- text format and reasoning ----------------------------------------------------------------

class TextFormat(Struct, omit_defaults=True):
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str | None = None
    schema: dict[str, Any] | None = None
    description: str | None = None
    strict: bool | None = None


class TextOptions(Struct, omit_defaults=True):
    format: TextFormat | None = None
    verbosity: str | None = None


class ReasoningOptions(Struct, omit_defaults=True):
    effort: str | None = None
    summary: str | None = None
    generate_summary: str | None = None


# ---- the request ------------------------------------------------------------------------------

class ResponsesRequest(KernelSampling, kw_only=True):
    input: str | Annotated[list[dict[str, Any]], Meta(max_length=4096)] | None = None
    model: str | None = None
    instructions: str | None = None
    tools: Annotated[list[RequestTool], Meta(max_length=256)] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    max_tool_calls: Annotated[int, Meta(ge=1, le=64)] | None = None
    text: TextOptions | None = None
    reasoning: ReasoningOptions | None = None
    max_output_tokens: PosInt | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    seed: Seed | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    stream: bool = False
    store: bool = True
    background: bool = False
    previous_response_id: Annotated[str, Meta(max_length=128)] | None = None
    metadata: Annotated[dict[str, str], Meta(max_length=16)] | None = None
    include: list[str] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    user: Annotated[str, Meta(max_length=256)] | None = None
