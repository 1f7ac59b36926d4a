"""The encoder's attention and residual LayerNorm on packed rows, as one small C library called through ctypes
(csrc/encoder_ops.c, built by core.native like the runner's kernels).

    varlen_attention   softmax(Q K^T * scale) V of every sequence and head, from one QKV GEMM's rows
    add_layernorm      LayerNorm(x + res) * w + b (BERT's residual and norm, one pass instead of two ops), the
                       residual stream in fp32

NOTE: why C: at 64 tokens torch's SDPA on a padded [batch, heads, len, head_dim] batch ran ~4 GFLOP/s on one core
(12 % of an all-MiniLM-L6-v2 forward for ~2 % of its FLOPs), and it needs the padding packed rows avoid.
"""
from __future__ import annotations

import ctypes
import os

import torch

from modelcall.core.native import INCLUDE, OnceLibrary

_p, _i64, _f, _int = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int


def _declare(lib: ctypes.CDLL) -> None:
    lib.varlen_attention.argtypes = [_p, _i64, _p, _i64, _p, _i64, _i64, _i64, _f, _int, _int]
    lib.add_layernorm.argtypes = [_p, _i64, _p, _i64, _p, _i64, _p, _p, _p, _i64, _i64, _f, _int, _int]
    lib.varlen_attention.restype = lib.add_layernorm.restype = _int


_LIB = OnceLibrary("encoder_ops", declare=_declare, fallback="the encoder keeps transformers' modules",
                   sources=(os.path.join(os.path.dirname(__file__), "csrc", "encoder_ops.c"),),
                   include_dirs=(INCLUDE,))


def load() -> ctypes.CDLL | None:
    """The compiled library, or None where it cannot be built (the encoder runner then keeps transformers' modules)."""
    return _LIB.get()


def _lib() -> ctypes.CDLL:
    lib = _LIB.get()
    if lib is None:
        raise RuntimeError("the encoder_ops library could not be built (see the log); packed_bert.build returns None then")
    return lib


def _bf(t: torch.Tensor) -> int:
    if t.dtype == torch.bfloat16:
        return 1
    if t.dtype == torch.float32:
        return 0
    raise TypeError(f"encoder ops take bf16 or fp32, not {t.dtype}")


def _rows(t: torch.Tensor) -> None:
    if t.dim() != 2 or t.stride(1) != 1 or t.device.type != "cpu":
        raise ValueError(f"encoder ops take CPU [rows, n] tensors with unit column stride, not {tuple(t.shape)} "
                         f"strides {t.stride()} on {t.device}")


def varlen_attention(qkv: torch.Tensor, cu_seqlens: torch.Tensor, heads: int, scale: float) -> torch.Tensor:
    """[tokens, hidden]: each sequence's bidirectional attention per head. `qkv` is [tokens, 3 * hidden] (q | k | v
    columns); `cu_seqlens` the int64 row offsets of the sequences (num_seqs + 1 of them, from 0 to tokens)."""
    _rows(qkv)
    tokens, hidden = qkv.shape[0], qkv.shape[1] // 3
    if cu_seqlens.dtype != torch.int64 or int(cu_seqlens[-1]) != tokens or hidden % heads:
        raise ValueError(f"varlen_attention: cu_seqlens must be int64 ending at {tokens} rows and {heads} heads "
                         f"must divide {hidden} columns")
    cu = cu_seqlens.contiguous()
    out = torch.empty((tokens, hidden), dtype=qkv.dtype)
    if _lib().varlen_attention(qkv.data_ptr(), qkv.stride(0), out.data_ptr(), out.stride(0), cu.data_ptr(),
                                 cu.numel() - 1, heads, hidden // heads, scale, _bf(qkv), torch.get_num_threads()):
        raise MemoryError("varlen_attention: no memory for a sequence's keys and values")
    return out


def add_layernorm(x: torch.Tensor, res: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                  eps: float, *, in_place: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(LayerNorm(x + res) * weight + bias in x's dtype, the same in fp32): x [rows, n] in bf16 or fp32 (a GEMM's
    output), res [rows, n] fp32 (the residual stream), weight and bias fp32. The fp32 result is the next residual;
    the other the next GEMM's input (the same tensor when x is fp32). `in_place`: the fp32 result is written over
    `res` (contiguous; each row is read whole before it is written) and returned as it."""
    _rows(x)
    _rows(res)
    if x.shape != res.shape or res.dtype != torch.float32 or weight.dtype != torch.float32 or bias.dtype != torch.float32:
        raise ValueError("add_layernorm: res, weight and bias must be fp32 and x the shape of res")
    bf = _bf(x)
    # NOTE: in place saves a fresh [rows, n] fp32 tensor a call (its pages faulted in and zeroed by the kernel)
    res_out = res if in_place and res.is_contiguous() else torch.empty(x.shape, dtype=torch.float32)
    out = torch.empty_like(x) if bf else res_out
    w, b = weight.contiguous(), bias.contiguous()
    if _lib().add_layernorm(x.data_ptr(), x.stride(0), res.data_ptr(), res.stride(0), out.data_ptr(), out.stride(0),
                            res_out.data_ptr() if bf else None, w.data_ptr(), b.data_ptr(), x.shape[0], x.shape[1],
                            eps, bf, torch.get_num_threads()):
        raise MemoryError("add_layernorm: no memory for a row")
    return out, res_out
