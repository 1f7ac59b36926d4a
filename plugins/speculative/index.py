"""`NgramIndex`: where each n-gram of a token sequence ended, kept up to date as the sequence grows.

    tokens:   a b c d a b c ?        min_n = 2: (a, b) ends at 1 and 5, (b, c) at 2 and 6 ...
    tail (b, c) ends at 6: its latest earlier end is 2, so the guess is tokens[3:] = d a b c

Only `min_n`-grams are indexed (one dict entry and one list slot per token: indexing is the part of a
miss paid on every token); a longer match is found by comparing the tokens before a candidate end
with the tail, up to `max_n`. Each end links to the previous end of the same n-gram, so the latest
`max_candidates` occurrences are tried, latest first. An n-gram ending at the sequence's last token
is indexed only once a later token arrives, so a lookup of the tail finds an earlier occurrence,
never itself.
"""
from __future__ import annotations


class NgramIndex:
    """n-grams of length `min_n` of one growing sequence -> the latest position each ended at, each
    position -> the previous end of its n-gram (-1: none)."""

    __slots__ = ("min_n", "max_n", "ends", "prev", "max_candidates")

    def __init__(self, min_n: int, max_n: int, max_candidates: int = 8) -> None:
        self.min_n = min_n
        self.max_n = max_n
        self.max_candidates = max_candidates
        self.ends: dict[tuple[int, ...], int] = {}
        self.prev: list[int] = []  # one per position indexed so far: positions < len(prev) are recorded

    @property
    def indexed(self) -> int:
        return len(self.prev)

    def update(self, tokens: list[int], upto: int) -> None:
        """Record the n-grams ending at positions `indexed` .. `upto - 1`."""
        ends, prev, n = self.ends, self.prev, self.min_n
        for p in range(len(prev), upto):
            if p < n - 1:
                prev.append(-1)
                continue
            key = tuple(tokens[p - n + 1:p + 1])
            prev.append(ends.get(key, -1))
            ends[key] = p

    def match(self, tokens: list[int]) -> tuple[int, int]:
        """(length, end) of the longest n-gram (min_n..max_n) ending `tokens` that ended earlier too
        (the latest such end on a tie), or (0, -1)."""
        n, size = self.min_n, len(tokens)
        if size < n:
            return (0, -1)
        end = self.ends.get(tuple(tokens[size - n:]), -1)   # the common case (no match): one lookup
        longest = min(self.max_n, size)
        found = (0, -1)
        for _ in range(self.max_candidates):
            if end < 0:
                break
            length = n
            while length < longest and end - length >= 0 and tokens[end - length] == tokens[size - 1 - length]:
                length += 1
            if length > found[0]:
                found = (length, end)
                if length == longest:
                    break
            end = self.prev[end]
        return found
