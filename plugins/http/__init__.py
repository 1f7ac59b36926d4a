"""The HTTP front end: OpenAI and Anthropic APIs over aiohttp (`modelcall serve`).

Build an app around a started kernel with `create_app(kernel, ServerSettings())`; other plugins
add routes with the `register_routes` hook and middlewares with `register_middlewares`.
"""
from __future__ import annotations

from typing import Any

from modelcall.core import hookimpl


@hookimpl(trylast=True)
def register_commands(register: Any) -> None:
    from modelcall.plugins.http import serve

    register("serve", "serve the model over HTTP (OpenAI and Anthropic APIs)", serve.configure, serve.run)


def create_app(*args: Any, **kwargs: Any) -> Any:
    from modelcall.plugins.http.app import create_app as create

    return create(*args, **kwargs)
