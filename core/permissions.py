"""The entry stage's permission step: what a caller may do with one request.

- model: a caller's allowlist applies to the model this kernel serves, under any of its names,
  whatever the request body says (leaving `model` out changes nothing);
- tools: every tool the request offers must be one the caller may use;
- priority: the less urgent (larger) of the caller's and the request's; a request may ask to
  run later than its key allows, never sooner;
- LoRA adapter: a caller's adapter allowlist and the adapters private to other keys (`check_lora`); loading and
  unloading adapters at run time needs the admin permission as well (`check_lora_admin`);
- cache scope: with a caller, the prefix-cache root is salted by the caller's cache scope (its
  `cache_group`, else its name), so one tenant's blocks never serve another's prompt and the
  `cached_tokens` figure (and the time to first token) tell a tenant nothing about what other
  tenants sent. Without a caller (no keys configured) the request's own salt is used as given.
"""
from __future__ import annotations

from collections.abc import Iterable

from modelcall.core.errors import PermissionDenied
from modelcall.core.metering import Caller

SCOPE_SEPARATOR = "\x1f"  # NOTE: cannot appear in a key name from TOML by accident; keeps scope and salt apart


def check_model(caller: Caller | None, served_names: Iterable[str]) -> None:
    if caller is None or caller.models is None or "*" in caller.models:
        return
    names = tuple(served_names)
    if not any(n in caller.models for n in names):
        raise PermissionDenied(f"the key {caller.name!r} may not use model {names[0]!r} (it may use: "
                               f"{', '.join(sorted(caller.models)) or 'none'})", field="model")


def check_tools(caller: Caller | None, names: tuple[str, ...]) -> None:
    if caller is None:
        return
    bad = caller.forbidden_tools(names)
    if bad:
        raise PermissionDenied(f"the key {caller.name!r} may not use tool(s) {', '.join(bad)}", field="tools")


def effective_priority(caller: Caller | None, requested: int | None) -> int:
    """Lower runs first: the request gets the less urgent of the two."""
    if caller is None:
        return requested or 0
    return caller.priority if requested is None else max(requested, caller.priority)


def cache_salt(caller: Caller | None, requested: str | None) -> str | None:
    """The salt of the request's prefix-cache root: the caller's scope first, then its own salt."""
    if caller is None:
        return requested
    scope = "tenant:" + caller.cache_scope
    return scope if not requested else scope + SCOPE_SEPARATOR + requested


def check_lora(caller: Caller | None, name: str) -> None:
    """403 when the caller may not run on the adapter `name` (not in its list, or private to another key)."""
    if caller is None or caller.may_use_lora(name):
        return
    raise PermissionDenied(f"the key {caller.name!r} may not use the LoRA adapter {name!r}", field="model")


def check_lora_admin(caller: Caller | None, name: str, keys_configured: bool) -> None:
    """403 unless the caller may load or unload the adapter `name`: an admin key that may use that name. With no
    keys configured at all nobody is authenticated, and the operator's enabling the routes is the only gate."""
    if caller is None:
        if keys_configured:
            raise PermissionDenied("loading and unloading LoRA adapters needs an API key with the admin permission",
                                   field="lora_name")
        return
    if not caller.admin:
        raise PermissionDenied(f"the key {caller.name!r} has no admin permission: it may not load or unload LoRA "
                               "adapters", field="lora_name")
    check_lora(caller, name)
