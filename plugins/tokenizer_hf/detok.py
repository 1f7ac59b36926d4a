"""Incremental detokenizers: O(1) work per token, and never half a character.

Two strategies, picked by the tokenizer's decoder:

* `ByteLevelDetokenizer` (GPT-2, Llama 3, Qwen: decoder `ByteLevel`): every token is a fixed byte
  string, so output text is an incremental UTF-8 decode of the concatenated bytes. Python's
  incremental decoder holds an unfinished character and replaces invalid bytes exactly as the
  one-shot decode does (one U+FFFD per maximal invalid subpart, like Rust's from_utf8_lossy).
* `WindowDetokenizer` (any other decoder: Metaspace, byte fallback, WordPiece...): the
  prefix-offset technique of vLLM/TGI. Decode a small window of recent tokens twice (with and
  without the new ones) and emit the difference once it does not end in U+FFFD.
"""
from __future__ import annotations

import codecs
from collections.abc import Sequence
from typing import Any

_utf8_decoder = codecs.getincrementaldecoder("utf-8")


class ByteLevelDetokenizer:
    """Output text of one request for byte-level BPE tokenizers. `table[id]` is the token's bytes."""

    __slots__ = ("_table", "_decoder")

    def __init__(self, table: Sequence[bytes]) -> None:
        self._table = table
        self._decoder = _utf8_decoder(errors="replace")

    def push(self, token_ids: Sequence[int]) -> str:
        table, n = self._table, len(self._table)
        if len(token_ids) == 1:
            t = token_ids[0]
            data = table[t] if 0 <= t < n else b""
        else:
            data = b"".join(table[t] for t in token_ids if 0 <= t < n)
        return self._decoder.decode(data)

    def flush(self) -> str:
        return self._decoder.decode(b"", True)


class WindowDetokenizer:
    """Output text of one request for any tokenizer, from decodes of a window of a few tokens.

    `ids[:read]` was already emitted (kept as context for the leading-space rules of decoders
    like Metaspace); `ids[read:]` is pending. The window starts with a few prompt tokens
    so the first output token decodes as it would in the middle of the text.
    """

    CONTEXT = 5       # prompt tokens kept as left context
    MAX_PENDING = 8   # an undecodable byte run longer than this is given up as U+FFFD

    __slots__ = ("_decode", "_skip", "_ids", "_read")

    def __init__(self, backend: Any, prompt_token_ids: Sequence[int], skip_special_tokens: bool = True) -> None:
        self._decode = backend.decode
        self._skip = skip_special_tokens
        self._ids = list(prompt_token_ids[-self.CONTEXT:])
        self._read = len(self._ids)

    def push(self, token_ids: Sequence[int]) -> str:
        self._ids.extend(token_ids)
        return self._advance(final=False)

    def flush(self) -> str:
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        ids, read = self._ids, self._read
        if read == len(ids):
            return ""
        decode, skip = self._decode, self._skip
        before = decode(ids[:read], skip_special_tokens=skip)
        end, after = len(ids), decode(ids, skip_special_tokens=skip)
        if not final and after.endswith("\ufffd"):
            end = self._split(before, after)
            if end is None:
                return ""
            if end < len(ids):
                after = decode(ids[:end], skip_special_tokens=skip)
        # NOTE: the tokens emitted now stay as left context; older ones are dropped, so the
        # list never holds more than one push's tokens plus the pending ones.
        del ids[:read]
        self._read = end - read
        return after[len(before):]

    def _split(self, before: str, full: str) -> int | None:
        """The text ends in an unfinished (or broken) character: the last token boundary up to
        which the text is final, or None to wait for more tokens.

        A boundary is final when the text before it ends in a whole character (a character
        spans at most 4 byte tokens), or, once more than MAX_PENDING tokens wait, when
        splitting there does not change the decoded text of a non-empty tail: then the broken
        bytes before it can no longer be completed.
        """
        ids, read, decode, skip = self._ids, self._read, self._decode, self._skip
        force = len(ids) - read > self.MAX_PENDING
        for k in range(len(ids) - 1, read if force else max(read, len(ids) - 4), -1):
            head = decode(ids[:k], skip_special_tokens=skip)
            if len(head) <= len(before):
                break
            if not head.endswith("\ufffd"):
                return k
            if force:  # NOTE: an empty tail (skipped special tokens) decides nothing
                tail = decode(ids[k:], skip_special_tokens=skip)
                if tail and head + tail == full:
                    return k
        return len(ids) if force else None  # nothing splits cleanly: give the broken bytes up
