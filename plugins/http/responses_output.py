"""The output of one Response, built once from the kernel's events: the output items and, in the same
step, the streaming events with OpenAI's names, order and `sequence_number`.

The whole answer and the stream come from this one builder, so item ids, call ids and text are
the same in the stream and in the final response (a non-streamed answer just drops the events).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from modelcall.core.tools import ServerToolInfo, ToolOutcome
from modelcall.events import ToolCallDelta
from modelcall.plugins.http.responses_items import new_id


class OutputBuilder:
    """Output items of one response and the events that announce them.

    `hosted(name)` tells a server-hosted tool (rendered as an `mcp_call` item the server runs)
    from a client's function (a `function_call` item the client runs)."""

    def __init__(self, hosted: Callable[[str], ServerToolInfo | None] = lambda _n: None) -> None:
        self.hosted = hosted
        self.items: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.seq = 0
        self._open: dict[str, Any] | None = None   # the reasoning or message item text is streaming into
        self._calls: dict[int, dict[str, Any]] = {}  # this pass's call index -> its item

    # ---- events --------------------------------------------------------------------------------

    def emit(self, kind: str, **fields: Any) -> dict[str, Any]:
        ev = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        self.events.append(ev)
        return ev

    def take_events(self) -> list[dict[str, Any]]:
        out, self.events = self.events, []
        return out

    # ---- text ----------------------------------------------------------------------------------

    def reasoning(self, text: str) -> None:
        if text:
            self._delta("reasoning", text)

    def text(self, text: str) -> None:
        if text:
            self._delta("message", text)

    def _delta(self, kind: str, text: str) -> None:
        item = self._open
        if item is None or item["type"] != kind:
            self.close_text()
            item = self._open_text(kind)
        idx = self.items.index(item)
        if kind == "message":
            item["content"][0]["text"] += text
            self.emit("response.output_text.delta", item_id=item["id"], output_index=idx, content_index=0,
                      delta=text, logprobs=[])
        else:
            item["content"][0]["text"] += text
            self.emit("response.reasoning_text.delta", item_id=item["id"], output_index=idx, content_index=0,
                      delta=text)

    def _open_text(self, kind: str) -> dict[str, Any]:
        if kind == "message":
            item: dict[str, Any] = {"type": "message", "id": new_id("msg"), "role": "assistant",
                                    "status": "in_progress", "content": []}
            part: dict[str, Any] = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        else:
            item = {"type": "reasoning", "id": new_id("rs"), "summary": [], "content": [], "status": "in_progress"}
            part = {"type": "reasoning_text", "text": ""}
        self.items.append(item)
        idx = len(self.items) - 1
        self.emit("response.output_item.added", output_index=idx, item=_copy(item))
        item["content"].append(part)
        self.emit("response.content_part.added", item_id=item["id"], output_index=idx, content_index=0,
                  part=dict(part, text=""))
        self._open = item
        return item

    def close_text(self, status: str = "completed") -> None:
        item, self._open = self._open, None
        if item is None:
            return
        idx = self.items.index(item)
        part = item["content"][0]
        if item["type"] == "message":
            self.emit("response.output_text.done", item_id=item["id"], output_index=idx, content_index=0,
                      text=part["text"], logprobs=[])
        else:
            self.emit("response.reasoning_text.done", item_id=item["id"], output_index=idx, content_index=0,
                      text=part["text"])
        self.emit("response.content_part.done", item_id=item["id"], output_index=idx, content_index=0,
                  part=dict(part))
        item["status"] = status
        self.emit("response.output_item.done", output_index=idx, item=_copy(item))

    # ---- tool calls ----------------------------------------------------------------------------

    def list_tools(self, label: str, tools: Sequence[ServerToolInfo]) -> None:
        """An `mcp_list_tools` item: what the model is offered from one MCP server (as OpenAI lists them)."""
        item: dict[str, Any] = {"type": "mcp_list_tools", "id": new_id("mcpl"), "server_label": label, "tools": [],
                                "error": None}
        self.items.append(item)
        idx = len(self.items) - 1
        self.emit("response.output_item.added", output_index=idx, item=_copy(item))
        self.emit("response.mcp_list_tools.in_progress", item_id=item["id"], output_index=idx)
        item["tools"] = [{"name": t.name, "description": t.description, "input_schema": t.parameters,
                          "annotations": None} for t in tools]
        self.emit("response.mcp_list_tools.completed", item_id=item["id"], output_index=idx)
        self.emit("response.output_item.done", output_index=idx, item=_copy(item))

    def tool_deltas(self, deltas: Sequence[ToolCallDelta]) -> None:
        for d in deltas:
            if d.name is not None:
                self.close_text()
                info = self.hosted(d.name)
                if info is not None:
                    item: dict[str, Any] = {"type": "mcp_call", "id": f"mcp_{d.id}", "server_label": info.server_label,
                                            "name": info.name, "arguments": "", "output": None, "error": None,
                                            "status": "in_progress"}
                else:
                    item = {"type": "function_call", "id": f"fc_{d.id}", "call_id": d.id or "", "name": d.name,
                            "arguments": "", "status": "in_progress"}
                self.items.append(item)
                self._calls[d.index] = item
                self.emit("response.output_item.added", output_index=len(self.items) - 1, item=_copy(item))
            item = self._calls.get(d.index)
            if item is not None and d.arguments:
                item["arguments"] += d.arguments
                kind = "mcp_call_arguments" if item["type"] == "mcp_call" else "function_call_arguments"
                self.emit(f"response.{kind}.delta", item_id=item["id"], output_index=self.items.index(item),
                          delta=d.arguments)

    def end_pass(self, complete: set[str], status: str = "completed") -> list[dict[str, Any]]:
        """The model request ended: close its text, and its calls — those not complete (cut by
        the token limit) end `incomplete` and never run. Returns the complete hosted calls' items,
        still open, in order (the caller runs them and ends each with `hosted_done`)."""
        self.close_text(status)
        to_run = []
        for item in self._calls.values():
            idx = self.items.index(item)
            call_id = item["id"][4:] if item["type"] == "mcp_call" else item["call_id"]
            done = call_id in complete
            if item["type"] == "function_call":
                self.emit("response.function_call_arguments.done", item_id=item["id"], output_index=idx,
                          arguments=item["arguments"], name=item["name"])
                item["status"] = "completed" if done else "incomplete"
                self.emit("response.output_item.done", output_index=idx, item=_copy(item))
                continue
            self.emit("response.mcp_call_arguments.done", item_id=item["id"], output_index=idx,
                      arguments=item["arguments"])
            if done:
                to_run.append(item)
            else:
                item["status"], item["error"] = "incomplete", "the call was cut off before its arguments were complete"
                self.emit("response.output_item.done", output_index=idx, item=_copy(item))
        self._calls = {}
        return to_run

    def hosted_started(self, item: dict[str, Any]) -> None:
        self.emit("response.mcp_call.in_progress", item_id=item["id"], output_index=self.items.index(item))

    def hosted_done(self, item: dict[str, Any], outcome: ToolOutcome) -> None:
        idx = self.items.index(item)
        if outcome.ok:
            item["status"], item["output"] = "completed", outcome.output
            self.emit("response.mcp_call.completed", item_id=item["id"], output_index=idx)
        else:
            item["status"], item["error"] = "failed", outcome.error
            self.emit("response.mcp_call.failed", item_id=item["id"], output_index=idx)
        self.emit("response.output_item.done", output_index=idx, item=_copy(item))

    @property
    def function_calls(self) -> list[dict[str, Any]]:
        return [i for i in self.items if i["type"] == "function_call" and i["status"] == "completed"]


def _copy(item: dict[str, Any]) -> dict[str, Any]:
    out = dict(item)
    if "content" in out:
        out["content"] = [dict(p) for p in out["content"]]
    return out


def output_text(items: Sequence[dict[str, Any]]) -> str:
    return "".join(p.get("text", "") for i in items if i["type"] == "message" for p in i["content"]
                   if p.get("type") == "output_text")
