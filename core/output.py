"""The output stage of one request: detokenize, decide stops, and hold back undecided text.

Text that might still turn into a stop string is held back (only as many characters as the
longest stop string needs) so a stop string is never streamed, even when it spans tokens.
"""
from __future__ import annotations

from modelcall.core.request import Request
from modelcall.core.stages import IncrementalDetokenizer


class OutputState:
    """Per-request output bookkeeping, advanced once per sampled token."""

    __slots__ = ("detok", "stops", "held", "pieces", "include_stop")

    def __init__(self, detok: IncrementalDetokenizer, stops: tuple[str, ...], include_stop: bool) -> None:
        self.detok = detok
        self.stops = stops
        self.include_stop = include_stop
        self.held = ""     # decided-not-yet text that could still start a stop string
        self.pieces: list[str] = []  # everything emitted so far (joined once, at the end: O(n) not O(n^2))

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def on_token(self, request: Request, token_id: int, window: int) -> tuple[str, str | None, str | int | None]:
        """Account for one newly appended token; return (text to emit, finish reason, stop reason)."""
        p = request.params
        n_out = request.num_output_tokens
        if not p.ignore_eos and token_id in request.eos_token_ids and n_out > p.min_tokens:
            return self._finish(self.detok.flush()), "stop", token_id
        if token_id in p.stop_token_ids and n_out > p.min_tokens:
            return self._finish(self.detok.flush()), "stop", token_id
        piece = self.detok.push((token_id,))
        if self.stops:
            buf = self.held + piece
            cut, which = _find_stop(buf, self.stops)
            if which is not None and n_out >= p.min_tokens:
                end = cut + len(which) if self.include_stop else cut
                self.held = ""
                return self._emit(buf[:end]), "stop", which
            keep = _stop_prefix_len(buf, self.stops)
            self.held = buf[len(buf) - keep:] if keep else ""
            piece = buf[:len(buf) - keep]
        if n_out >= request.max_tokens or request.num_tokens >= window:
            return self._finish(piece + self.detok.flush()), "length", None
        return self._emit(piece), None, None

    def _emit(self, text: str) -> str:
        if text:
            self.pieces.append(text)
        return text

    def _finish(self, tail: str) -> str:
        """Give up everything held: the request ended without a stop string match."""
        out = self.held + tail
        self.held = ""
        return self._emit(out)

    def close(self) -> str:
        """The request ended from outside (abort, error): release held text."""
        return self._finish(self.detok.flush())


def _find_stop(text: str, stops: tuple[str, ...]) -> tuple[int, str | None]:
    best, which = len(text) + 1, None
    for s in stops:
        i = text.find(s)
        if i != -1 and i < best:
            best, which = i, s
    return best, which


def _stop_prefix_len(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of some stop string."""
    longest = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), longest, -1):
            if text.endswith(s[:k]):
                longest = k
                break
    return longest


def count_reasoning_tokens(token_ids: list[int], num_prompt: int, think: tuple[int, int] | None) -> int:
    """Output tokens spent inside reasoning blocks (`think` = (start id, end id)), tags included.

    A block the prompt opened (a template ending in the start tag) counts from the first output
    token. Computed once when a request ends, so it costs nothing per token.
    """
    if think is None:
        return 0
    start, end = think
    inside = False
    for t in reversed(token_ids[:num_prompt]):
        if t == end:
            break
        if t == start:
            inside = True
            break
    n = 0
    for t in token_ids[num_prompt:]:
        if t == start:
            inside = True
            n += 1
        elif t == end:
            inside = False
            n += 1
        elif inside:
            n += 1
    return n
