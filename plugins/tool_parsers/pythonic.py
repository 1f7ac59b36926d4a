"""Pythonic format (Llama 3.2/4, some small models): the output is a Python list of calls,
`[get_weather(city="Paris", unit="c"), now()]`, keyword arguments with literal values only.

A call is decided whole, at its closing parenthesis: its arguments go out as one fragment.
"""
from __future__ import annotations

import ast
import json

from modelcall.core.tools import ToolCall
from modelcall.events.tools import ToolCallDelta
from modelcall.plugins.tool_parsers.base import StreamParser

_OPEN_CLOSE = {"(": ")", "[": "]", "{": "}"}


def _call_end(text: str, start: int) -> int | None:
    """Index just past the call starting at `start` (`name(...)`), None when it is not closed yet.
    Raises ValueError when the text cannot be a call."""
    i = start
    while i < len(text) and (text[i].isalnum() or text[i] in "_."):
        i += 1
    if i == len(text):
        return None
    if i == start or text[i] != "(":
        raise ValueError("not a call")
    stack: list[str] = []
    quote = ""
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif text.startswith(quote, i):
                i += len(quote) - 1
                quote = ""
        elif c in "'\"":
            quote = c * 3 if text.startswith(c * 3, i) else c
            i += len(quote) - 1
        elif c in _OPEN_CLOSE:
            stack.append(_OPEN_CLOSE[c])
        elif c in ")]}":
            if not stack or stack.pop() != c:
                raise ValueError("unbalanced brackets")
            if not stack:
                return i + 1
        i += 1
    return None


def _to_json_call(source: str) -> tuple[str, str]:
    """(name, arguments JSON text) of one `name(k=literal, ...)`; ValueError if it is not that."""
    try:
        node = ast.parse(source, mode="eval").body
    except SyntaxError as e:
        raise ValueError(str(e)) from None
    if not isinstance(node, ast.Call) or node.args:
        raise ValueError("a call with keyword arguments only")
    name = ast.unparse(node.func)
    args = {}
    for kw in node.keywords:
        if kw.arg is None:
            raise ValueError("no **kwargs")
        args[kw.arg] = ast.literal_eval(kw.value)
    return name, json.dumps(args, ensure_ascii=False)


class PythonicParser(StreamParser):
    name = "pythonic"
    markers = ("[func_name1(params_name1=params_value1",)
    tags = ()
    call_format = None  # not JSON: constrained decoding needs a JSON format

    mode = "start"
    _raw = ""   # the list text consumed so far and not yet part of a decided call
    _pos = 0    # where in `buf` scanning resumes (the text before it is in _raw)

    def _run(self, final: bool) -> None:
        while self.buf:
            if self.mode == "plain":
                self.emit_content(self.buf)
                self.buf = ""
            elif self.mode == "start":
                rest = self.buf.lstrip()
                if not rest:
                    if final:
                        self._to_plain()
                    return
                if rest[0] != "[":
                    self._to_plain()
                    continue
                self._raw = self.buf[:len(self.buf) - len(rest) + 1]
                self.buf, self.mode = rest[1:], "item"
            elif self.mode in ("item", "after_item"):
                rest = self.buf.lstrip()
                self._raw += self.buf[:len(self.buf) - len(rest)]
                self.buf = rest
                if not rest:
                    return
                c = rest[0]
                if c == "]":
                    self.buf, self.mode, self._raw = rest[1:], "plain", ""
                elif c == "," and self.mode == "after_item":
                    self._raw += c
                    self.buf, self.mode = rest[1:], "item"
                elif self.mode == "item":
                    if not self._take_call():
                        return
                else:
                    self._to_plain()
        if final and self.mode != "plain":
            self._to_plain()

    def _take_call(self) -> bool:
        """Decide the call at the head of `buf`; False when it is not complete yet."""
        try:
            end = _call_end(self.buf, 0)
            if end is None:
                return False
            name, arguments = _to_json_call(self.buf[:end])
        except (ValueError, SyntaxError, TypeError):
            self._to_plain()
            return True
        index = self.num_calls
        self.num_calls += 1
        self._held_ws = ""
        call_id = self.new_id(index)
        self._deltas.append(ToolCallDelta(index, call_id, name))
        self._deltas.append(ToolCallDelta(index, arguments=arguments))
        self._completed.append(ToolCall(call_id, name, arguments))
        self.buf, self.mode, self._raw = self.buf[end:], "after_item", ""
        return True
