"""API keys for `modelcall serve --api-keys FILE`: the middleware and the quota meter.

    plugin_config = {"auth": {"api_keys": "/etc/modelcall/keys.toml"}}
"""
from __future__ import annotations

from typing import Any

from modelcall.core import hookimpl
from modelcall.plugins.auth.keys import KeyStore
from modelcall.plugins.auth.quota import QuotaBook


def keys_file(config: Any) -> str | None:
    return ((getattr(config, "plugin_config", None) or {}).get("auth") or {}).get("api_keys")


@hookimpl(trylast=True)
def register_meters(register: Any, config: Any) -> None:
    if keys_file(config):
        register(QuotaBook())


@hookimpl(trylast=True)
def register_middlewares(register: Any, config: Any) -> None:
    path = keys_file(config)
    if path:
        from modelcall.plugins.auth.middleware import auth_middleware  # aiohttp only where served

        register(auth_middleware(KeyStore.load(path)), order=-100)
