"""modelcall-xmlcall: a tool-call parser for models that write calls as XML-ish tags.

    Let me look that up. <call name="get_weather">{"city": "Paris"}</call>

Text outside the tags is content; each tag is one call whose body is its JSON arguments.
Select it per request (`tool_parser="xmlcall"`), for a model (`plugin_config = {"tools":
{"parser": "xmlcall"}}`), or let the chat template choose it: a template that mentions
`<call name=` picks this parser.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from modelcall.core import hookimpl
from modelcall.core.tools import ParsedOutput, ParserDelta, ToolCall
from modelcall.events.tools import ToolCallDelta

__version__ = "0.1.0"
OPEN, NAME_END, CLOSE = '<call name="', '">', "</call>"


@hookimpl
def register_tool_parsers(register: Any) -> None:
    register("xmlcall", XmlCallParser, markers=(OPEN,))


def _partial(text: str, tag: str) -> int:
    """Length of the longest end of `text` that could still grow into `tag`."""
    return next((k for k in range(min(len(tag) - 1, len(text)), 0, -1) if text.endswith(tag[:k])), 0)


class XmlCallParser:
    """A `modelcall.core.tools.ToolParser`: streamed and whole parses agree for any chunking."""

    name = "xmlcall"
    call_format = None  # no JSON-schema-constrained decoding for this format (see ToolCallFormat)

    def __init__(self, new_id: Callable[[int], str] = lambda i: f"call_{i}") -> None:
        self.new_id = new_id
        self.buf = ""           # undecided text
        self.in_call = False    # inside a tag's body
        self.args = ""          # the current call's argument text so far (sent)
        self.ws = ""            # whitespace held back inside a body (it may be trailing)
        self.index = -1
        self.call: tuple[str, str] | None = None  # (id, name) of the open call

    def feed(self, text: str) -> ParserDelta:
        self.buf += text
        content, deltas, completed = [], [], []
        while True:
            if not self.in_call:
                at = self.buf.find(OPEN)
                if at == -1:
                    keep = _partial(self.buf, OPEN)
                    content.append(self.buf[:len(self.buf) - keep])
                    self.buf = self.buf[len(self.buf) - keep:]
                    break
                end = self.buf.find(NAME_END, at + len(OPEN))
                content.append(self.buf[:at])
                self.buf = self.buf[at:]
                if end == -1:
                    break  # the name is not complete yet: a call's name is never sent half-done
                name = self.buf[len(OPEN):end - at]
                self.buf = self.buf[end - at + len(NAME_END):]
                self.index += 1
                self.call, self.in_call, self.args, self.ws = (self.new_id(self.index), name), True, "", ""
                deltas.append(ToolCallDelta(self.index, self.call[0], name, ""))
            else:
                at = self.buf.find(CLOSE)
                body = self.buf if at == -1 else self.buf[:at]
                keep = _partial(body, CLOSE) if at == -1 else 0
                piece = self.ws + body[:len(body) - keep]
                if not self.args:
                    piece = piece.lstrip()
                stripped = piece.rstrip()
                self.ws = piece[len(stripped):]
                if stripped:
                    self.args += stripped
                    deltas.append(ToolCallDelta(self.index, arguments=stripped))
                if at == -1:
                    self.buf = body[len(body) - keep:]
                    break
                self.buf = self.buf[at + len(CLOSE):]
                self.in_call = False
                done = self._complete()
                if done is not None:
                    if not self.args:
                        deltas.append(ToolCallDelta(self.index, arguments="{}"))
                    completed.append(done)
        return ParserDelta("".join(content), _merge(deltas), tuple(completed))

    def _complete(self) -> ToolCall | None:
        args = self.args or "{}"
        try:
            ok = isinstance(json.loads(args), dict)
        except ValueError:
            ok = False
        call_id, name = self.call  # type: ignore[misc]
        self.call = None
        return ToolCall(call_id, name, args) if ok else None

    def finish(self) -> ParserDelta:
        out = ParserDelta()
        if not self.in_call:
            out = ParserDelta(content=self.buf)  # a partial opening tag was just text after all
        # NOTE: an unclosed call had its name sent; it is dropped, never completed.
        self.buf, self.in_call, self.call = "", False, None
        return out

    def parse(self, text: str) -> ParsedOutput:
        fresh = type(self)(self.new_id)
        a, b = fresh.feed(text), fresh.finish()
        return ParsedOutput(a.content + b.content, a.completed + b.completed)


def _merge(deltas: list[ToolCallDelta]) -> tuple[ToolCallDelta, ...]:
    """One delta per call per feed where possible: the header, then argument text joined."""
    out: list[ToolCallDelta] = []
    for d in deltas:
        last = out[-1] if out else None
        if last is not None and last.index == d.index and d.id is None:
            out[-1] = ToolCallDelta(last.index, last.id, last.name, last.arguments + d.arguments)
        else:
            out.append(d)
    return tuple(out)
