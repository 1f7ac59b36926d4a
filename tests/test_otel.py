"""OpenTelemetry traces: a real OTLP/HTTP receiver on loopback decodes what modelcall exports.

One span per model request with GenAI semantic-convention attributes and queue / prefill /
decode children timed where they happened; an incoming W3C `traceparent` is the parent, the
agent runtime's HTTP client sends one, and prompt/output text appears only when asked.
"""
from __future__ import annotations

import json

import anyio
import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from modelcall.events import ToolExecuted
from modelcall.plugins.otel.plugin import tracing_of, traces_url
from modelcall.testing.server import server_for_test

pytestmark = pytest.mark.anyio

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


class Receiver:
    """An OTLP/HTTP trace receiver: POST /v1/traces with a protobuf ExportTraceServiceRequest."""

    def __init__(self) -> None:
        self.spans: list[trace_pb2.Span] = []
        self.resources: list[dict] = []
        self.content_types: set[str] = set()

    async def handle(self, request: web.Request) -> web.Response:
        self.content_types.add(request.content_type)
        msg = trace_service_pb2.ExportTraceServiceRequest()
        msg.ParseFromString(await request.read())
        for rs in msg.resource_spans:
            self.resources.append(attrs_of(rs.resource.attributes))
            for ss in rs.scope_spans:
                self.spans.extend(ss.spans)
        body = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=body, content_type="application/x-protobuf")

    def named(self, prefix: str) -> list[trace_pb2.Span]:
        return [s for s in self.spans if s.name.startswith(prefix)]


def value_of(v) -> object:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value_of(x) for x in v.array_value.values]
    return getattr(v, kind)


def attrs_of(kvs) -> dict:
    return {kv.key: value_of(kv.value) for kv in kvs}


