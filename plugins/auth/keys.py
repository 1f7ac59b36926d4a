"""The API-key file: `[[keys]]` entries with the sha256 of each key (plain keys are never stored).

    [[keys]]
    name = "ci"
    sha256 = "9f86d08188…"          # hashlib.sha256(key.encode()).hexdigest()
    models = ["demo"]               # omit for every model
    tools = ["search"]              # omit for every tool
    rpm = 60                        # requests per minute   (omit: no limit)
    tpm = 20000                     # tokens per minute     (prompt + completion)
    daily_tokens = 500000           # tokens per UTC day
    priority = 0                    # the most urgent its requests may run at (lower runs first)
    cache_group = "team-a"          # keys of one group share prefix-cache blocks (default: the key's own)
    expires_at = 2027-01-01T00:00:00Z   # refused from then on (a TOML datetime; no offset: UTC)
    disabled = false                # `modelcall keys revoke NAME` sets it; a server reloads a changed file within a second
    weight = 1.0                    # its share under `--scheduling fair` (2.0: twice the tokens of a 1.0 key when both wait)
    loras = ["support-v2"]          # the LoRA adapters it may use (omit: any not private to another key)
    private_loras = ["support-v2"]  # adapters private to this key: never listed to, nor usable by, another key
    permissions = ["admin"]         # admin: may load and unload LoRA adapters when the server allows runtime updates
"""
from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import logging
import os
import secrets
import threading
import time
import tomllib
from pathlib import Path
from typing import Any

import msgspec

from modelcall.core.errors import ConfigError
from modelcall.core.metering import Caller
from modelcall.core.quota_store import QuotaLimits

log = logging.getLogger("modelcall.auth")


Limits = QuotaLimits  # a key's limits are what the quota meters and stores apply (core/quota_store.py)


class KeyEntry(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: str
    sha256: str
    models: list[str] | None = None
    tools: list[str] | None = None
    rpm: int | None = None
    tpm: int | None = None
    daily_tokens: int | None = None
    priority: int = 0
    cache_group: str | None = None
    expires_at: dt.datetime | None = None
    disabled: bool = False
    weight: float = 1.0
    loras: list[str] | None = None
    private_loras: list[str] = []
    permissions: list[str] = []

    @property
    def expires_ts(self) -> float | None:
        if self.expires_at is None:
            return None
        at = self.expires_at if self.expires_at.tzinfo is not None else self.expires_at.replace(tzinfo=dt.UTC)
        return at.timestamp()

    def state(self, now: float | None = None) -> str:
        """active, disabled or expired."""
        if self.disabled:
            return "disabled"
        exp = self.expires_ts
        return "expired" if exp is not None and (time.time() if now is None else now) >= exp else "active"


class KeyFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    keys: list[KeyEntry] = []


PERMISSIONS = ("admin",)


def _private_owners(entries: list[KeyEntry]) -> dict[str, str]:
    """LoRA adapter -> the one key it is private to; an adapter private to two keys, or an unknown permission, is
    a configuration error."""
    owners: dict[str, str] = {}
    for e in entries:
        bad = sorted(set(e.permissions) - set(PERMISSIONS))
        if bad:
            raise ConfigError(f"API key {e.name!r}: unknown permission(s) {bad}; known: {list(PERMISSIONS)}")
        for name in e.private_loras:
            if owners.setdefault(name, e.name) != e.name:
                raise ConfigError(f"LoRA adapter {name!r} is private to two keys ({owners[name]!r}, {e.name!r}); "
                                  "an adapter is private to one key (share it with a loras list instead)")
    return owners


def digest_of(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def new_key() -> tuple[str, str]:
    """A fresh random key and its sha256 hex (the only part that goes into the key file)."""
    key = "mc-" + secrets.token_urlsafe(32)
    return key, hashlib.sha256(key.encode()).hexdigest()


class KeyStore:
    """The configured keys; `verify` finds a presented key's caller in constant time."""

    def __init__(self, entries: list[KeyEntry]) -> None:
        self.entries = list(entries)
        self._keys: list[tuple[bytes, Caller, KeyEntry]] = []
        seen: set[str] = set()
        private = _private_owners(entries)
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
            if not e.weight > 0:
                raise ConfigError(f"API key {e.name!r}: weight must be > 0, got {e.weight}")
            caller = Caller(name=e.name, priority=e.priority, weight=e.weight,
                            models=frozenset(e.models) if e.models is not None else None,
                            tools=frozenset(e.tools) if e.tools is not None else None,
                            limits=Limits(rpm=e.rpm, tpm=e.tpm, daily_tokens=e.daily_tokens),
                            cache_group=e.cache_group, expires_at=e.expires_ts,
                            loras=frozenset(e.loras) if e.loras is not None else None,
                            hidden_loras=frozenset(n for n, owner in private.items() if owner != e.name),
                            admin="admin" in e.permissions)
            self._keys.append((digest, caller, e))

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
        """The caller whose key this is, or None (also for a disabled or expired key)."""
        caller, state = self.check(presented)
        return caller if state == "active" else None

    def check(self, presented: str | None) -> tuple[Caller | None, str]:
        """(caller, state): state is active, disabled, expired or unknown. Compares digests in
        constant time, all of them."""
        if not presented:
            return None, "unknown"
        digest = digest_of(presented)
        found: tuple[Caller, KeyEntry] | None = None
        for known, caller, entry in self._keys:  # NOTE: no early exit, so timing does not tell which entry matched
            if hmac.compare_digest(digest, known):
                found = (caller, entry)
        if found is None:
            return None, "unknown"
        return found[0], found[1].state()


class KeyRing:
    """The key file of a running server: `reload()` (on SIGHUP) swaps in the file's new contents
    at once; a request in flight keeps the caller it was admitted with, the next one sees the change.
    A file that no longer loads leaves the old keys in place (and says why in the log)."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self.store = KeyStore.load(path)
        self.reloads = 0
        self._lock = threading.Lock()
        self._watcher: threading.Thread | None = None
        self._stop = threading.Event()

    def reload(self) -> bool:
        with self._lock:
            try:
                store = KeyStore.load(self.path)
            except ConfigError as e:
                log.error("API keys not reloaded, the old ones stay in force: %s", e)
                return False
            self.store = store  # NOTE: one reference swap; readers never see a half-loaded store
            self.reloads += 1
        log.info("API keys reloaded from %s: %d keys", self.path, len(store))
        return True

    def check(self, presented: str | None) -> tuple[Caller | None, str]:
        return self.store.check(presented)

    def _signature(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size, st.st_ino

    def watch(self, interval_s: float = 0.25) -> None:
        """Reload whenever the file changes (checked every `interval_s` by a daemon thread), so a
        revocation reaches this process within about `interval_s`, with no signal to send."""
        if self._watcher is not None:
            return
        self._stop.clear()
        seen = self._signature()

        def poll() -> None:
            nonlocal seen
            while not self._stop.wait(interval_s):
                now = self._signature()
                if now is not None and now != seen:
                    seen = now
                    self.reload()

        self._watcher = threading.Thread(target=poll, name="keys-watch", daemon=True)
        self._watcher.start()

    def stop_watching(self) -> None:
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=2)
            self._watcher = None


def presented_key(headers: Any) -> str | None:
    """The key from `Authorization: Bearer …` or `x-api-key: …`."""
    auth = headers.get("Authorization") or ""
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip() or None
    return (headers.get("x-api-key") or "").strip() or None
