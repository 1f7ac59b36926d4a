"""`modelcall serve`: start a kernel, serve it over HTTP, drain on SIGTERM and exit 0."""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from modelcall.core import Kernel
from modelcall.core.host import PluginHost
from modelcall.plugins.http.app import INFLIGHT, create_app
from modelcall.plugins.http.settings import ServerSettings

log = logging.getLogger("modelcall.http")
_DEFAULTS = ServerSettings()


def configure(parser: argparse.ArgumentParser) -> None:
    _add_kernel_options(parser)
    parser.add_argument("--served-model-name", action="append", default=None, metavar="NAME",
                        help="the name clients use for the model (repeatable; the first is reported)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on (0: any free port)")
    parser.add_argument("--max-running", type=int, default=None, metavar="N",
                        help="at most N sequences running at once (the kernel's max_num_seqs)")
    parser.add_argument("--max-queued", type=int, default=None, metavar="N",
                        help="at most N requests waiting; more get 429 with Retry-After (the kernel's max_queued)")
    parser.add_argument("--max-body-bytes", type=int, default=_DEFAULTS.max_body_bytes, metavar="N",
                        help="larger request bodies get 413")
    parser.add_argument("--drain-timeout", type=float, default=_DEFAULTS.drain_timeout_s, metavar="S",
                        help="on SIGTERM, how long in-flight requests may take to finish")
    g = parser.add_argument_group("security and records")
    g.add_argument("--api-keys", metavar="FILE", help="TOML file of [[keys]] (name, sha256, models, tools, rpm, tpm, "
                   "daily_tokens, priority); every route but /health and /ready then needs a key")
    g.add_argument("--quota-store", metavar="URL", help="keep the keys' quotas in this Redis (redis://HOST:PORT/DB), "
                   "shared by every process that names it: replicas and front ends (docs/tenancy.md)")
    g.add_argument("--quota-store-fail", choices=["open", "closed"], default="closed",
                   help="when the quota store cannot be reached: closed refuses with 503 (default), open counts "
                   "in this process only and shows modelcall:quota_store_fail_open 1 on /metrics")
    g.add_argument("--ledger", metavar="PATH", help="SQLite request ledger (default: in the user data directory; "
                   "'off' disables it)")
    g.add_argument("--request-log", metavar="PATH", help="write the JSON request log to PATH (default: stderr log)")
    g.add_argument("--log-text", action="store_true", help="include outputs and tool arguments in the request log")
    g.add_argument("--blocklist", metavar="FILE", help="refuse prompts and end outputs containing any line of FILE")
    g.add_argument("--redact-pii", action="store_true", help="redact emails, phone and card numbers in outputs")
    g.add_argument("--no-metrics", action="store_true", help="do not serve /metrics")
    t = parser.add_argument_group("responses API and server-hosted tools")
    t.add_argument("--tools-config", metavar="FILE", help="TOML or JSON file of [[servers]] (MCP servers over stdio "
                   "or streamable HTTP) whose tools run inside /v1/responses requests (docs/server-tools.md)")
    r = parser.add_argument_group("replicas (the scale extra: Ray Serve; docs/scale.md)")
    r.add_argument("--replicas", type=_replica_count, default=None, metavar="N",
                   help="serve N kernel replicas on Ray Serve behind this front end, routed by prefix")
    r.add_argument("--ray-address", metavar="ADDR", help="join this Ray cluster (default: start a local one)")
    t.add_argument("--responses-store", metavar="PATH", help="SQLite file of stored responses (default: in memory, "
                   "bounded; docs/responses.md)")