@pytest.fixture
async def receiver():
    rec = Receiver()
    app = web.Application()
    app.router.add_post("/v1/traces", rec.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    rec.url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1/traces"
    yield rec
    await runner.cleanup()


async def flush(kernel) -> None:
    # NOTE: the exporter posts to the receiver on this loop: wait for it from a thread.
    assert await anyio.to_thread.run_sync(tracing_of(kernel).flush)


async def test_span_per_request_with_genai_attributes_and_traceparent_parent(receiver):
    otel = {"endpoint": receiver.url, "delay_ms": 20}
    async with server_for_test(plugin_config={"otel": otel}) as srv:
        body = {"model": srv.kernel.model_name, "messages": [{"role": "user", "content": "secret prompt"}],
                "max_tokens": 8, "temperature": 0.7, "top_p": 0.9}
        headers = {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}
        async with srv.client.post("/v1/chat/completions", json=body, headers=headers) as resp:
            assert resp.status == 200
            answer = await resp.json()
        await flush(srv.kernel)
    assert receiver.content_types == {"application/x-protobuf"}
    assert receiver.resources[0]["service.name"] == "modelcall"
    [span] = receiver.named("chat ")
    assert span.name == f"chat {body['model']}"
    assert span.kind == trace_pb2.Span.SPAN_KIND_SERVER
    assert span.trace_id.hex() == TRACE_ID and span.parent_span_id.hex() == PARENT_ID
    a = attrs_of(span.attributes)
    usage = answer["usage"]
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.provider.name"] == "modelcall"
    assert a["gen_ai.request.model"] == body["model"]
    assert a["gen_ai.request.max_tokens"] == 8
    assert a["gen_ai.request.temperature"] == pytest.approx(0.7) and a["gen_ai.request.top_p"] == pytest.approx(0.9)
    assert a["gen_ai.response.id"] == answer["id"]
    assert a["gen_ai.response.finish_reasons"] == [answer["choices"][0]["finish_reason"]]
    assert a["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert a["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
    assert a["gen_ai.usage.cache_read.input_tokens"] == 0
    assert a["gen_ai.usage.reasoning.output_tokens"] == 0
    assert a["server.address"] == "127.0.0.1" and isinstance(a["server.port"], int)
    assert not any(k.startswith("gen_ai.input") or k.startswith("gen_ai.output") for k in a)  # content: opt-in
    assert "secret prompt" not in repr(receiver.spans)
    children = {s.name: s for s in receiver.spans if s.parent_span_id == span.span_id}
    assert set(children) == {"queue", "prefill", "decode"}
    q, p, d = children["queue"], children["prefill"], children["decode"]
    assert span.start_time_unix_nano <= q.start_time_unix_nano <= q.end_time_unix_nano == p.start_time_unix_nano
    assert p.end_time_unix_nano == d.start_time_unix_nano <= d.end_time_unix_nano <= span.end_time_unix_nano
    assert all(c.trace_id == span.trace_id for c in children.values())
    assert attrs_of(d.attributes)["modelcall.output_tokens"] == usage["completion_tokens"]


async def test_no_traceparent_starts_a_trace_and_content_only_when_asked(receiver):
    otel = {"endpoint": receiver.url, "delay_ms": 20, "capture_content": True}
    async with server_for_test(plugin_config={"otel": otel}) as srv:
        body = {"model": srv.kernel.model_name, "prompt": "hello there", "max_tokens": 4}
        async with srv.client.post("/v1/completions", json=body) as resp:
            answer = await resp.json()
        await flush(srv.kernel)
    [span] = receiver.named("text_completion ")
    assert span.parent_span_id == b""
    a = attrs_of(span.attributes)
    assert a["gen_ai.operation.name"] == "text_completion" and a["gen_ai.response.id"] == answer["id"]
    assert json.loads(a["gen_ai.input.messages"])[0]["parts"][0]["content"] == "hello there"
    out = json.loads(a["gen_ai.output.messages"])[0]
    assert out["parts"][0]["content"] == answer["choices"][0]["text"]


async def test_tool_call_span_is_a_child_of_its_model_request(receiver):
    otel = {"endpoint": receiver.url, "delay_ms": 20}
    async with server_for_test(plugin_config={"otel": otel}) as srv:
        done = await srv.kernel.complete("weather?", max_tokens=3, task_id="trip")
        # what a runtime that executed the model's call publishes (the agent's KernelChatClient does)
        srv.kernel.bus.publish([ToolExecuted(request_id=done.request_id, task_id="trip", call_id="call_1",
                                             name="get_weather", duration_s=0.25)])
        await flush(srv.kernel)
    [req] = receiver.named("text_completion ")
    [tool] = receiver.named("execute_tool ")
    assert tool.name == "execute_tool get_weather" and tool.parent_span_id == req.span_id
    a = attrs_of(tool.attributes)
    assert a["gen_ai.operation.name"] == "execute_tool" and a["gen_ai.tool.call.id"] == "call_1"
    assert tool.end_time_unix_nano - tool.start_time_unix_nano == pytest.approx(0.25e9, abs=1e3)
    assert attrs_of(req.attributes)["gen_ai.conversation.id"] == "trip"


async def test_agent_http_client_sends_one_trace_per_task(receiver):
    from modelcall.plugins.agent.client import OpenAIChatClient

    otel = {"endpoint": receiver.url, "delay_ms": 20}
    async with server_for_test(plugin_config={"otel": otel}) as srv:
        client = OpenAIChatClient(srv.url, model=srv.kernel.model_name)
        try:
            for _ in range(2):
                await client.chat([{"role": "user", "content": "hi"}], tools=[], tool_choice=None, task_id="t1",
                                  params={"max_tokens": 2})
            await client.chat([{"role": "user", "content": "hi"}], tools=[], tool_choice=None, task_id="t2",
                              params={"max_tokens": 2})
        finally:
            await client.close()
        await flush(srv.kernel)
    spans = receiver.named("chat ")
    assert len(spans) == 3 and all(s.parent_span_id for s in spans)  # each has the client's span as parent
    by_task: dict[str, list] = {}
    for s in spans:
        by_task.setdefault(attrs_of(s.attributes)["gen_ai.conversation.id"], []).append(s)
    (a1, a2), (b,) = by_task["t1"], by_task["t2"]
    assert a1.trace_id == a2.trace_id != b.trace_id
    assert len({s.parent_span_id for s in spans}) == 3


def test_endpoint_forms():
    assert traces_url("http://c:4318") == "http://c:4318/v1/traces"
    assert traces_url("http://c:4318/api/public/otel/v1/traces") == "http://c:4318/api/public/otel/v1/traces"
    from modelcall.core import ConfigError

    with pytest.raises(ConfigError, match="expected an http"):
        traces_url("c:4318")


async def test_a_refused_request_is_an_error_span_under_its_traceparent(receiver):
    otel = {"endpoint": receiver.url, "delay_ms": 20}
    async with server_for_test(plugin_config={"otel": otel}) as srv:
        body = {"model": srv.kernel.model_name, "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 10**6}
        async with srv.client.post("/v1/chat/completions", json=body,
                                   headers={"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}) as resp:
            assert resp.status == 400
        await flush(srv.kernel)
    [span] = receiver.named("chat ")
    assert span.status.code == trace_pb2.Status.STATUS_CODE_ERROR
    assert span.trace_id.hex() == TRACE_ID and span.parent_span_id.hex() == PARENT_ID
    a = attrs_of(span.attributes)
    assert a["http.response.status_code"] == 400 and a["error.type"]


def test_cli_option_configures_the_exporter():
    import argparse

    from modelcall.core.commands import add_kernel_options, config_from_args

    parser = argparse.ArgumentParser()
    add_kernel_options(parser)
    cfg = config_from_args(parser.parse_args(["--otlp-traces-endpoint", "http://127.0.0.1:4318/v1/traces",
                                              "--otlp-capture-content"]))
    assert cfg.plugin_config["otel"] == {"endpoint": "http://127.0.0.1:4318/v1/traces", "capture_content": True}
    assert "otel" not in config_from_args(parser.parse_args([])).plugin_config


def test_the_batcher_drops_and_counts_past_its_bound_and_keeps_order():
    from modelcall.plugins.otel.batcher import Batcher

    seen: list[list[int]] = []
    b = Batcher(seen.append, maxsize=3, interval_s=60)  # the worker sleeps: only flush drains
    try:
        for i in range(5):
            b(i)
        assert b.dropped == 2
        b.flush()
        assert seen == [[0, 1, 2]]
        b(7)
        b.flush()
        assert seen == [[0, 1, 2], [7]]
    finally:
        b.close()
