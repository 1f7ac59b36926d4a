"""A pattern blocklist: a prompt containing a blocked pattern is refused; an output that produces one ends.

Literal patterns match case-insensitively, and the stream holds back only the end of the text
that could still grow into one; regex patterns give their longest possible match (`max_match`),
and with any of them the stream holds back that many characters.
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
        self.literals = tuple(s.lower() for s in literals)
        # NOTE: a regex match can only start within the last (max_match - 1) characters seen.
        self.hold = max_match - 1 if regexes else 0

    def check_input(self, text: str) -> Verdict | None:
        return Verdict.block("the prompt contains a blocked term") if self.pattern.search(text) else None

    def output_filter(self, request: object) -> BlocklistStream:
        return BlocklistStream(self.pattern, self.hold, self.literals)


class BlocklistStream:
    """One request's output: releases text that can no longer become part of a match."""

    __slots__ = ("pattern", "hold", "literals", "buf", "blocked")

    def __init__(self, pattern: re.Pattern[str], hold: int, literals: tuple[str, ...] = ()) -> None:
        self.pattern, self.hold, self.literals = pattern, hold, literals
        self.buf = ""
        self.blocked: str | None = None

    def push(self, text: str) -> str:
        if self.blocked is not None:  # the output has ended; nothing more is released
            return ""
        buf = self.buf + text
        m = self.pattern.search(buf)
        if m is not None:
            self.buf, self.blocked = "", "the output contained a blocked term"
            return buf[:m.start()]
        keep = max(self.hold, _prefix_suffix_len(buf.lower(), self.literals))
        cut = max(0, len(buf) - keep)
        self.buf = buf[cut:]
        return buf[:cut]

    def flush(self) -> str:
        out = self.push("")
        if self.blocked is None:  # NOTE: what push still held (a possible start of a term) is decided now
            out += self.buf
        self.buf = ""
        return out


def _prefix_suffix_len(text: str, literals: tuple[str, ...]) -> int:
    """Length of the longest end of `text` that is the start of some literal (it may still become one)."""
    longest = 0
    for lit in literals:
        for k in range(min(len(lit) - 1, len(text)), longest, -1):
            if text.endswith(lit[:k]):
                longest = k
                break
    return longest
