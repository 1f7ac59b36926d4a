"""The API-key file: `[[keys]]` entries with the sha256 of each key (plain keys are never stored).

    [[keys]]
    name = "ci"
    sha256 = "9f86d08188…"          # hashlib.sha256(key.encode()).hexdigest()
    models = ["demo"]               # omit for every model
    tools = ["search"]              # omit for every tool
    rpm = 60                        # requests per minute   (omit: no limit)
    tpm = 20000                     # tokens per minute     (prompt + completion)
    daily_tokens = 500000           # tokens per UTC day
    priority = 0
"""
from __future__ import annotations

import hashlib
import hmac
import secrets
import tomllib
from pathlib import Path
from typing import Any

import msgspec

from modelcall.core.errors import ConfigError
from modelcall.core.metering import Caller


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    rpm: int | None = None
    tpm: int | None = None
    daily_tokens: int | None = None


class KeyEntry(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: str
    sha256: str
    models: list[str] | None = None
    tools: list[str] | None = None
    rpm: int | None = None
    tpm: int | None = None
    daily_tokens: int | None = None
    priority: int = 0


class KeyFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    keys: list[KeyEntry] = []


def digest_of(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def new_key() -> tuple[str, str]:
    """A fresh random key and its sha256 hex (the only part that goes into the key file)."""
    key = "mc-" + secrets.token_urlsafe(32)
    return key, hashlib.sha256(key.encode()).hexdigest()


class KeyStore:
    """The configured keys; `verify` finds a presented key's caller in constant time."""

    def __init__(self, entries: list[KeyEntry]) -> None:
        self._keys: list[tuple[bytes, Caller]] = []
        seen: set[str] = set()
        for e in entries:
            if e.name in seen:
                raise ConfigError(f"API key name {e.name!r} appears twice; names must be unique")
            seen.add(e.name)
            try:
                digest = bytes.fromhex(e.sha256)
            except ValueError:
                digest = b""
            if len(digest) != 32:
                raise ConfigError(f"API key {e.name!r}: sha256 must be 64 hex characters (the key's SHA-256)")
            for field in ("rpm", "tpm", "daily_tokens"):
                v = getattr(e, field)
                if v is not None and v < 1:
                    raise ConfigError(f"API key {e.name!r}: {field} must be >= 1 or omitted, got {v}")
            caller = Caller(name=e.name, priority=e.priority,
                            models=frozenset(e.models) if e.models is not None else None,
                            tools=frozenset(e.tools) if e.tools is not None else None,
                            limits=Limits(rpm=e.rpm, tpm=e.tpm, daily_tokens=e.daily_tokens))
            self._keys.append((digest, caller))

    @classmethod
    def load(cls, path: str | Path) -> KeyStore:
        try:
            raw: dict[str, Any] = tomllib.loads(Path(path).read_text())
            parsed = msgspec.convert(raw, KeyFile)
        except FileNotFoundError:
            raise ConfigError(f"API key file {path} does not exist") from None
        except (tomllib.TOMLDecodeError, msgspec.ValidationError) as e:
            raise ConfigError(f"API key file {path}: {e}") from None
        if not parsed.keys:
            raise ConfigError(f"API key file {path} has no [[keys]] entries")
        return cls(parsed.keys)

    def __len__(self) -> int:
        return len(self._keys)

    def verify(self, presented: str | None) -> Caller | None:
        """The caller whose key this is, or None. Compares digests in constant time, all of them."""
        if not presented:
            return None
        digest = digest_of(presented)
        found = None
        for known, caller in self._keys:  # NOTE: no early exit, so timing does not tell which entry matched
            if hmac.compare_digest(digest, known):
                found = caller
        return found


def presented_key(headers: Any) -> str | None:
    """The key from `Authorization: Bearer …` or `x-api-key: …`."""
    auth = headers.get("Authorization") or ""
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip() or None
    return (headers.get("x-api-key") or "").strip() or None
