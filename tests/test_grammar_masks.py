"""Grammar masks as the sampler applies them: llguidance's packed bitmask words unpacked on the
words' own device (so on CUDA only vocab/8 bytes cross to the device), every bit in its place,
the end-of-sequence exceptions set in the words themselves."""
from __future__ import annotations

import random

import torch

from modelcall.plugins.structured.masks import adjusted_words, unpack_blocked


class _State:
    """The two matcher answers the adjustment reads (llguidance's is_error / is_accepting)."""

    def __init__(self, error: bool = False, accepting: bool = False, eos: tuple[int, ...] = ()) -> None:
        self.matcher = self
        self._error, self._accepting, self.eos = error, accepting, sorted(eos)

    def is_error(self) -> bool:
        return self._error

    def is_accepting(self) -> bool:
        return self._accepting


def _reference_forbidden(words: list[int]) -> list[bool]:
    return [not (w >> j) & 1 for w in words for j in range(32)]  # bit j of word i: token 32*i + j


def test_every_bit_of_every_word_unpacks_to_its_token():
    rng = random.Random(7)
    words = [rng.getrandbits(32) for _ in range(9)] + [0, 0xFFFFFFFF, 1 << 31, 1]
    as_int32 = torch.tensor([w - (1 << 32) if w >= 1 << 31 else w for w in words], dtype=torch.int32)
    assert unpack_blocked(as_int32).tolist() == _reference_forbidden(words)
    rows = torch.stack([as_int32, as_int32.flip(0)])
    assert unpack_blocked(rows).tolist() == [_reference_forbidden(words), _reference_forbidden(words[::-1])]


def test_end_of_sequence_is_allowed_once_the_grammar_may_end_and_only_it_after_an_error():
    none_allowed = torch.zeros((3, 2), dtype=torch.int32)
    states = [_State(accepting=True, eos=(31, 40, 99)),   # 31: the sign bit of word 0; 99 is past the vocabulary
              _State(accepting=False, eos=(5,)),
              _State(error=True, eos=(63,))]
    blocked = unpack_blocked(adjusted_words(none_allowed, states))
    allowed = [[t for t in range(64) if not blocked[i, t]] for i in range(3)]
    assert allowed == [[31, 40], [], [63]]
    everything = torch.full((1, 2), -1, dtype=torch.int32)
    assert unpack_blocked(adjusted_words(everything, [_State(error=True, eos=(2,))]))[0].logical_not().nonzero().flatten().tolist() == [2]
