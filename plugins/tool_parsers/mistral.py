"""Mistral format: content, then `[TOOL_CALLS]` and a JSON list of `{"name": ..., "arguments": {...}}`."""
from __future__ import annotations

from modelcall.core.tools import ToolCallFormat
from modelcall.plugins.tool_parsers.base import StreamParser, partial_prefix_len
from modelcall.plugins.tool_parsers.json_call import DONE, ERROR

TAG = "[TOOL_CALLS]"


class MistralParser(StreamParser):
    name = "mistral"
    markers = (TAG,)
    tags = (TAG,)
    call_format = ToolCallFormat(prefix=TAG + "[", separator=", ", suffix="]")

    mode = "text"
    _raw = ""  # the tag and list opening, content if no call follows

    def _run(self, final: bool) -> None:
        while self.buf:
            mode = self.mode
            if mode == "text":
                i = self.buf.find(TAG)
                if i < 0:
                    keep = 0 if final else partial_prefix_len(self.buf, TAG)
                    self.emit_content(self.buf[:len(self.buf) - keep])
                    self.buf = self.buf[len(self.buf) - keep:]
                    return
                self.emit_content(self.buf[:i])
                self.buf, self._raw, self.mode = self.buf[i + len(TAG):], TAG, "list"
            elif mode == "call":
                status = self.push_call()
                if status == DONE:
                    self.mode = "after_item"
                elif status == ERROR:
                    self.mode = "text"
                else:
                    return
            else:  # list (after the tag), item (after `[` or `,`), after_item
                rest = self.buf.lstrip()
                ws = self.buf[:len(self.buf) - len(rest)]
                if not rest:
                    self._raw += ws
                    self.buf = ""
                    return
                c = rest[0]
                if mode == "list" and c == "[":
                    self._raw += ws + c
                    self.buf, self.mode = rest[1:], "item"
                elif mode == "item" and c == "{":
                    self.start_call(self._raw + ws)
                    self._raw = ""
                    self.buf, self.mode = rest, "call"
                elif mode in ("item", "after_item") and c == "]":
                    self._raw = ""
                    self.buf, self.mode = rest[1:], "text"
                elif mode == "after_item" and c == ",":
                    self.buf, self.mode = rest[1:], "item"
                else:
                    self._not_a_list()
        if final and self.mode in ("list", "item"):
            self._not_a_list()

    def _not_a_list(self) -> None:
        """What followed the tag is not (or no more) a list of calls: the rest is content."""
        if self._raw:
            self.emit_content(self._raw)
        self._raw = ""
        self.mode = "text"
