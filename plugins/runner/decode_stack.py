"""The lean stack's plain decode step over quantized weights as one C call for all layers (csrc/decode_stack.c).

lean.LeanStack.forward makes ~8 calls from Python per layer; at batch 1 on SmolLM2 (30 layers, hidden 576) their
interpreter time was ~1.5 ms of a ~7 ms token. When every linear of every layer is a quantized weight
(GGUF, --quantization) and the step is a plain decode step (plain_decode.DecodeAttention.prepare said yes), the whole
layer loop runs in C through pointers to the very functions those calls reach, in the same order: the same bits.

`runner.lean_decode_stack` in the plugin config: "auto" (default) or false (the per-layer Python loop).
"""
from __future__ import annotations

import ctypes
import os
from typing import TYPE_CHECKING, Any

import torch

from modelcall.core.native import INCLUDE, OnceLibrary
from modelcall.plugins.runner import cpu_kernel, fused_ops, quant

if TYPE_CHECKING:
    from modelcall.plugins.runner.lean import LeanStack

_p, _i64, _f, _int = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int


class QPart(ctypes.Structure):
    """csrc/decode_stack.c's qpart_t: one quantized weight writing columns [col, col + n) of an output."""

    _fields_ = [("w", _p), ("bias", _p), ("row_bytes", _i64), ("n", _i64), ("k", _i64), ("col", _i64), ("qt", _int),
                ("int8", _int)]


class StackLayer(ctypes.Structure):
    """csrc/decode_stack.c's stack_layer_t."""

    _fields_ = [("qkv", QPart * 3), ("gate_up", QPart * 2), ("o", QPart), ("down", QPart), ("n_qkv", _int),
                ("n_gate_up", _int), ("norm2", _p), ("next_norm", _p), ("post_attn", _p), ("post_ff", _p),
                ("attention", _p)]


class Stack(ctypes.Structure):
    """csrc/decode_stack.c's stack_t."""

    _fields_ = [("qmatmul", _p), ("qmatmul_int8", _p), ("attention", _p), ("add_rmsnorm", _p), ("act_mul", _p),
                ("attention_step", _p),
                ("layers", ctypes.POINTER(StackLayer)), ("n_layers", _i64), ("tokens", _i64), ("hidden", _i64),
                ("inter", _i64), ("qkv_width", _i64), ("attn_width", _i64), ("h", _p), ("x", _p), ("qkv", _p),
                ("attn", _p), ("tmp", _p), ("gu", _p), ("act", _p), ("eps", _f), ("bf16", _int), ("nthreads", _int)]


def _declare(lib: ctypes.CDLL) -> None:
    lib.decode_stack.argtypes = [_p]
    lib.decode_stack.restype = _int
    lib.decode_burst.argtypes = [_p, _p]
    lib.decode_burst.restype = _int
    lib.decode_first_max.argtypes = [_p, _i64, _int]
    lib.decode_first_max.restype = _i64


_LIB = OnceLibrary("decode_stack", declare=_declare, fallback="plain decode steps keep the per-layer loop",
                   sources=(os.path.join(os.path.dirname(__file__), "csrc", "decode_stack.c"),),
                   include_dirs=(INCLUDE,))

# A projection: the quantized linears whose outputs sit side by side, in column order
Parts = list[quant.QuantLinear]


def parts_of(linear: Any, modules: list[Any]) -> Parts | None:
    """The quantized linears behind one of lean's linears: the QuantLinear it is a bound method of (a fused same-type
    weight), else `modules` when all are QuantLinears without biases (each writes its own columns); None when not
    quantized that way."""
    owner = getattr(linear, "__self__", None)
    if isinstance(owner, quant.QuantLinear):
        return [owner]
    if all(isinstance(m, quant.QuantLinear) and m.bias is None for m in modules) and len(modules) > 1:
        return list(modules)
    return None


def part_of(q: quant.QuantLinear, col: int) -> QPart:
    qw = q.qweight
    n, k = qw.shape
    return QPart(w=qw.data.data_ptr(), bias=q.bias.data_ptr() if q.bias is not None else None,
                 row_bytes=qw.data.shape[1], n=n, k=k, col=col, qt=qw.qtype, int8=int(q.int8))


