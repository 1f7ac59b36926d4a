"""Tool calls in model output: the contract of a tool-call parser, and the per-request stream that
turns its findings into deltas and `ToolRequested` events.

A parser knows one output format (Hermes/Qwen `<tool_call>` tags, Llama 3 JSON, Mistral
`[TOOL_CALLS]`, pythonic lists, ...). Parsers are registered by plugins through the
`register_tool_parsers` hook and chosen per model (configuration, else the chat template).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import msgspec

from modelcall.events.tools import ToolCallDelta
from modelcall.events.types import ToolRequested


class ToolCall(msgspec.Struct, frozen=True, gc=False):
    """One complete, parsed call: `arguments` is the text of a JSON object."""

    id: str
    name: str
    arguments: str


class ParserDelta(msgspec.Struct, frozen=True, gc=False):
    """What one `feed` decided: text that is content, tool-call fragments, and calls completed by it."""

    content: str = ""
    deltas: tuple[ToolCallDelta, ...] = ()
    completed: tuple[ToolCall, ...] = ()


class ParsedOutput(msgspec.Struct, frozen=True, gc=False):
    """A whole output split into content and the complete tool calls it holds."""

    content: str
    tool_calls: tuple[ToolCall, ...]


class ToolCallFormat(msgspec.Struct, frozen=True, gc=False):
    """How a model writes JSON tool calls, for constrained decoding (no grammar library here).

    The output is `prefix`, then one or more calls each written as `call_open` + a JSON object
    `{name_key: <name>, args_key: <arguments>}` + `call_close`, joined by `separator`, then
    `suffix`. A format that is not JSON objects (pythonic calls) has no ToolCallFormat.
    """

    call_open: str = ""
    call_close: str = ""
    separator: str = ""
    prefix: str = ""
    suffix: str = ""
    name_key: str = "name"
    args_key: str = "arguments"


@runtime_checkable
class ToolParser(Protocol):
    """Finds tool calls in one response, streamed or whole. One instance serves one response.

    Promises, whatever the chunking of the text fed in:
    - the concatenation of everything `feed` and `finish` return is the same (content, call
      names, argument fragments joined per call, completed calls) as for feeding the whole
      text at once — `parse` is exactly that;
    - text before a call stays content; text that may still turn out to be markup (a partial
      tag such as `<tool_ca`) is held back, never leaked as content;
    - a call's first delta carries its id and complete name; argument fragments of one call
      concatenate to a JSON object text, `"{}"` for a call without parameters;
    - a call appears in `completed` (and so becomes a `ToolRequested` event) only once its
      arguments are complete and valid JSON.

    `call_format` describes the format for constrained decoding (None: it cannot be forced,
    e.g. pythonic calls), so `tool_choice` "required" writes calls this parser reads.

    `tags` are the markup strings the parser reads (`<tool_call>`, `</tool_call>`): when a
    tokenizer makes them special tokens, the output stage still shows them to the parser, in
    place, and never releases them as content. The parser sees only content: text the reasoning
    parser decided is reasoning never reaches it.
    """

    name: str
    call_format: ToolCallFormat | None
    tags: tuple[str, ...]

    def feed(self, text: str) -> ParserDelta:
        """Take the next piece of output text; return what it decided."""
        ...

    def finish(self) -> ParserDelta:
        """The output ended: decide everything still held back (an unfinished call becomes content
        when its name was not complete yet; otherwise it is dropped from `completed`)."""
        ...

    def parse(self, text: str) -> ParsedOutput:
        """Parse a whole output (on a fresh instance)."""
        ...


ToolParserFactory = Callable[[Callable[[int], str]], ToolParser]
"""`factory(new_id)` returns a fresh parser; `new_id(index)` gives the id of the index-th call."""


class ToolCallStream:
    """Runs one response's parser inside the output stage and records the calls it completes."""

    __slots__ = ("parser", "request_id", "task_id", "calls", "done")

    def __init__(self, parser: ToolParser, request_id: str, task_id: str | None) -> None:
        self.parser = parser
        self.request_id = request_id
        self.task_id = task_id
        self.calls: list[ToolCall] = []
        self.done = False

    @property
    def tags(self) -> tuple[str, ...]:
        """Markup strings the parser reads (a tokenizer may make them special tokens)."""
        tags = getattr(self.parser, "tags", None)
        return tuple(tags if tags is not None else getattr(self.parser, "markers", ()) or ())

    def feed(self, text: str, final: bool) -> ParserDelta:
        """Parse `text` (and, when `final`, everything held back): content, deltas, completed calls."""
        if self.done:
            return ParserDelta(text)
        d = self.parser.feed(text) if text else ParserDelta()
        if final:
            self.done = True
            f = self.parser.finish()
            d = ParserDelta(d.content + f.content, d.deltas + f.deltas, d.completed + f.completed)
        return d

    def requested(self, calls: tuple[ToolCall, ...], events: list) -> None:
        """Record complete calls (after the output filters) and append their `ToolRequested`."""
        for call in calls:
            self.calls.append(call)
            events.append(ToolRequested(request_id=self.request_id, task_id=self.task_id, call_id=call.id,
                                        name=call.name, arguments=call.arguments))


def default_call_id(request_id: str) -> Callable[[int], str]:
    """Call ids unique per response: `call_<request id tail>_<index>`."""
    tail = request_id.rsplit("-", 1)[-1][:16]
    return lambda index: f"call_{tail}_{index}"
