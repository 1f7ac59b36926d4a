"""The lean stack's plain decode step: each layer's rope, K/V write and paged attention as one C call.

Between a layer's QKV GEMM and its O GEMM, attention.paged_attention makes three C calls (rope, write_kv,
paged_attention) and ~40 lines of Python deciding which path a layer takes (the step's variant, its KV group,
long chunks, a shared prefix...). For a step of decodes and short chunks over one KV group, with every layer
plain (no window, soft-cap or sinks), those answers are the same for every layer, so they are taken once per
step (`DecodeAttention.prepare`) and each layer is one call into csrc/attention_decode.c's `decode_layer_attention`,
which makes the same three calls in the same order (the same bits: tests/test_plain_decode.py).

NOTE: why one call matters more than the Python's own cost: measured on a Zen 3 core, right after a GEMM has
streamed its weights through the caches a ctypes call into libc took 8 us and a 16-value add_rmsnorm 15-46 us,
so every Python-level op between two GEMMs costs as if the interpreter ran cold.
"""
from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

import torch

from modelcall.plugins.runner import attention, cpu_kernel, fused_ops
from modelcall.plugins.runner.batch import StepBatch

if TYPE_CHECKING:
    from modelcall.plugins.runner.lean import LeanStack

_p, _i64, _f, _int = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int


class StepArgs(ctypes.Structure):
    """csrc/attention_decode.c's decode_step_t, field for field."""

    _fields_ = [("rope", _p), ("pos", _p), ("cos", _p), ("sin", _p), ("slot_mapping", _p), ("tok_seq", _p),
                ("tok_pos", _p), ("slots", _p), ("n", _i64), ("row_stride", _i64), ("nq", _i64), ("nkv", _i64),
                ("d", _i64), ("max_ctx", _i64), ("min_split", _i64), ("eps", _f), ("bf16", _int), ("kvt", _int),
                ("nthreads", _int)]


class LayerArgs(ctypes.Structure):
    """csrc/attention_decode.c's decode_layer_t."""

    _fields_ = [("kc", _p), ("vc", _p), ("q_norm", _p), ("k_norm", _p), ("scale", _f)]


def _ptr(t: torch.Tensor | None) -> int | None:
    return t.data_ptr() if t is not None else None


class DecodeAttention:
    """Per-step arguments of `decode_layer_attention` for one LeanStack, and the per-layer call."""

    def __init__(self, stack: LeanStack) -> None:
        self.stack = stack
        self.fn = cpu_kernel.load().decode_layer_attention
        rope = fused_ops.load().rope
        self.args = StepArgs(rope=ctypes.cast(rope, _p).value, nq=stack.num_q, nkv=stack.num_kv, d=stack.head_dim,
                             row_stride=(stack.num_q + 2 * stack.num_kv) * stack.head_dim, eps=stack.eps)
        self.step_addr = ctypes.addressof(self.args)
        self.layers = [LayerArgs(q_norm=_ptr(L.q_norm), k_norm=_ptr(L.k_norm), scale=L.scale) for L in stack.layers]
        self.layer_addrs = [ctypes.addressof(a) for a in self.layers]
        self.layer_ids = [L.attn.layer_idx for L in stack.layers]
        self.out = self.rows = torch.empty(0)
        self.out_ptr = 0

    def prepare(self, step: StepBatch, pos: torch.Tensor, tokens: int, dtype: torch.dtype) -> bool:
        """Whether `step` is one this path computes as attention.paged_attention would (then its arguments are
        set): every row a paged token of KV group 0, no long chunk, no shared prefix, the C kernel usable, no
        attention backend or load-time probe in the step."""
        if step.fresh or step.num_paged != tokens or not tokens or step.paged_slots is None:
            return False
        if not (step.slot_mapping.is_contiguous() and step.paged_slots.is_contiguous() and pos.is_contiguous()):
            return False
        scratch = step.scratch
        if (scratch.get("probe_windows") is not None or scratch.get("attention_backend") is not None
                or any(scratch.get("layer_group") or ()) or any(scratch.get("layer_windows") or ())):
            return False
        kv0, vc0 = step.kv[self.layer_ids[0]]
        if (kv0.device.type != "cpu" or kv0.dtype not in cpu_kernel.KV_TYPES
                or dtype not in (torch.float32, torch.bfloat16) or not (kv0.is_contiguous() and vc0.is_contiguous())
                or step.slot_mapping.dtype != torch.int64):
            return False
        if attention._long_chunks(step) or attention._shared_prefix(step, step.paged_slots, 0,
                                                                     self.stack.num_q // self.stack.num_kv):
            return False
        stack, a = self.stack, self.args
        if self.out.shape[0] < tokens or self.out.dtype != dtype:
            self.out = torch.empty(max(tokens, 2 * self.out.shape[0]), stack.num_q * stack.head_dim, dtype=dtype)
            self.out_ptr = self.out.data_ptr()
        self.rows = self.out[:tokens]
        for args, layer in zip(self.layers, self.layer_ids):
            kc, vc = step.kv[layer]
            args.kc, args.vc = kc.data_ptr(), vc.data_ptr()
        slots = step.paged_slots
        a.pos, a.cos, a.sin = pos.data_ptr(), stack.cos.data_ptr(), stack.sin.data_ptr()
        a.slot_mapping, a.tok_seq, a.tok_pos = (step.slot_mapping.data_ptr(), step.paged_token_seq.data_ptr(),
                                                step.paged_token_pos.data_ptr())
        a.slots, a.max_ctx, a.n = slots.data_ptr(), slots.shape[1], tokens
        a.min_split, a.nthreads = cpu_kernel.MIN_SPLIT, torch.get_num_threads()
        a.bf16, a.kvt = int(dtype == torch.bfloat16), cpu_kernel.KV_TYPES[kv0.dtype]
        return True

    def attend(self, i: int, qkv: torch.Tensor) -> torch.Tensor:
        """Layer i's rope, K/V write and attention on its QKV GEMM's rows ([tokens, (Hq + 2 Hkv) * D], contiguous:
        a GEMM's output): [tokens, Hq * D], in a buffer every layer reuses (the O GEMM reads it before the next)."""
        self.fn(self.step_addr, self.layer_addrs[i], qkv.data_ptr(), self.out_ptr)
        return self.rows
