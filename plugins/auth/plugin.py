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
def register_middlewares(register: Any, config: Any, kernel: Any) -> None:
    path = keys_file(config)
    if path:
        from modelcall.plugins.auth.middleware import auth_middleware  # aiohttp only where served

        def publish(event: Any) -> None:  # refusals reach the metrics, the ledger and the request log
            kernel.bus.publish((event,))

        register(auth_middleware(KeyStore.load(path), publish=publish), order=-100)


def _configure_keys(parser: Any) -> None:
    parser.add_argument("name", metavar="NAME", help="a name for the key (recorded with every request it makes)")
    parser.add_argument("--rpm", type=int, help="requests per minute")
    parser.add_argument("--tpm", type=int, help="tokens per minute (prompt + completion)")
    parser.add_argument("--daily-tokens", type=int, help="tokens per UTC day")
    parser.add_argument("--models", nargs="+", help="models the key may use (default: all)")
    parser.add_argument("--tools", nargs="+", help="tools the key may offer (default: all)")


def _run_keys(args: Any) -> int:
    import json
    import sys

    from modelcall.plugins.auth.keys import new_key

    key, digest = new_key()
    lines = ["[[keys]]", f"name = {json.dumps(args.name)}", f'sha256 = "{digest}"']
    for field in ("rpm", "tpm", "daily_tokens"):
        if getattr(args, field) is not None:
            lines.append(f"{field} = {getattr(args, field)}")
    for field in ("models", "tools"):
        if getattr(args, field):
            lines.append(f"{field} = {json.dumps(getattr(args, field))}")
    print("\n".join(lines))
    print(f"# the key (shown once, not stored anywhere): {key}", file=sys.stderr)
    return 0


@hookimpl(trylast=True)
def register_commands(register: Any) -> None:
    register("keys new", "make an API key: prints its [[keys]] entry (the sha256 only) and the key once on stderr",
             _configure_keys, _run_keys)
