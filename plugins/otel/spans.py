"""Turns a request's events into OpenTelemetry spans; runs on the tracer's worker thread only.

One span per model request (`{operation} {model}`, kind SERVER) whose parent is the caller's
W3C `traceparent` when it sent one, with children `queue`, `prefill` and `decode` and one
`execute_tool {name}` per tool call. Every span is timed with the monotonic timestamps the
events carry, taken where each stage happened, and turned into wall time by one offset.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from modelcall.events import (
    Finished, Preempted, RequestAdmitted, RequestFailed, RequestRejected, RequestScheduled, ToolExecuted, ToolFailed,
)
from modelcall.plugins.otel import attributes as A
from modelcall.plugins.otel.incoming import Incoming

_propagator = TraceContextTextMapPropagator()


class _Open:
    """What is known of a request still running."""

    __slots__ = ("admitted", "incoming", "cached", "preempted", "tools")

    def __init__(self, admitted: RequestAdmitted, incoming: Incoming | None) -> None:
        self.admitted = admitted
        self.incoming = incoming
        self.cached = 0
        self.preempted: list[Preempted] = []
        self.tools: list[ToolExecuted | ToolFailed] = []


class SpanBuilder:
    """`handle_batch(items)`: items are events, or `(event, Incoming | None)` for admissions and refusals."""

    def __init__(self, tracer: trace.Tracer, *, capture_content: bool = False, keep: int = 10_000) -> None:
        self.tracer = tracer
        self.capture_content = capture_content
        # NOTE: one offset, so span durations are exactly the monotonic differences measured.
        self.offset_ns = time.time_ns() - time.monotonic_ns()
        self.open: dict[str, _Open] = {}
        # Span contexts of finished requests, for tool calls that run after their request ended.
        self.finished: OrderedDict[str, Context] = OrderedDict()
        self.keep = keep
        self.spans = 0

    def ns(self, t: float) -> int:
        return int(t * 1e9) + self.offset_ns

    def handle_batch(self, items: list[Any]) -> None:
        for item in items:
            if type(item) is tuple:
                ev, incoming = item
                if type(ev) is RequestAdmitted:
                    self.open[ev.request_id] = _Open(ev, incoming)
                else:
                    self._rejected(ev, incoming)
                continue
            kind = type(item)
            rec = self.open.get(item.request_id)
            if kind is RequestScheduled:
                if rec is not None:
                    rec.cached = item.cached_tokens
            elif kind is Preempted:
                if rec is not None:
                    rec.preempted.append(item)
            elif kind is ToolExecuted or kind is ToolFailed:
                if rec is not None:
                    rec.tools.append(item)
                else:
                    parent = self.finished.get(item.request_id)
                    if parent is not None:
                        self._tool(item, parent)
            elif kind is Finished or kind is RequestFailed:
                rec = self.open.pop(item.request_id, None)
                if rec is not None:
                    self._request(rec, item)

    # ---- spans ----------------------------------------------------------------------------------

    def _parent(self, incoming: Incoming | None) -> Context | None:
        if incoming is None or not incoming.traceparent:
            return None
        carrier = {"traceparent": incoming.traceparent}
        if incoming.tracestate:
            carrier["tracestate"] = incoming.tracestate
        return _propagator.extract(carrier)

    def _request(self, rec: _Open, end: Finished | RequestFailed) -> None:
        adm, inc = rec.admitted, rec.incoming
        body = A.decode_body(inc.body) if inc is not None else {}
        op, id_prefix = A.operation(inc.path if inc is not None else None, adm)
        attrs = A.request_attributes(adm, body, op)
        attrs.update(A.server_attributes(inc.host if inc is not None else None))
        if self.capture_content:
            prompt = A.input_messages(body)
            if prompt is not None:
                attrs["gen_ai.input.messages"] = prompt
        t = end.timings if type(end) is Finished else None
        start = t.received if t is not None else adm.ts
        span = self.tracer.start_span(f"{op} {attrs['gen_ai.request.model']}", context=self._parent(inc),
                                      kind=SpanKind.SERVER, attributes=attrs, start_time=self.ns(start))
        ctx = trace.set_span_in_context(span)
        if t is not None:
            self._child("queue", ctx, t.admitted, t.scheduled, {})
            self._child("prefill", ctx, t.scheduled, t.first_token,
                        {"modelcall.cached_tokens": end.usage.cached_tokens,
                         "modelcall.computed_tokens": end.usage.prompt_tokens - end.usage.cached_tokens})
            self._child("decode", ctx, t.first_token, t.last_token,
                        {"modelcall.output_tokens": end.usage.completion_tokens})
            span.set_attributes(A.finished_attributes(end, id_prefix + adm.request_id))
            if self.capture_content:
                span.set_attribute("gen_ai.output.messages", A.output_messages(end))
            if end.reason == "error":
                span.set_status(Status(StatusCode.ERROR))
        else:
            span.set_attribute("error.type", end.error_type)
            span.set_status(Status(StatusCode.ERROR, end.message[:200]))
        for p in rec.preempted:
            span.add_event("preempted", {"modelcall.recompute_tokens": p.recompute_tokens}, timestamp=self.ns(p.ts))
        for tool in rec.tools:
            self._tool(tool, ctx)
        span.end(end_time=self.ns(t.finished if t is not None and t.finished is not None else end.ts))
        self.spans += 1
        self.finished[adm.request_id] = ctx
        while len(self.finished) > self.keep:
            self.finished.popitem(last=False)

    def _child(self, name: str, ctx: Context, a: float | None, b: float | None, attrs: dict[str, Any]) -> None:
        if a is None or b is None:
            return
        span = self.tracer.start_span(name, context=ctx, attributes=attrs, start_time=self.ns(a))
        span.end(end_time=self.ns(b))
        self.spans += 1

    def _tool(self, ev: ToolExecuted | ToolFailed, ctx: Context) -> None:
        attrs = {"gen_ai.operation.name": "execute_tool", "gen_ai.provider.name": A.PROVIDER,
                 "gen_ai.tool.name": ev.name, "gen_ai.tool.call.id": ev.call_id}
        span = self.tracer.start_span(f"execute_tool {ev.name}", context=ctx, attributes=attrs,
                                      start_time=self.ns(ev.ts - ev.duration_s))
        if type(ev) is ToolFailed:
            span.set_attribute("error.type", "tool_failed")
            span.set_status(Status(StatusCode.ERROR, ev.error[:200]))
        span.end(end_time=self.ns(ev.ts))
        self.spans += 1

    def _rejected(self, ev: RequestRejected, inc: Incoming | None) -> None:
        body = A.decode_body(inc.body) if inc is not None else {}
        op = A.ROUTES.get(inc.path, ("chat", ""))[0] if inc is not None else "chat"
        model = body.get("model") if isinstance(body.get("model"), str) else "unknown"
        attrs = {"gen_ai.operation.name": op, "gen_ai.provider.name": A.PROVIDER, "gen_ai.request.model": model,
                 "error.type": ev.error_type, "http.response.status_code": ev.status,
                 "modelcall.request_id": ev.request_id}
        attrs.update(A.server_attributes(inc.host if inc is not None else None))
        span = self.tracer.start_span(f"{op} {model}", context=self._parent(inc), kind=SpanKind.SERVER,
                                      attributes=attrs, start_time=self.ns(ev.ts))
        span.set_status(Status(StatusCode.ERROR, ev.message[:200]))
        span.end(end_time=self.ns(ev.ts))
        self.spans += 1
