"""Quantized and 16-bit float weights in their r16 layouts for decode (csrc/quant_r16.c, quant_r16k.c, quant_r16f.c),
and int8 activations on request.

A decode step at batch 1 reads every weight once and multiplies it by one activation row. The plain layouts' kernels
widen each weight to fp32 (exact, but compute-bound at 5-8 GB/s on one Zen 4 core). The r16 layouts (16 rows
interleaved: the same information in another order, Q4_K 3% larger) let integer dot products sum 16 rows at once:
the activation row is quantized per 32 values to int16 (an error of |x| / 65534: results within ~3e-5 of the fp32
path's, so greedy output keeps to transformers' reference) or, with `int8_activations`, to int8 as llama.cpp does
(faster still, and llama.cpp's numerics: top-1 agreement with the fp32 reference fell to 97% on SmolLM2). With fp32
activations prefill chunks of any size stay on the integer kernels too (quant.dense_from_tokens: they beat the dequantized
fp32 GEMM at every size measured); with bf16 ones, chunks of more than 16 rows take the dequantized bf16 GEMM.

F16 and BF16 weights (an F16 GGUF) take the float r16 layout: no integer products, but 16 rows' weights in one vector
times a broadcast activation, one sequential stream and no horizontal sum per row (csrc/quant_r16f.c); prefill
chunks of more than 16 rows dequantize them for the GEMM, as before.

Runner plugin config: `repack` "auto" (default: where the CPU has the kernels: AVX-512 with VNNI) or false (the plain
layouts); `int8_activations` false (default) or true.
"""
from __future__ import annotations

import logging
from typing import Any

import torch

from modelcall.plugins.runner import heap, quant

log = logging.getLogger("modelcall.runner")


def enabled(setting: Any) -> bool:
    """Whether a runner setting says on ("auto" and true alike)."""
    return setting not in (False, None, "off", "false", "no")


def repack_model(model: torch.nn.Module) -> int:
    """Give every quantized linear and embedding of `model` whose format has an r16 layout its weight in that layout
    (a weight shared by a tied embedding and lm_head stays shared); returns the number of weights moved. Expert weights
    (gguf_experts) keep their plain layout."""
    if not quant.r16_available():
        return 0
    done: dict[int, quant.QWeight | None] = {}   # id of a plain weight -> its r16 form (None: it has none)
    for name, mod in model.named_modules():
        qw = getattr(mod, "qweight", None)
        if not isinstance(qw, quant.QWeight) or ".experts." in f".{name}.":
            continue
        if id(qw) not in done:
            done[id(qw)] = quant.repack_r16(qw)
        if done[id(qw)] is not None:
            mod.qweight = done[id(qw)]
    moved = sum(r is not None for r in done.values())
    if moved:
        heap.release_free_memory()   # the replaced weights' blocks, kept by heap.keep_freed_memory's thresholds
        log.info("%d quantized weights in their r16 layout for decode", moved)
    return moved


def use_int8_activations(model: torch.nn.Module) -> None:
    """Every quantized linear of `model` quantizes its activations to int8 when it reads few rows (QuantLinear.int8:
    the r16 kernels' and the plain layouts' int8 paths alike)."""
    for mod in model.modules():
        if isinstance(mod, quant.QuantLinear):
            mod.int8 = True
