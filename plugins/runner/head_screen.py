"""The greedy lm_head screened at int8: a greedy row's token without computing most of its logits.

A decode step's head is a matmul of every row with the whole vocabulary: Gemma 3 270M's 262,144 x 640 is 63% of
a step's multiply-adds, SmolLM2's 49,152 x 576 about a fifth. A greedy request needs only the index of the first
maximum. `HeadScreen.argmax` (csrc/quant_screen.c) estimates every logit at int8 with a proven bound on its distance
from the logit the head computes, then computes with the head's own kernel only the 16-row tiles that can hold the
maximum (a decode row keeps ~1-16 tiles of thousands) and takes the first maximum over them: the head's
logits' answer bit for bit, which the tests check against the full head and the engine's outputs with and without.

Heads it takes: r16 layouts (quant_repack.py) of Q8_0 (the screen reads the head's own bytes with int8 x where the
head takes int16 x: one integer dot product where it takes two) and of F16 / BF16 (the screen reads a Q8_0 copy made
here: 34 bytes per 32 weights beside the head's 64, e.g. 178 MB for Gemma 3 270M). Not taken: other formats, a head
with a bias, activations with int8 numerics already (`int8_activations`), no AVX-512 VNNI. Rows per call up to
`MAX_ROWS` (from 2 on a Q8_0 head: one row reads its bytes as the head does), and only where the head itself would
run its kernel (`quant.dense_from_tokens`).

`runner.head_screen` in the plugin config: "auto" (default) or false (every greedy row computes its whole head).
"""
from __future__ import annotations

import ctypes
import logging

import torch

from modelcall.plugins.runner import huge_pages, quant

log = logging.getLogger("modelcall.runner")

MAX_ROWS = 64   # csrc/quant_screen.c's SCREEN_MAX_ROWS
_Q8_0, _F16, _BF16 = quant.GGML_TYPES["Q8_0"], quant.GGML_TYPES["F16"], quant.GGML_TYPES["BF16"]
_p, _i64 = ctypes.c_void_p, ctypes.c_int64


class ScreenArgs(ctypes.Structure):
    """csrc/quant_screen.c's screen_t."""

    _fields_ = [("base", ctypes.c_int), ("w", _p), ("row_bytes", _i64), ("sw", _p), ("s_row_bytes", _i64),
                ("norm", _p), ("err", _p), ("n", _i64), ("k", _i64)]


class HeadScreen:
    """The screened greedy head of one QuantLinear lm_head (see the module docstring)."""

    def __init__(self, head: quant.QuantLinear) -> None:
        w = head.qweight
        self.qtype, (n, k) = w.qtype, w.shape
        base = w.qtype - quant.R16_OFF
        lib = quant.load()
        screen = w
        if base != _Q8_0:   # a Q8_0 copy of the float head, in the r16 layout, on 2 MiB pages as the head's stream is
            data = torch.empty(n, quant.row_bytes(_Q8_0 + quant.R16_OFF, k), dtype=torch.uint8)
            huge_pages.advise(data)
            screen = quant.QWeight(data, _Q8_0 + quant.R16_OFF, (n, k))
        self.norm = torch.empty(n, dtype=torch.float32)
        self.err = None if screen is w else torch.empty(n, dtype=torch.float32)
        rc = lib.quant_screen_prepare(base, w.data.data_ptr(), w.data.shape[1], n, k,
                                      None if screen is w else screen.data.data_ptr(), self.norm.data_ptr(),
                                      None if self.err is None else self.err.data_ptr(), quant._threads())
        if rc:
            raise RuntimeError(f"head screen: preparing it failed (code {rc})")
        self.keep = (w, screen)   # what the pointers below point into
        self.screen_bytes = 0 if screen is w else screen.data.numel()
        # NOTE: one row reading the Q8_0 head's own bytes is bound by reading them, as the head is: no gain (Gemma 3's
        # head, one thread, /tmp script: 7.3 against 7.7 ms); from two rows the head's int16 x costs twice the int8
        # dot products (16 rows: 33.6 against 18.6 ms). An F16 head's screen reads half its bytes: from one row.
        self.min_rows = 2 if screen is w else 1
        self.args = ScreenArgs(base=base, w=w.data.data_ptr(), row_bytes=w.data.shape[1], sw=screen.data.data_ptr(),
                               s_row_bytes=screen.data.shape[1], norm=self.norm.data_ptr(),
                               err=None if self.err is None else self.err.data_ptr(), n=n, k=k)
        self.fn = lib.quant_screen_argmax
        self.ids = torch.empty(MAX_ROWS, dtype=torch.long)

    @classmethod
    def build(cls, head: torch.nn.Module, setting: object = "auto") -> HeadScreen | None:
        """The screen of `head` where it takes one (see the module docstring), else None."""
        if setting in (False, "off", "false") or not isinstance(head, quant.QuantLinear) or head.int8:
            return None
        base = head.qweight.qtype - quant.R16_OFF
        if base not in (_Q8_0, _F16, _BF16) or head.bias is not None or not quant.r16_available():
            return None
        screen = cls(head)
        if screen.screen_bytes:
            log.info("greedy head screened at int8: a Q8_0 copy of the %s head, %.1f MB",
                     quant.type_name(base), screen.screen_bytes / 1e6)
        return screen

    def usable(self, rows: int, dtype: torch.dtype) -> bool:
        """Whether `rows` rows of `dtype` activations take the screen: few enough, and the head's own kernel is
        what would compute their logits."""
        return self.min_rows <= rows <= MAX_ROWS and rows <= quant.dense_from_tokens(dtype, self.qtype)

    def argmax(self, x: torch.Tensor) -> list[int]:
        """The first maximum of each row of head(x), x [rows, K] fp32 or bf16 (logits in x's dtype)."""
        if x.stride(-1) != 1:
            x = x.contiguous()
        rows, bf16 = x.shape[0], x.dtype is torch.bfloat16
        rc = self.fn(ctypes.addressof(self.args), x.data_ptr(), bf16, x.stride(0), rows, bf16, self.ids.data_ptr(),
                     torch.get_num_threads())
        if rc:
            raise RuntimeError(f"head screen failed (code {rc})")
        return self.ids[:rows].tolist()
