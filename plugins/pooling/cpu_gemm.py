"""The encoder's CPU matmuls: which dtype `auto` means on this CPU, and linear weights packed once into oneDNN's
blocked layout at load (an encoder's forward is ~80 % GEMMs; F.linear reorders the weight on every call).

NOTE: measured on all-MiniLM-L6-v2, one Zen 4 core, a 32 x 64-token batch: packed linears took the forward from
634 to 576 ms in bf16 (the same bits) and from 1152 to 965 ms in fp32 (within 6e-6: oneDNN sums in another
order than MKL); bf16 itself (AVX512_BF16 dot products) ran the GEMMs ~1.5x faster than fp32.
"""
from __future__ import annotations

import functools
import logging

import torch

log = logging.getLogger("modelcall.pooling")

ROWS_HINT = 2048   # the rows oneDNN packs a weight for: a step's ~2,048 tokens (max_num_batched_tokens' default)
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})   # CPU flags of bf16 dot-product instructions


@functools.cache
def native_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively (AVX512_BF16 or AMX), so bf16 GEMMs beat fp32 ones: what an
    encoder's dtype `auto` resolves by, as vLLM's CPU backend picks bf16 where the CPU supports it."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return not NATIVE_BF16_FLAGS.isdisjoint(line.split(":", 1)[1].split())
    except OSError:
        pass
    return False


def auto_dtype(device: torch.device) -> torch.dtype:
    """`auto`: bfloat16 on a CPU with native bf16 dot products, float32 elsewhere (a GPU keeps float32 too: the
    checkpoints served here are fp32, and the parity bar is fp32's)."""
    return torch.bfloat16 if device.type == "cpu" and native_bf16() else torch.float32


class OneDnnLinear(torch.nn.Module):
    """An `nn.Linear` whose weight is held only in oneDNN's packed layout."""

    def __init__(self, linear: torch.nn.Linear, rows_hint: int) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight_packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), rows_hint)
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.weight_packed, self.bias, "none", [], "")


def packing_agrees(dtype: torch.dtype, rows_hint: int = ROWS_HINT) -> bool:
    """Whether a oneDNN-packed linear in `dtype` agrees with F.linear on one probe (bf16: bit for bit; fp32: within
    its rounding) on this CPU and torch build."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:   # NOTE: the probe also finds a CPU whose oneDNN cannot pack this dtype (bf16 needs AVX-512): RuntimeError
        probe = torch.nn.Linear(64, 48).to(dtype)
        x = torch.randn(7, 64, generator=torch.Generator().manual_seed(0)).to(dtype)
        with torch.inference_mode():
            got, want = OneDnnLinear(probe, rows_hint)(x), probe(x)
        same = torch.equal(got, want) if dtype == torch.bfloat16 else torch.allclose(got, want, rtol=1e-4, atol=1e-5)
    except Exception as e:   # an op this torch build or CPU lacks
        log.info("encoder linears left unpacked (%s)", e)
        return False
    if not same:
        log.info("encoder linears left unpacked: the packed %s GEMM differs from F.linear", dtype)
    return bool(same)


def pack_cpu_linears(model: torch.nn.Module, rows_hint: int = ROWS_HINT) -> int:
    """Swap every CPU `nn.Linear` of `model` for a OneDnnLinear after one probe agrees with F.linear (bf16: bit for
    bit; fp32: within its rounding); returns how many were swapped (0: left as they are)."""
    linears = [(name, m) for name, m in model.named_modules()
               if type(m) is torch.nn.Linear and m.weight.device.type == "cpu"]
    if not linears or not packing_agrees(linears[0][1].weight.dtype, rows_hint):
        return 0
    with torch.inference_mode():
        for name, m in linears:
            parent, _, attr = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, attr, OneDnnLinear(m, rows_hint))
    return len(linears)
