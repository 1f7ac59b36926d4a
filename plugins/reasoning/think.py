"""`<think>…</think>` reasoning blocks: split the text on the tags, count tokens by the tags' ids.

Text is split on the tag strings, holding back only a partial tag at the end of a piece; the
newlines a model writes right after a tag are dropped. Tokens are counted by id when each tag is
one token (every tokenizer that has them), else by where the text split stood.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

START, END = "<think>", "</think>"


class ThinkParser:
    """One response's reasoning split. `inside`: the output starts inside a block (the prompt opened it)."""

    __slots__ = ("start_tag", "end_tag", "start_id", "end_id", "inside", "_tokens_inside", "_pending", "_strip_next")

    def __init__(self, start_id: int | None = None, end_id: int | None = None, *, inside: bool = False,
                 start_tag: str = START, end_tag: str = END) -> None:
        self.start_tag, self.end_tag = start_tag, end_tag
        self.start_id, self.end_id = start_id, end_id
        self.inside = inside
        self._tokens_inside = inside
        self._pending = ""
        self._strip_next = inside  # drop the newline a model writes right after a tag

    @property
    def tags(self) -> tuple[str, ...]:
        return (self.start_tag, self.end_tag)

    def is_reasoning(self, token_id: int) -> bool:
        if self.start_id is None or self.end_id is None:
            return self.inside  # NOTE: tags of several tokens: the text split decides (it may lag a little)
        if token_id == self.start_id:
            self._tokens_inside = True
            return True
        if token_id == self.end_id:
            self._tokens_inside = False
            return True
        return self._tokens_inside

    def feed(self, text: str) -> tuple[str, str]:
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

    def finish(self) -> tuple[str, str]:
        held, self._pending = self._pending, ""
        return (held, "") if self.inside else ("", held)

    def _strip(self, piece: str) -> str:
        if self._strip_next and piece:
            piece = piece.lstrip("\n")
            self._strip_next = not piece
        return piece


def tag_ids(tokenizer: Any) -> tuple[int | None, int | None]:
    """The ids of `<think>` and `</think>` when each is one token of `tokenizer`."""
    return _one_token(tokenizer, START), _one_token(tokenizer, END)


def _one_token(tokenizer: Any, tag: str) -> int | None:
    to_id = getattr(tokenizer, "token_to_id", None)
    if to_id is not None:
        i = to_id(tag)
        if i is not None:
            return i
    ids = tokenizer.encode(tag)
    return ids[0] if len(ids) == 1 else None


def opened_in_prompt(tokenizer: Any, prompt_token_ids: Sequence[int], start_id: int | None,
                     end_id: int | None) -> bool | None:
    """True when the prompt leaves a block open (a template ending in `<think>`), False when its
    last tag closes one, None when it shows no tag."""
    if start_id is not None and end_id is not None:
        for t in reversed(prompt_token_ids):
            if t == end_id:
                return False
            if t == start_id:
                return True
        return None
    tail = tokenizer.decode(list(prompt_token_ids[-64:]), skip_special_tokens=False)
    s, e = tail.rfind(START), tail.rfind(END)
    return None if s == e == -1 else s > e


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0
