"""The operator's tools configuration (`modelcall serve --tools-config FILE`, TOML or JSON).

    [[servers]]
    label = "files"                       # namespaces its tools: the model sees files__read
    command = ["python", "files_server.py"]   # stdio: the server runs as a child process
    # url = "http://127.0.0.1:9000/mcp"   # or streamable HTTP
    env = { ROOT = "/srv/data" }
    timeout_s = 30                        # per call (default 30)
    changes_world = ["write"]             # these run at most once per (response, call)
    tool_timeouts = { slow_scan = 120 }

    claims_path = "/var/lib/modelcall/tool-claims.sqlite3"   # at-most-once records (default: memory)

The same table may come inline as `plugin_config = {"server_tools": {"servers": [...]}}`.
"""
from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import msgspec

from modelcall.core.errors import ConfigError

LABEL = re.compile(r"^[A-Za-z][A-Za-z0-9-]{0,63}$")  # no "_" runs: "__" separates label and tool


class ServerConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    label: str
    command: list[str] | None = None
    url: str | None = None
    env: dict[str, str] | None = None
    cwd: str | None = None
    timeout_s: float = 30.0
    connect_timeout_s: float = 20.0
    changes_world: list[str] = []
    tool_timeouts: dict[str, float] = {}
    description: str | None = None


class ToolsConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    servers: list[ServerConfig] = []
    claims_path: str | None = None
    config: str | None = None  # a file to read the rest from (the CLI's --tools-config)


def load(plugin_config: dict[str, Any] | None) -> ToolsConfig:
    raw = dict((plugin_config or {}).get("server_tools") or {})
    if raw.get("config"):
        raw = {**_read(raw["config"]), **{k: v for k, v in raw.items() if k != "config"}}
    try:
        cfg = msgspec.convert(raw, ToolsConfig)
    except msgspec.ValidationError as e:
        raise ConfigError(f"tools configuration: {e}") from None
    seen: set[str] = set()
    for s in cfg.servers:
        if not LABEL.match(s.label):
            raise ConfigError(f"tools configuration: server label {s.label!r} must be a letter then letters, "
                              "digits or '-' (64 at most)")
        if s.label in seen:
            raise ConfigError(f"tools configuration: server label {s.label!r} appears twice")
        seen.add(s.label)
        if (s.command is None) == (s.url is None):
            raise ConfigError(f"tools configuration: server {s.label!r} needs exactly one of command (stdio) "
                              "or url (streamable HTTP)")
        if s.timeout_s <= 0:
            raise ConfigError(f"tools configuration: server {s.label!r}: timeout_s must be > 0")
    return cfg


def _read(path: str) -> dict[str, Any]:
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise ConfigError(f"tools configuration file {path} does not exist") from None
    try:
        return json.loads(text) if p.suffix == ".json" else tomllib.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"tools configuration file {path}: {e}") from None
