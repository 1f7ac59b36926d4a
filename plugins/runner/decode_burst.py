"""A greedy decode burst in one C call on the quantized decode stack: no Python between its steps.

In a burst (core/burst.py) each step after the first is fed the tokens the last one chose. For rows that decode
greedily through the lean stack's one-call layers (decode_stack.py), a step is five C calls: the ids' rows of the
quantized token table, the first layer's norm, every layer, the lm_head and each row's first maximum (or, where the
runner has one, the head's int8 screen: head_screen.py, the same ids from a fraction of the logits); then each
position and K/V slot moves one further. `decode_burst` (csrc/decode_stack.c) runs every step of the burst, from the
inputs the runner's first decode batch holds. What the Python path spends around those calls, ~0.35 ms a step on
SmolLM2 at one thread (the step's tensors, the attention's arguments, the head's module call, the sampler), each piece
with an interpreter its weight stream has left cold, is spent once a burst instead.

The same bits as that path: the same functions on the same buffers in the same order, and the sampler's greedy
choice is the row's first maximum (a sampler says so with `greedy_argmax`; core.stages.Sampler). Taken only where
the Python path would run exactly those calls: the lean Llama-like stack (not Gemma's, whose embedding is scaled),
a quantized (or F16/BF16 GGUF) table and head with no logit scaling or soft-cap, every row greedy, no more rows than
the decode stack and the head keep their one-row kernels for, attention on one thread a row (MIN_SPLIT 0), and the
attention path `prepare` accepts. Otherwise the runner's Python steps go on (`run` returns None).
"""
from __future__ import annotations

import ctypes
from typing import Any

import torch

from modelcall.core import SchedulePlan
from modelcall.plugins.runner import cpu_kernel, quant
from modelcall.plugins.runner.batch import DecodeState, StepBatch
from modelcall.plugins.runner.decode_stack import _LIB, QPart, part_of
from modelcall.plugins.runner.gguf_weights import QuantEmbedding
from modelcall.plugins.runner.head_screen import HeadScreen
from modelcall.plugins.runner.lean import LeanStack

_p, _i64 = ctypes.c_void_p, ctypes.c_int64


class BurstArgs(ctypes.Structure):
    """csrc/decode_stack.c's burst_t."""

    _fields_ = [("stack", _p), ("dequant", _p), ("embed", QPart), ("head", QPart), ("norm1", _p), ("logits", _p),
                ("ids", _p), ("pos", _p), ("slot", _p), ("slots", _p), ("rows", _i64), ("slots_stride", _i64),
                ("steps", _i64), ("out", _p), ("ends", _p), ("screen", _p), ("screen_argmax", _p)]


