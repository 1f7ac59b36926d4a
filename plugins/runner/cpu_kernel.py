"""Placeholder: the CPU paged-attention kernel (filled in below)."""
from __future__ import annotations

import torch


def usable(q_rows: torch.Tensor, kc: torch.Tensor) -> bool:
    return False


def paged_attention(q_rows, kc, vc, step, scale):  # pragma: no cover
    raise NotImplementedError
