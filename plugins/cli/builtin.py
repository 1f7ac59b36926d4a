"""The built-in subcommand `generate` (stream one completion). `demo-model` is the demo-model plugin's."""
from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from modelcall.core import SamplingParams
from modelcall.core.commands import CommandError, add_kernel_options, kernel_from_args, wait_ready

if TYPE_CHECKING:
    from modelcall.plugins.cli.main import Command


def commands() -> list[Command]:
    from modelcall.plugins.cli.main import Command
    return [
        Command("generate", "generate text from a prompt, streamed to stdout", configure_generate, run_generate),
    ]


# ---- generate ---------------------------------------------------------------------------------

def configure_generate(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompt", required=True, metavar="TEXT", help="the prompt; - reads it from stdin")
    parser.add_argument("--chat", action="store_true", help="send the prompt as a user message (chat template)")
    parser.add_argument("--system", metavar="TEXT", help="a system message (with --chat)")
    parser.add_argument("--max-tokens", type=int, default=128, metavar="N", help="default: 128")
    parser.add_argument("--temperature", type=float, metavar="T", help="0 is greedy (default: 1.0)")
    parser.add_argument("--top-p", type=float, metavar="P")
    parser.add_argument("--top-k", type=int, metavar="K")
    parser.add_argument("--min-p", type=float, metavar="P")
    parser.add_argument("--seed", type=int, metavar="S")
    parser.add_argument("--stop", action="append", default=[], metavar="S", help="stop string (repeatable)")
    parser.add_argument("--ignore-eos", action="store_true", help="keep going past end-of-sequence tokens")
    parser.add_argument("--json", action="store_true", help="print every event as one JSON line")
    add_kernel_options(parser)


async def run_generate(args: argparse.Namespace) -> int:
    from modelcall.events import Finished, RequestFailed, TokensEmitted, to_json

    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    if args.system and not args.chat:
        raise CommandError("--system needs --chat")
    source: dict = {"prompt": prompt}
    if args.chat:
        messages = [{"role": "system", "content": args.system}] if args.system else []
        source = {"messages": [*messages, {"role": "user", "content": prompt}]}
    sampling = dict(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                    min_p=args.min_p, seed=args.seed, stop=tuple(args.stop), ignore_eos=args.ignore_eos or None)
    params = SamplingParams.create(**{k: v for k, v in sampling.items() if v is not None})  # bad input: before loading
    out = sys.stdout
    async with kernel_from_args(args) as kernel:
        await wait_ready(kernel)
        async for event in kernel.generate(**source, params=params):
            if args.json:
                out.write(to_json(event).decode() + "\n")
            elif type(event) is TokensEmitted:
                out.write(event.text)
            elif type(event) is Finished:
                out.write("\n")
            out.flush()
            if type(event) is RequestFailed:
                raise CommandError(f"the request failed: {event.error_type}: {event.message}", 1)
    return 0
