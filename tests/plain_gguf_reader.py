"""gguf's GGUFReader over a plain NumPy view of its memory map: the same fields and tensors, read in half the time.

NOTE: GGUFReader slices its np.memmap once or more per value it parses (~12M slices for Gemma 3's 262k-token
vocabulary: tokens, scores and types), and every slice of a memmap runs memmap's Python __getitem__ and
__array_finalize__: 55% of transformers' load of that file, which reads it twice (the config, then the weights).
A plain ndarray view of the same map holds the same bytes (and keeps the map alive) without that; measured on the
Gemma file, one thread: 31-32 s CPU to 14 s, with a bit-identical state dict. tests/test_plain_gguf_reader.py checks
the fields and tensors against GGUFReader's.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any
from unittest import mock

import gguf
import numpy as np


class PlainGGUFReader(gguf.GGUFReader):
    """GGUFReader whose `data` (np.memmap, assigned in GGUFReader.__init__ before it parses) is a plain ndarray."""

    @property  # type: ignore[override]
    def data(self) -> np.ndarray:
        return self._plain

    @data.setter
    def data(self, mapped: np.ndarray) -> None:
        self._plain = mapped.view(np.ndarray)


@contextlib.contextmanager
def transformers_reads_gguf_plainly() -> Iterator[Any]:
    """Within: transformers' GGUF loading (`from_pretrained(..., gguf_file=)`, which imports gguf.GGUFReader when
    called) reads the file with PlainGGUFReader."""
    with mock.patch.object(gguf, "GGUFReader", PlainGGUFReader):
        yield PlainGGUFReader
