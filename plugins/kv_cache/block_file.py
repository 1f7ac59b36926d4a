"""One KV block on disk: a fixed header, the block's key, then its K/V bytes.

    offset  size  field
    0       4     magic b"MCKV"
    4       2     format version (1)
    6       2     key length k
    8       32    fingerprint: the model, dtypes and KV layout the bytes belong to (fingerprint.py)
    40      8     payload length n (the runner's bytes per block)
    48      4     CRC-32 of the payload
    52      k     the block's prefix-cache key (its chained hash, tenant salt and KV group included)
    52 + k  n     the payload: every paged K/V tensor's slots of the block, in the runner's order

NOTE: the header is read alone at start-up (the index is rebuilt from headers and file sizes, no
payload read); the CRC is checked each time a payload is read back, before any byte reaches the pool.
"""
from __future__ import annotations

import struct
import zlib

MAGIC = b"MCKV"
VERSION = 1
HEAD = struct.Struct("<4sHH32sQI")
SUFFIX = ".kv"


class BadBlockFile(ValueError):
    """A block file that must not be loaded; the message says why (for the skipped-files report)."""


def file_name(key: bytes) -> str:
    return key.hex() + SUFFIX


def encode_header(fingerprint: bytes, key: bytes, payload: memoryview) -> bytes:
    return HEAD.pack(MAGIC, VERSION, len(key), fingerprint, payload.nbytes, zlib.crc32(payload)) + key


def parse_header(head: bytes, fingerprint: bytes, payload_bytes: int) -> tuple[bytes, int, int]:
    """(key, payload offset, CRC) of a header, or BadBlockFile naming what is wrong with it."""
    if len(head) < HEAD.size:
        raise BadBlockFile(f"truncated header ({len(head)} of {HEAD.size} bytes)")
    magic, version, key_len, fp, n, crc = HEAD.unpack_from(head)
    if magic != MAGIC or version != VERSION:
        raise BadBlockFile(f"not a modelcall KV block (magic {magic!r}, version {version})")
    if fp != fingerprint:
        raise BadBlockFile(f"another model fingerprint ({fp.hex()[:16]}, this model's is {fingerprint.hex()[:16]})")
    if n != payload_bytes:
        raise BadBlockFile(f"payload of {n} bytes, this model's blocks have {payload_bytes}")
    if len(head) < HEAD.size + key_len:
        raise BadBlockFile("truncated key")
    return bytes(head[HEAD.size:HEAD.size + key_len]), HEAD.size + key_len, crc


def check_payload(payload: memoryview, crc: int) -> None:
    if zlib.crc32(payload) != crc:
        raise BadBlockFile("checksum mismatch (torn or corrupted payload)")
