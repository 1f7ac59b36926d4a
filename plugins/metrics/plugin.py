"""`GET /metrics` for `modelcall serve`: a registry per kernel, fed by bus observers.

On unless `plugin_config = {"metrics": {"enabled": false}}`.
"""
from __future__ import annotations

from typing import Any

from modelcall.core import hookimpl
from modelcall.events import Finished, Preempted, RequestAdmitted, RequestFailed, RequestRejected, TokensEmitted
from modelcall.plugins.metrics.metrics import KernelMetrics

NAME = "metrics"  # the key of this plugin's state in `kernel.plugin_state`: the kernel's KernelMetrics
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def enabled(config: Any) -> bool:
    return ((getattr(config, "plugin_config", None) or {}).get("metrics") or {}).get("enabled", True) is not False


def metrics_for(kernel: Any) -> KernelMetrics | None:
    return kernel.plugin_state.get(NAME)


@hookimpl(trylast=True)
def register_observers(register: Any, config: Any, kernel: Any) -> None:
    if not enabled(config):
        return
    m = kernel.plugin_state[NAME] = KernelMetrics()
    register(TokensEmitted, m.on_tokens, name="metrics")
    register(Finished, m.on_finished, name="metrics")
    register(RequestAdmitted, m.on_admitted, name="metrics")
    register(RequestFailed, m.on_failed, name="metrics")
    register(Preempted, m.on_preempted, name="metrics")
    register(RequestRejected, m.on_rejected, name="metrics")


@hookimpl(trylast=True)
def startup(kernel: Any) -> None:
    m = metrics_for(kernel)
    if m is not None:
        m.attach(kernel)


@hookimpl(trylast=True)
def shutdown(kernel: Any) -> None:
    kernel.plugin_state.pop(NAME, None)


@hookimpl(trylast=True)
def register_routes(register: Any, kernel: Any) -> None:
    m = metrics_for(kernel)
    if m is None:
        return
    from aiohttp import web  # only where served

    async def metrics(request: web.Request) -> web.Response:
        """Prometheus metrics of this server (text exposition format)."""
        return web.Response(body=m.exposition(), headers={"Content-Type": CONTENT_TYPE})

    register("GET", "/metrics", metrics)
