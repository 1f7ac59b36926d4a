"""modelcall-wordfilter: a safety filter that refuses prompts with banned words and stops output at one.

    plugin_config = {"wordfilter": {"words": ["password", "rm -rf"]}}

A prompt containing a word is refused before any compute (HTTP 400, `content_filter`). In the
output, the filter holds back only the characters that could still become a word; when a word
completes, the request ends with finish reason `content_filter` and the word is never sent.
Matching ignores case.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from modelcall.core import hookimpl
from modelcall.core.safety import Verdict

__version__ = "0.1.0"


@hookimpl
def register_safety_filters(register: Any, config: Any) -> None:
    words = config.plugin_config.get("wordfilter", {}).get("words")
    if words:
        register(WordFilter(words))


class WordFilter:
    """A `modelcall.core.safety.SafetyFilter`. Also a plugin object: `Kernel(plugins=[WordFilter([...])])`."""

    name = "wordfilter"

    def __init__(self, words: Iterable[str]) -> None:
        self.words = tuple(w.lower() for w in words if w)
        if not self.words:
            raise ValueError("WordFilter needs at least one non-empty word")

    @hookimpl
    def register_safety_filters(self, register: Any) -> None:
        register(self)

    def check_input(self, text: str) -> Verdict | None:
        low = text.lower()
        hit = next((w for w in self.words if w in low), None)
        return Verdict.block(f"the prompt contains a banned word ({hit!r})") if hit else None

    def output_filter(self, request: Any) -> WordStream:
        return WordStream(self.words)


class WordStream:
    """One request's output: an `OutputFilter` that releases text as soon as no word can start in it."""

    __slots__ = ("words", "held", "blocked")

    def __init__(self, words: tuple[str, ...]) -> None:
        self.words = words
        self.held = ""
        self.blocked: str | None = None

    def push(self, text: str) -> str:
        buf = self.held + text
        low = buf.lower()
        found = [(i, w) for w in self.words if (i := low.find(w)) != -1]
        if found:
            at, word = min(found)
            self.blocked, self.held = f"output contained a banned word ({word!r})", ""
            return buf[:at]
        keep = max((k for w in self.words for k in range(min(len(w) - 1, len(buf)), 0, -1)
                    if low.endswith(w[:k])), default=0)
        self.held = buf[len(buf) - keep:] if keep else ""
        return buf[:len(buf) - keep]

    def flush(self) -> str:
        out, self.held = self.held, ""
        return out
