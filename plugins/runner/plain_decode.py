"""The lean stack's plain decode step: each layer's rope, K/V write and paged attention as one C call.

Between a layer's QKV GEMM and its O GEMM, attention.paged_attention makes three C calls (rope, write_kv,
paged_attention) and ~40 lines of Python deciding which path a layer takes (the step's variant, its KV group,
long chunks, a shared prefix...). For a step of decodes and short chunks, with every layer plain (no soft-cap
or sinks), those answers are the same for every layer of a KV group, so they are taken once per
step (`DecodeAttention.prepare`) and each layer is one call into csrc/attention_decode.c's `decode_layer_attention`,
which makes the same three calls in the same order (the same bits: tests/test_plain_decode.py). Sliding-window
layers and several KV groups too: each layer carries its group's slot mapping and tables, its window and its
rotary table (Gemma 3's local and global ones).

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

    _fields_ = [("rope", _p), ("pos", _p), ("tok_seq", _p), ("tok_pos", _p), ("n", _i64), ("row_stride", _i64),
                ("nq", _i64), ("nkv", _i64), ("d", _i64), ("min_split", _i64), ("eps", _f), ("bf16", _int),
                ("kvt", _int), ("nthreads", _int)]


class LayerArgs(ctypes.Structure):
    """csrc/attention_decode.c's decode_layer_t."""

    _fields_ = [("kc", _p), ("vc", _p), ("q_norm", _p), ("k_norm", _p), ("slot_mapping", _p), ("slots", _p),
                ("cos", _p), ("sin", _p), ("max_ctx", _i64), ("window", _i64), ("scale", _f)]


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
        self.layers = [LayerArgs(q_norm=_ptr(L.q_norm), k_norm=_ptr(L.k_norm), window=L.window or 0, scale=L.scale)
                       for L in stack.layers]
        self.layer_addrs = [ctypes.addressof(a) for a in self.layers]
        self.layer_ids = [L.attn.layer_idx for L in stack.layers]
        self.windowed = [bool(L.window) for L in stack.layers]
        self.out = self.rows = torch.empty(0)
        self.out_ptr = 0
        self._fixed: tuple = ()   # what the layers' cache and rotary pointers were last set from (prepare)
        self._windows_ok: object = None   # the declared layer windows last found to match the layers'

    def prepare(self, step: StepBatch, pos: torch.Tensor, tokens: int, dtype: torch.dtype) -> bool:
        """Whether `step` is one this path computes as attention.paged_attention would (then its arguments are
        set): every row a paged token, the C kernel usable, no attention backend or load-time probe in the step,
        and for each KV group whose layers attend to the whole context (no window) no long chunk and no shared
        prefix (paged_attention splits those; a windowed layer's attention is the kernel's in any case)."""
        if step.fresh or step.num_paged != tokens or not tokens or step.paged_slots is None:
            return False
        if not (step.slot_mapping.is_contiguous() and step.paged_slots.is_contiguous() and pos.is_contiguous()):
            return False
        scratch = step.scratch
        if scratch.get("probe_windows") is not None or scratch.get("attention_backend") is not None:
            return False
        declared = scratch.get("layer_windows")
        if declared and declared is not self._windows_ok:
            if any((declared[i] or 0) != a.window for i, a in zip(self.layer_ids, self.layers)):
                return False   # paged_attention refuses such a step: let it say so
            self._windows_ok = declared   # the runner's spec: the same list every step
        kv0, vc0 = step.kv[self.layer_ids[0]]
        if (kv0.device.type != "cpu" or kv0.dtype not in cpu_kernel.KV_TYPES
                or dtype not in (torch.float32, torch.bfloat16) or not (kv0.is_contiguous() and vc0.is_contiguous())
                or step.slot_mapping.dtype != torch.int64):
            return False
        groups = scratch.get("layer_group") or [0] * (max(self.layer_ids) + 1)
        stack = self.stack
        per_group: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        full_checked: set[int] = set()   # groups whose whole-context layers were checked (the same answer for each)
        for layer, windowed in zip(self.layer_ids, self.windowed):
            g = groups[layer]
            if g not in per_group:
                mapping = step.slot_mapping if g == 0 else step.group_slot_mapping[g - 1]
                slots = step.paged_slots if g == 0 else step.group_paged_slots[g - 1]
                if not (mapping.is_contiguous() and slots.is_contiguous() and mapping.dtype == torch.int64):
                    return False
                per_group[g] = (mapping, slots)
            if not windowed and g not in full_checked:
                if attention._long_chunks(step) or attention._shared_prefix(
                        step, per_group[g][1], g, stack.num_q // stack.num_kv):
                    return False
                full_checked.add(g)
        a = self.args
        if self.out.shape[0] < tokens or self.out.dtype != dtype:
            self.out = torch.empty(max(tokens, 2 * self.out.shape[0]), stack.num_q * stack.head_dim, dtype=dtype)
            self.out_ptr = self.out.data_ptr()
        self.rows = self.out[:tokens]
        # NOTE: the caches and rotary tables change only when the cache is new or a table grows; the slot tables
        # every step. Writing only those (once-computed per group) took prepare from ~0.12 to ~0.05 ms a step
        # (30 layers; SmolLM2's whole token is 5-8 ms on one thread). The first and last layers' tables stand for
        # all: a stack rebuilds every table kind at once when positions outgrow them (lean.py, lean_gemma.py), each
        # new tensor allocated while the old one is alive, so its address differs
        tables = [stack.rope_table(i)[0] for i in (0, len(self.layers) - 1)]
        fixed = (id(step.kv), step.kv[self.layer_ids[0]][0].data_ptr(), tuple(t.data_ptr() for t in tables))
        if fixed != self._fixed:
            self._fixed = fixed
            for i, (args, layer) in enumerate(zip(self.layers, self.layer_ids)):
                kc, vc = step.kv[layer]
                cos, sin = stack.rope_table(i)
                args.kc, args.vc, args.cos, args.sin = kc.data_ptr(), vc.data_ptr(), cos.data_ptr(), sin.data_ptr()
        ptrs = {g: (m.data_ptr(), t.data_ptr(), t.shape[1]) for g, (m, t) in per_group.items()}
        for args, layer in zip(self.layers, self.layer_ids):
            args.slot_mapping, args.slots, args.max_ctx = ptrs[groups[layer]]
        a.pos = pos.data_ptr()
        a.tok_seq, a.tok_pos = step.paged_token_seq.data_ptr(), step.paged_token_pos.data_ptr()
        a.n, a.min_split, a.nthreads = tokens, cpu_kernel.MIN_SPLIT, torch.get_num_threads()
        a.bf16, a.kvt = int(dtype == torch.bfloat16), cpu_kernel.KV_TYPES[kv0.dtype]
        return True

    def attend(self, i: int, qkv: torch.Tensor) -> torch.Tensor:
        """Layer i's rope, K/V write and attention on its QKV GEMM's rows ([tokens, (Hq + 2 Hkv) * D], contiguous:
        a GEMM's output): [tokens, Hq * D], in a buffer every layer reuses (the O GEMM reads it before the next)."""
        self.fn(self.step_addr, self.layer_addrs[i], qkv.data_ptr(), self.out_ptr)
        return self.rows