class GreedyBurst:
    """The C burst of one runner's lean decode stack."""

    def __init__(self, stack: LeanStack, embed: QuantEmbedding, head: quant.QuantLinear,
                 screen: HeadScreen | None = None) -> None:
        self.stack, self.dtype = stack, embed.dtype
        table = embed.qweight
        lookup = QPart(w=table.data.data_ptr(), row_bytes=table.data.shape[1], n=table.shape[0], k=table.shape[1],
                       qt=table.qtype)
        dequant = ctypes.cast(quant.load().quant_dequantize_rows, _p).value
        self.args = BurstArgs(stack=stack.cstack.addr, dequant=dequant, embed=lookup, head=part_of(head, 0),
                              norm1=stack.layers[0].norm1.data_ptr())
        self.keep = (table, head)   # what the pointers above point into
        self.head_qtype = head.qweight.qtype
        self.screen = screen   # the head screened at int8 (head_screen.py), where the runner has one
        if screen is not None:
            self.args.screen_argmax = ctypes.cast(screen.fn, _p).value
        self.fn = _LIB.get().decode_burst
        self.rows: torch.Tensor | None = None   # [3, R] int64: ids | positions | slots, what the C side advances
        self.buffers: tuple[torch.Tensor, ...] = ()

    @classmethod
    def build(cls, runner: Any) -> GreedyBurst | None:
        """The burst path of `runner` (a TorchModelRunner) where its model takes it, else None."""
        stack = runner.lean
        if type(stack) is not LeanStack or stack.cstack is None or stack.plain is None or _LIB.get() is None:
            return None
        embed, head = getattr(runner.base, "embed_tokens", None), runner.lm_head
        if not isinstance(embed, QuantEmbedding) or embed.scale is not None or not isinstance(head, quant.QuantLinear):
            return None
        if runner.logit_mult is not None or runner.softcap:
            return None
        return cls(stack, embed, head, runner.head_screen)

    def usable(self, plan: SchedulePlan, sampler: Any) -> bool:
        """Whether the burst's later steps of `plan` may run here (its rows greedy, and few enough)."""
        rows, dtype = len(plan.chunks), self.dtype
        one_row_kernels = min(self.stack.cstack.max_tokens(dtype), quant.dense_from_tokens(dtype, self.head_qtype))
        return (getattr(sampler, "greedy_argmax", False) and all(c.request.params.greedy for c in plan.chunks)
                and rows <= one_row_kernels and (cpu_kernel.MIN_SPLIT == 0 or torch.get_num_threads() == 1))

    def run(self, state: DecodeState, tokens: list[int], first: list[int], steps: int, block_size: int, kv: list,
            windows: tuple[int, ...]) -> tuple[list[list[int]], list[float]] | None:
        """`steps` steps of the requests `state` holds (its last decode step's, in order), fed `tokens` at positions
        `first` (one each): each step's tokens and end time, `state` left as the Python steps would leave it. None
        (nothing run): not here."""
        reqs, rows = state.requests, len(tokens)
        if not reqs or len(reqs) != rows or state.slots is None:
            return None
        slots = []
        for s, req in enumerate(reqs):   # every slot the burst writes, filled in state.slots (and checked) now
            last = first[s] + steps - 1
            if last >= state.slots.shape[1] or state.slot_of(s, req.block_table, last, block_size) is None:
                return None
            slots.append(state.slot_of(s, req.block_table, first[s], block_size))
        stack = self.stack
        top = max(first) + steps
        if top > stack.cos.shape[0]:
            stack._rope_table(top)
        ids_pos_slot = self._rows(rows)
        ids_pos_slot.copy_(torch.tensor([tokens, first, slots], dtype=torch.long))
        step = StepBatch(input_ids=ids_pos_slot[0].view(1, rows), positions=ids_pos_slot[1].view(1, rows),
                         slot_mapping=ids_pos_slot[2], sample_rows=None, num_sampled=rows, num_paged=rows)
        step.paged_token_seq, step.paged_token_pos = state.seq, ids_pos_slot[1]
        step.paged_slots = state.slots   # every position's slot: row stride the capacity, read up to each position
        step.paged_ctx_lens, step.paged_q_lens = [p + 1 for p in first], [1] * rows
        step.kv = kv
        step.scratch["layer_windows"] = windows
        if not stack.plain.prepare(step, ids_pos_slot[1], rows, self.dtype):
            return None
        h, x, logits, out, ends = self._buffers(rows, steps)
        stack.cstack.bind(h, x)
        a = self.args
        a.logits, a.ids, a.pos, a.slot = (logits.data_ptr(), ids_pos_slot[0].data_ptr(), ids_pos_slot[1].data_ptr(),
                                          ids_pos_slot[2].data_ptr())
        a.slots, a.rows, a.slots_stride, a.steps = state.slots.data_ptr(), rows, state.slots.shape[1], steps
        a.out, a.ends = out.data_ptr(), ends.data_ptr()
        screen = self.screen
        a.screen = ctypes.addressof(screen.args) if screen is not None and screen.usable(rows, self.dtype) else None
        done = ctypes.c_int64(0)
        rc = self.fn(ctypes.addressof(a), ctypes.byref(done))
        if rc:
            raise RuntimeError(f"a decode burst's step failed (code {rc}) after {done.value} steps")
        state.computed = [p - 1 for p in ids_pos_slot[1].tolist()]   # the last step's positions, as decode_step keeps
        return out[:done.value].tolist(), ends[:done.value].tolist()

    def _rows(self, rows: int) -> torch.Tensor:
        if self.rows is None or self.rows.shape[1] != rows:
            self.rows = torch.empty(3, rows, dtype=torch.long)
        return self.rows

    def _buffers(self, rows: int, steps: int) -> tuple[torch.Tensor, ...]:
        """h and x ([rows, hidden]), logits ([rows, vocab]), the tokens ([steps, rows]) and the step ends, kept."""
        have = self.buffers
        if not have or have[0].shape[0] != rows or have[3].shape[0] < steps:
            hidden, vocab = self.args.embed.k, self.args.head.n
            dt = self.dtype
            most = max(steps, 8)
            have = self.buffers = (torch.empty(rows, hidden, dtype=dt), torch.empty(rows, hidden, dtype=dt),
                                   torch.empty(rows, vocab, dtype=dt), torch.empty(most, rows, dtype=torch.long),
                                   torch.empty(most, dtype=torch.float64))
        return have
