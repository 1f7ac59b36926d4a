"""Split a model's output into reasoning (inside `<think>…</think>`) and answer, counting reasoning tokens.

Used by both protocols, streaming and not, so a streamed answer always concatenates to the
non-streamed one. Tokens are counted by id (the tokenizer's think token ids); text is split
on the tags, holding back only a partial tag at the end of a delta.
"""
from __future__ import annotations

from collections.abc import Sequence


class ReasoningSplitter:
    """Feed each delta's (token ids, text); get back (reasoning text, answer text)."""

    def __init__(self, start_id: int, end_id: int, start_tag: str = "<think>", end_tag: str = "</think>",
                 prompt_token_ids: Sequence[int] = ()) -> None:
        self.start_id, self.end_id = start_id, end_id
        self.start_tag, self.end_tag = start_tag, end_tag
        self.inside = _opened_in_prompt(prompt_token_ids, start_id, end_id)  # e.g. a template ending in <think>
        self._tokens_inside = self.inside
        self._pending = ""
        self._strip_next = self.inside  # drop the newline a model writes right after a tag
        self.reasoning_tokens = 0

    @classmethod
    def for_tokenizer(cls, tokenizer: object, prompt_token_ids: Sequence[int] = ()) -> ReasoningSplitter | None:
        """A splitter when the tokenizer names its think tokens (`think_token_ids`), else None."""
        ids = getattr(tokenizer, "think_token_ids", None)
        if not ids or len(ids) != 2 or ids[0] is None or ids[1] is None:
            return None
        start, end = ids
        tags = [_decode(tokenizer, t) or d for t, d in ((start, "<think>"), (end, "</think>"))]
        return cls(start, end, tags[0], tags[1], prompt_token_ids)

    def feed(self, token_ids: Sequence[int], text: str) -> tuple[str, str]:
        has_start, has_end = self.start_id in token_ids, self.end_id in token_ids
        self._count(token_ids)
        if has_start and self.start_tag not in text and not self.inside:  # tag skipped as a special token
            self.inside, self._strip_next = True, True
        reasoning, answer = self._split(text)
        if has_end and self.end_tag not in text and self.inside:
            self.inside, self._strip_next = False, True
            reasoning, answer = reasoning + self._pending, answer
            self._pending = ""
        return reasoning, answer

    def flush(self) -> tuple[str, str]:
        """The output ended: give up a held partial tag as plain text."""
        held, self._pending = self._pending, ""
        return (held, "") if self.inside else ("", held)

    def _count(self, token_ids: Sequence[int]) -> None:
        for t in token_ids:
            if t == self.start_id:
                self._tokens_inside = True
                self.reasoning_tokens += 1
            elif t == self.end_id:
                self._tokens_inside = False
                self.reasoning_tokens += 1
            elif self._tokens_inside:
                self.reasoning_tokens += 1

    def _split(self, text: str) -> tuple[str, str]:
        buf, self._pending = self._pending + text, ""
        reasoning: list[str] = []
        answer: list[str] = []
        while buf:
            tag = self.end_tag if self.inside else self.start_tag
            out = reasoning if self.inside else answer
            i = buf.find(tag)
            if i == -1:
                keep = _partial_suffix(buf, tag)
                out.append(self._strip(buf[:len(buf) - keep]))
                self._pending = buf[len(buf) - keep:]
                break
            out.append(self._strip(buf[:i]))
            buf = buf[i + len(tag):]
            self.inside, self._strip_next = not self.inside, True
        return "".join(reasoning), "".join(answer)

    def _strip(self, piece: str) -> str:
        if self._strip_next and piece:
            piece = piece.lstrip("\n")
            self._strip_next = not piece
        return piece


def _opened_in_prompt(ids: Sequence[int], start: int, end: int) -> bool:
    for t in reversed(ids):
        if t == end:
            return False
        if t == start:
            return True
    return False


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


def _decode(tokenizer: object, token_id: int) -> str:
    try:
        return tokenizer.decode([token_id], skip_special_tokens=False)  # type: ignore[attr-defined]
    except Exception:
        return ""
