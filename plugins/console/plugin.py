"""The live console of `modelcall serve`: `GET /console` (a page) and `GET /-/events` (its feed).

    plugin_config = {"console": {"enabled": true}}     # on by default

The page is static files shipped in this package (no build step, nothing fetched from outside).
`/-/events` is server-sent events of the bus: each viewer sees the request events of its own
API key only (every request when the server has no keys), plus the engine's step figures a few
times a second. `?types=PrefillDone,Finished` narrows the feed.
"""
from __future__ import annotations

from typing import Any

from modelcall.core import hookimpl
from modelcall.events import (
    Event, Finished, PrefillDone, RequestAdmitted, RequestFailed, RequestRejected, RequestScheduled, StepDone,
)
from modelcall.plugins.console.hub import ConsoleHub

NAME = "console"  # the key of this plugin's state in `kernel.plugin_state`: the kernel's ConsoleHub


def settings(config: Any) -> dict[str, Any]:
    return dict((getattr(config, "plugin_config", None) or {}).get(NAME) or {})


def hub_of(kernel: Any) -> ConsoleHub | None:
    return kernel.plugin_state.get(NAME)


@hookimpl(trylast=True)
def register_observers(register: Any, config: Any, kernel: Any) -> None:
    if settings(config).get("enabled", True) is False:
        return
    hub = kernel.plugin_state[NAME] = ConsoleHub()
    register((RequestAdmitted, RequestScheduled, PrefillDone, Finished, RequestFailed, RequestRejected),
             hub.on_lifecycle, name="console")
    register(Event, hub.forward, name="console")
    register(StepDone, hub.on_step, name="console")


@hookimpl(trylast=True)
def shutdown(kernel: Any) -> None:
    hub = kernel.plugin_state.pop(NAME, None)
    if hub is not None:
        hub.closed = True


@hookimpl(trylast=True)
def register_routes(register: Any, config: Any, kernel: Any) -> None:
    hub = hub_of(kernel)
    if hub is None:
        return
    from modelcall.plugins.console import routes  # aiohttp only where served

    for method, path, handler in routes.routes(hub, kernel, keys_configured(config)):
        register(method, path, handler)


@hookimpl(trylast=True)
def register_middlewares(register: Any, kernel: Any) -> None:
    if hub_of(kernel) is None:
        return
    from modelcall.plugins.console import routes

    # NOTE: outside the key check: a browser cannot send a key when it opens a page, and the page's
    # files hold no data (the page then reads /-/events with the key it is given).
    register(routes.open_page_middleware(), order=-1000)


def keys_configured(config: Any) -> bool:
    return bool(((getattr(config, "plugin_config", None) or {}).get("auth") or {}).get("api_keys"))
