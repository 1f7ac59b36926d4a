"""Tool calls on the wire: request options to kernel arguments, the calls a client sends back as chat
templates read them, and rendering what the kernel decided: `TokensEmitted.tool_calls` deltas as OpenAI
`tool_calls` deltas and Anthropic `tool_use` blocks, and complete calls (`ToolRequested`) in whole
responses. Nothing here parses model output."""
from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
from aiohttp import web

from modelcall.events import ToolCallDelta, ToolRequested
from modelcall.plugins.http.errors import ApiError

TASK_HEADER = "x-modelcall-task-id"


def task_id_of(request: web.Request) -> str | None:
    """The task this request belongs to (an agent sends one id for all its model requests)."""
    task = request.headers.get(TASK_HEADER)
    if task is not None and not (0 < len(task) <= 128 and task.isprintable()):
        raise ApiError(400, f"{TASK_HEADER} must be 1 to 128 printable characters", param=TASK_HEADER)
    return task


def openai_options(body: Any) -> dict[str, Any]:
    """Kernel arguments for an OpenAI chat request's tool and format options."""
    choice = body.tool_choice
    return {"tool_choice": msgspec.to_builtins(choice) if choice is not None and not isinstance(choice, str) else choice,
            "parallel_tool_calls": body.parallel_tool_calls,
            "response_format": msgspec.to_builtins(body.response_format) if body.response_format is not None else None}


def template_call(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    """A call of an earlier assistant turn (chat, Responses or Anthropic input) as chat templates read
    it (HF conventions): `arguments` as an object, decoded when it is the JSON text of one; any other
    text is kept as it came, so a template that prints arguments shows what the model wrote."""
    if isinstance(arguments, str):
        try:
            value = json.loads(arguments)
        except ValueError:
            value = None
        arguments = value if isinstance(value, dict) else arguments
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def anthropic_options(body: Any) -> dict[str, Any]:
    """Kernel arguments for an Anthropic tool_choice: any -> required, tool -> a named function."""
    tc = body.tool_choice
    if tc is None:
        return {}
    if tc.type == "tool":
        if not tc.name:
            raise ApiError(400, "tool_choice type 'tool' needs a name", param="tool_choice.name")
        choice: Any = {"type": "function", "function": {"name": tc.name}}
    else:
        choice = {"any": "required"}.get(tc.type, tc.type)
    return {"tool_choice": choice, "parallel_tool_calls": False if tc.disable_parallel_tool_use else None}


class ToolCalls:
    """The complete calls of one response (its ToolRequested events), for whole responses."""

    __slots__ = ("calls",)

    def __init__(self) -> None:
        self.calls: list[dict[str, str]] = []

    def add(self, ev: ToolRequested) -> None:
        self.calls.append({"id": ev.call_id, "name": ev.name, "arguments": ev.arguments})

    def __bool__(self) -> bool:
        return bool(self.calls)


def openai_calls(calls: ToolCalls, make: Callable[..., Any], function: Callable[..., Any]) -> list[Any] | None:
    """Whole-response `message.tool_calls` built with the schema classes the caller passes."""
    return [make(id=c["id"], type="function", function=function(name=c["name"], arguments=c["arguments"]))
            for c in calls.calls] or None


def openai_deltas(deltas: Sequence[ToolCallDelta], make: Callable[..., Any]) -> list[Any]:
    """Streamed `delta.tool_calls`: id, type and name once per call, then argument fragments."""
    out = []
    for d in deltas:
        if d.name is not None:
            out.append(make(index=d.index, id=d.id, type="function", function={"name": d.name, "arguments": d.arguments}))
        else:
            out.append(make(index=d.index, function={"arguments": d.arguments}))
    return out


def anthropic_input(arguments: str) -> dict[str, Any]:
    value = json.loads(arguments) if arguments else {}
    return value if isinstance(value, dict) else {}


def anthropic_tool_frames(deltas: Sequence[ToolCallDelta], next_block: Callable[[], int],
                          frame: Callable[[str, dict], bytes], open_blocks: dict[int, int]) -> list[bytes]:
    """`tool_use` content blocks: start (id, name, empty input), `input_json_delta` fragments; the
    caller stops the open ones (`open_blocks`: call index -> block index) when the message ends."""
    out = []
    for d in deltas:
        if d.name is not None:
            for block in open_blocks.values():  # one block open at a time, as Anthropic streams
                out.append(frame("content_block_stop", {"type": "content_block_stop", "index": block}))
            open_blocks.clear()
            block = next_block()
            open_blocks[d.index] = block
            out.append(frame("content_block_start", {"type": "content_block_start", "index": block, "content_block": {
                "type": "tool_use", "id": d.id, "name": d.name, "input": {}}}))
        if d.arguments and d.index in open_blocks:
            out.append(frame("content_block_delta", {"type": "content_block_delta", "index": open_blocks[d.index],
                                                     "delta": {"type": "input_json_delta", "partial_json": d.arguments}}))
    return out
