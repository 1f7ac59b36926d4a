"""OpenTelemetry traces for every model request, exported over OTLP/HTTP (`--otlp-traces-endpoint URL`).

    plugin_config = {"otel": {"endpoint": "http://collector:4318/v1/traces",
                              "capture_content": false,        # prompt/output text: only when asked
                              "headers": {"authorization": "..."}, "service_name": "modelcall"}}

Off the hot path: the engine's observers only append to a bounded batch (dropped and counted
when full); a worker thread drains it five times a second and builds the spans, which the SDK's
BatchSpanProcessor exports on its own thread. Each kernel has its own TracerProvider (no global state).
"""
from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from modelcall.core import ConfigError, hookimpl
from modelcall.events import (
    Finished, Preempted, RequestAdmitted, RequestFailed, RequestRejected, RequestScheduled,
    ToolExecuted, ToolFailed,
)

NAME = "otel"  # the key of this plugin's state in `kernel.plugin_state`: a Tracing
_EVENTS = (RequestScheduled, Preempted, ToolExecuted, ToolFailed, Finished, RequestFailed)


def settings(config: Any) -> dict[str, Any]:
    return dict((getattr(config, "plugin_config", None) or {}).get(NAME) or {})


def traces_url(endpoint: str) -> str:
    """The URL spans are POSTed to: as given, or with `/v1/traces` when only a base was given."""
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"--otlp-traces-endpoint {endpoint!r}: expected an http(s) URL such as "
                          "http://127.0.0.1:4318/v1/traces")
    return endpoint.rstrip("/") + "/v1/traces" if parts.path in ("", "/") else endpoint


class Tracing:
    """A kernel's tracer pipeline: the inline observers, the span builder's worker, the SDK provider."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError as e:
            raise ConfigError(f"--otlp-traces-endpoint needs the OpenTelemetry SDK and OTLP exporter ({e}); "
                              "install them with: pip install 'modelcall[otel]'") from None
        from modelcall.plugins.otel.batcher import Batcher
        from modelcall.plugins.otel.spans import SpanBuilder

        self.url = traces_url(str(cfg["endpoint"]))
        resource = Resource.create({"service.name": cfg.get("service_name", "modelcall")})
        self.provider = TracerProvider(resource=resource)
        self.exporter = exporter = OTLPSpanExporter(endpoint=self.url, headers=cfg.get("headers") or None,
                                    timeout=float(cfg.get("timeout_s", 10)))
        self.provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=int(cfg.get("delay_ms", 1000))))
        self.builder = SpanBuilder(self.provider.get_tracer("modelcall"),
                                   capture_content=bool(cfg.get("capture_content", False)))
        self.observer = Batcher(self.builder.handle_batch, maxsize=int(cfg.get("queue", 10_000)),
                                interval_s=float(cfg.get("interval_s", 0.2)))

    def register(self, register: Any) -> None:
        from modelcall.plugins.otel.incoming import current

        put, get = self.observer, current.get

        # NOTE: admissions and refusals run inline in the submitting task, so the HTTP exchange's
        # context variable is visible here; only a reference to it is enqueued.
        def with_incoming(ev: Any) -> None:
            put((ev, get()))

        register((RequestAdmitted, RequestRejected), with_incoming, name="otel")
        register(_EVENTS, self.observer, name="otel")

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Build every queued span and export it (tests, shutdown)."""
        self.observer.flush()
        return self.provider.force_flush(int(timeout_s * 1000))

    def close(self) -> None:
        self.observer.close()
        self.provider.shutdown()


def tracing_of(kernel: Any) -> Tracing | None:
    return kernel.plugin_state.get(NAME)


@hookimpl(trylast=True)
def register_observers(register: Any, config: Any, kernel: Any) -> None:
    cfg = settings(config)
    if not cfg.get("endpoint"):
        return
    tracing = kernel.plugin_state[NAME] = Tracing(cfg)
    tracing.register(register)


@hookimpl(trylast=True)
def register_middlewares(register: Any, kernel: Any) -> None:
    if tracing_of(kernel) is not None:
        from modelcall.plugins.otel.incoming import trace_middleware

        # inside the key check (-100) and the records middleware (-50): refusals there carry no trace
        register(trace_middleware(), order=-40)


@hookimpl(trylast=True)
def shutdown(kernel: Any) -> None:
    tracing = kernel.plugin_state.pop(NAME, None)
    if tracing is not None:
        tracing.close()
