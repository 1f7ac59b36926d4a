"""The tensor table of a GGUF file, read fast: names, GGML types, shapes and byte ranges over one memory map.

NOTE: gguf.GGUFReader parses every metadata value into NumPy parts in Python before it lists a tensor: 5.4 s for
SmolLM2's 49k-token vocabulary and merges here, most of a load. The weights need none of those values, so this
reader walks the header with `struct`, skipping array values by their sizes (strings by their lengths), keeps only
`general.alignment`, and reads the tensor infos. The layout and the type sizes are the gguf package's own
(GGUFValueType, GGML_QUANT_SIZES); tests/test_gguf_load.py checks the table against GGUFReader's on real files.

    magic "GGUF" | u32 version | u64 tensors | u64 kvs | kvs: (string key, u32 type, value)...
    | tensor infos: (string name, u32 dims, u64 ne[dims], u32 type, u64 offset)... | pad to alignment | data
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

# GGUFValueType -> fixed size in bytes (STRING = 8 and ARRAY = 9 are variable)
_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY, _U32 = 8, 9, 4


@dataclass(frozen=True, slots=True)
class TensorEntry:
    """One tensor: `ne` lists dimensions innermost first (ne[0]: values per row), `data` its raw bytes."""

    name: str
    qtype: int
    ne: tuple[int, ...]
    data: np.ndarray   # uint8 view of the file's memory map


class _Cursor:
    def __init__(self, buf: memoryview) -> None:
        self.buf, self.at = buf, 0

    def take(self, fmt: str) -> tuple:
        v = struct.unpack_from("<" + fmt, self.buf, self.at)
        self.at += struct.calcsize("<" + fmt)
        return v

    def string(self) -> str:
        (n,) = self.take("Q")
        s = bytes(self.buf[self.at:self.at + n]).decode("utf-8", "replace")
        self.at += n
        return s

    def skip_value(self, vtype: int) -> None:
        if vtype == _STRING:
            (n,) = self.take("Q")
            self.at += n
        elif vtype == _ARRAY:
            (etype, count) = self.take("IQ")
            if etype == _STRING:
                for _ in range(count):
                    (n,) = struct.unpack_from("<Q", self.buf, self.at)
                    self.at += 8 + n
            elif etype == _ARRAY:
                for _ in range(count):
                    self.skip_value(_ARRAY)
            else:
                self.at += _SIZES[etype] * count
        else:
            self.at += _SIZES[vtype]


def read_tensors(path: str) -> dict[str, TensorEntry]:
    """Every tensor of the GGUF file `path` by name (ValueError on a file that is not GGUF v2/v3)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    mm = np.memmap(path, dtype=np.uint8, mode="r")
    cur = _Cursor(memoryview(mm))
    magic, version = cur.take("4sI")
    if magic != b"GGUF" or version not in (2, 3):
        raise ValueError(f"{path}: not a GGUF v2/v3 file (magic {magic!r}, version {version})")
    n_tensors, n_kv = cur.take("QQ")
    alignment = 32
    for _ in range(n_kv):
        key = cur.string()
        (vtype,) = cur.take("I")
        if key == "general.alignment" and vtype == _U32:
            (alignment,) = cur.take("I")
        else:
            cur.skip_value(vtype)
    infos = []
    for _ in range(n_tensors):
        name = cur.string()
        (dims,) = cur.take("I")
        ne = cur.take("Q" * dims)
        qtype, offset = cur.take("IQ")
        infos.append((name, qtype, tuple(int(x) for x in ne), offset))
    start = (cur.at + alignment - 1) // alignment * alignment
    out = {}
    for name, qtype, ne, offset in infos:
        block, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)]
        size = int(np.prod(ne)) // block * nbytes
        out[name] = TensorEntry(name, qtype, ne, mm[start + offset:start + offset + size])
    return out
