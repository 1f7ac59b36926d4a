"""`modelcall demo-model OUT_DIR`: write one of the demo models to a directory (registered by this
plugin through `register_commands`, so the CLI plugin never reaches into the demo model's code)."""
from __future__ import annotations

import argparse


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out_dir", metavar="OUT_DIR", help="a new or empty directory")
    kind = parser.add_mutually_exclusive_group()
    kind.add_argument("--random", action="store_true", help="the tiny random-weight model")
    kind.add_argument("--trained", action="store_true",
                      help="the small model trained on the project's synthetic tool chats")
    # neither: the one `modelcall serve` serves with no model flag (MODELCALL_DEMO_MODEL, else trained)


def run(args: argparse.Namespace) -> int:
    from modelcall.plugins.demo_model import build_demo_model, copy_trained_model
    from modelcall.plugins.demo_model.plugin import wanted_kind

    trained = args.trained or (not args.random and wanted_kind() == "trained")
    path = copy_trained_model(args.out_dir) if trained else build_demo_model(args.out_dir)
    print(path)
    return 0
