"""OpenAI request and response bodies as msgspec Structs: decoding validates, the OpenAPI document is generated.

Request structs ignore unknown fields (clients send newer fields than we know), but every field
we read is typed and bounded, so bad input is a 400 that names the field.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct, field

INT32 = 2**31 - 1
PosInt = Annotated[int, Meta(ge=1, le=INT32)]
NonNegInt = Annotated[int, Meta(ge=0, le=INT32)]
Seed = Annotated[int, Meta(ge=0, le=2**63 - 1)]
Temperature = Annotated[float, Meta(ge=0.0, le=100.0)]
TopP = Annotated[float, Meta(gt=0.0, le=1.0)]
Penalty = Annotated[float, Meta(ge=-2.0, le=2.0)]
Choices = Annotated[int, Meta(ge=1, le=64, description="how many completions to generate")]
TopLogprobs = Annotated[int, Meta(ge=0, le=20)]
Stop = str | Annotated[list[str], Meta(max_length=16)] | None
TokenId = Annotated[int, Meta(ge=0, le=INT32)]


# ---- messages -------------------------------------------------------------------------------

class TextPart(Struct, tag_field="type", tag="text"):
    text: str


class ImageUrl(Struct):
    url: str
    detail: str | None = None


class ImagePart(Struct, tag_field="type", tag="image_url"):
    image_url: ImageUrl


class RefusalPart(Struct, tag_field="type", tag="refusal"):
    refusal: str


class FunctionCall(Struct):
    name: str
    arguments: str


class ToolCall(Struct):
    id: str
    function: FunctionCall
    type: Literal["function"] = "function"


class SystemMessage(Struct, tag_field="role", tag="system"):
    content: str | list[TextPart]
    name: str | None = None


class DeveloperMessage(Struct, tag_field="role", tag="developer"):
    content: str | list[TextPart]
    name: str | None = None


class UserMessage(Struct, tag_field="role", tag="user"):
    content: str | list[TextPart | ImagePart]
    name: str | None = None


class AssistantMessage(Struct, tag_field="role", tag="assistant"):
    content: str | list[TextPart | RefusalPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    reasoning_content: str | None = None


class ToolMessage(Struct, tag_field="role", tag="tool"):
    content: str | list[TextPart]
    tool_call_id: str


Message = SystemMessage | DeveloperMessage | UserMessage | AssistantMessage | ToolMessage


# ---- tools ------------------------------------------------------------------------------------

class FunctionDef(Struct, omit_defaults=True):
    name: Annotated[str, Meta(min_length=1, max_length=256)]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(Struct):
    function: FunctionDef
    type: Literal["function"] = "function"


class NamedFunction(Struct):
    name: str


class NamedToolChoice(Struct):
    function: NamedFunction
    type: Literal["function"] = "function"


class ResponseFormat(Struct):
    type: Literal["text", "json_object", "json_schema"] = "text"
    json_schema: dict[str, Any] | None = None


class StreamOptions(Struct):
    include_usage: bool = False
    continuous_usage_stats: bool = False


# ---- requests ---------------------------------------------------------------------------------

class KernelSampling(Struct, kw_only=True):
    """Sampling fields beyond OpenAI's, accepted as extra body fields like vLLM does."""

    top_k: Annotated[int, Meta(ge=-1, le=INT32)] | None = None
    min_p: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    repetition_penalty: Annotated[float, Meta(gt=0.0, le=100.0)] | None = None
    min_tokens: NonNegInt | None = None
    ignore_eos: bool | None = None
    stop_token_ids: Annotated[list[TokenId], Meta(max_length=64)] | None = None
    include_stop_str_in_output: bool | None = None
    skip_special_tokens: bool | None = None
    prompt_logprobs: TopLogprobs | None = None  # vLLM's: logprobs of the prompt tokens, N alternatives each
    priority: Annotated[int, Meta(ge=-(2**31), le=INT32)] = 0
    cache_salt: Annotated[str, Meta(max_length=256)] | None = None