def _replica_count(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def _add_kernel_options(parser: argparse.ArgumentParser) -> None:
    try:
        from modelcall.core.commands import add_kernel_options
    except ImportError:  # the CLI plugin is not installed: the options serve needs itself
        parser.add_argument("--model", default=None, help="a Hugging Face model directory (default: the demo model)")
        parser.add_argument("--max-model-len", type=int, default=None)
        parser.add_argument("--num-kv-blocks", type=int, default=None)
        parser.add_argument("--plugin", action="append", default=[], metavar="MODULE")
        parser.add_argument("-p", dest="blocked", action="append", default=[], metavar="no:NAME")
    else:
        add_kernel_options(parser)


def _records_config(args: argparse.Namespace) -> dict[str, dict]:
    """plugin_config for the security and records plugins, from the options above."""
    out: dict[str, dict] = {}
    if getattr(args, "api_keys", None):
        out["auth"] = {"api_keys": args.api_keys}
        if getattr(args, "quota_store", None):
            out["auth"].update(quota_store=args.quota_store, quota_store_fail=args.quota_store_fail)
    elif getattr(args, "quota_store", None):
        raise SystemExit("--quota-store holds the quotas of API keys: give --api-keys FILE too")
    ledger = getattr(args, "ledger", None)
    if ledger != "off":
        if ledger is None:
            import platformdirs

            ledger = str(Path(platformdirs.user_data_dir("modelcall")) / "ledger.sqlite3")
        out["ledger"] = {"path": ledger}
    out["request_log"] = {"path": getattr(args, "request_log", None), "include_text": bool(getattr(args, "log_text", False))}
    safety: dict[str, Any] = {}
    if getattr(args, "blocklist", None):
        safety["blocklist"] = [ln.strip() for ln in Path(args.blocklist).read_text().splitlines() if ln.strip()]
    if getattr(args, "redact_pii", False):
        safety["redact_pii"] = True
    if safety:
        out["safety"] = safety
    if getattr(args, "no_metrics", False):
        out["metrics"] = {"enabled": False}
    if getattr(args, "tools_config", None):
        out["server_tools"] = {"config": args.tools_config}
    if getattr(args, "responses_store", None):
        out["responses"] = {"path": args.responses_store}
    return out


def _kernel_from_args(args: argparse.Namespace) -> Kernel:
    overrides: dict[str, Any] = {}
    records = _records_config(args)
    if args.served_model_name:
        overrides["served_model_name"] = args.served_model_name[0]
    if args.max_running is not None:
        overrides["max_num_seqs"] = args.max_running
    if args.max_queued is not None:
        overrides["max_queued"] = args.max_queued
    try:
        from modelcall.core.commands import kernel_from_args
    except ImportError:
        fields = {k: getattr(args, k) for k in ("model", "max_model_len", "num_kv_blocks")
                  if getattr(args, k, None) is not None}
        return Kernel(plugins=args.plugin, blocked=args.blocked, plugin_config=records, **fields, **overrides)
    # NOTE: an explicit --plugin-config NAME=... comes later and wins over these.
    args.plugin_config = [f"{name}={json.dumps(cfg)}" for name, cfg in records.items()] + list(args.plugin_config)
    kernel = kernel_from_args(args, **overrides)
    if getattr(args, "replicas", None) or getattr(args, "ray_address", None):
        return _replicated(args, kernel)
    return kernel


def _replicated(args: argparse.Namespace, kernel: Kernel) -> Any:
    """The kernel's configuration served by N replicas: whatever plugin provides
    `provide_replicated_kernel` (the built-in one is plugins/scale, on Ray Serve)."""
    if getattr(args, "api_keys", None) and not getattr(args, "quota_store", None):
        log.warning("--replicas %s without --quota-store: each replica keeps its own quota counters, so a key may "
                    "use up to %s times its limits; give --quota-store redis://HOST:PORT to share them",
                    args.replicas or 1, args.replicas or 1)
    plugins, blocked = tuple(getattr(args, "plugins", ())), tuple(getattr(args, "blocked", ()))
    host = PluginHost(plugins, blocked=blocked)
    replicated = host.pm.hook.provide_replicated_kernel(
        config=kernel.config, plugins=plugins, blocked=blocked, num_replicas=args.replicas or 1,
        ray_address=args.ray_address)
    if replicated is None:
        raise SystemExit("--replicas needs a plugin that provides replicas: pip install 'modelcall[scale]'")
    return replicated


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = ServerSettings(host=args.host, port=args.port, max_body_bytes=args.max_body_bytes,
                              drain_timeout_s=args.drain_timeout,
                              served_model_names=tuple((args.served_model_name or [])[1:]))
    return asyncio.run(serve(_kernel_from_args(args), settings))


async def serve(kernel: Kernel, settings: ServerSettings, stop: asyncio.Event | None = None) -> int:
    """Serve until SIGTERM/SIGINT (or `stop` is set), then drain: new requests get 503, running
    ones may finish within `settings.drain_timeout_s`."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with kernel:
        app = create_app(kernel, settings)
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None,
                               shutdown_timeout=max(1.0, settings.drain_timeout_s))
        await runner.setup()
        site = web.TCPSite(runner, settings.host, settings.port)
        await site.start()
        host, port = runner.addresses[0][:2]
        # NOTE: tests and scripts read this line to find the port when --port 0 was given.
        print(f"modelcall: serving {kernel.model_name!r} on http://{host}:{port}", flush=True)
        await stop.wait()
        t0 = time.monotonic()
        log.info("draining: refusing new requests, waiting up to %.0f s for %d running",
                 settings.drain_timeout_s, kernel.stats()["unfinished"])
        finished = await kernel.drain(settings.drain_timeout_s)
        # The kernel is done; give handlers a moment to write their last frames.
        while app[INFLIGHT]["count"] and time.monotonic() - t0 < settings.drain_timeout_s + 2:
            await asyncio.sleep(0.02)
        log.info("drained (%s) in %.2f s; stopping", "all finished" if finished else "timed out",
                 time.monotonic() - t0)
        await runner.cleanup()
    print("modelcall: stopped", flush=True)
    sys.stdout.flush()
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m modelcall.plugins.http.serve ...`: the same as `modelcall serve ...`."""
    parser = argparse.ArgumentParser(prog="modelcall serve", description="serve the model over HTTP")
    configure(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
