"""Pre-packed linear weights for CPU bf16: oneDNN's blocked layout made once at load instead of per call.

`F.linear` on bf16 CPU tensors reorders the weight into oneDNN's blocked layout on every call; at
decode sizes that reorder is a large share of the matmul (W1, batch 32: 22 -> 16 ms CPU for all
linears, identical results). Packing once costs nothing later.
"""
from __future__ import annotations

import logging

import torch

log = logging.getLogger("modelcall.runner")


class PackedLinear(torch.nn.Module):
    """Drop-in for an `nn.Linear` whose weight lives only in oneDNN's packed layout."""

    def __init__(self, linear: torch.nn.Linear, batch_hint: int) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), batch_hint)
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


def pack_linears(model: torch.nn.Module, batch_hint: int = 32) -> int:
    """Replace every bf16 CPU `nn.Linear` of `model` by a PackedLinear; returns how many (0 when
    oneDNN is unavailable or the packed result would differ)."""
    if not torch.backends.mkldnn.is_available():
        return 0
    try:  # one trial, checked against the plain op, before touching the model
        probe = torch.nn.Linear(64, 48, bias=True).to(torch.bfloat16)
        x = torch.randn(5, 64, dtype=torch.bfloat16)
        if not torch.equal(PackedLinear(probe, batch_hint)(x), probe(x)):
            return 0
    except Exception as e:  # an op missing from this build
        log.info("no packed bf16 linears (%s)", e)
        return 0
    targets = [(name, mod) for name, mod in model.named_modules()
               if type(mod) is torch.nn.Linear and mod.weight.dtype == torch.bfloat16 and mod.weight.device.type == "cpu"]
    for name, mod in targets:
        parent_name, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, attr, PackedLinear(mod, batch_hint))
    return len(targets)
