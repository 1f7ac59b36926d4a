"""The tool loop: ask the model, check each proposed call (known tool, allowed, valid arguments,
confirmed if dangerous, not already run under its idempotency key), run it with a timeout, feed
the result or an explicit failure back, and ask again, until an answer or the budget ends it."""
from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import jsonschema

from modelcall.events import ToolExecuted, ToolFailed
from modelcall.plugins.agent.client import ChatClient, ModelError, ModelReply
from modelcall.plugins.agent.idempotency import IdempotencyStore, MemoryStore, same_call
from modelcall.plugins.agent.policy import Policy
from modelcall.plugins.agent.result import Budget, ModelRequestRecord, TaskResult, ToolOutcome
from modelcall.plugins.agent.tools import Tool

log = logging.getLogger("modelcall.agent")
ToolChoice = Any  # "auto" | "required" | "none" | {"type": "function", ...} | callable(turn) -> one of those


class Agent:
    """Runs tasks against a model client with a fixed set of tools, policy and budget."""

    def __init__(self, client: ChatClient, tools: Iterable[Tool | Callable[..., Any]], *,
                 policy: Policy | None = None, budget: Budget | None = None,
                 store: IdempotencyStore | None = None, caller: str = "default",
                 tool_choice: ToolChoice = "auto", params: dict[str, Any] | None = None,
                 on_event: Callable[[Any], None] | None = None) -> None:
        self.client = client
        self.tools = {t.name: t for t in (x if isinstance(x, Tool) else Tool(x) for x in tools)}
        self.policy = policy or Policy()
        self.budget = budget or Budget()
        self.store = store or MemoryStore()
        self.caller = caller
        self.tool_choice = tool_choice
        self.params = params or {}
        self.on_event = on_event or getattr(client, "publish", None)

    def offered(self, caller: str) -> list[Tool]:
        """The tools this caller may use: the only ones the model is told about."""
        return [t for t in self.tools.values() if self.policy.allowed(caller, t.name)]

    async def run(self, question: str, *, task_id: str | None = None, system: str | None = None,
                  caller: str | None = None) -> TaskResult:
        task_id = task_id or f"task-{uuid.uuid4().hex[:16]}"
        caller = caller or self.caller
        t0 = time.monotonic()
        messages: list[dict[str, Any]] = ([{"role": "system", "content": system}] if system else []) + \
            [{"role": "user", "content": question}]
        requests: list[ModelRequestRecord] = []
        outcomes: list[ToolOutcome] = []
        usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        status, answer = "max_turns", None
        tools = [t.openai() for t in self.offered(caller)]
        try:
            for turn in range(self.budget.max_turns):
                left = None if self.budget.max_wall_s is None else self.budget.max_wall_s - (time.monotonic() - t0)
                if left is not None and left <= 0:
                    status = "timeout"
                    break
                if self.budget.max_tokens is not None and usage["total_tokens"] >= self.budget.max_tokens:
                    status = "max_tokens"
                    break
                choice = self.tool_choice(turn) if callable(self.tool_choice) else self.tool_choice
                reply = await self._ask(messages, tools, choice, task_id, turn, left, requests)
                if reply is None:
                    status = "timeout" if requests[-1].error == "timeout" else "model_error"
                    break
                for k in usage:
                    usage[k] += int(reply.usage.get(k, 0))
                if not reply.tool_calls:
                    # NOTE: an answer cut by the request's max_tokens is still returned, but says so.
                    status = "truncated" if reply.finish_reason == "length" else "answered"
                    answer = reply.content
                    break
                # NOTE: the runtime names calls by turn and position, so a retried model request
                # gives a call the same id (and idempotency key); the model's id is kept for events.
                calls = [dict(c, model_id=c["id"], id=f"call_{turn}_{i}") for i, c in enumerate(reply.tool_calls)]
                messages.append({"role": "assistant", "content": reply.content or "", "tool_calls": [
                    {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                    for c in calls]})
                for call in calls:
                    out = await self._execute(call, caller, task_id, turn, reply.request_id)
                    outcomes.append(out)
                    messages.append({"role": "tool", "tool_call_id": call["id"], "content": _fed_back(out)})
        except asyncio.CancelledError:
            status = "cancelled"
            raise
        finally:
            result = TaskResult(task_id=task_id, status=status, answer=answer, requests=requests,
                                tool_calls=outcomes, wall_s=time.monotonic() - t0, usage=usage)
            log.info("task %s: %s", task_id, status)
        return result

    # ---- model requests -------------------------------------------------------------------

    async def _ask(self, messages: list[dict], tools: list[dict], choice: Any, task_id: str, turn: int,
                   left: float | None, requests: list[ModelRequestRecord]) -> ModelReply | None:
        t = time.monotonic()
        params = dict(self.params)
        try:
            reply = await asyncio.wait_for(self.client.chat(messages, tools=tools, tool_choice=choice,
                                                            task_id=task_id, params=params), left)
        except (asyncio.TimeoutError, ModelError) as e:
            timeout = isinstance(e, asyncio.TimeoutError)
            requests.append(ModelRequestRecord(request_id=None, turn=turn, finish_reason=None, usage={},
                                               latency_s=time.monotonic() - t, retries=getattr(e, "retries", []),
                                               error="timeout" if timeout else str(e)))
            return None
        requests.append(ModelRequestRecord(request_id=reply.request_id, turn=turn, finish_reason=reply.finish_reason,
                                           usage=dict(reply.usage), latency_s=time.monotonic() - t,
                                           timings=reply.timings, retries=reply.retries))
        return reply

    # ---- tool calls -----------------------------------------------------------------------

    async def _execute(self, call: dict[str, str], caller: str, task_id: str, turn: int,
                       request_id: str | None) -> ToolOutcome:
        name, raw = call["name"], call["arguments"]

        def outcome(status: str, result: str, duration: float = 0.0, key: str | None = None) -> ToolOutcome:
            out = ToolOutcome(call_id=call["id"], name=name, arguments=raw, status=status, result=result,
                              duration_s=duration, idempotency_key=key, turn=turn, model_call_id=call.get("model_id"))
            self._publish(out, request_id or task_id, task_id)
            return out

        tool = self.tools.get(name)
        if tool is None or not self.policy.allowed(caller, name):
            # NOTE: an unknown tool and one outside the allowlist read the same to the model.
            return outcome("refused" if tool is not None else "unknown_tool",
                           f"there is no tool {name!r} you may use; available: {sorted(t.name for t in self.offered(caller))}")
        try:
            args = json.loads(raw or "{}")
            if not isinstance(args, dict):
                raise ValueError("arguments must be a JSON object")
            jsonschema.validate(args, tool.parameters)
        except (ValueError, jsonschema.ValidationError) as e:
            msg = e.message if isinstance(e, jsonschema.ValidationError) else str(e)
            return outcome("invalid", f"invalid arguments for {name}: {msg}; the tool was not run")
        refusal = await self.policy.authorize(caller, tool, args)
        if refusal is not None:
            return outcome("refused", refusal)
        key = None
        if tool.changes_world:
            key = f"{task_id}:{call['id']}"
            fresh, record = self.store.claim(key, name, raw)
            if not fresh:
                return self._already(record, name, raw, key, outcome)
            if tool.takes_key:
                args["idempotency_key"] = key
        t = time.monotonic()
        try:
            if tool.is_async:
                value = await asyncio.wait_for(tool.fn(**args), tool.timeout_s)
            else:
                value = await asyncio.wait_for(asyncio.to_thread(tool.fn, **args), tool.timeout_s)
        except asyncio.TimeoutError:
            # NOTE: the key stays claimed with no result: the outcome is unknown, so it never runs again.
            return outcome("failed", f"{name} timed out after {tool.timeout_s:g}s; its outcome is unknown",
                           time.monotonic() - t, key)
        except Exception as e:  # noqa: BLE001 - a tool's failure is fed back, never raised
            if key is not None:
                self.store.settle(key, "failed", f"{type(e).__name__}: {e}")
            return outcome("failed", f"{name} failed: {type(e).__name__}: {e}", time.monotonic() - t, key)
        result = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
        if key is not None:
            self.store.settle(key, "done", result)
        return outcome("ok", result, time.monotonic() - t, key)

    def _already(self, record: dict[str, Any] | None, name: str, raw: str, key: str, outcome: Any) -> ToolOutcome:
        assert record is not None
        if not same_call(record, name, raw):
            return outcome("refused", f"idempotency key {key} was already used for another call; not run")
        if record["state"] == "done":
            return outcome("skipped", record["result"], 0.0, key)
        return outcome("skipped", f"{name} was already attempted under {key} (state {record['state']}); "
                                  "its outcome is unknown, so it is not run again", 0.0, key)

    def _publish(self, out: ToolOutcome, request_id: str, task_id: str) -> None:
        if self.on_event is None:
            return
        call_id = out.model_call_id or out.call_id
        if out.status == "ok":
            ev: Any = ToolExecuted(request_id=request_id, task_id=task_id, call_id=call_id, name=out.name,
                                   duration_s=out.duration_s, result_preview=out.result[:200])
        else:
            ev = ToolFailed(request_id=request_id, task_id=task_id, call_id=call_id, name=out.name,
                            error=out.result, duration_s=out.duration_s)
        try:
            self.on_event(ev)
        except Exception:  # an observer never breaks the task
            log.exception("agent event observer failed")


def _fed_back(out: ToolOutcome) -> str:
    if out.status in ("ok", "skipped") and not out.result.startswith(f"{out.name} was already attempted"):
        return out.result
    return f"ERROR ({out.status}): {out.result}"
