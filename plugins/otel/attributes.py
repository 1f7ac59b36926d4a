"""GenAI semantic-convention attributes of one model request (the current names, not vLLM's legacy ones).

Request parameters come from the HTTP body when there was one (what the client asked for);
an embedded request only has what `RequestAdmitted` says.
"""
from __future__ import annotations

import json
from typing import Any

import msgspec

from modelcall.events import Finished, RequestAdmitted

PROVIDER = "modelcall"
# route -> (gen_ai.operation.name, prefix of the response id the client sees)
ROUTES = {"/v1/chat/completions": ("chat", "chatcmpl-"), "/v1/completions": ("text_completion", "cmpl-"),
          "/v1/messages": ("chat", "msg_"), "/v1/responses": ("chat", "")}
_BODY_PARAMS = (("temperature", "gen_ai.request.temperature"), ("top_p", "gen_ai.request.top_p"),
                ("top_k", "gen_ai.request.top_k"), ("frequency_penalty", "gen_ai.request.frequency_penalty"),
                ("presence_penalty", "gen_ai.request.presence_penalty"), ("seed", "gen_ai.request.seed"))


def decode_body(raw: bytes) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        body = msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        return {}
    return body if isinstance(body, dict) else {}


def operation(path: str | None, admitted: RequestAdmitted) -> tuple[str, str]:
    """(operation name, response-id prefix); embedded chat requests are known by their prompt parts."""
    if path in ROUTES:
        return ROUTES[path]
    return ("chat" if admitted.prompt_parts is not None else "text_completion"), ""


def request_attributes(admitted: RequestAdmitted, body: dict[str, Any], op: str) -> dict[str, Any]:
    model = body.get("model") if isinstance(body.get("model"), str) else admitted.model
    max_tokens = next((body[k] for k in ("max_completion_tokens", "max_tokens", "max_output_tokens")
                       if isinstance(body.get(k), int)), admitted.max_tokens)
    attrs: dict[str, Any] = {"gen_ai.operation.name": op, "gen_ai.provider.name": PROVIDER,
                             "gen_ai.request.model": model, "gen_ai.request.max_tokens": max_tokens,
                             "gen_ai.response.model": admitted.model}
    for field, name in _BODY_PARAMS:
        v = body.get(field)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            attrs[name] = v
    stop = body.get("stop", body.get("stop_sequences"))
    if isinstance(stop, str):
        stop = [stop]
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop) and stop:
        attrs["gen_ai.request.stop_sequences"] = stop
    if admitted.task_id:
        attrs["gen_ai.conversation.id"] = admitted.task_id
    if admitted.caller:
        attrs["modelcall.caller"] = admitted.caller
    attrs["modelcall.request_id"] = admitted.request_id
    attrs["modelcall.prompt_tokens"] = admitted.prompt_tokens
    if admitted.lora:
        attrs["modelcall.lora"] = admitted.lora
    return attrs


def server_attributes(host: str | None) -> dict[str, Any]:
    """`server.address` / `server.port` from the Host header the client used."""
    if not host:
        return {}
    name, sep, port = host.rpartition(":")
    if sep and port.isdigit() and (":" not in name or name.endswith("]")):
        return {"server.address": name.strip("[]"), "server.port": int(port)}
    return {"server.address": host.strip("[]")}


def finished_attributes(ev: Finished, response_id: str) -> dict[str, Any]:
    u = ev.usage
    return {"gen_ai.response.id": response_id, "gen_ai.response.finish_reasons": [ev.reason],
            "gen_ai.usage.input_tokens": u.prompt_tokens, "gen_ai.usage.output_tokens": u.completion_tokens,
            "gen_ai.usage.cache_read.input_tokens": u.cached_tokens,
            "gen_ai.usage.reasoning.output_tokens": u.reasoning_tokens}


def input_messages(body: dict[str, Any]) -> str | None:
    """`gen_ai.input.messages` (opt-in): the prompt as role + text parts, JSON-encoded."""
    msgs = body.get("messages")
    if isinstance(msgs, list):
        out = []
        for m in msgs:
            if isinstance(m, dict):
                out.append({"role": m.get("role"), "parts": [{"type": "text", "content": _text(m.get("content"))}]})
        return json.dumps(out, ensure_ascii=False)
    prompt = body.get("prompt", body.get("input"))
    if isinstance(prompt, str):
        return json.dumps([{"role": "user", "parts": [{"type": "text", "content": prompt}]}], ensure_ascii=False)
    return None


def output_messages(ev: Finished) -> str:
    """`gen_ai.output.messages` (opt-in): the generated text and its finish reason."""
    return json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": ev.text}],
                        "finish_reason": ev.reason}], ensure_ascii=False)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""
