"""Tools for plugin authors: `modelcall plugins [--json]`, `GET /-/plugins` and the hook reference
(`python -m modelcall.plugins.devtools.hookdocs`)."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from modelcall.core import KernelConfig, PluginHost, hookimpl
from modelcall.plugins.devtools.listing import describe, render_text


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON (the same as GET /-/plugins)")


def run(args: argparse.Namespace) -> int:
    """List what is installed without loading a model. `--plugin MODULE` and `-p no:NAME` are the
    command line's global options (before the subcommand)."""
    host = PluginHost(list(getattr(args, "plugins", None) or ()), blocked=list(getattr(args, "blocked", None) or ()))
    listing = describe(host, KernelConfig())
    sys.stdout.write(json.dumps(listing, indent=2) + "\n" if args.json else render_text(listing))
    return 0


@hookimpl
def register_commands(register: Any) -> None:
    register("plugins", "list installed plugins, the hooks each implements and who provides each stage",
             configure, run)


@hookimpl
def register_routes(register: Any, kernel: Any) -> None:
    from aiohttp import web  # only where served

    async def plugins(_request: web.Request) -> web.Response:
        """Installed plugins, their versions and hooks, and the plugin that provides each stage."""
        return web.json_response(describe(kernel.host, kernel.config, running=True))

    register("GET", "/-/plugins", plugins)
