"""The ledger plugin: records every model request of a kernel into SQLite, and `modelcall usage`.

    plugin_config = {"ledger": {"path": "/var/lib/modelcall/ledger.sqlite3", "queue": 10000}}

Off unless a path is configured (`modelcall serve` sets one: `--ledger PATH`, default in the
user data directory).
"""
from __future__ import annotations

import argparse
import sys
from typing import Any

from modelcall.core import hookimpl
from modelcall.events import OffloadedObserver

NAME = "ledger"  # the key of this plugin's state in `kernel.plugin_state`: (observer, recorder)


def settings(config: Any) -> dict[str, Any]:
    return dict((getattr(config, "plugin_config", None) or {}).get("ledger") or {})


@hookimpl(trylast=True)
def register_observers(register: Any, config: Any, kernel: Any) -> None:
    cfg = settings(config)
    if not cfg.get("path"):
        return
    from modelcall.events import RequestRejected
    from modelcall.plugins.ledger.recorder import EVENT_TYPES, Recorder
    from modelcall.plugins.ledger.throttle import UnauthenticatedThrottle

    recorder = Recorder(cfg["path"])
    observer = OffloadedObserver(handle_batch=recorder.handle_batch, maxsize=int(cfg.get("queue", 10_000)),
                                 name="ledger", max_batch=int(cfg.get("batch", 512)))
    kernel.plugin_state[NAME] = (observer, recorder)
    register(tuple(t for t in EVENT_TYPES if t is not RequestRejected), observer, name="ledger")
    register(RequestRejected, UnauthenticatedThrottle(observer), name="ledger")


def ledger_of(kernel: Any) -> tuple[OffloadedObserver, Any] | None:
    """(observer, recorder) of this kernel's ledger (None when off or stopped), for flushing in tests and tools."""
    return kernel.plugin_state.get(NAME)


@hookimpl(trylast=True)
def shutdown(kernel: Any) -> None:
    entry = kernel.plugin_state.pop(NAME, None)
    if entry is not None:
        observer, recorder = entry
        observer.close()
        recorder.close()


# ---- CLI ----------------------------------------------------------------------------------------

def _configure_usage(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ledger", metavar="PATH", help="the ledger database (default: the user data directory)")
    parser.add_argument("--by", choices=("key", "model", "day", "kind", "lora"), default="key",
                        help="group rows by (lora: the LoRA adapter, '-' the base model; default: key)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _run_usage(args: argparse.Namespace) -> int:
    from modelcall.plugins.ledger.store import default_path, open_readonly
    from modelcall.plugins.ledger.usage import render, summarize

    try:
        conn = open_readonly(args.ledger or default_path())
    except FileNotFoundError as e:
        print(f"modelcall usage: {e}", file=sys.stderr)
        return 2
    with conn:
        print(render(summarize(conn, args.by), args.by, args.json))
    return 0




def _configure_report(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("task_id", metavar="TASK_ID", help="the task id the requests were sent with")
    parser.add_argument("--ledger", metavar="PATH", help="the ledger database (default: the user data directory)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def _run_report(args: argparse.Namespace) -> int:
    import json

    from modelcall.plugins.ledger.report import render, task_report
    from modelcall.plugins.ledger.store import default_path, open_readonly

    try:
        conn = open_readonly(args.ledger or default_path())
        with conn:
            rep = task_report(conn, args.task_id)
    except (FileNotFoundError, LookupError) as e:
        print(f"modelcall report: {e.args[0] if e.args else e}", file=sys.stderr)
        return 2
    print(json.dumps(rep, indent=2) if args.json else render(rep))
    return 0


@hookimpl(trylast=True)
def register_commands(register: Any) -> None:
    register("usage", "summarize the request ledger by key, model, day, kind or LoRA adapter", _configure_usage, _run_usage)
    register("report", "what one task's model saw, where its time went, whether it completed, what it cost",
             _configure_report, _run_report)
