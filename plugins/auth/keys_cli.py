"""`modelcall keys list FILE` and `modelcall keys revoke NAME FILE`: read and edit a key file.

`revoke` sets `disabled = true` in the key's own `[[keys]]` block and leaves every other line
(comments included) as it was; the file is checked to load before it is replaced. A running
server applies the change within a second (each server process watches the file; SIGHUP
reloads at once): requests in flight finish, the next request with that key gets 401.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
import tomllib
from pathlib import Path

from modelcall.core.errors import ConfigError
from modelcall.plugins.auth.keys import KeyEntry, KeyStore

_NAME_LINE = re.compile(r"""^\s*name\s*=\s*(".*?"|'.*?')\s*(#.*)?$""")
_DISABLED_LINE = re.compile(r"^\s*disabled\s*=")


def _file_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("keys_file", metavar="FILE", nargs="?", default=os.environ.get("MODELCALL_API_KEYS"),
                        help="the key file (default: $MODELCALL_API_KEYS)")


def configure_list(parser: argparse.ArgumentParser) -> None:
    _file_arg(parser)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def configure_revoke(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="the key's name")
    _file_arg(parser)


def _load(path: str | None) -> KeyStore:
    if not path:
        raise ConfigError("name the key file (modelcall keys list FILE, or set MODELCALL_API_KEYS)")
    return KeyStore.load(path)


def _row(e: KeyEntry, now: float) -> dict:
    return {"name": e.name, "state": e.state(now), "models": e.models, "tools": e.tools, "priority": e.priority,
            "cache_group": e.cache_group, "rpm": e.rpm, "tpm": e.tpm, "daily_tokens": e.daily_tokens,
            "expires_at": e.expires_at.isoformat() if e.expires_at is not None else None}


def run_list(args: argparse.Namespace) -> int:
    try:
        store = _load(args.keys_file)
    except ConfigError as e:
        print(f"modelcall keys list: {e}", file=sys.stderr)
        return 2
    rows = [_row(e, time.time()) for e in store.entries]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    cols = ("name", "state", "priority", "models", "rpm", "tpm", "daily_tokens", "cache_group", "expires_at")
    table = [[_cell(r[c]) for c in cols] for r in rows]
    widths = [max(len(c), *(len(t[i]) for t in table)) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)).rstrip())
    for t in table:
        print("  ".join(v.ljust(w) for v, w in zip(t, widths)).rstrip())
    return 0


def _cell(v: object) -> str:
    if v is None:
        return "-"
    return ",".join(v) if isinstance(v, list) else str(v)


def revoked_text(text: str, name: str) -> str:
    """The key file's text with `disabled = true` in the block of key `name` (LookupError if none)."""
    lines = text.splitlines(keepends=True)
    starts = [i for i, ln in enumerate(lines) if ln.strip() == "[[keys]]"] + [len(lines)]
    for a, b in zip(starts, starts[1:]):
        block = lines[a:b]
        named = [i for i, ln in enumerate(block) if _NAME_LINE.match(ln) and _value(ln) == name]
        if not named:
            continue
        kept = [ln for ln in block if not _DISABLED_LINE.match(ln)]
        at = kept.index(block[named[0]]) + 1
        kept.insert(at, "disabled = true\n")
        if not kept[at - 1].endswith("\n"):
            kept[at - 1] += "\n"
        return "".join(lines[:a] + kept + lines[b:])
    raise LookupError(name)


def _value(line: str) -> object:
    try:
        return tomllib.loads(line.strip()).get("name")
    except tomllib.TOMLDecodeError:
        return None


def run_revoke(args: argparse.Namespace) -> int:
    try:
        store = _load(args.keys_file)
    except ConfigError as e:
        print(f"modelcall keys revoke: {e}", file=sys.stderr)
        return 2
    if args.name not in {e.name for e in store.entries}:
        print(f"modelcall keys revoke: no key named {args.name!r} in {args.keys_file} "
              f"(keys: {', '.join(e.name for e in store.entries)})", file=sys.stderr)
        return 2
    path = Path(args.keys_file)
    new = revoked_text(path.read_text(), args.name)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".keys-", suffix=".toml")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(new)
        check = KeyStore.load(tmp)  # never replace a loadable file with one that does not load
        if next(e for e in check.entries if e.name == args.name).state() != "disabled":
            raise ConfigError(f"could not mark {args.name!r} disabled in {path}")
        os.chmod(tmp, path.stat().st_mode & 0o777)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    print(f"revoked {args.name!r} in {path}; running servers apply it within a second (they watch the file; SIGHUP applies it at once)")
    return 0
