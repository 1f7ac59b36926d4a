"""PII redaction: emails, phone numbers and card numbers (Luhn-checked) become placeholders.

Streaming: the filter releases text up to the last point no match can span (a character no
pattern contains, or a space not between digits), so ordinary prose is held back by at most
a word, and never more than `max_hold` characters.
"""
from __future__ import annotations

import re

from modelcall.core.safety import Verdict

CARD = r"(?P<card>(?<![\d])(?:\d[ -]?){12,18}\d(?![\d]))"
EMAIL = r"(?P<email>[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}(?:\.[A-Za-z0-9-]{1,63})*\.[A-Za-z]{2,24})"
PHONE = r"(?P<phone>(?<![\w+])(?:\+\d{1,3}[ .-]?)?(?:\(\d{3}\)[ .-]?|\d{3}[ .-])\d{3}[ .-]\d{4}(?!\w))"
PII = re.compile("|".join((CARD, EMAIL, PHONE)))
_CHARSET = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._%+@()-")
PLACEHOLDERS = {"card": "[card]", "email": "[email]", "phone": "[phone]"}


def luhn_ok(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _replace(m: re.Match[str]) -> str:
    kind = m.lastgroup or ""
    if kind == "card" and not luhn_ok(re.sub(r"\D", "", m.group())):
        return m.group()  # a long number that is not a card number
    return PLACEHOLDERS[kind]


def redact(text: str) -> str:
    """`text` with every email, phone number and Luhn-valid card number replaced by a placeholder."""
    return PII.sub(_replace, text)


def safe_cut(buf: str, max_hold: int) -> int:
    """The longest prefix of `buf` that no PII match can extend past."""
    i, lo = len(buf), max(0, len(buf) - max_hold)
    while i > lo:
        c = buf[i - 1]
        if c in _CHARSET or (c == " " and i >= 2 and (buf[i - 2].isdigit() or buf[i - 2] == ")")):
            i -= 1
            continue
        break
    return i


class PiiRedactor:
    """A SafetyFilter that redacts PII in outputs (and, with `block_input`, refuses prompts holding any)."""

    name = "pii"

    def __init__(self, *, block_input: bool = False, max_hold: int = 128) -> None:
        self.block_input = block_input
        self.max_hold = max_hold

    def check_input(self, text: str) -> Verdict | None:
        if self.block_input and redact(text) != text:
            return Verdict.block("the prompt contains personal data (an email, phone or card number)")
        return None

    def output_filter(self, request: object) -> PiiStream:
        return PiiStream(self.max_hold)


class PiiStream:
    __slots__ = ("max_hold", "buf", "blocked")

    def __init__(self, max_hold: int) -> None:
        self.max_hold = max_hold
        self.buf = ""
        self.blocked: str | None = None  # redaction never ends a request

    def push(self, text: str) -> str:
        buf = self.buf + text
        cut = safe_cut(buf, self.max_hold)
        self.buf = buf[cut:]
        return redact(buf[:cut])

    def flush(self) -> str:
        out, self.buf = redact(self.buf), ""
        return out
