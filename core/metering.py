"""Who is calling, and the meters that charge them: reserve at admission, settle at the end.

A front end that authenticates a caller sets it for the current task with `acting_as(caller)`
(a context variable holding an `Exchange`, so the kernel's `submit` called from the same task
sees it without every handler passing it along). At admission the kernel hands each meter that has a `reserve`
method an `Admission`; a meter refuses by raising `Overloaded` (429, with `retry_after`) or
`PermissionDenied` (403). Every meter's `observe(event)` then receives the request's terminal
event (Finished, RequestFailed or RequestRejected) and settles what it reserved.

NOTE: reserve-then-settle is what keeps a quota true under a burst: a reservation counts
immediately (prompt tokens + max_tokens), before any token is computed, and is replaced by
the real usage when the request ends.
"""
from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol, runtime_checkable

import msgspec


class Caller(msgspec.Struct, frozen=True, kw_only=True):
    """An authenticated caller. `name` is recorded with each request (never the key itself).

    `models` / `tools`: what the caller may use (None: anything). `limits` is the meters' own
    (e.g. requests and tokens per minute).
    """

    name: str
    priority: int = 0
    models: frozenset[str] | None = None
    tools: frozenset[str] | None = None
    limits: Any = None

    def may_use_model(self, model: str) -> bool:
        return self.models is None or model in self.models or "*" in self.models

    def forbidden_tools(self, names: list[str]) -> list[str]:
        if self.tools is None or "*" in self.tools:
            return []
        return [n for n in names if n not in self.tools]


CONTEXT_DROPPED_HEADER = "x-modelcall-context-dropped"


class Exchange:
    """What a front end knows about one client exchange (e.g. one HTTP request) before the kernel
    sees it, and what the kernel admitted for it. Set with `exchange(...)`; `Kernel.submit`
    reads it for anything its own arguments leave unset, and appends the handles it returns."""

    __slots__ = ("caller", "task_id", "context_policy", "retries", "handles")

    def __init__(self, caller: Caller | None = None, task_id: str | None = None, context_policy: str | None = None,
                 retries: int = 0) -> None:
        self.caller = caller
        self.task_id = task_id
        self.context_policy = context_policy
        self.retries = retries
        self.handles: list[Any] = []

    def response_headers(self) -> dict[str, str]:
        """Headers a front end adds to its response: what a context policy dropped, if anything."""
        for h in self.handles:
            c = getattr(h, "context", None)
            if c:
                return {CONTEXT_DROPPED_HEADER: (f"policy={c['policy']}; messages={c['dropped_messages']}; "
                                                 f"tokens={c['dropped_tokens']}")}
        return {}


def exchange_headers() -> dict[str, str]:
    """`response_headers()` of the current exchange ({} outside one)."""
    ex = _current.get()
    return ex.response_headers() if ex is not None else {}


_current: contextvars.ContextVar[Exchange | None] = contextvars.ContextVar("modelcall_exchange", default=None)


def current_exchange() -> Exchange | None:
    return _current.get()


def current_caller() -> Caller | None:
    """The caller set for the current task, or None (unauthenticated / embedded use)."""
    ex = _current.get()
    return ex.caller if ex is not None else None


@contextmanager
def exchange(**fields: Any) -> Iterator[Exchange]:
    """Within this block, requests submitted from this task carry these fields. Nested blocks
    update the enclosing exchange (so an auth middleware and a records middleware share one)."""
    outer = _current.get()
    if outer is not None:
        for k, v in fields.items():
            setattr(outer, k, v)
        yield outer
        return
    ex = Exchange(**fields)
    token = _current.set(ex)
    try:
        yield ex
    finally:
        _current.reset(token)


@contextmanager
def acting_as(caller: Caller | None) -> Iterator[None]:
    """Within this block, requests submitted from this task are charged to `caller`."""
    with exchange(caller=caller):
        yield


class Admission(msgspec.Struct, frozen=True, kw_only=True):
    """What a meter sees of a request at admission (tokenized, within the window, not yet queued)."""

    request_id: str
    task_id: str | None
    model: str
    caller: Caller | None
    prompt_tokens: int
    max_tokens: int
    tools: tuple[str, ...] = ()

    @property
    def reserved_tokens(self) -> int:
        """The most this request can cost: its prompt and every token it may generate."""
        return self.prompt_tokens + self.max_tokens


@runtime_checkable
class Meter(Protocol):
    """Turns requests into figures (a cost, a quota charge). `reserve` is optional."""

    def observe(self, event: Any) -> None:
        """A request's terminal event (Finished / RequestFailed / RequestRejected). Inline: microseconds."""
        ...


def tool_names(tools: list[dict[str, Any]] | None) -> tuple[str, ...]:
    """Names of OpenAI-style (`{"function": {"name"}}`) or Anthropic-style (`{"name"}`) tool definitions."""
    names = []
    for t in tools or ():
        if isinstance(t, dict):
            fn = t.get("function")
            name = fn.get("name") if isinstance(fn, dict) else t.get("name")
            if isinstance(name, str):
                names.append(name)
    return tuple(names)
