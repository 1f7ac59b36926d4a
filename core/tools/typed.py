"""Tools as typed Python functions, shared by the app-side agent runtime (plugins/agent) and the
server-hosted tools (plugins/server_tools): the JSON Schema of the arguments comes from the type
hints (through msgspec), the description from the docstring."""
from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, get_type_hints

import msgspec


class Tool:
    """A function the model may call. `dangerous` tools need the policy's confirmation;
    `changes_world` tools run at most once per idempotency key (task id + call id)."""

    def __init__(self, fn: Callable[..., Any], *, name: str | None = None, description: str | None = None,
                 dangerous: bool = False, changes_world: bool = False, timeout_s: float = 30.0,
                 parameters: dict[str, Any] | None = None) -> None:
        self.fn = fn
        self.name = name or fn.__name__
        self.description = (description or inspect.getdoc(fn) or "").strip()
        self.dangerous = dangerous
        self.changes_world = changes_world
        self.timeout_s = timeout_s
        self.parameters = parameters if parameters is not None else schema_of(fn)
        self.is_async = inspect.iscoroutinefunction(fn)
        self.takes_key = "idempotency_key" in inspect.signature(fn).parameters

    def openai(self) -> dict[str, Any]:
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        flags = [f for f, on in (("dangerous", self.dangerous), ("changes_world", self.changes_world)) if on]
        return f"Tool({self.name!r}{', ' if flags else ''}{', '.join(flags)})"


def tool(fn: Callable[..., Any] | None = None, **options: Any) -> Any:
    """Decorate a function as a Tool: `@tool` or `@tool(dangerous=True, changes_world=True, timeout_s=5)`."""
    if fn is None:
        return lambda f: Tool(f, **options)
    return Tool(fn, **options)


def schema_of(fn: Callable[..., Any]) -> dict[str, Any]:
    """The JSON Schema (an object) of `fn`'s parameters from its type hints. Parameters without a
    default are required; `idempotency_key` (filled by the runtime) is not shown to the model."""
    hints = get_type_hints(fn, include_extras=True)
    fields = []
    for p in inspect.signature(fn).parameters.values():
        if p.name == "idempotency_key" or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        ann = hints.get(p.name, Any)
        fields.append((p.name, ann) if p.default is p.empty else (p.name, ann, p.default))
    struct = msgspec.defstruct(f"{fn.__name__}_args", fields, kw_only=True, forbid_unknown_fields=True)
    (out,), components = msgspec.json.schema_components([struct], ref_template="#/$defs/{name}")
    name = out["$ref"].rsplit("/", 1)[-1]
    schema = dict(components.pop(name))
    schema.pop("title", None)
    schema.setdefault("properties", {})
    schema.setdefault("required", [])
    if components:
        schema["$defs"] = components
    return schema
