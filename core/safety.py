"""The safety filter contract: input checks at admission, streaming output filters per request.

A plugin registers filters with `register_safety_filters(register)`. The kernel checks every
prompt with `check_input` before tokenizing it, and, when any filter offers an output filter,
passes everything a request's output releases (content, reasoning, tool arguments, logprobs)
through chains of them inside the engine step, last in the output stage. When no filter is
registered the output path is untouched (no per-token cost).

    class NoSecrets:
        name = "no-secrets"
        def check_input(self, text):      return Verdict.block("secrets are not allowed") if "sk-" in text else None
        def output_filter(self, request): return None   # input only
"""
from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import msgspec

from modelcall.core.request import Request
from modelcall.core.tools import ToolCall
from modelcall.events.tools import ToolCallDelta
from modelcall.events.types import PositionLogprobs


class Verdict(msgspec.Struct, frozen=True, gc=False):
    """A filter's decision about a text: `blocked` with the `reason` a client may read."""

    blocked: bool = False
    reason: str = ""

    @classmethod
    def block(cls, reason: str) -> Verdict:
        return cls(True, reason)


@runtime_checkable
class OutputFilter(Protocol):
    """One request's streaming output filter: text in, releasable text out.

    `push` may hold back the end of the text it was given, but only as many characters as the
    longest pattern it looks for needs; it returns the text that is decided (possibly
    rewritten, e.g. redacted). When it finds something that must end the request it sets
    `blocked` (a reason) and returns only the text before the match.
    """

    blocked: str | None

    def push(self, text: str) -> str:
        ...

    def flush(self) -> str:
        """The output ended: decide and return whatever is still held back."""
        ...


@runtime_checkable
class SafetyFilter(Protocol):
    """A registered filter. Either method may decline (return None)."""

    name: str

    def check_input(self, text: str) -> Verdict | None:
        """Check a prompt's text (each message's text for chat) before any compute."""
        ...

    def output_filter(self, request: Request) -> OutputFilter | None:
        """A fresh streaming filter for one request's output, or None to leave it alone."""
        ...


class FilterChain:
    """Output filters applied in order: what one releases, the next one reads."""

    __slots__ = ("filters", "blocked")

    def __init__(self, filters: list[OutputFilter]) -> None:
        self.filters = filters
        self.blocked: str | None = None

    def push(self, text: str, final: bool = False) -> str:
        for f in self.filters:
            text = f.push(text)
            if final:
                text += f.flush()
            if f.blocked is not None:
                self.blocked = f.blocked
                return text
        return text


class OutputFilters:
    """One request's output filters over every way its text leaves: content, reasoning, each tool
    call's arguments and the logprobs. Each stream gets its own chain (fresh filters from the
    registered factories), so a pattern is matched within the text a client reads in one place.

    A block anywhere ends the request (`blocked`: the reason); after it nothing more is released.
    A complete call whose filtered arguments are no longer a JSON object counts as a block.
    """

    __slots__ = ("make_chain", "content", "reasoning", "args", "arg_text", "call_index", "gate", "blocked")

    def __init__(self, make_chain: Callable[[], FilterChain], token_text: Callable[[int], str] | None = None) -> None:
        self.make_chain = make_chain
        self.content = make_chain()
        self.reasoning: FilterChain | None = None
        self.args: dict[int, FilterChain] = {}
        self.arg_text: dict[int, list[str]] = {}
        self.call_index: dict[str, int] = {}
        self.gate = LogprobGate(make_chain, token_text)
        self.blocked: str | None = None

    def text(self, content: str, reasoning: str, final: bool) -> tuple[str, str]:
        """Filter one step's reasoning then content delta (the order the model wrote them)."""
        r = ""
        if reasoning or (final and self.reasoning is not None):
            if self.reasoning is None:
                self.reasoning = self.make_chain()
            r = self.reasoning.push(reasoning, final)
            if self.reasoning.blocked is not None:
                self.blocked = self.reasoning.blocked
                return "", r
        c = self.content.push(content, final) if content or final else ""
        if self.content.blocked is not None:
            self.blocked = self.content.blocked
        return c, r

    def calls(self, deltas: tuple[ToolCallDelta, ...] | None, completed: tuple[ToolCall, ...],
              final: bool) -> tuple[tuple[ToolCallDelta, ...] | None, tuple[ToolCall, ...]]:
        """Filter tool-call argument fragments per call; complete calls carry the filtered arguments."""
        out: list[ToolCallDelta] = []
        for d in deltas or ():
            if d.name is not None:
                self.args[d.index] = self.make_chain()
                self.arg_text[d.index] = []
                if d.id is not None:
                    self.call_index[d.id] = d.index
            chain = self.args.get(d.index)
            if chain is None:
                continue
            frag = chain.push(d.arguments) if d.arguments else ""
            if chain.blocked is not None:
                self.blocked = chain.blocked
                return tuple(out) or None, ()
            self.arg_text[d.index].append(frag)
            if frag or d.name is not None:
                out.append(ToolCallDelta(d.index, d.id, d.name, frag))
        calls: list[ToolCall] = []
        done = {self.call_index.get(c.id): c for c in completed}
        for index, chain in list(self.args.items()):
            call = done.get(index)
            if call is None and not final:
                continue
            tail = chain.push("", final=True)
            if chain.blocked is not None:
                self.blocked = chain.blocked
                return tuple(out) or None, ()
            if tail:
                self.arg_text[index].append(tail)
                out.append(ToolCallDelta(index, arguments=tail))
            del self.args[index]
            if call is not None:
                arguments = "".join(self.arg_text[index])
                if not _is_object(arguments):
                    self.blocked = "a filter changed a tool call's arguments into something that is not a JSON object"
                    return tuple(out) or None, ()
                calls.append(ToolCall(call.id, call.name, arguments))
        return tuple(out) or None, tuple(calls)


