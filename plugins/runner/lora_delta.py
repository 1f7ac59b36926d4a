"""The LoRA delta of one step: rows of the batch grouped by adapter, each group's shrink then expand.

One step mixes rows of several adapters and of the base model. Each request's rows are contiguous in the flat
batch (batch.py), so an adapter's rows are a few runs of rows; per projection and adapter (punica's SGMV, in torch):

    rows of adapter a:  x_a = x[rows_a]                         (a slice when they are one run)
    shrink:             s   = x_a @ A_a^T          [n_a, r]     (q, k, v share x: their A's stacked, one GEMM)
    expand:             d   = s @ B_a^T            [n_a, out]   (B block-diagonal over the stacked parts, scale in it)
    add:                y[rows_a] += d                          (index_add_ when the rows are not one run)

Rows of the base model are not touched; no weight is ever merged, and the adapters' rows of one step share one
base GEMM. `LoraContext` holds the step's groups while its forward runs (set and cleared by the runner, read by
the wrapped projections: `wrap_linear` for a callable of the lean stack, `LoraModule` for a transformers module).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from modelcall.plugins.runner.lora_weights import LoraWeights

Rows = slice | torch.Tensor   # one run of rows, or their indices


@dataclass(slots=True)
class GroupWeights:
    """One adapter's projections that read the same input, stacked: A [sum r, in]^T and block-diagonal B^T."""

    a_t: torch.Tensor     # [in, sum r]
    b_t: torch.Tensor     # [sum r, out of the group]


class LoraContext:
    """The adapters of the step being computed: [(weights, rows)], empty when no row runs on an adapter."""

    __slots__ = ("groups",)

    def __init__(self) -> None:
        self.groups: list[tuple[LoraWeights, Rows]] = []


def step_groups(chunks: list[Any], last_rows: list[int] | None, weights_of: Callable[[Any], LoraWeights]
                ) -> list[tuple[LoraWeights, Rows]]:
    """The step's rows per adapter, from the plan's chunks and each chunk's last flat row (None: chunk i is row i,
    a decode step). A fork (no rows of its own) samples from its parent's rows, computed on the same adapter."""
    runs: dict[str, tuple[Any, list[tuple[int, int]]]] = {}
    for i, c in enumerate(chunks):
        ref = c.request.lora
        if ref is None or c.fork_of is not None or c.num_new_tokens == 0:
            continue
        last = i if last_rows is None else last_rows[i]
        first = last - c.num_new_tokens + 1
        entry = runs.get(ref.key)
        if entry is None:
            runs[ref.key] = entry = (ref, [])
        spans = entry[1]
        if spans and spans[-1][1] == first:   # adjacent to the last run: one longer run
            spans[-1] = (spans[-1][0], last + 1)
        else:
            spans.append((first, last + 1))
    out: list[tuple[LoraWeights, Rows]] = []
    for ref, spans in runs.values():
        if len(spans) == 1:
            rows: Rows = slice(spans[0][0], spans[0][1])
        else:
            rows = torch.cat([torch.arange(a, b) for a, b in spans])
        out.append((weights_of(ref), rows))
    return out


def group_weights(w: LoraWeights, layer: int, projs: tuple[str, ...], widths: tuple[int, ...]) -> GroupWeights | None:
    """`w`'s projections `projs` of `layer` (output widths `widths`, in the order the base GEMM writes them) as one
    stacked shrink and one block-diagonal expand; None when the adapter targets none of them. Cached on `w`."""
    key = (layer, projs)
    if key in w.groups:
        return w.groups[key]   # type: ignore[return-value]
    parts = [(j, w.pairs[(layer, p)]) for j, p in enumerate(projs) if (layer, p) in w.pairs]
    g = None
    if parts:
        a_cat = torch.cat([a for _, (a, _) in parts])
        ref = parts[0][1][1]
        b_t = ref.new_zeros(a_cat.shape[0], sum(widths))
        r0 = 0
        for j, (a, b) in parts:
            c0 = sum(widths[:j])
            b_t[r0:r0 + a.shape[0], c0:c0 + widths[j]] = b.t()
            r0 += a.shape[0]
        g = GroupWeights(a_cat.t().contiguous(), b_t)
    w.groups[key] = g
    return g


def add_delta(ctx: LoraContext, layer: int, projs: tuple[str, ...], widths: tuple[int, ...], x: torch.Tensor,
              y: torch.Tensor) -> None:
    """y[rows of a] += x[rows of a]'s delta of every adapter of the step (x [T, in], y [T, sum widths])."""
    for w, rows in ctx.groups:
        g = group_weights(w, layer, projs, widths)
        if g is None:
            continue
        if isinstance(rows, slice):
            y[rows].addmm_(x[rows] @ g.a_t, g.b_t)   # a run of rows: in place, no gather or scatter
        else:
            y.index_add_(0, rows, (x.index_select(0, rows) @ g.a_t) @ g.b_t)


def wrap_linear(fn: Callable[[torch.Tensor], torch.Tensor], ctx: LoraContext, layer: int, projs: tuple[str, ...],
                widths: tuple[int, ...]) -> Callable[[torch.Tensor], torch.Tensor]:
    """A lean-stack projection (x [T, in] -> [T, out]) that adds the step's adapter deltas to its output."""
    def run(x: torch.Tensor) -> torch.Tensor:
        y = fn(x)
        if ctx.groups:
            add_delta(ctx, layer, projs, widths, x, y)
        return y
    return run


def wrap_residual(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], ctx: LoraContext, layer: int,
                  proj: str, width: int) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """A lean-stack GEMM with the residual add in it ((a, h) -> h + W a): the delta of `a` added to its result."""
    def run(a: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        y = fn(a, h)
        if ctx.groups:
            add_delta(ctx, layer, (proj,), (width,), a, y)
        return y
    return run


class LoraModule(torch.nn.Module):
    """A transformers projection module with the step's adapter deltas added to its output."""

    def __init__(self, base: torch.nn.Module, ctx: LoraContext, layer: int, proj: str) -> None:
        super().__init__()
        self.base = base
        self.ctx = ctx
        self.layer, self.proj = layer, proj
        self.in_features, self.out_features = base.in_features, base.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        if self.ctx.groups:
            add_delta(self.ctx, self.layer, (self.proj,), (self.out_features,), x.reshape(-1, self.in_features),
                      y.view(-1, self.out_features))
        return y
