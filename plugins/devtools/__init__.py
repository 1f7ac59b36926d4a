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
    if not any("--plugin" in a.option_strings for a in parser._actions):
        parser.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                            help="also load this plugin module (repeatable)")
    if not any("-p" in a.option_strings for a in parser._actions):
        parser.add_argument("-p", dest="blocked", action="append", default=[], metavar="no:NAME",
                            help="block an installed plugin by name (repeatable)")


def run(args: argparse.Namespace) -> int:
    """List what is installed without loading a model."""
    plugins = list(getattr(args, "plugin", None) or [])
    blocked = list(getattr(args, "blocked", None) or [])
    host = PluginHost(plugins, blocked=blocked)
    listing = describe(host, KernelConfig())
    sys.stdout.write(json.dumps(listing, indent=2) + "\n" if args.json else render_text(listing))
    return 0


@hookimpl
def register_commands(register: Any) -> None:
    register("plugins", "list installed plugins, the hooks each implements and who provides each stage",
             configure, run)