class LogprobGate:
    """Releases a request's logprob positions only once its token's text has passed the filters
    unchanged; positions whose text was redacted or blocked are withheld, and so is any top
    alternative whose own text the filters would change (checked with the text before it).

    The sampled tokens' text (before stop strings and splits) runs through a chain of its own;
    while what the chain releases is a prefix of what it was given, the positions it covers go
    out. When it rewrites something, the positions not yet covered are withheld and a fresh chain
    reads what follows (a pattern that began inside the withheld text is not seen by it; the
    content chain still is, and a block there withholds everything pending).
    """

    CONTEXT = 64  # characters of released text an alternative token is checked after

    __slots__ = ("make_chain", "token_text", "chain", "pending", "context", "dead")

    def __init__(self, make_chain: Callable[[], FilterChain], token_text: Callable[[int], str] | None) -> None:
        self.make_chain = make_chain
        self.token_text = token_text
        self.chain: FilterChain | None = None
        self.pending: list[list[Any]] = []  # [position or None, its text not yet released]
        self.context = ""
        self.dead = False

    def push(self, text: str, position: PositionLogprobs | None, final: bool) -> tuple[PositionLogprobs, ...]:
        if self.dead:
            return ()
        if self.chain is None:
            self.chain = self.make_chain()
        if position is not None or text:
            self.pending.append([position, text])
        given = "".join(t for _, t in self.pending)
        out = self.chain.push(text, final)
        if self.chain.blocked is not None:
            self.dead, self.pending = True, []
            return ()
        if given.startswith(out):
            return self._release(len(out), final)
        released = self._release(_common_prefix(given, out), False)
        self.pending = []   # NOTE: what the filters rewrote is withheld, with everything not yet decided
        self.chain = None   # and a fresh chain reads what follows
        return released

    def _release(self, n: int, final: bool) -> tuple[PositionLogprobs, ...]:
        """Release the positions whose text lies within the first `n` characters given (a position
        with no text of its own waits for the next one that has some, or the end)."""
        out: list[PositionLogprobs] = []
        group: list[PositionLogprobs] = []
        i = 0
        for i, (pos, text) in enumerate(self.pending):
            if not text:
                if pos is not None:
                    group.append(pos)
                continue
            if len(text) > n:
                self.pending[i][1] = text[n:]
                self.context = (self.context + text[:n])[-self.CONTEXT:]
                self.pending = self.pending[i:]
                if group:  # the first part of a character can't go before the rest
                    self.pending[0:0] = [[p, ""] for p in group]
                return tuple(out)
            n -= len(text)
            if pos is not None:
                out.extend(self._checked(p) for p in group)
                out.append(self._checked(pos, text))
            else:
                out.extend(self._checked(p) for p in group)
            group = []
            self.context = (self.context + text)[-self.CONTEXT:]
        self.pending = [[p, ""] for p in group]
        if final:
            out.extend(self._checked(p) for p in group)
            self.pending = []
        return tuple(out)

    def _checked(self, pos: PositionLogprobs, text: str = "") -> PositionLogprobs:
        if not pos.top or self.token_text is None:
            return pos
        keep = tuple(t for t in pos.top if t.token_id == pos.token_id or self._clean(self.token_text(t.token_id)))
        return pos if len(keep) == len(pos.top) else PositionLogprobs(pos.token_id, pos.logprob, keep)

    def _clean(self, alternative: str) -> bool:
        probe = self.context + alternative
        chain = self.make_chain()
        return chain.push(probe, final=True) == probe and chain.blocked is None


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _is_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def check_input(filters: list[tuple[str, Any]], texts: list[str]) -> tuple[str, str] | None:
    """(filter name, reason) of the first filter that blocks any of `texts`, else None."""
    for name, f in filters:
        check = getattr(f, "check_input", None)
        if check is None:
            continue
        for text in texts:
            verdict = check(text)
            if verdict is not None and verdict.blocked:
                return getattr(f, "name", name), verdict.reason
    return None


def output_chain(filters: list[tuple[str, Any]], request: Request) -> FilterChain | None:
    """A fresh output chain for `request`, or None when no filter wants to see its output."""
    made = []
    for _name, f in filters:
        factory = getattr(f, "output_filter", None)
        of = factory(request) if factory is not None else None
        if of is not None:
            made.append(of)
    return FilterChain(made) if made else None


def output_filters(filters: list[tuple[str, Any]], request: Request,
                   token_text: Callable[[int], str] | None = None) -> OutputFilters | None:
    """The request's `OutputFilters`, or None when no filter wants to see its output (then the
    output path has no filter cost at all)."""
    if output_chain(filters, request) is None:
        return None
    return OutputFilters(lambda: output_chain(filters, request) or FilterChain([]), token_text)
