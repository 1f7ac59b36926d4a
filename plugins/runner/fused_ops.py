"""Fused elementwise ops of a Llama-like decoder layer on CPU, as one small C library called through ctypes.

Each replaces a run of small torch ops (one dispatch and one pass over memory each) by one call and one pass:

    add_rmsnorm   h += x; out = w * norm(h)        HF: residual add, then RMSNorm's 7 ops (fp32 round trip)
    rope          q, k of the packed QKV rows       HF: per layer 2 x (mul, slice, neg, cat, mul, add), + q/k norm
                  rotated in place from a cos/sin
                  table row per token position
    silu_mul      out = silu(gate) * up             HF: silu, mul
    gelu_tanh_mul out = gelu_tanh(gate) * up        HF (Gemma): gelu_pytorch_tanh, mul

The arithmetic is transformers': fp32 math, rounded to the activation dtype wherever the HF module rounds
(bf16: after the residual add, the normalized value before the weight, each rotary product and their sum,
silu before the product), so bf16 results equal HF's bit for bit except where a sum's order differs (the
RMSNorm variance). Rows run in parallel only when large (prefill): at decode sizes a parallel region's
wake-up costs more than the work.
"""
from __future__ import annotations

import ctypes
import os

import torch

from modelcall.core.native import INCLUDE, OnceLibrary


_p, _i64, _f, _int = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int


def _declare(lib: ctypes.CDLL) -> None:
    lib.add_rmsnorm.argtypes = [_p, _i64, _p, _i64, _p, _i64, _p, _i64, _i64, _f, _int, _int]
    lib.rope.argtypes = [_p, _i64, _i64, _i64, _i64, _i64, _p, _p, _p, _p, _p, _f, _int, _int]
    lib.silu_mul.argtypes = [_p, _i64, _p, _i64, _p, _i64, _i64, _i64, _int, _int]
    lib.gelu_tanh_mul.argtypes = [_p, _i64, _p, _i64, _p, _i64, _i64, _i64, _int, _int]
    for fn in (lib.add_rmsnorm, lib.rope, lib.silu_mul, lib.gelu_tanh_mul):
        fn.restype = None


# NOTE: -lmvec: with -ffast-math gcc turns silu's expf loop into calls of glibc's vector expf
_LIB = OnceLibrary("fused_ops", declare=_declare, fallback="the runner keeps transformers' modules",
                   libs=("-lm", "-lmvec"), sources=(os.path.join(os.path.dirname(__file__), "csrc", "fused_ops.c"),),
                   include_dirs=(INCLUDE,))


def load() -> ctypes.CDLL | None:
    """The compiled library, or None where it cannot be built (the runner then keeps transformers' modules)."""
    return _LIB.get()


def _bf(t: torch.Tensor) -> int:
    if t.dtype == torch.bfloat16:
        return 1
    if t.dtype == torch.float32:
        return 0
    raise TypeError(f"fused ops take bf16 or fp32, not {t.dtype}")


def add_rmsnorm(x: torch.Tensor | None, res: torch.Tensor, out: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    """res += x (rounded, when x is given), then out = weight * rmsnorm(res): [rows, n] with unit column stride."""
    rows, n = res.shape
    _LIB.lib.add_rmsnorm(x.data_ptr() if x is not None else None, x.stride(0) if x is not None else 0, res.data_ptr(),
                     res.stride(0), out.data_ptr(), out.stride(0), weight.data_ptr(), rows, n, eps, _bf(res),
                     torch.get_num_threads())


def rope(qkv: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_q: int, num_k: int,
         head_dim: int, q_norm: torch.Tensor | None = None, k_norm: torch.Tensor | None = None, eps: float = 0.0) -> None:
    """Rotate the first num_q + num_k heads of each `qkv` row in place by its position's row of cos/sin
    ([positions, head_dim], the dtype of qkv), after an optional per-head RMSNorm (weights [head_dim])."""
    _LIB.lib.rope(qkv.data_ptr(), qkv.shape[0], qkv.stride(0), num_q, num_k, head_dim, positions.data_ptr(),
              cos.data_ptr(), sin.data_ptr(), q_norm.data_ptr() if q_norm is not None else None,
              k_norm.data_ptr() if k_norm is not None else None, eps, _bf(qkv), torch.get_num_threads())


def silu_mul(gate: torch.Tensor, up: torch.Tensor, out: torch.Tensor) -> None:
    """out = silu(gate) * up, [rows, n] each (row strides free: gate and up may be slices of one GEMM result)."""
    rows, n = gate.shape
    _LIB.lib.silu_mul(gate.data_ptr(), gate.stride(0), up.data_ptr(), up.stride(0), out.data_ptr(), out.stride(0),
                  rows, n, _bf(gate), torch.get_num_threads())


def gelu_tanh_mul(gate: torch.Tensor, up: torch.Tensor, out: torch.Tensor) -> None:
    """out = gelu(gate, approximate="tanh") * up, [rows, n] each (row strides free), as Gemma's MLP computes it."""
    rows, n = gate.shape
    _LIB.lib.gelu_tanh_mul(gate.data_ptr(), gate.stride(0), up.data_ptr(), up.stride(0), out.data_ptr(), out.stride(0),
                       rows, n, _bf(gate), torch.get_num_threads())
