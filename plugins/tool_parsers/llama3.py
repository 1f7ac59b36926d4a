"""Llama 3.x JSON format: the output *is* the calls, `{"name": ..., "parameters": {...}}`, joined by
`;`, optionally after `<|python_tag|>`. An output that does not start with a call is all content."""
from __future__ import annotations

from modelcall.core.tools import ToolCallFormat
from modelcall.plugins.tool_parsers.base import StreamParser
from modelcall.plugins.tool_parsers.json_call import DONE, ERROR

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonParser(StreamParser):
    name = "llama3_json"
    markers = (PYTHON_TAG, '"parameters"')
    tags = (PYTHON_TAG,)
    call_format = ToolCallFormat(separator="; ", args_key="parameters")

    mode = "start"
    _raw = ""  # text taken before the first call, content if no call follows

    def _run(self, final: bool) -> None:
        while self.buf:
            mode = self.mode
            if mode == "plain":
                self.emit_content(self.buf)
                self.buf = ""
            elif mode == "call":
                status = self.push_call()
                if status == DONE:
                    self.mode = "after"
                elif status == ERROR:
                    self.mode = "plain"
                else:
                    return
            elif mode == "after":  # `;` and another call, or the end
                rest = self.buf.lstrip()
                self.buf = rest
                if rest:
                    self.buf, self.mode = (rest[1:], "next") if rest[0] == ";" else (rest, "plain")
            else:  # start, tagged (after <|python_tag|>), next (after `;`)
                rest = self.buf.lstrip()
                ws = self.buf[:len(self.buf) - len(rest)]
                if not rest:
                    if final:
                        self._to_plain()
                    elif mode == "start":
                        return  # hold leading whitespace: the output may still be a call
                    else:
                        self._raw += ws
                        self.buf = ""
                elif mode == "start" and rest.startswith(PYTHON_TAG):
                    self._raw += ws + PYTHON_TAG
                    self.buf, self.mode = rest[len(PYTHON_TAG):], "tagged"
                elif mode == "start" and PYTHON_TAG.startswith(rest) and not final:
                    return
                elif rest[0] == "{":
                    self.start_call(self._raw + ws)
                    self._raw = ""
                    self.buf, self.mode = rest, "call"
                else:
                    self._to_plain()
        if final and self.mode != "call":
            self._to_plain()
