"""`modelcall agent --base-url URL --tools module:function ... "question"`: run one task, print the
answer and its summary (or the whole TaskResult as JSON)."""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any

import msgspec

from modelcall.plugins.agent.client import OpenAIChatClient
from modelcall.plugins.agent.policy import Policy
from modelcall.plugins.agent.result import Budget
from modelcall.plugins.agent.runtime import Agent
from modelcall.plugins.agent.tools import Tool


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("question", help="the task for the model")
    parser.add_argument("--base-url", required=True, metavar="URL", help="an OpenAI-compatible server")
    parser.add_argument("--tools", nargs="+", default=[], metavar="MODULE:FUNCTION",
                        help="tools (plain typed functions or @tool objects)")
    parser.add_argument("--model", metavar="NAME")
    parser.add_argument("--api-key", metavar="KEY")
    parser.add_argument("--tool-choice", default="auto", metavar="CHOICE",
                        help="for the first model request: auto (default), required, none, or a function name; "
                             "later requests use auto")
    parser.add_argument("--max-turns", type=int, default=8, metavar="N")
    parser.add_argument("--max-tokens", type=int, metavar="N", help="token budget of the whole task")
    parser.add_argument("--max-wall-s", type=float, metavar="S", help="wall-time budget of the whole task")
    parser.add_argument("--task-id", metavar="ID")
    parser.add_argument("--yes", action="store_true", help="confirm dangerous tools without asking")
    parser.add_argument("--param", action="append", default=[], metavar="KEY=JSON",
                        help="a request field, e.g. temperature=0 or max_tokens=256 (repeatable)")
    parser.add_argument("--json", action="store_true", help="print the whole task result as JSON")


def load_tool(spec: str) -> Tool:
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        from modelcall.core.commands import CommandError
        raise CommandError(f"--tools wants MODULE:FUNCTION, got {spec!r}")
    try:
        obj = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        from modelcall.core.commands import CommandError
        raise CommandError(f"cannot load tool {spec!r}: {e}") from None
    return obj if isinstance(obj, Tool) else Tool(obj)


def _confirm(yes: bool) -> Any:
    def confirm(caller: str, tool: Tool, arguments: dict) -> bool:
        if yes:
            return True
        if not sys.stdin.isatty():
            return False
        return input(f"run dangerous tool {tool.name}({arguments})? [y/N] ").strip().lower() == "y"
    return confirm


async def run(args: argparse.Namespace) -> int:
    import json
    tools = [load_tool(s) for s in args.tools]
    choice: Any = args.tool_choice
    if choice not in ("auto", "required", "none"):
        choice = {"type": "function", "function": {"name": choice}}
    params = {}
    for p in args.param:
        k, _, v = p.partition("=")
        params[k] = json.loads(v)
    client = OpenAIChatClient(args.base_url, model=args.model, api_key=args.api_key)
    agent = Agent(client, tools, policy=Policy(confirm=_confirm(args.yes)), params=params,
                  tool_choice=lambda turn: choice if turn == 0 else "auto",
                  budget=Budget(max_turns=args.max_turns, max_tokens=args.max_tokens, max_wall_s=args.max_wall_s))
    try:
        result = await agent.run(args.question, task_id=args.task_id)
    finally:
        await client.close()
    if args.json:
        print(msgspec.json.encode(result).decode())
    else:
        print(result.answer if result.answer is not None else f"(no answer: {result.status})")
        print(result.summary(), file=sys.stderr)
    return 0 if result.status in ("answered", "truncated") else 1
