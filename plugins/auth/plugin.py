"""API keys for `modelcall serve --api-keys FILE`: the middleware and the quota meter.

    plugin_config = {"auth": {"api_keys": "/etc/modelcall/keys.toml"}}
"""
from __future__ import annotations

import logging
import signal
from typing import Any

from modelcall.core import hookimpl
from modelcall.plugins.auth.keys import KeyRing
from modelcall.plugins.auth.quota import QuotaBook

log = logging.getLogger("modelcall.auth")
NAME = "auth"  # this plugin's state in `kernel.plugin_state`: the KeyRing of the served key file


def keys_file(config: Any) -> str | None:
    return ((getattr(config, "plugin_config", None) or {}).get("auth") or {}).get("api_keys")


def ring_of(kernel: Any) -> KeyRing | None:
    """The kernel's key ring (loaded once, reloaded on SIGHUP), or None without --api-keys."""
    ring = kernel.plugin_state.get(NAME)
    if ring is None:
        path = keys_file(kernel.config)
        if path:
            ring = kernel.plugin_state[NAME] = KeyRing(path)
    return ring


@hookimpl(trylast=True)
def register_meters(register: Any, config: Any) -> None:
    if keys_file(config):
        register(QuotaBook())


@hookimpl(trylast=True)
def startup(kernel: Any) -> None:
    ring = ring_of(kernel)  # NOTE: a bad key file fails the start, not the first request
    if ring is None:
        return
    import asyncio

    try:
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, ring.reload)
    except (RuntimeError, ValueError, NotImplementedError, AttributeError) as e:  # not the main thread, or no SIGHUP
        log.info("API keys will not reload on SIGHUP here (%s); call the key ring's reload()", e)
    else:
        kernel.plugin_state[NAME + ".sighup"] = True


@hookimpl(trylast=True)
def shutdown(kernel: Any) -> None:
    if kernel.plugin_state.pop(NAME + ".sighup", False):
        import asyncio

        try:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
        except (RuntimeError, ValueError):
            pass
    kernel.plugin_state.pop(NAME, None)


@hookimpl(trylast=True)
def register_middlewares(register: Any, config: Any, kernel: Any) -> None:
    ring = ring_of(kernel)
    if ring is not None:
        from modelcall.plugins.auth.middleware import auth_middleware  # aiohttp only where served

        def publish(event: Any) -> None:  # refusals reach the metrics, the ledger and the request log
            kernel.bus.publish((event,))

        register(auth_middleware(ring, publish=publish), order=-100)


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
    from modelcall.plugins.auth.keys_cli import configure_list, configure_revoke, run_list, run_revoke

    register("keys new", "make an API key: prints its [[keys]] entry (the sha256 only) and the key once on stderr",
             _configure_keys, _run_keys)
    register("keys list", "list the keys of a key file: name, state (active, disabled, expired), limits",
             configure_list, run_list)
    register("keys revoke", "disable a key in a key file (a running server applies it on SIGHUP)",
             configure_revoke, run_revoke)
