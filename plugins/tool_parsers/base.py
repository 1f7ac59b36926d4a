"""What every built-in parser shares: a buffer of undecided text, content with held-back
whitespace, and the bookkeeping of calls (header once, argument fragments, completion)."""
from __future__ import annotations

from collections.abc import Callable

from modelcall.core.tools import ParsedOutput, ParserDelta, ToolCall, ToolCallFormat
from modelcall.events.tools import ToolCallDelta
from modelcall.plugins.tool_parsers.json_call import DONE, ERROR, CallScanner


def partial_prefix_len(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag` (held back: it may
    still become the tag)."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


class StreamParser:
    """Base of the built-in parsers. Subclasses implement `_run(final)`, which decides as much of
    `self.buf` as it can. `parse` is `feed(whole) + finish()` on the same machinery, so streamed
    and whole results agree by construction; the tests check it for every split anyway."""

    name = "base"
    call_format: ToolCallFormat | None = None
    tags: tuple[str, ...] = ()  # markup strings read (kept for the parser when a tokenizer makes them special)
    mode = "start"
    _raw = ""  # text taken while deciding whether a call begins; content if none does

    def __init__(self, new_id: Callable[[int], str] = lambda i: f"call_{i}") -> None:
        self.new_id = new_id
        self.buf = ""
        self.num_calls = 0               # calls started (their header sent)
        self._held_ws = ""
        self._content: list[str] = []
        self._deltas: list[ToolCallDelta] = []
        self._completed: list[ToolCall] = []
        self._scanner: CallScanner | None = None
        self._block: list[str] = []      # raw text of the call being read (content if it is none)
        self._header_sent = False

    # ---- the protocol ---------------------------------------------------------------------

    def feed(self, text: str) -> ParserDelta:
        self.buf += text
        self._run(final=False)
        return self._collect()

    def finish(self) -> ParserDelta:
        self._run(final=True)
        if self._scanner is not None:
            self._abandon_call()
        self.buf = ""
        if self.num_calls == 0:
            self._content.append(self._held_ws)
        self._held_ws = ""
        return self._collect()

    def parse(self, text: str) -> ParsedOutput:
        fresh = type(self)(self.new_id)
        a, b = fresh.feed(text), fresh.finish()
        return ParsedOutput(a.content + b.content, a.completed + b.completed)

    def _run(self, final: bool) -> None:
        raise NotImplementedError

    def _collect(self) -> ParserDelta:
        merged: list[ToolCallDelta] = []
        for d in self._deltas:  # one delta per call per feed: fewer frames, same concatenation
            last = merged[-1] if merged else None
            if last is not None and last.index == d.index and not (d.id or d.name):
                merged[-1] = ToolCallDelta(last.index, last.id, last.name, last.arguments + d.arguments)
            else:
                merged.append(d)
        out = ParserDelta("".join(self._content), tuple(merged), tuple(self._completed))
        self._content.clear()
        self._deltas.clear()
        self._completed.clear()
        return out

    # ---- content ----------------------------------------------------------------------------

    def emit_content(self, text: str) -> None:
        """Content, with trailing whitespace held back: dropped once a call starts (and at the
        end of an output with calls), kept when more text follows."""
        text = self._held_ws + text
        kept = text.rstrip()
        self._held_ws = text[len(kept):]
        if kept:
            self._content.append(kept)

    def _to_plain(self) -> None:
        """Not (or no more) a call: the text held in `self._raw` (a subclass's raw lookahead) is
        content, and so is the rest of the buffer; the parser stays in mode "plain"."""
        self.buf = self._raw + self.buf
        self._raw = ""
        self.mode = "plain"
        if self.buf:
            self.emit_content(self.buf)
            self.buf = ""

    # ---- calls ------------------------------------------------------------------------------

    def start_call(self, opening: str = "") -> None:
        self._scanner = CallScanner()
        self._block = [opening]
        self._header_sent = False

    def push_call(self) -> str:
        """Feed `self.buf` to the current call; returns MORE, DONE or ERROR and leaves the rest
        of the buffer (from the first character the call did not take) in `self.buf`."""
        sc = self._scanner
        assert sc is not None
        n, status = sc.push(self.buf)
        self._block.append(self.buf[:n])
        self.buf = self.buf[n:]
        if not self._header_sent and sc.name is not None:
            self._deltas.append(ToolCallDelta(self.num_calls, self.new_id(self.num_calls), sc.name))
            self._header_sent = True
            self._held_ws = ""
            self.num_calls += 1
        if self._header_sent:
            frag = sc.take_args()
            if frag:
                self._deltas.append(ToolCallDelta(self.num_calls - 1, arguments=frag))
        if status == DONE:
            if not sc.args_seen:
                self._deltas.append(ToolCallDelta(self.num_calls - 1, arguments="{}"))
            self._completed.append(ToolCall(self.new_id(self.num_calls - 1), sc.name or "", sc.arguments))
            self._scanner = None
        elif status == ERROR:
            self._abandon_call()
        return status

    def _abandon_call(self) -> None:
        """The call being read is not one: before its name was sent its raw text is content;
        after, it is dropped (never completed, so never requested)."""
        if not self._header_sent:
            self.emit_content("".join(self._block))
        self._scanner = None
        self._block = []
