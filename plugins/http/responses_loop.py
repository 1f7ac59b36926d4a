"""The provider-side tool loop of one Response: model passes through the kernel (the same Entry
pipeline as chat: caller, permissions, quotas) and hosted tool calls run in between.

    generate -> complete calls (ToolRequested) -> toolbox.execute (validate, authorize, timeout,
    at most once) -> result or explicit failure into the context -> generate again

until the model answers without a hosted call, a client function call ends the turn, the token
budget is spent, or `max_tool_calls` hosted calls ran (then hosted tools are no longer offered).
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from modelcall.core.tools import ServerToolbox, ToolOutcome
from modelcall.events import Finished, RequestFailed, ResponseSent, TokensEmitted, ToolRequested, Usage
from modelcall.plugins.http.responses_output import OutputBuilder
from modelcall.plugins.http.responses_plan import Plan
from modelcall.plugins.http.service import Generation, ServingContext, check_outcome, sampling_params

Flush = Callable[[], Awaitable[None]]


class LoopResult(msgspec.Struct, kw_only=True):
    status: str = "completed"                # completed | incomplete
    incomplete_reason: str | None = None     # max_output_tokens | content_filter
    usage: Usage = Usage()
    passes: int = 0
    request_ids: list[str] = []


async def run_loop(ctx: ServingContext, plan: Plan, builder: OutputBuilder, toolbox: ServerToolbox | None,
                   flush: Flush, *, task_id: str | None, priority: int = 0, cache_salt: str | None = None) -> LoopResult:
    out = LoopResult()
    messages = list(plan.messages)
    budget = plan.fields.get("max_tokens")
    hosted_runs = 0
    for label in plan.list_labels:
        builder.list_tools(label, [t for t in plan.hosted.values() if t.server_label == label])
    while True:
        offer_hosted = hosted_runs < plan.max_tool_calls
        tools = plan.functions + ([t.openai() for t in plan.hosted.values()] if offer_hosted else [])
        if plan.tool_choice == "none":
            tools = []  # as chat: tool_choice none renders no tool definitions at all
        choice = plan.tool_choice
        if out.passes > 0 and plan.forced:
            choice = "auto"  # NOTE: forcing again after a hosted result would loop until max_tool_calls
        if choice is not None and not isinstance(choice, str) and choice["function"]["name"] not in \
                {t["function"]["name"] for t in tools}:
            choice = "auto"
        remaining = None if budget is None else budget - out.usage.completion_tokens
        if remaining is not None and remaining <= 0:
            out.status, out.incomplete_reason = "incomplete", "max_output_tokens"
            break
        params = sampling_params({**plan.fields, "max_tokens": remaining}, 1)
        (handle,) = await ctx.submit(params, messages=messages, tools=tools or None,
                                     tool_choice=choice if tools else None,
                                     parallel_tool_calls=plan.parallel_tool_calls if tools else None,
                                     response_format=plan.response_format, task_id=task_id, priority=priority,
                                     cache_salt=cache_salt)
        out.passes += 1
        out.request_ids.append(handle.request_id)
        try:
            gen, complete = await _one_pass(ctx, handle, builder, flush)
        finally:
            handle.close()
        out.usage = _add(out.usage, gen.usage)
        reason = gen.finished.reason if gen.finished is not None else "stop"
        to_run = builder.end_pass({c.call_id for c in complete}, "incomplete" if reason == "length" else "completed")
        await flush()
        if reason == "length":
            out.status, out.incomplete_reason = "incomplete", "max_output_tokens"
            break
        if reason == "content_filter":
            out.status, out.incomplete_reason = "incomplete", "content_filter"
            break
        if not to_run or toolbox is None:
            break
        _pass_sent(ctx, handle)
        assistant: dict[str, Any] = {"role": "assistant", "content": gen.text, "tool_calls": [
            {"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": _object(c.arguments)}}
            for c in complete]}
        if gen.reasoning_text:
            assistant["reasoning_content"] = gen.reasoning_text
        messages.append(assistant)
        by_id = {c.call_id: c for c in complete}
        for item in to_run:
            call = by_id[item["id"][4:]]
            builder.hosted_started(item)
            await flush()
            if hosted_runs >= plan.max_tool_calls:
                outcome = ToolOutcome(call_id=call.call_id, ok=False,
                                      error=f"not run: this response already ran max_tool_calls ({plan.max_tool_calls}) "
                                            "hosted tool calls")
            else:
                hosted_runs += 1
                outcome = await toolbox.execute(plan.hosted[call.name], call_id=call.call_id, arguments=call.arguments,
                                                request_id=handle.request_id, task_id=task_id,
                                                idempotency_key=f"{plan.response_id}/{out.passes - 1}/{to_run.index(item)}",
                                                caller=getattr(ctx.exchange, "caller", None))
            builder.hosted_done(item, outcome)
            await flush()
            messages.append({"role": "tool", "tool_call_id": call.call_id,
                             "content": outcome.output if outcome.ok else f"error: {outcome.error}"})
        if builder.function_calls and any(c.name not in plan.hosted for c in complete):
            break  # the client runs its own functions: the turn is theirs
    return out


async def _one_pass(ctx: ServingContext, handle: Any, builder: OutputBuilder, flush: Flush
                    ) -> tuple[Generation, list[ToolRequested]]:
    """Read one model request; the core output stage already split content, reasoning and calls."""
    gen = Generation(0, handle)
    complete: list[ToolRequested] = []
    async for ev in handle:
        kind = type(ev)
        if kind is TokensEmitted:
            reasoning, answer = gen.on_tokens(ev)
            builder.reasoning(reasoning)
            builder.text(answer)
            if ev.tool_calls:
                builder.tool_deltas(ev.tool_calls)
            await flush()
        elif kind is ToolRequested:
            complete.append(ev)  # NOTE: only complete, parsed calls ever run (never a partial one)
        elif kind is Finished or kind is RequestFailed:
            check_outcome(ev)
            gen.on_finished(ev)
    return gen, complete


def _pass_sent(ctx: ServingContext, handle: Any) -> None:
    """A model pass whose hosted calls run next is done being answered now: record it so (the
    ledger's response_sent), and take it off the exchange so the HTTP response's end does not
    move it; the report then shows the tool time between this pass and the next."""
    ctx.kernel.bus.publish([ResponseSent(request_id=handle.request_id, task_id=handle.task_id)])
    handles = getattr(ctx.exchange, "handles", None)
    if handles is not None and handle in handles:
        handles.remove(handle)


def _add(a: Usage, b: Usage) -> Usage:
    """Usage of several model passes of one response: every pass's tokens, each by its own definition."""
    return Usage(prompt_tokens=a.prompt_tokens + b.prompt_tokens, cached_tokens=a.cached_tokens + b.cached_tokens,
                 completion_tokens=a.completion_tokens + b.completion_tokens,
                 reasoning_tokens=a.reasoning_tokens + b.reasoning_tokens)


def _object(arguments: str) -> Any:
    try:
        value = msgspec.json.decode(arguments)
    except msgspec.DecodeError:
        return arguments
    return value if isinstance(value, dict) else arguments
