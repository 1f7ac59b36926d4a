"""Registers `modelcall agent`."""
from __future__ import annotations

from typing import Any

from modelcall.core import hookimpl


@hookimpl
def register_commands(register: Any) -> None:
    from modelcall.plugins.agent import cli
    register("agent", "run a task with tools against an OpenAI-compatible server", cli.configure, cli.run)
