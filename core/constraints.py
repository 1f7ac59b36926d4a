"""Constrained decoding, library-free: what a request asks the output to be (`ConstraintSpec`,
built from OpenAI-style `response_format` / `tool_choice`), and the contract of the plugin that
enforces it through `request.logits_processors` (a grammar engine lives in that plugin, never here).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import msgspec

from modelcall.core.errors import InvalidRequest
from modelcall.core.tools import ToolCallFormat

LogitsProcessor = Callable[[Sequence[int], Any], Any]
"""`fn(output_token_ids, logits_row) -> row | None`: may edit the row in place (see Request)."""


class ConstraintSpec(msgspec.Struct, frozen=True, gc=False):
    """What the output must be.

    kind "json": one JSON value valid against `schema` (`{"type": "object"}` for json_object).
    kind "tool_calls": between `min_calls` and `max_calls` (None: no limit) calls written in
    `call_format`, each naming one of `tools` (name -> parameters schema) with arguments valid
    against that tool's schema and holding only its declared parameters. A strict json schema
    closes objects the same way (OpenAI's strict mode).
    Whitespace between JSON tokens is fixed (one space after `:` and `,`), so a model cannot
    spend its budget on it, and strings never hold raw control characters.
    """

    kind: str
    schema: dict | None = None
    tools: tuple[tuple[str, dict], ...] = ()
    call_format: ToolCallFormat | None = None
    min_calls: int = 1
    max_calls: int | None = 1
    strict: bool = True  # objects hold only declared properties (forced tool arguments always do)


@runtime_checkable
class ConstraintBackend(Protocol):
    """Turns a ConstraintSpec into a logits processor. Provided by `provide_constraint_backend`.

    A backend may also have `observe(event)`: the kernel then subscribes it to `TokensEmitted`,
    `StepDone` and the terminal events, so it can advance each request's grammar as soon as a
    token is known and compute the next masks while the next forward pass runs.
    """

    name: str

    def logits_processor(self, spec: ConstraintSpec, request_id: str,
                         eos_token_ids: frozenset[int]) -> LogitsProcessor:
        """A fresh processor for one request. Raises InvalidRequest (naming the field) when the
        spec cannot be enforced, e.g. a schema keyword the engine does not support."""
        ...


def _function(tool: Any, i: int) -> tuple[str, dict]:
    fn = tool.get("function") if isinstance(tool, dict) and tool.get("type", "function") == "function" else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise InvalidRequest(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ..., "
                             f"'parameters': {{...}}}}}}", field="tools")
    params = fn.get("parameters")
    if params is None:
        params = {"type": "object", "properties": {}}
    if not isinstance(params, dict):
        raise InvalidRequest(f"tools[{i}].function.parameters must be a JSON Schema object", field="tools")
    return fn["name"], params


def tool_choice_name(tool_choice: Any) -> str | None:
    """The forced function's name of a named tool_choice, else None."""
    if isinstance(tool_choice, dict):
        fn = tool_choice.get("function")
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            return fn["name"]
        raise InvalidRequest("tool_choice must be 'none', 'auto', 'required' or "
                             "{'type': 'function', 'function': {'name': ...}}", field="tool_choice")
    if tool_choice not in (None, "none", "auto", "required"):
        raise InvalidRequest(f"tool_choice must be 'none', 'auto', 'required' or a named function, got {tool_choice!r}",
                             field="tool_choice")
    return None


def spec_for_tools(tools: list[dict] | None, tool_choice: Any, parallel_tool_calls: bool | None,
                   call_format: ToolCallFormat | None) -> ConstraintSpec | None:
    """The constraint `tool_choice` asks for: None for none/auto, calls otherwise."""
    forced = tool_choice_name(tool_choice)
    if tool_choice in (None, "none", "auto"):
        return None
    if not tools:
        raise InvalidRequest("tool_choice needs tools to choose from", field="tool_choice")
    funcs = [_function(t, i) for i, t in enumerate(tools)]
    if forced is not None:
        funcs = [f for f in funcs if f[0] == forced]
        if not funcs:
            raise InvalidRequest(f"tool_choice names {forced!r}, which is not in tools", field="tool_choice")
    if call_format is None:
        raise InvalidRequest("this model's tool-call format cannot be enforced (not JSON); use tool_choice 'auto'",
                             field="tool_choice")
    one = forced is not None or parallel_tool_calls is False
    return ConstraintSpec(kind="tool_calls", tools=tuple(funcs), call_format=call_format, max_calls=1 if one else None)


def spec_for_response_format(response_format: Any) -> ConstraintSpec | None:
    """The constraint an OpenAI `response_format` asks for (None for text)."""
    if response_format is None:
        return None
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return ConstraintSpec(kind="json", schema={"type": "object"}, strict=False)
    if kind == "json_schema":
        js = response_format.get("json_schema")
        schema = js.get("schema") if isinstance(js, dict) else None
        if not isinstance(schema, dict):
            raise InvalidRequest("response_format json_schema needs {'json_schema': {'name': ..., 'schema': {...}}}",
                                 field="response_format")
        return ConstraintSpec(kind="json", schema=schema, strict=js.get("strict") is True)
    raise InvalidRequest(f"response_format type must be text, json_object or json_schema, got {kind!r}",
                         field="response_format")
