"""One JSON line per ended request on the `modelcall.requests` logger (or a file), written off the hot path.

    plugin_config = {"request_log": {"enabled": true, "path": null, "include_text": false}}

By default a line holds ids, caller name, model (and LoRA adapter), finish reason, usage and timings — never the
prompt, the output, tool arguments or anything from request headers. `include_text` adds the
output text and tool-call arguments (a per-deployment choice).
"""
from __future__ import annotations

import json
import logging
from typing import Any

from modelcall.core import hookimpl
from modelcall.events import Finished, OffloadedObserver, RequestAdmitted, RequestFailed, RequestRejected, ToolRequested

log = logging.getLogger("modelcall.requests")
NAME = "request_log"  # the key of this plugin's state in `kernel.plugin_state`: its OffloadedObserver


def settings(config: Any) -> dict[str, Any]:
    return dict((getattr(config, "plugin_config", None) or {}).get("request_log") or {})


def _ms(s: float | None) -> float | None:
    return None if s is None else round(s * 1000, 3)


class RequestLog:
    """Runs on the worker thread: keeps admission facts per request, writes a line when it ends."""

    def __init__(self, path: str | None, include_text: bool) -> None:
        self.include_text = include_text
        self.file = open(path, "a", buffering=1, encoding="utf-8") if path else None  # noqa: SIM115
        self.open: dict[str, dict[str, Any]] = {}

    def handle(self, ev: Any) -> None:
        kind = type(ev)
        if kind is RequestAdmitted:
            self.open[ev.request_id] = {"caller": ev.caller, "model": ev.model, "lora": ev.lora,
                                        "prompt_parts": ev.prompt_parts, "dropped_messages": ev.dropped_messages or None}
            return
        if kind is ToolRequested:
            rec = self.open.get(ev.request_id)
            if rec is not None:
                call = {"id": ev.call_id, "name": ev.name}
                if self.include_text:
                    call["arguments"] = ev.arguments
                rec.setdefault("tool_calls", []).append(call)
            return
        line: dict[str, Any] = {"event": "request", "request_id": ev.request_id, "task_id": ev.task_id}
        line.update({k: v for k, v in self.open.pop(ev.request_id, {}).items() if v is not None})
        if kind is Finished:
            t, u = ev.timings, ev.usage
            line.update(status=200, finish_reason=ev.reason, prompt_tokens=u.prompt_tokens,
                        cached_tokens=u.cached_tokens, completion_tokens=u.completion_tokens,
                        reasoning_tokens=u.reasoning_tokens, ttft_ms=_ms(t.ttft_s), queue_ms=_ms(t.queue_s),
                        prefill_ms=_ms(t.prefill_s), decode_ms=_ms(t.decode_s), e2e_ms=_ms(t.e2e_s))
            if self.include_text:
                line["output"] = ev.text
        elif kind is RequestFailed:
            line.update(status=500, finish_reason="error", error_type=ev.error_type)
        else:  # RequestRejected: the message may quote limits, never the prompt
            line.update(status=ev.status, finish_reason="rejected", error_type=ev.error_type)
            if ev.caller:
                line["caller"] = ev.caller
        text = json.dumps(line, separators=(",", ":"))
        if self.file is not None:
            self.file.write(text + "\n")
        else:
            log.info(text)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


@hookimpl(trylast=True)
def register_observers(register: Any, config: Any, kernel: Any) -> None:
    cfg = settings(config)
    if cfg.get("enabled", True) is False:
        return
    writer = RequestLog(cfg.get("path"), bool(cfg.get("include_text", False)))
    observer = OffloadedObserver(writer.handle, maxsize=int(cfg.get("queue", 10_000)), name="request_log")
    observer.writer = writer  # type: ignore[attr-defined]
    kernel.plugin_state[NAME] = observer
    register((RequestAdmitted, ToolRequested, Finished, RequestFailed, RequestRejected), observer, name="request_log")


def log_of(kernel: Any) -> OffloadedObserver | None:
    return kernel.plugin_state.get(NAME)


@hookimpl(trylast=True)
def shutdown(kernel: Any) -> None:
    observer = kernel.plugin_state.pop(NAME, None)
    if observer is not None:
        observer.close()
        observer.writer.close()  # type: ignore[attr-defined]