class DecodeStack:
    """The C arguments of one LeanStack's layers (fixed at build), and the per-step call."""

    def __init__(self, stack: LeanStack, projections: list[tuple[Parts, Parts, Parts, Parts]]) -> None:
        lib = _LIB.get()
        if lib is None or stack.plain is None:
            raise RuntimeError("the decode stack needs its library and the plain decode path")
        self.stack, self.fn = stack, lib.decode_stack
        self.keep = projections   # the linears whose weights and biases the pointers below point into
        n = len(stack.layers)
        self.layers = (StackLayer * n)()
        plain = stack.plain
        for i, (L, (qkv, o, gate_up, down)) in enumerate(zip(stack.layers, projections)):
            a = self.layers[i]
            col = 0
            for j, q in enumerate(qkv):
                a.qkv[j] = part_of(q, col)
                col += q.out_features
            col = 0
            for j, q in enumerate(gate_up):
                a.gate_up[j] = part_of(q, col)
                col += q.out_features
            a.n_qkv, a.n_gate_up = len(qkv), len(gate_up)
            a.o, a.down = part_of(o[0], 0), part_of(down[0], 0)
            pre_ff = getattr(L, "pre_ff", None)   # Gemma (lean_gemma.GemmaLayer): norm2 is the post-attention norm
            a.norm2 = (pre_ff if pre_ff is not None else L.norm2).data_ptr()
            if pre_ff is not None:
                a.post_attn, a.post_ff = L.norm2.data_ptr(), L.post_ff.data_ptr()
            a.next_norm = (stack.final_norm if i == n - 1 else stack.layers[i + 1].norm1).data_ptr()
            a.attention = plain.layer_addrs[i]
        hidden = stack.final_norm.shape[0]
        self.inter = sum(q.out_features for q in projections[0][2]) // 2
        self.args = Stack(
            qmatmul=ctypes.cast(quant.load().quant_qmatmul, _p).value,
            qmatmul_int8=ctypes.cast(quant.load().quant_qmatmul_int8, _p).value,
            attention=ctypes.cast(cpu_kernel.load().decode_layer_attention, _p).value,
            add_rmsnorm=ctypes.cast(fused_ops.load().add_rmsnorm, _p).value,
            act_mul=ctypes.cast(getattr(fused_ops.load(), stack.act_mul), _p).value,
            attention_step=plain.step_addr, layers=self.layers, n_layers=n, hidden=hidden, inter=self.inter,
            qkv_width=(stack.num_q + 2 * stack.num_kv) * stack.head_dim, attn_width=stack.num_q * stack.head_dim,
            eps=stack.eps)
        self.addr = ctypes.addressof(self.args)
        self.buffers: dict[torch.dtype, tuple[torch.Tensor, ...]] = {}
        self.qtypes = {q.qweight.qtype for four in projections for parts in four for q in parts}

    def max_tokens(self, dtype: torch.dtype) -> int:
        """The most rows a step may have to take this path: where every weight's kernel still beats its dequantized
        GEMM (quant.dense_from_tokens of each weight type), as QuantLinear chooses layer by layer."""
        return min(quant.dense_from_tokens(dtype, qt) for qt in self.qtypes)

    @classmethod
    def build(cls, stack: LeanStack, projections: list[tuple[Any, ...]] | None) -> DecodeStack | None:
        """The decode stack for `stack` when every layer's four projections are quantized weights (`projections`
        from parts_of, None anywhere: not taken) and the plain decode path and the library are there."""
        if stack.plain is None or projections is None or _LIB.get() is None:
            return None
        if quant.load() is None or cpu_kernel.load() is None or fused_ops.load() is None:
            return None   # the functions it calls live there (one may not have built: a timeout, no compiler)
        if any(p is None or len(p[1]) != 1 or len(p[3]) != 1 or not 1 <= len(p[0]) <= 3 or not 1 <= len(p[2]) <= 2
               for p in projections):
            return None
        return cls(stack, projections)

    def _buffers(self, tokens: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """Row views of one set of step buffers, grown (doubling) to the largest step seen."""
        a, have = self.args, self.buffers.get(dtype)
        if have is None or have[0].shape[0] < tokens:
            rows = max(tokens, 2 * have[0].shape[0] if have is not None else 1)
            have = self.buffers[dtype] = tuple(torch.empty(rows, width, dtype=dtype)
                                               for width in (a.qkv_width, a.hidden, 2 * a.inter, a.inter))
        return tuple(b[:tokens] for b in have)

    def bind(self, h: torch.Tensor, x: torch.Tensor) -> None:
        """Point the layers' arguments at a step of h's rows (DecodeAttention.prepare done for it)."""
        tokens = h.shape[0]
        qkv, tmp, gu, act = self._buffers(tokens, h.dtype)
        a = self.args
        a.tokens, a.h, a.x, a.qkv, a.tmp, a.gu, a.act = (tokens, h.data_ptr(), x.data_ptr(), qkv.data_ptr(),
                                                         tmp.data_ptr(), gu.data_ptr(), act.data_ptr())
        a.attn, a.bf16, a.nthreads = self.stack.plain.out_ptr, int(h.dtype == torch.bfloat16), torch.get_num_threads()

    def run(self, h: torch.Tensor, x: torch.Tensor) -> None:
        """All layers of a plain decode step (DecodeAttention.prepare done for it): `x` holds the first layer's
        normed input and ends as the final-normed rows; `h`, the residual stream, is updated in place."""
        self.bind(h, x)
        rc = self.fn(self.addr)
        if rc:
            raise RuntimeError(f"a quantized matmul of the decode stack failed (code {rc})")
