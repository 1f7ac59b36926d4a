"""The safety filter contract: input checks at admission, streaming output filters per request.

A plugin registers filters with `register_safety_filters(register)`. The kernel checks every
prompt with `check_input` before tokenizing it, and, when any filter offers an output filter,
passes each request's text deltas through a chain of them inside the engine step. When no
filter is registered the output path is untouched (no per-token cost).

    class NoSecrets:
        name = "no-secrets"
        def check_input(self, text):      return Verdict.block("secrets are not allowed") if "sk-" in text else None
        def output_filter(self, request): return None   # input only
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import msgspec

from modelcall.core.output import OutputState
from modelcall.core.request import Request
from modelcall.core.stages import IncrementalDetokenizer


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


class FilteredOutputState(OutputState):
    """OutputState whose released text passes through a request's output filter chain.

    A blocked output ends the request with finish reason `content_filter` (stop reason: the
    filter's reason); text held back by the filters is never released after a block.
    """

    __slots__ = ("chain",)

    def __init__(self, detok: IncrementalDetokenizer, stops: tuple[str, ...], include_stop: bool,
                 chain: FilterChain) -> None:
        super().__init__(detok, stops, include_stop)
        self.chain = chain

    def _emit(self, text: str) -> str:
        return text  # NOTE: `self.pieces` keeps what the filters released, added in on_token/close

    def on_token(self, request: Request, token_id: int, window: int) -> tuple[str, str | None, Any]:
        text, reason, stop_reason = super().on_token(request, token_id, window)
        chain = self.chain
        if chain.blocked is not None:  # already ended; nothing more is released
            return "", "content_filter", chain.blocked
        out = chain.push(text, final=reason is not None)
        if out:
            self.pieces.append(out)
        if chain.blocked is not None:
            return out, "content_filter", chain.blocked
        return out, reason, stop_reason

    def close(self) -> str:
        tail = super().close()
        if self.chain.blocked is not None:
            return ""
        out = self.chain.push(tail, final=True)
        if out:
            self.pieces.append(out)
        return out


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
    """The request's output chain, or None when no filter wants to see its output."""
    made = []
    for _name, f in filters:
        factory = getattr(f, "output_filter", None)
        of = factory(request) if factory is not None else None
        if of is not None:
            made.append(of)
    return FilterChain(made) if made else None
