"""Prebuilt SSE frames for the streaming hot path: a stream's token chunks differ only in their text.

A plain token delta (no logprobs, no reasoning, no tool call) is the same JSON every time but for one
string, so each stream encodes its chunk once with a marker in that string and splits it there; a token's
frame is then the head, the text encoded as a JSON string, and the tail: the bytes the whole chunk's
encoding would give (msgspec writes a string the same wherever it sits), without building two or three
Structs and re-encoding the id, model and nulls per token.
"""
from __future__ import annotations

from collections.abc import Callable

import msgspec

_MARK = "\ue000modelcall-text\ue001"  # private-use characters: no id, model name or created time holds them
_encode_str = msgspec.json.Encoder().encode


class TextFrame:
    """`frame(text)`: the SSE data frame `make(text)` encodes, from bytes split once."""

    __slots__ = ("head", "tail")

    def __init__(self, head: bytes, tail: bytes) -> None:
        self.head = head
        self.tail = tail

    @classmethod
    def of(cls, make: Callable[[str], bytes]) -> TextFrame | None:
        """The template of `make` (text -> the chunk's JSON); None when the marker is not found exactly once."""
        whole = make(_MARK)
        mark = _encode_str(_MARK)
        if whole.count(mark) != 1:
            return None
        head, tail = whole.split(mark)
        return cls(b"data: " + head, tail + b"\n\n")

    def frame(self, text: str) -> bytes:
        return self.head + _encode_str(text) + self.tail
