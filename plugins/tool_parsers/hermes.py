"""Hermes / Qwen 2.5 format: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, any number."""
from __future__ import annotations

from modelcall.core.tools import ToolCallFormat
from modelcall.plugins.tool_parsers.base import StreamParser, partial_prefix_len
from modelcall.plugins.tool_parsers.json_call import DONE, ERROR

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class HermesParser(StreamParser):
    name = "hermes"
    markers = (OPEN,)
    tags = (OPEN, CLOSE)
    call_format = ToolCallFormat(call_open=OPEN + "\n", call_close="\n" + CLOSE, separator="\n")

    mode = "text"

    def _run(self, final: bool) -> None:
        while self.buf:
            if self.mode == "text":
                i = self.buf.find(OPEN)
                if i < 0:
                    keep = 0 if final else partial_prefix_len(self.buf, OPEN)
                    self.emit_content(self.buf[:len(self.buf) - keep])
                    self.buf = self.buf[len(self.buf) - keep:]
                    return
                self.emit_content(self.buf[:i])
                self.buf = self.buf[i + len(OPEN):]
                self.start_call(OPEN)
                self.mode = "call"
            elif self.mode == "call":
                status = self.push_call()
                if status == DONE:
                    self.mode = "after"
                elif status == ERROR:
                    self.mode = "text"
                else:
                    return
            else:  # after a call object: whitespace, then the closing tag (optional)
                rest = self.buf.lstrip()
                if not rest:
                    self.buf = ""
                    return
                if rest.startswith(CLOSE):
                    self.buf = rest[len(CLOSE):]
                    self.mode = "text"
                elif CLOSE.startswith(rest) and not final:
                    self.buf = rest
                    return
                else:
                    self.buf = rest
                    self.mode = "text"
        if final and self.mode == "call":
            self.mode = "text"
