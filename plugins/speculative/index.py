"""`NgramIndex`: where each n-gram of a token sequence last ended, kept up to date as the sequence grows.

    tokens:   a b c d a b c ?        n = 2: (a, b) -> 1, (b, c) -> 2, (c, d) -> 3, (d, a) -> 4, (a, b) -> 5
    tail (b, c) ends at 6: its last earlier end is 2, so the guess is tokens[3:] = d a b c

An n-gram ending at the sequence's last token is indexed only once a later token arrives, so a
lookup of the tail finds an earlier occurrence, never itself.
"""
from __future__ import annotations


class NgramIndex:
    """n-grams of length `min_n`..`max_n` of one growing sequence -> the position each last ended at."""

    __slots__ = ("min_n", "max_n", "ends", "indexed")

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n = min_n
        self.max_n = max_n
        self.ends: dict[tuple[int, ...], int] = {}
        self.indexed = 0  # positions < indexed have had their n-grams recorded

    def update(self, tokens: list[int], upto: int) -> None:
        """Record the n-grams ending at positions `indexed` .. `upto - 1`."""
        ends = self.ends
        lo, hi = self.min_n, self.max_n
        for p in range(self.indexed, upto):
            for n in range(lo, min(hi, p + 1) + 1):
                ends[tuple(tokens[p - n + 1:p + 1])] = p
        self.indexed = max(self.indexed, upto)

    def match(self, tokens: list[int]) -> tuple[int, int]:
        """(length, end) of the longest n-gram ending `tokens` seen earlier, or (0, -1)."""
        # NOTE: shortest first: an n-gram seen earlier means its suffixes were too, so the first miss
        # ends the search, and the common case (no match at all) costs one lookup.
        ends = self.ends
        size = len(tokens)
        found = (0, -1)
        for n in range(self.min_n, min(self.max_n, size) + 1):
            end = ends.get(tuple(tokens[size - n:]))
            if end is None:
                break
            found = (n, end)
        return found
