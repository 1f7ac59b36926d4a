"""`modelcall`: parse global options, gather subcommands (built-in and from plugins), run one.

User errors (bad input, bad configuration, a missing model) print one line on stderr and exit 2;
a failure while running exits 1; only a bug shows a traceback.
"""
from __future__ import annotations

import argparse
import inspect
import os
import sys
from collections.abc import Callable, MutableMapping, Sequence
from typing import Any

from modelcall.core import ConfigError, InvalidRequest, ModelcallError, ModelNotFound, PluginHost
from modelcall.core import __version__
from modelcall.plugins.cli import builtin
from modelcall.core.commands import CommandError


class Command:
    __slots__ = ("name", "help", "configure", "run", "plugin")

    def __init__(self, name: str, help: str, configure: Callable[[argparse.ArgumentParser], Any],
                 run: Callable[[argparse.Namespace], Any], plugin: str = "modelcall") -> None:
        self.name, self.help, self.configure, self.run, self.plugin = name, help, configure, run, plugin


# About 1 ms of spinning on this machine (30 us per 1,000 spins, measured): the gaps inside a decode step.
COMPUTE_SPINCOUNT = "30000"


def compute_thread_defaults(environ: MutableMapping[str, str]) -> None:
    """How long torch's OpenMP workers spin between parallel regions, set before torch is imported (libgomp reads
    it once, when it loads). Under OMP_WAIT_POLICY=PASSIVE libgomp does not spin at all, so each of a decode
    step's ~40 small GEMMs pays a futex wake-up of its second thread (70-100 us against a 50-270 us GEMM);
    vLLM's CPU workers spin 5 ms (KMP_BLOCKTIME=5) under the same setting. modelcall's spin about 1 ms: the
    gaps inside a step, not the idle time between requests. An explicit GOMP_SPINCOUNT (0: never spin) wins.

    And torch's CPU allocations of 2 MB or more go on transparent huge pages (THP_MEM_ALLOC_ENABLE=1, torch's own
    switch; this machine's THP is "madvise", so nothing else gets them): the KV cache is read in 16-token blocks
    scattered over gigabytes, and with 4 KB pages each block is a TLB miss (decode attention 1.06-1.26x, W1's
    32 x 192 decode 9.6 -> 13.9-15.3 GB/s, benchmarks/decode_attention.py). An explicit value (0: off) wins."""
    environ.setdefault("GOMP_SPINCOUNT", COMPUTE_SPINCOUNT)
    environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # NOTE: before anything imports transformers: the command line shows no download-style bars.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    compute_thread_defaults(os.environ)
    plugins, blocked = _global_plugin_options(argv)
    try:
        commands = _commands(plugins, blocked)
    except ModelcallError as e:
        return _fail(f"{e} (block a plugin with -p no:NAME)", 1)
    parser = _parser(commands)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    return run_command(commands[_chosen(args)].run, args)


def run_command(run: Callable[[argparse.Namespace], Any], args: argparse.Namespace) -> int:
    """Run a subcommand (sync or async), turning errors into a message and an exit status."""
    try:
        result = run(args)
        if inspect.isawaitable(result):
            import anyio
            result = anyio.run(_wait, result)
        return int(result or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `modelcall generate ... | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except BaseException as e:  # noqa: BLE001 - sorted below; bugs are re-raised
        error = _unwrap(e)
        if isinstance(error, CommandError):
            return _fail(str(error), error.code)
        if isinstance(error, (InvalidRequest, ConfigError, ModelNotFound, FileExistsError, FileNotFoundError,
                              NotADirectoryError)):
            return _fail(str(error), 2)
        if isinstance(error, ModelcallError):
            return _fail(str(error), 1)
        raise


async def _wait(awaitable: Any) -> Any:
    return await awaitable


def _unwrap(e: BaseException) -> BaseException:
    """The one real error inside task-group exception groups."""
    while isinstance(e, BaseExceptionGroup) and len(e.exceptions) == 1:
        e = e.exceptions[0]
    return e


def _fail(message: str, code: int) -> int:
    print(f"modelcall: error: {message}", file=sys.stderr)
    return code


def _global_plugin_options(argv: list[str]) -> tuple[list[str], list[str]]:
    """`--plugin MODULE` and `-p no:NAME` given before the subcommand (needed to find subcommands)."""
    plugins: list[str] = []
    blocked: list[str] = []
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        arg = argv[i]
        for flag, into in (("--plugin", plugins), ("-p", blocked)):
            if arg == flag and i + 1 < len(argv):
                into.append(argv[i + 1])
                i += 1
            elif arg.startswith(flag + "=") or (flag == "-p" and arg.startswith("-p") and len(arg) > 2
                                                 and not arg.startswith("-p=")):
                into.append(arg[len(flag):].lstrip("="))
        i += 1
    return plugins, blocked


def _commands(plugins: list[str], blocked: list[str]) -> dict[str, Command]:
    commands = {c.name: c for c in builtin.commands()}
    host = PluginHost(plugins, blocked=blocked)
    for plugin, args, kw in host.collect("register_commands"):
        fields = dict(zip(("name", "help", "configure", "run"), args)) | kw
        try:
            cmd = Command(fields["name"], fields.get("help", ""), fields["configure"], fields["run"], plugin)
        except KeyError as e:
            raise ConfigError(f"plugin {plugin!r} registered a command without {e.args[0]!r}") from None
        clash = _clash(cmd.name, commands)
        if clash is not None:
            print(f"modelcall: warning: plugin {plugin!r} registers command {cmd.name!r}, which clashes with "
                  f"{clash!r} of {commands[clash].plugin!r}; ignored", file=sys.stderr)
            continue
        commands[cmd.name] = cmd
    return commands


def _clash(name: str, commands: dict[str, Command]) -> str | None:
    """The registered command `name` collides with: the same name, or a command and a group of one name."""
    if name in commands:
        return name
    group, _, member = name.partition(" ")
    if member and group in commands:
        return group
    return next((c for c in commands if c.startswith(name + " ")), None)


def _parser(commands: dict[str, Command]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="modelcall", description="Serve and run large language models.")
    parser.add_argument("--version", action="version", version=f"modelcall {__version__}")
    parser.add_argument("--plugin", dest="plugins", action="append", default=[], metavar="MODULE",
                        help="also load this plugin module (repeatable; before the subcommand)")
    parser.add_argument("-p", dest="blocked", action="append", default=[], metavar="no:NAME",
                        help="do not load the plugin NAME (repeatable; before the subcommand)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    groups: dict[str, Any] = {}
    for cmd in sorted(commands.values(), key=lambda c: c.name):
        group, _, member = cmd.name.partition(" ")
        if not member:
            p = sub.add_parser(cmd.name, help=cmd.help, description=cmd.help)
        else:  # "GROUP MEMBER": plugins join one group (e.g. `bench throughput`, `bench serve`)
            if group not in groups:
                members = sorted(c.name.partition(" ")[2] for c in commands.values() if c.name.startswith(group + " "))
                gp = sub.add_parser(group, help=f"{group} commands: {', '.join(members)}")
                groups[group] = gp.add_subparsers(dest=GROUP_MEMBER, metavar="SUBCOMMAND", required=True)
            p = groups[group].add_parser(member, help=cmd.help, description=cmd.help)
        cmd.configure(p)
    return parser


GROUP_MEMBER = "modelcall_subcommand"


def _chosen(args: argparse.Namespace) -> str:
    """The registered name of the command `args` chose ("GROUP MEMBER" for a group member)."""
    member = getattr(args, GROUP_MEMBER, None)
    return f"{args.command} {member}" if member else args.command
