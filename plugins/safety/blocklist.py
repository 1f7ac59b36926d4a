"""A pattern blocklist: a prompt containing a blocked pattern is refused; an output that produces one ends.

Literal patterns match case-insensitively; regex patterns give their longest possible match
(`max_match`) so the stream holds back only that much text.
"""
from __future__ import annotations

import re
from collections.abc import Iterable

from modelcall.core.safety import Verdict


class Blocklist:
    """A SafetyFilter over literal strings and regular expressions."""

    name = "blocklist"

    def __init__(self, literals: Iterable[str] = (), regexes: Iterable[str] = (), *, max_match: int = 64) -> None:
        literals = [s for s in literals if s]
        regexes = list(regexes)
        if not literals and not regexes:
            raise ValueError("a blocklist needs at least one pattern")
        alts = [re.escape(s) for s in sorted(literals, key=len, reverse=True)] + [f"(?:{r})" for r in regexes]
        self.pattern = re.compile("|".join(alts), re.IGNORECASE)
        # NOTE: a match can only start within the last (longest - 1) characters of what was seen.
        self.hold = max([len(s) for s in literals] + ([max_match] if regexes else [])) - 1

    def check_input(self, text: str) -> Verdict | None:
        return Verdict.block("the prompt contains a blocked term") if self.pattern.search(text) else None

    def output_filter(self, request: object) -> BlocklistStream:
        return BlocklistStream(self.pattern, self.hold)


class BlocklistStream:
    """One request's output: releases text that can no longer become part of a match."""

    __slots__ = ("pattern", "hold", "buf", "blocked")

    def __init__(self, pattern: re.Pattern[str], hold: int) -> None:
        self.pattern, self.hold = pattern, hold
        self.buf = ""
        self.blocked: str | None = None

    def push(self, text: str) -> str:
        buf = self.buf + text
        m = self.pattern.search(buf)
        if m is not None:
            self.buf, self.blocked = "", "the output contained a blocked term"
            return buf[:m.start()]
        cut = max(0, len(buf) - self.hold)
        self.buf = buf[cut:]
        return buf[:cut]

    def flush(self) -> str:
        out, self.buf = self.push(""), ""
        if self.blocked is None:
            out, self.buf = out + self.buf, ""
        return out
