"""Authorization in code: which caller may use which tool, and confirmation for dangerous ones."""
from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from modelcall.plugins.agent.tools import Tool

Confirm = Callable[[str, Tool, dict[str, Any]], bool | Awaitable[bool]]


class Policy:
    """`allow`: tool names every caller may use, or a mapping caller -> tool names (`"*"`: any
    caller). A tool outside the caller's allowlist is neither offered to the model nor run.
    `confirm(caller, tool, arguments)` decides each call of a dangerous tool (no callback: refused).
    """

    def __init__(self, allow: Iterable[str] | Mapping[str, Iterable[str]] | None = None, *,
                 confirm: Confirm | None = None) -> None:
        if allow is None:
            self._allow: dict[str, frozenset[str]] | None = None
        elif isinstance(allow, Mapping):
            self._allow = {caller: frozenset(names) for caller, names in allow.items()}
        else:
            self._allow = {"*": frozenset(allow)}
        self.confirm = confirm

    def allowed(self, caller: str, name: str) -> bool:
        if self._allow is None:
            return True
        names = self._allow.get(caller, self._allow.get("*", frozenset()))
        return name in names

    async def authorize(self, caller: str, tool: Tool, arguments: dict[str, Any]) -> str | None:
        """None when the call may run, else why not (fed back to the model)."""
        if not self.allowed(caller, tool.name):
            return f"tool {tool.name!r} is not permitted for {caller!r}"
        if tool.dangerous:
            if self.confirm is None:
                return f"tool {tool.name!r} is dangerous and no one is here to confirm it"
            ok = self.confirm(caller, tool, arguments)
            if inspect.isawaitable(ok):
                ok = await ok
            if not ok:
                return f"the call of {tool.name!r} was not confirmed"
        return None
