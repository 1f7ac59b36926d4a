"""What a task leaves behind: its status and answer, every model request (finish reason, usage,
timings, retries) and every tool call (outcome, duration)."""
from __future__ import annotations

from typing import Any

import msgspec


class Budget(msgspec.Struct, frozen=True, kw_only=True):
    """Limits of one task; the first one reached ends it with that status."""

    max_turns: int = 8              # model requests that may propose tools
    max_tokens: int | None = None   # prompt + completion tokens over all model requests
    max_wall_s: float | None = None


class Retry(msgspec.Struct, frozen=True):
    attempt: int
    error: str
    delay_s: float


class ModelRequestRecord(msgspec.Struct, kw_only=True):
    request_id: str | None
    turn: int
    finish_reason: str | None
    usage: dict[str, int]
    latency_s: float                    # client side: send to whole answer, retries included
    timings: dict[str, Any] = {}        # server side, where the server tells (in-process kernel)
    retries: list[Retry] = []
    error: str | None = None


class ToolOutcome(msgspec.Struct, kw_only=True):
    """status: ok, failed (raised or timed out), invalid (arguments), refused (policy),
    unknown_tool, skipped (an idempotency key already used: not run again)."""

    call_id: str
    name: str
    arguments: str
    status: str
    result: str
    duration_s: float
    idempotency_key: str | None = None
    turn: int = 0
    model_call_id: str | None = None  # the id the model (server) gave the call; events carry this one


class TaskResult(msgspec.Struct, kw_only=True):
    """status: answered, truncated (the answer hit the request's max_tokens), max_turns, max_tokens,
    timeout, model_error, cancelled."""

    task_id: str
    status: str
    answer: str | None
    requests: list[ModelRequestRecord]
    tool_calls: list[ToolOutcome]
    wall_s: float
    usage: dict[str, int]

    def summary(self) -> str:
        lines = [f"task {self.task_id}: {self.status} in {self.wall_s:.2f}s, {len(self.requests)} model requests, "
                 f"{len(self.tool_calls)} tool calls, tokens {self.usage}"]
        for r in self.requests:
            retry = f", {len(r.retries)} retries" if r.retries else ""
            server = "".join(f", {k[:-2]} {v * 1e3:.0f} ms" for k, v in r.timings.items() if v is not None)
            lines.append(f"  model turn {r.turn}: {r.finish_reason or r.error} in {r.latency_s * 1e3:.0f} ms"
                         f"{server}, usage {r.usage}{retry}")
        for t in self.tool_calls:
            lines.append(f"  tool {t.name}({t.arguments}) -> {t.status} in {t.duration_s * 1e3:.1f} ms: "
                         f"{t.result[:80]!r}")
        return "\n".join(lines)
