"""API keys for `modelcall serve --api-keys FILE`: the middleware and the quota meter.

    plugin_config = {"auth": {"api_keys": "/etc/modelcall/keys.toml"}}
    plugin_config = {"auth": {"api_keys": "...", "quota_store": "redis://127.0.0.1:6379/0",
                              "quota_store_fail": "closed"}}   # quotas shared by processes (docs/tenancy.md)
"""
from __future__ import annotations

import logging
import signal
from typing import Any

from modelcall.core import hookimpl
from modelcall.core.errors import ConfigError
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


def auth_config(config: Any) -> dict[str, Any]:
    return (getattr(config, "plugin_config", None) or {}).get("auth") or {}


@hookimpl(trylast=True)
def register_meters(register: Any, config: Any, kernel: Any) -> None:
    if not keys_file(config):
        return
    url = auth_config(config).get("quota_store")
    if not url:
        register(QuotaBook())  # one process: its own counters
        return
    from modelcall.plugins.auth.shared_quota import SharedQuotaBook
    from modelcall.plugins.auth.store_redis import RedisQuotaStore

    if not str(url).startswith(("redis://", "rediss://", "unix://")):
        raise ConfigError(f"quota_store must be a redis://HOST:PORT URL, got {url!r}")
    book = SharedQuotaBook(RedisQuotaStore(url), fail=auth_config(config).get("quota_store_fail", "closed"),
                           name=f"the quota store at {_without_password(url)}")
    kernel.plugin_state[NAME + ".quota"] = book
    register(book)


def _without_password(url: str) -> str:
    """The URL as logs and errors may show it."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return url if parts.password is None else url.replace(f":{parts.password}@", ":***@", 1)


@hookimpl(trylast=True)
def startup(kernel: Any) -> None:
    ring = ring_of(kernel)  # NOTE: a bad key file fails the start, not the first request
    if ring is None:
        return
    # Revocation reaches every process within a second: each one watches the file (docs/tenancy.md).
    ring.watch(float(auth_config(kernel.config).get("watch_interval_s", 0.25)))
    import asyncio

    try:
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, ring.reload)
    except (RuntimeError, ValueError, NotImplementedError, AttributeError) as e:  # not the main thread, or no SIGHUP
        log.info("API keys will not reload on SIGHUP here (%s); call the key ring's reload()", e)
    else:
        kernel.plugin_state[NAME + ".sighup"] = True


@hookimpl(trylast=True)
def shutdown(kernel: Any) -> None:
    ring = kernel.plugin_state.get(NAME)
    if ring is not None:
        ring.stop_watching()
    book = kernel.plugin_state.pop(NAME + ".quota", None)
    if book is not None:
        book.close()
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
