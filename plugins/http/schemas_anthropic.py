"""Anthropic Messages API bodies as msgspec Structs (requests validated, responses and stream events encoded)."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

from modelcall.plugins.http.schemas_openai import INT32, PosInt, Seed

# ---- content blocks ---------------------------------------------------------------------------


class TextBlock(Struct, tag_field="type", tag="text", omit_defaults=True):
    text: str
    cache_control: dict[str, Any] | None = None


class ImageSource(Struct):
    type: str
    media_type: str | None = None
    data: str | None = None
    url: str | None = None


class ImageBlock(Struct, tag_field="type", tag="image"):
    source: ImageSource


class ToolUseBlock(Struct, tag_field="type", tag="tool_use"):
    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(Struct, tag_field="type", tag="tool_result", omit_defaults=True):
    tool_use_id: str
    content: str | list[TextBlock | ImageBlock] = ""
    is_error: bool = False


class ThinkingBlock(Struct, tag_field="type", tag="thinking"):
    thinking: str
    signature: str = ""


class RedactedThinkingBlock(Struct, tag_field="type", tag="redacted_thinking"):
    data: str


ContentBlock = TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock


class InputMessage(Struct):
    role: Literal["user", "assistant"]
    content: str | list[ContentBlock]


class AnthropicTool(Struct, omit_defaults=True):
    name: Annotated[str, Meta(min_length=1, max_length=256)]
    input_schema: dict[str, Any]
    description: str | None = None
    cache_control: dict[str, Any] | None = None


class ToolChoice(Struct, omit_defaults=True):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class ThinkingConfig(Struct, omit_defaults=True):
    type: Literal["enabled", "disabled"]
    budget_tokens: PosInt | None = None


class Metadata(Struct):
    user_id: Annotated[str, Meta(max_length=256)] | None = None


# ---- requests ---------------------------------------------------------------------------------

class MessagesRequest(Struct, kw_only=True):
    model: str
    messages: Annotated[list[InputMessage], Meta(min_length=1)]
    max_tokens: PosInt
    system: str | list[TextBlock] | None = None
    stop_sequences: Annotated[list[str], Meta(max_length=16)] | None = None
    stream: bool = False
    temperature: Annotated[float, Meta(ge=0.0, le=100.0)] | None = None
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Meta(ge=0, le=INT32)] | None = None
    metadata: Metadata | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    # modelcall extras (like the OpenAI routes' extra sampling fields)
    seed: Seed | None = None
    min_p: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    repetition_penalty: Annotated[float, Meta(gt=0.0, le=100.0)] | None = None


class CountTokensRequest(Struct, kw_only=True):
    model: str
    messages: Annotated[list[InputMessage], Meta(min_length=1)]
    system: str | list[TextBlock] | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None


# ---- responses ---------------------------------------------------------------------------------

class AnthropicUsage(Struct):
    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0


class OutText(Struct, tag_field="type", tag="text"):
    text: str


class OutThinking(Struct, tag_field="type", tag="thinking"):
    thinking: str
    signature: str = ""


class OutToolUse(Struct, tag_field="type", tag="tool_use"):
    id: str
    name: str
    input: dict[str, Any]


OutBlock = OutText | OutThinking | OutToolUse


class MessageResponse(Struct, tag_field="type", tag="message"):
    id: str
    model: str
    content: list[OutBlock]
    stop_reason: str | None
    stop_sequence: str | None
    usage: AnthropicUsage
    role: Literal["assistant"] = "assistant"


class CountTokensResponse(Struct):
    input_tokens: int


class AnthropicErrorDetail(Struct):
    type: str
    message: str


class AnthropicError(Struct, tag_field="type", tag="error"):
    error: AnthropicErrorDetail
