"""Responses API input items: decode and check them, give them ids, and turn a conversation of items
into the chat messages a template renders (function calls and their outputs included).

Items are kept as plain dicts in the shape OpenAI returns them, so the store, `input_items` and
`previous_response_id` all read the same objects the client sent or received.
"""
from __future__ import annotations

import uuid
from typing import Any

from modelcall.core.tools import qualified_name
from modelcall.plugins.http.errors import ApiError
from modelcall.plugins.http.tool_calls import template_call

TEXT_PARTS = {"input_text", "output_text", "text", "summary_text", "reasoning_text"}
SKIPPED = {"mcp_list_tools", "mcp_approval_request", "mcp_approval_response"}  # carry no model context
ID_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs",
             "mcp_call": "mcp", "mcp_list_tools": "mcpl"}


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def normalize_input(raw: str | list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The request's input as items with ids: text becomes one user message; each item is checked."""
    if raw is None:
        return []
    if isinstance(raw, str):
        return [{"type": "message", "id": new_id("msg"), "role": "user", "status": "completed",
                 "content": [{"type": "input_text", "text": raw}]}]
    return [_check(item, i) for i, item in enumerate(raw)]


def _check(item: dict[str, Any], i: int) -> dict[str, Any]:
    where = f"input[{i}]"
    kind = item.get("type", "message")
    if not isinstance(kind, str):
        raise ApiError(400, f"{where}.type must be a string", param=f"{where}.type")
    out = {**item, "type": kind}
    if kind == "message":
        if out.get("role") not in ("user", "assistant", "system", "developer"):
            raise ApiError(400, f"{where}.role must be user, assistant, system or developer, got {out.get('role')!r}",
                           param=f"{where}.role")
        _text(out.get("content"), f"{where}.content")
    elif kind == "function_call":
        for name in ("call_id", "name", "arguments"):
            if not isinstance(out.get(name), str):
                raise ApiError(400, f"{where}.{name} must be a string (a function_call item needs call_id, name "
                                    "and arguments)", param=f"{where}.{name}")
    elif kind == "function_call_output":
        if not isinstance(out.get("call_id"), str):
            raise ApiError(400, f"{where}.call_id must be a string", param=f"{where}.call_id")
        _text(out.get("output"), f"{where}.output")
    elif kind == "reasoning":
        _reasoning_text(out, where)
    elif kind == "mcp_call":
        for name in ("server_label", "name"):
            if not isinstance(out.get(name), str):
                raise ApiError(400, f"{where}.{name} must be a string", param=f"{where}.{name}")
    elif kind == "item_reference":
        raise ApiError(400, f"{where}: item_reference is not supported; send the item itself or use "
                            "previous_response_id", param=f"{where}.type")
    elif kind not in SKIPPED:
        raise ApiError(400, f"{where}.type {kind!r} is not supported (message, function_call, function_call_output, "
                            "reasoning, mcp_call)", param=f"{where}.type")
    if not isinstance(out.get("id"), str):
        out["id"] = new_id(ID_PREFIX.get(kind, "item"))
    return out


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ApiError(400, f"{where} must be a string or a list of content parts", param=where)
    parts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in TEXT_PARTS:
            parts.append(str(part.get("text") or ""))
        elif kind == "refusal":
            parts.append(str(part.get("refusal") or ""))
        elif kind in ("input_image", "input_file", "input_audio"):
            raise ApiError(400, f"this model takes text only; {kind} content is not supported", param=f"{where}[{j}]")
        else:
            raise ApiError(400, f"{where}[{j}].type must be input_text or output_text, got {kind!r}",
                           param=f"{where}[{j}].type")
    return "".join(parts)


def _reasoning_text(item: dict[str, Any], where: str) -> str:
    content = item.get("content") or item.get("summary") or []
    return _text(content, f"{where}.content") if content else ""


def to_messages(items: list[dict[str, Any]], instructions: str | None) -> list[dict[str, Any]]:
    """The chat messages (HF template conventions) of a conversation of items.

    A reasoning item goes with the assistant turn that follows it; consecutive function calls
    become one assistant turn with several tool calls; hosted tool calls (mcp_call) become a
    call and its result, exactly as the model saw them when it ran."""
    msgs: list[dict[str, Any]] = []
    if instructions:
        msgs.append({"role": "system", "content": instructions})
    reasoning: str | None = None

    def assistant_for_call() -> dict[str, Any]:
        nonlocal reasoning
        last = msgs[-1] if msgs else None
        if last is not None and last["role"] == "assistant" and reasoning is None:
            last.setdefault("tool_calls", [])
            return last
        m: dict[str, Any] = {"role": "assistant", "content": "", "tool_calls": []}
        if reasoning:
            m["reasoning_content"] = reasoning
        reasoning = None
        msgs.append(m)
        return m

    for i, it in enumerate(items):
        kind = it["type"]
        if kind == "message":
            text = _text(it.get("content"), f"input[{i}].content")
            role = it["role"]
            if role in ("system", "developer"):
                msgs.append({"role": "system", "content": text})
            elif role == "assistant":
                m = {"role": "assistant", "content": text}
                if reasoning:
                    m["reasoning_content"] = reasoning
                reasoning = None
                msgs.append(m)
            else:
                msgs.append({"role": "user", "content": text})
        elif kind == "reasoning":
            reasoning = _reasoning_text(it, f"input[{i}]") or None
        elif kind == "function_call":
            assistant_for_call()["tool_calls"].append(template_call(it["call_id"], it["name"], it["arguments"]))
        elif kind == "function_call_output":
            msgs.append({"role": "tool", "tool_call_id": it["call_id"],
                         "content": _text(it.get("output"), f"input[{i}].output")})
        elif kind == "mcp_call":
            call_id = it["id"]
            assistant_for_call()["tool_calls"].append(
                template_call(call_id, qualified_name(it["server_label"], it["name"]), it.get("arguments") or "{}"))
            result = it.get("output") if it.get("error") is None else f"error: {it['error']}"
            msgs.append({"role": "tool", "tool_call_id": call_id, "content": result or ""})
    return msgs
