"""The LoRA delta of one step: rows of the batch grouped by adapter, each group's shrink then expand.

One step mixes rows of several adapters and of the base model. Each request's rows are contiguous in the flat
batch (batch.py), so an adapter's rows are a few runs of rows; per projection and adapter (punica's SGMV, in torch):

    rows of adapter a:  x_a = x[rows_a]                         (a slice when they are one run)
    shrink:             s   = x_a @ A_a^T          [n_a, r]     (q, k, v share x: their A's stacked, one GEMM)
    expand:             d   = s @ B_a^T            [n_a, out]   (B block-diagonal over the stacked parts, scale in it)
    add:                y[rows_a] += d                          (index_add_ when the rows are not one run)

When the step's adapters have about as many rows each (decode steps), the adapters are done at once instead
(`Batched`): their rows gathered adapter by adapter into [adapters, m, in] (short ones padded, the pads' deltas
masked to 0), one batched shrink and one batched expand over the adapters' stacked A and B (ranks padded with
zeros), one index_add_: 4-5 torch ops per projection group instead of 4 per adapter.

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


@dataclass(slots=True)
class Batched:
    """A step's adapter rows laid out for batched matmuls: `perm` [adapters * m] the rows of adapter 0, then 1, ...,
    each padded to m with row 0; `mask` [adapters * m, 1] 0 at the pads (None: no pads); `keys` the adapters'."""

    perm: torch.Tensor
    m: int
    keys: tuple[str, ...]
    pads: torch.Tensor | None    # bool [adapters * m, 1]: True at pads
    masks: dict | None = None    # dtype -> mask tensor, built on first use

    def mask(self, dtype: torch.dtype) -> torch.Tensor | None:
        if self.pads is None:
            return None
        if self.masks is None:
            self.masks = {}
        got = self.masks.get(dtype)
        if got is None:
            got = self.masks[dtype] = (~self.pads).to(dtype)
        return got


class LoraContext:
    """The adapters of the step being computed: [(weights, rows)], empty when no row runs on an adapter; `batched`
    when they are done at once (see the module docstring), with the stacked weights of recent adapter sets."""

    __slots__ = ("groups", "batched", "stacks", "_slots")

    def __init__(self) -> None:
        self.groups: list[tuple[LoraWeights, Rows]] = []
        self.batched: Batched | None = None
        self._slots: torch.Tensor | None = None   # row -> index in `groups` (-1: base model), built on first use
        # adapter keys -> {(layer, projs): (A [n, in, R], B [n, R, out]) or None}; the last few sets kept
        self.stacks: dict[tuple[str, ...], dict] = {}

    def set(self, groups: list[tuple[LoraWeights, Rows]], keys: list[str], device: torch.device | None = None) -> None:
        """The step's groups; `device` the activations' (row indices are built on the CPU: moved there once, since
        index_select and index_add_ take their index on the tensor's device)."""
        if len(groups) > 1:   # NOTE: in key order, so one set of adapters is one stack whatever the plan's order
            order = sorted(range(len(keys)), key=keys.__getitem__)
            groups, keys = [groups[i] for i in order], [keys[i] for i in order]
        batched = batch_rows(groups, keys) if len(groups) > 1 else None
        if device is not None and device.type != "cpu":
            groups = [(w, r if isinstance(r, slice) else r.to(device)) for w, r in groups]
            if batched is not None:
                batched.perm = batched.perm.to(device)
                batched.pads = batched.pads.to(device) if batched.pads is not None else None
        self.groups = groups
        self.batched = batched
        self._slots = None

    def clear(self) -> None:
        self.groups = []
        self.batched = None
        self._slots = None

    def row_slots(self, num_rows: int, device: torch.device) -> torch.Tensor:
        """Each of the step's `num_rows` flat rows: the index of its adapter in `groups`, -1 for the base model
        (for the MoE experts, whose rows per expert come from the router, not from the plan)."""
        if self._slots is None or self._slots.shape[0] != num_rows:
            slots = torch.full((num_rows,), -1, dtype=torch.long, device=device)
            for k, (_, rows) in enumerate(self.groups):
                slots[rows] = k
            self._slots = slots
        return self._slots


def batch_rows(groups: list[tuple[LoraWeights, Rows]], keys: list[str]) -> Batched | None:
    """The batched layout of `groups`, or None when padding to the longest adapter would cost more than half again
    the rows (a prefill chunk beside decodes: the per-adapter loop is cheaper then)."""
    rows = [torch.arange(r.start, r.stop) if isinstance(r, slice) else r for _, r in groups]
    counts = [len(r) for r in rows]
    m, total = max(counts), sum(counts)
    if m * len(rows) > total + total // 2 + len(rows):
        return None
    perm = torch.zeros(len(rows), m, dtype=torch.long)
    pads = torch.ones(len(rows), m, dtype=torch.bool)
    for k, r in enumerate(rows):
        perm[k, :len(r)] = r
        pads[k, :len(r)] = False
    return Batched(perm.view(-1), m, tuple(keys), pads.view(-1, 1) if m * len(rows) != total else None)


def step_groups(chunks: list[Any], last_rows: list[int] | None, weights_of: Callable[[Any], LoraWeights],
                keys: list[str] | None = None) -> list[tuple[LoraWeights, Rows]]:
    """The step's rows per adapter, from the plan's chunks and each chunk's last flat row (None: chunk i is row i,
    a decode step); `keys` gets the adapters' load keys in the same order. A fork (no rows of its own) samples from
    its parent's rows, computed on the same adapter."""
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
        if keys is not None:
            keys.append(ref.key)
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


def stacked(ctx: LoraContext, layer: int, projs: tuple[str, ...], widths: tuple[int, ...]
            ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The step's adapters' group weights stacked for batched matmuls (A [n, in, R], B [n, R, out], ranks padded
    with zeros, an adapter without these projections all zeros); None when none of them has any. Cached per adapter
    set (the last 4 sets)."""
    b = ctx.batched
    assert b is not None
    cache = ctx.stacks.get(b.keys)
    if cache is None:
        if len(ctx.stacks) >= 4:
            ctx.stacks.pop(next(iter(ctx.stacks)))
        cache = ctx.stacks[b.keys] = {}
    key = (layer, projs)
    if key in cache:
        return cache[key]
    gs = [group_weights(w, layer, projs, widths) for w, _ in ctx.groups]
    found = [g for g in gs if g is not None]
    out = None
    if found:
        r = max(g.a_t.shape[1] for g in found)
        like = found[0].a_t
        a = like.new_zeros(len(gs), like.shape[0], r)
        bt = like.new_zeros(len(gs), r, sum(widths))
        for k, g in enumerate(gs):
            if g is not None:
                a[k, :, :g.a_t.shape[1]] = g.a_t
                bt[k, :g.b_t.shape[0]] = g.b_t
        out = (a, bt)
    cache[key] = out
    return out


def add_delta(ctx: LoraContext, layer: int, projs: tuple[str, ...], widths: tuple[int, ...], x: torch.Tensor,
              y: torch.Tensor) -> None:
    """y[rows of a] += x[rows of a]'s delta of every adapter of the step (x [T, in], y [T, sum widths])."""
    b = ctx.batched
    if b is not None:
        ab = stacked(ctx, layer, projs, widths)
        if ab is not None:
            xs = x.index_select(0, b.perm).view(len(ctx.groups), b.m, x.shape[1])
            d = torch.bmm(torch.bmm(xs, ab[0]), ab[1]).view(-1, y.shape[1])
            mask = b.mask(d.dtype)
            if mask is not None:
                d.mul_(mask)
            y.index_add_(0, b.perm, d)
        return
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
