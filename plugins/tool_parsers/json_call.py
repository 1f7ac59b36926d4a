"""An incremental scanner for one JSON call object, `{"name": "f", "arguments": {...}}`, fed piece by piece.

It decides as early as the text allows: the name once its string closes, argument text as it
arrives (raw, so the fragments concatenate to exactly what the model wrote), and the end of
the object at its closing brace. Keys may come in any order; other keys are skipped.
"""
from __future__ import annotations

import json

WS = " \t\r\n"
MORE, DONE, ERROR = "more", "done", "error"


class CallScanner:
    """State machine over the characters of one call object. Read `name`, take `take_args()`."""

    def __init__(self, args_keys: tuple[str, ...] = ("arguments", "parameters")) -> None:
        self.args_keys = args_keys
        self.state = "open"
        self.name: str | None = None
        self.args_seen = False
        self.args_text: list[str] = []      # the whole arguments text so far
        self._pending: list[str] = []       # argument text not yet taken by the parser
        self._str: list[str] = []           # a key, name or string-encoded arguments being read
        self._key: str | None = None
        self._depth = 0
        self._in_str = False
        self._esc = False
        self.error: str | None = None

    def take_args(self) -> str:
        out = "".join(self._pending)
        self._pending.clear()
        return out

    @property
    def arguments(self) -> str:
        return "".join(self.args_text) if self.args_seen else "{}"

    def push(self, text: str) -> tuple[int, str]:
        """Consume characters of `text` until the object ends or turns out not to be a call.
        Returns (characters consumed, MORE | DONE | ERROR); on ERROR the offending character
        is not consumed."""
        for i, c in enumerate(text):
            status = self._step(c)
            if status is DONE:
                return i + 1, DONE
            if status is ERROR:
                return i, ERROR
        return len(text), MORE

    def _fail(self, why: str) -> str:
        self.error = why
        return ERROR

    def _step(self, c: str) -> str | None:  # noqa: C901 - one branch per state reads best here
        st = self.state
        if st in ("args", "skip_nested"):
            return self._nested(c, st == "args")
        if st in ("key", "name", "args_str", "skip_str"):
            return self._string(c, st)
        if c in WS and st != "skip_scalar":
            return None
        if st == "open":
            if c != "{":
                return self._fail("a call starts with '{'")
            self.state = "key_or_end"
        elif st in ("key_or_end", "key_start"):
            if c == '"':
                self.state, self._str = "key", [c]
            elif c == "}" and st == "key_or_end":
                return self._done()
            else:
                return self._fail("expected a key")
        elif st == "colon":
            if c != ":":
                return self._fail("expected ':'")
            self.state = "value"
        elif st == "value":
            return self._value(c)
        elif st == "skip_scalar":
            if c in WS or c in ",}":
                self.state = "after_value"
                return self._step(c)
        elif st == "after_value":
            if c == ",":
                self.state = "key_start"
            elif c == "}":
                return self._done()
            else:
                return self._fail("expected ',' or '}'")
        return None

    def _value(self, c: str) -> str | None:
        key = self._key
        if key == "name":
            if c != '"' or self.name is not None:
                return self._fail("the name must be one string")
            self.state, self._str = "name", [c]
        elif key in self.args_keys:
            if self.args_seen:
                return self._fail("arguments given twice")
            self.args_seen = True
            if c == "{":
                self.state, self._depth = "args", 1
                self._emit(c)
            elif c == '"':
                self.state, self._str = "args_str", [c]
            else:
                return self._fail("arguments must be a JSON object")
        elif c in "{[":
            self.state, self._depth = "skip_nested", 1
        elif c == '"':
            self.state, self._str = "skip_str", [c]
        else:
            self.state = "skip_scalar"
        return None

    def _nested(self, c: str, keep: bool) -> str | None:
        if keep:
            self._emit(c)
        if self._in_str:
            if self._esc:
                self._esc = False
            elif c == "\\":
                self._esc = True
            elif c == '"':
                self._in_str = False
        elif c == '"':
            self._in_str = True
        elif c in "{[":
            self._depth += 1
        elif c in "}]":
            self._depth -= 1
            if self._depth == 0:
                self.state = "after_value"
        return None

    def _string(self, c: str, st: str) -> str | None:
        self._str.append(c)
        if self._esc:
            self._esc = False
            return None
        if c == "\\":
            self._esc = True
            return None
        if c != '"':
            return None
        try:
            value = json.loads("".join(self._str))
        except ValueError:
            return self._fail("an invalid JSON string")
        self.state = "after_value"
        if st == "key":
            self._key, self.state = value, "colon"
        elif st == "name":
            if not value:
                return self._fail("an empty name")
            self.name = value
        elif st == "args_str":  # arguments encoded as a JSON string: decide it whole
            try:
                ok = isinstance(json.loads(value), dict)
            except ValueError:
                ok = False
            if not ok:
                return self._fail("arguments string is not a JSON object")
            self._emit(value.strip())
        return None

    def _emit(self, s: str) -> None:
        self.args_text.append(s)
        self._pending.append(s)

    def _done(self) -> str:
        if self.name is None:
            return self._fail("a call without a name")
        if self.args_seen:
            try:
                ok = isinstance(json.loads(self.arguments), dict)
            except ValueError:
                ok = False
            if not ok:
                return self._fail("arguments are not valid JSON")
        self.state = "end"
        return DONE