class ChatCompletionRequest(KernelSampling, kw_only=True):
    messages: Annotated[list[Message], Meta(min_length=1)]
    model: str | None = None
    max_tokens: PosInt | None = None
    max_completion_tokens: PosInt | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    n: Choices = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: Stop = None
    seed: Seed | None = None
    logprobs: bool = False
    top_logprobs: TopLogprobs | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    logit_bias: dict[str, float] | None = None
    user: Annotated[str, Meta(max_length=256)] | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class CompletionRequest(KernelSampling, kw_only=True):
    prompt: str | Annotated[list[str | TokenId | list[TokenId]], Meta(min_length=1)]
    model: str | None = None
    max_tokens: NonNegInt | None = 16  # 0 with echo: score the prompt, generate nothing
    temperature: Temperature | None = None
    top_p: TopP | None = None
    n: Choices = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: Stop = None
    seed: Seed | None = None
    logprobs: TopLogprobs | None = None
    echo: bool = False
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    logit_bias: dict[str, float] | None = None
    best_of: Choices | None = None
    suffix: str | None = None
    user: Annotated[str, Meta(max_length=256)] | None = None


# ---- responses --------------------------------------------------------------------------------

class PromptTokensDetails(Struct):
    cached_tokens: int = 0


class CompletionTokensDetails(Struct):
    reasoning_tokens: int = 0


class UsageInfo(Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails = field(default_factory=PromptTokensDetails)
    completion_tokens_details: CompletionTokensDetails = field(default_factory=CompletionTokensDetails)


class TopLogprob(Struct):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprobInfo(Struct):
    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(Struct):
    content: list[TokenLogprobInfo] | None


class ChatMessage(Struct, omit_defaults=True, kw_only=True):
    role: Literal["assistant"]  # no default: omit_defaults would drop it
    content: str | None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None


class ChatChoice(Struct):
    index: int
    message: ChatMessage
    finish_reason: str | None
    logprobs: ChoiceLogprobs | None = None


class ChatCompletion(Struct):
    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo
    object: Literal["chat.completion"] = "chat.completion"
    prompt_logprobs: PromptLogprobsList | None = None


class ToolCallDelta(Struct, omit_defaults=True):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: dict[str, str] | None = None


class ChatDelta(Struct, omit_defaults=True):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(Struct, omit_defaults=True):
    index: int
    delta: ChatDelta
    finish_reason: str | None  # required, so null is written out on every delta chunk
    logprobs: ChoiceLogprobs | None = None


class ChatCompletionChunk(Struct):
    id: str
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: UsageInfo | None = None
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"


class CompletionLogprobs(Struct):
    tokens: list[str]
    token_logprobs: list[float | None]  # None for the first prompt token with echo (it has no context)
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class PromptLogprob(Struct):
    """vLLM's prompt_logprobs entry: one token's logprob, its rank (1: most likely) and its text."""

    logprob: float
    rank: int | None
    decoded_token: str


PromptLogprobsList = list[dict[str, PromptLogprob] | None]  # per prompt token, keyed by token id; first None


class CompletionChoice(Struct):
    index: int
    text: str
    finish_reason: str | None
    logprobs: CompletionLogprobs | None = None
    prompt_logprobs: PromptLogprobsList | None = None


class Completion(Struct):
    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None
    object: Literal["text_completion"] = "text_completion"


class ModelCard(Struct):
    id: str
    created: int
    owned_by: str = "modelcall"
    max_model_len: int | None = None
    object: Literal["model"] = "model"
    task: str | None = None   # "generate", "embed" (an embedding model) or "generate,embed"
    parent: str | None = None   # a LoRA adapter's base model (vLLM's field); None: a base model
    root: str | None = None     # a LoRA adapter's directory (vLLM's field)


class ModelList(Struct):
    data: list[ModelCard]
    object: Literal["list"] = "list"


class ErrorDetail(Struct):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(Struct):
    error: ErrorDetail


encoder = msgspec.json.Encoder()
