"""Who is calling, and the meters that charge them: reserve at admission, settle at the end.

A front end that authenticated a caller passes it to `Kernel.submit(caller=...)`, or with an
`Exchange` (what it knows about one client exchange: caller, task, policy, client address),
explicitly: no context variable carries it. At admission the entry stage hands each meter that
has a `reserve` method an `Admission`; a meter refuses by raising `Overloaded` (429, with
`retry_after`) or `PermissionDenied` (403). Every meter's `observe(event)` then receives the
request's terminal event (Finished, RequestFailed or RequestRejected) and settles what it reserved.

NOTE: reserve-then-settle is what keeps a quota true under a burst: a reservation counts
immediately (prompt tokens + max_tokens), before any token is computed, and is replaced by
the real usage when the request ends.
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import msgspec

from modelcall.core.quota_store import QuotaLimits


class Caller(msgspec.Struct, frozen=True, kw_only=True):
    """An authenticated caller. `name` is recorded with each request (never the key itself).

    `models` / `tools`: what the caller may use (None: anything). `priority`: the most urgent
    priority its requests may run at (lower runs first; a request may ask for less urgent, never
    more). `cache_group`: callers in one group share prefix-cache blocks (default: the caller's
    own name, so no other caller can hit its blocks). `expires_at`: a Unix time after which the
    caller is refused. `limits` is the meters' own (e.g. requests and tokens per minute).
    `weight`: the caller's share of the engine under a fair-share scheduler (2.0: twice the
    tokens of a 1.0 caller while both have requests waiting).
    """

    name: str
    priority: int = 0
    models: frozenset[str] | None = None
    tools: frozenset[str] | None = None
    # NOTE: typed, so that a caller sent to a replica (plugins/scale/wire.py) decodes with its limits as
    # limits, not as a dict the quota meters cannot read.
    limits: QuotaLimits | None = None
    cache_group: str | None = None
    expires_at: float | None = None
    weight: float = 1.0
    # LoRA adapters (docs/lora.md): `loras` the ones it may use (None: any not private to another key), `hidden_loras`
    # those private to other keys (never listed to it, never usable by it), `admin`: it may load and unload adapters
    # at run time when the operator enabled that.
    loras: frozenset[str] | None = None
    hidden_loras: frozenset[str] = frozenset()
    admin: bool = False

    def may_use_lora(self, name: str) -> bool:
        if name in self.hidden_loras:
            return False
        return self.loras is None or name in self.loras or "*" in self.loras

    def may_use_model(self, model: str) -> bool:
        return self.models is None or model in self.models or "*" in self.models

    def forbidden_tools(self, names: list[str] | tuple[str, ...]) -> list[str]:
        if self.tools is None or "*" in self.tools:
            return []
        return [n for n in names if n not in self.tools]

    @property
    def cache_scope(self) -> str:
        """The prefix-cache scope of this caller's blocks (see `core/permissions.py`)."""
        return self.cache_group or self.name


CONTEXT_DROPPED_HEADER = "x-modelcall-context-dropped"
# Where an HTTP front end keeps a request's Exchange (`request[EXCHANGE_KEY]`), so its middlewares
# (auth, records) fill the same one explicitly. A plain string: core knows no aiohttp.
EXCHANGE_KEY = "modelcall.exchange"


class Exchange:
    """What a front end knows about one client exchange (e.g. one HTTP request) before the kernel
    sees it, and what the kernel admitted for it. The front end makes one per exchange and passes
    it to `Kernel.submit(exchange=...)`; the entry stage reads it for anything its own arguments
    leave unset, counts the sequences it admitted (the per-call cap) and appends their handles."""

    __slots__ = ("caller", "task_id", "context_policy", "retries", "client", "handles", "sequences", "refused")

    def __init__(self, caller: Caller | None = None, task_id: str | None = None, context_policy: str | None = None,
                 retries: int = 0, client: str | None = None) -> None:
        self.caller = caller
        self.task_id = task_id
        self.context_policy = context_policy
        self.retries = retries
        self.client = client
        self.handles: list[Any] = []
        self.sequences = 0  # sequences admitted for this exchange (prompts × n of one call)
        self.refused = False  # a refusal of this exchange was published already (RequestRejected)

    def sequence_ended(self) -> None:
        """One sequence of this exchange ended, and its front end feeds the call through a window (a pooling call's
        inputs: at most max_sequences_per_call in flight, the next admitted when one ends), so the per-call cap
        counts the sequences in flight, not every one the call started."""
        self.sequences -= 1

    def response_headers(self) -> dict[str, str]:
        """Headers a front end adds to its response: what a context policy dropped, if anything, and
        what a handle names itself (`handle.response_headers`, e.g. the replica that served it)."""
        named: dict[str, str] = {}
        for h in self.handles:
            named.update(getattr(h, "response_headers", None) or {})
        return {**named, **self._context_headers()}

    def _context_headers(self) -> dict[str, str]:
        for h in self.handles:
            c = getattr(h, "context", None)
            if c:
                return {CONTEXT_DROPPED_HEADER: (f"policy={c['policy']}; messages={c['dropped_messages']}; "
                                                 f"tokens={c['dropped_tokens']}")}
        return {}


class Admission(msgspec.Struct, frozen=True, kw_only=True):
    """What a meter sees of a request at admission (tokenized, within the window, not yet queued)."""

    request_id: str
    task_id: str | None
    model: str
    caller: Caller | None
    prompt_tokens: int
    max_tokens: int
    tools: tuple[str, ...] = ()
    count_only: bool = False  # a token count (no generation): one request for rpm, nothing to settle

    @property
    def reserved_tokens(self) -> int:
        """The most this request can cost: its prompt and every token it may generate."""
        return self.prompt_tokens + self.max_tokens


@runtime_checkable
class Meter(Protocol):
    """Turns requests into figures (a cost, a quota charge).

    `reserve(admission)` is optional: the entry pipeline calls it after the permission step,
    before any compute; raising `Overloaded` or `PermissionDenied` refuses the request (and the
    meters that reserved before it get its RequestRejected to release). An admission with
    `count_only` (a token count, e.g. `count_tokens`) is never followed by a terminal event:
    charge it as a request and hold nothing open for it.
    """

    def observe(self, event: Any) -> None:
        """A request's terminal event (Finished / RequestFailed / RequestRejected). Inline: microseconds."""
        ...

    # Optional: `gauges() -> list[(name, help, value)]`, read when /metrics is scraped; each becomes
    # the gauge `modelcall:<name>` (e.g. whether a shared quota store answers).


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
