"""Runtime LoRA loading in vLLM's shapes: `POST /v1/load_lora_adapter {"lora_name", "lora_path"}` and
`POST /v1/unload_lora_adapter {"lora_name"}`, answered with vLLM's plain-text success line.

Off unless the operator enables them (`modelcall serve --allow-runtime-lora-updates`: 404 otherwise, saying so);
then only for keys with the admin permission that may use the adapter's name (core/permissions.py
`check_lora_admin`: 403 otherwise). With no keys file nobody is authenticated and enabling the routes is the only
gate: the path is read on the server, so enable them only where the callers are trusted (docs/lora.md).
"""
from __future__ import annotations

import anyio
import msgspec
from aiohttp import web

from modelcall.core.permissions import check_lora_admin
from modelcall.plugins.http.errors import ApiError
from modelcall.plugins.http.service import ServingContext


class LoadLoraAdapter(msgspec.Struct, kw_only=True):
    lora_name: str
    lora_path: str
    load_inplace: bool = False    # vLLM's field: refused when true (a loaded name is unloaded first here)


class UnloadLoraAdapter(msgspec.Struct, kw_only=True):
    lora_name: str
    lora_int_id: int | None = None   # vLLM's field, ignored: names are unique


def _catalog(ctx: ServingContext, name: str):   # noqa: ANN202 - a core.lora.LoraCatalog
    kernel = ctx.kernel
    if not kernel.config.runtime_lora_updates or kernel.loras is None:
        raise ApiError(404, "runtime LoRA updates are off on this server (modelcall serve "
                            "--allow-runtime-lora-updates turns them on)", error_type="not_found_error",
                       code="runtime_lora_updates_off")
    keys = bool(((kernel.config.plugin_config or {}).get("auth") or {}).get("api_keys"))
    check_lora_admin(ctx.exchange.caller if ctx.exchange is not None else None, name, keys)
    return kernel.loras


async def load(request: web.Request, ctx: ServingContext, body: LoadLoraAdapter) -> web.Response:
    """Load a LoRA adapter at run time (vLLM's load_lora_adapter; admin keys, when the operator allows it)."""
    catalog = _catalog(ctx, body.lora_name)
    if body.load_inplace:
        raise ApiError(400, "load_inplace is not supported: unload the adapter, then load it again", param="load_inplace")
    await anyio.to_thread.run_sync(catalog.load, body.lora_name, body.lora_path)
    return web.Response(text=f"Success: LoRA adapter '{body.lora_name}' added successfully.")


async def unload(request: web.Request, ctx: ServingContext, body: UnloadLoraAdapter) -> web.Response:
    """Unload a LoRA adapter (vLLM's unload_lora_adapter; admin keys, when the operator allows it)."""
    catalog = _catalog(ctx, body.lora_name)
    await anyio.to_thread.run_sync(catalog.unload, body.lora_name)   # replicas: every one of them is told
    return web.Response(text=f"Success: LoRA adapter '{body.lora_name}' removed successfully.")


def routes(json_route) -> list[tuple[str, str, object]]:   # noqa: ANN001 - app._json_route
    """The two routes as (method, path, handler), listed in /openapi.json with the other extra routes."""
    out = []
    for path, body, fn in (("/v1/load_lora_adapter", LoadLoraAdapter, load),
                           ("/v1/unload_lora_adapter", UnloadLoraAdapter, unload)):
        handler = json_route(body, fn)
        handler.__doc__ = fn.__doc__
        out.append(("POST", path, handler))
    return out
