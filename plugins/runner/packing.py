"""Pre-packed linear weights for CPU bf16: oneDNN's blocked layout made once at load instead of per call.

`F.linear` on bf16 CPU tensors reorders the weight into oneDNN's blocked layout on every call; at
decode sizes that reorder is a large share of the matmul (W1, batch 32: 22 -> 16 ms CPU for all
linears, identical results). Packing once costs nothing later.

Sibling linears that read the same input (q/k/v, gate/up) are packed side by side into one weight
and run as one GEMM (`FusedLinears`): each call is a parallel region, and with two threads the
wake-up of the second thread costs about as much as a 512x512 GEMM at batch 32 (W1, 2 threads:
q+k+v 3 x 113 us -> 191 us fused). Each sibling returns its column slice of the shared result; a
group is fused only when the slices equal the separate packed outputs bit for bit (checked at load
on the model's own weights).
"""
from __future__ import annotations

import functools
import logging

import torch

log = logging.getLogger("modelcall.runner")


def gemm(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ W.T (+ bias) with W in oneDNN's packed layout: every packed GEMM of the model goes through here
    (benchmarks/gemm_fraction.py times them by wrapping this function)."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def gemm_add(x: torch.Tensor, packed: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """x @ W.T + other in one oneDNN call (a binary post-op: `other` is added to the accumulator as each output
    tile is stored, while it is in registers, instead of in a pass of its own). In fp32 the same bits as
    gemm(x, packed, None) + other (one rounding each way); the lean stack takes it for its residual adds."""
    return torch.ops.mkldnn._linear_pointwise.binary(x, other, packed, None, "add")


@functools.cache
def can_pack(dtype: torch.dtype) -> bool:
    """Whether oneDNN here can pack `dtype` weights: its bf16 reorder needs AVX-512 (bw, vl, dq) or AVX-NE-CONVERT,
    so on an AVX2-only CPU (AMD Zen 2/3) bf16 linears stay F.linear, while fp32 packs on any x86 CPU."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(16, 16, dtype=dtype), 4)
    except RuntimeError:
        return False
    return True


class PackedLinear(torch.nn.Module):
    """Drop-in for an `nn.Linear` whose weight lives only in oneDNN's packed layout."""

    def __init__(self, linear: torch.nn.Linear, batch_hint: int) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), batch_hint)
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gemm(x, self.packed, self.bias)


class FusedLinears:
    """One packed GEMM for sibling linears of one module called on the same input tensor."""

    def __init__(self, linears: list[torch.nn.Linear], batch_hint: int) -> None:
        weight = torch.cat([m.weight.detach() for m in linears])
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, batch_hint)
        self.bias = torch.cat([m.bias.detach() for m in linears]) if linears[0].bias is not None else None
        self.bounds: list[tuple[int, int]] = []
        start = 0
        for m in linears:
            self.bounds.append((start, start + m.out_features))
            start += m.out_features
        self._x: torch.Tensor | None = None   # the input of the last GEMM, held until every part was read
        self._y: torch.Tensor | None = None
        self._left = 0

    def part(self, x: torch.Tensor, i: int) -> torch.Tensor:
        # NOTE: identity, not equality: the first sibling called on a new input tensor runs the GEMM; holding
        # `x` keeps its id from being reused. Dropped once every sibling has read its slice.
        if self._x is not x:
            self._y = gemm(x, self.packed, self.bias)
            self._x, self._left = x, len(self.bounds)
        y = self._y
        a, b = self.bounds[i]
        self._left -= 1
        if self._left <= 0:
            self._x = self._y = None
        return y[..., a:b]


class FusedPart(torch.nn.Module):
    """Drop-in for one sibling `nn.Linear`: its columns of a FusedLinears result (a strided view)."""

    def __init__(self, fused: FusedLinears, index: int, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.fused, self.index = fused, index

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fused.part(x, self.index)


# (names, fuse on one thread too): on one thread gate+up fused ran ~10% slower than the two GEMMs (W1:
# 2 x 237 us -> 525 us; the fused weight no longer fits L2), q+k+v fused slightly faster (3 x 94 -> 271 us).
FUSE_GROUPS = ((("q_proj", "k_proj", "v_proj"), True), (("gate_proj", "up_proj"), False))


def _siblings(mod: torch.nn.Module, names: tuple[str, ...], dtype: torch.dtype) -> list[torch.nn.Linear] | None:
    subs = [getattr(mod, n, None) for n in names]
    if not all(type(m) is torch.nn.Linear and m.weight.dtype == dtype and m.weight.device.type == "cpu"
               for m in subs):
        return None
    if len({m.in_features for m in subs}) != 1 or len({m.bias is None for m in subs}) != 1:
        return None
    return subs  # type: ignore[return-value]


def _fused_equal(linears: list[torch.nn.Linear], batch_hint: int) -> bool:
    fused = FusedLinears(linears, batch_hint)
    singles = [PackedLinear(m, batch_hint) for m in linears]
    gen = torch.Generator().manual_seed(0)
    for rows in sorted({1, 3, 16, batch_hint, 2 * batch_hint + 1}):
        x = torch.randn(1, rows, linears[0].in_features, generator=gen).to(linears[0].weight.dtype)
        for i, single in enumerate(singles):
            if not torch.equal(fused.part(x, i), single(x)):
                return False
    return True


GRAIN = 32768   # torch's intra-op grain (at::internal::GRAIN_SIZE): smaller elementwise ops stay on the calling thread


class SerialGatedMLP:
    """`down(silu(gate(x)) * up(x))` for a module whose gate/up are fused, with silu and the product run in row
    chunks below torch's grain: on one thread, instead of two parallel regions whose wake-up of the second
    thread costs more than the work (W1, 32 x 1408: silu 36 us on one thread, 72-80 us as a region of two).
    Elementwise, row by row either way (the gate/up slices are strided): the same numbers, checked at load."""

    def __init__(self, mod: torch.nn.Module) -> None:
        self.mod = mod
        self.fused: FusedLinears = mod.gate_proj.fused
        self.width = mod.gate_proj.out_features

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        f, width = self.fused, self.width
        y = gemm(x, f.packed, f.bias)
        g, u = y[..., :width], y[..., width:]
        h = torch.empty(g.shape, dtype=y.dtype)
        g2, u2, h2 = g.reshape(-1, width), u.reshape(-1, width), h.view(-1, width)
        step = max(1, (GRAIN - 1) // width)
        for a in range(0, g2.shape[0], step):
            torch.mul(torch.nn.functional.silu(g2[a:a + step]), u2[a:a + step], out=h2[a:a + step])
        return self.mod.down_proj(h)


def _serial_mlps(model: torch.nn.Module, batch_hint: int) -> int:
    """Install SerialGatedMLP on the modules with fused gate/up and a down_proj, when on the first of them it
    gives the module's own output bit for bit (a SiLU-gated MLP); returns how many."""
    mods = [m for m in model.modules() if isinstance(getattr(m, "gate_proj", None), FusedPart)
            and isinstance(getattr(m, "up_proj", None), FusedPart) and m.gate_proj.fused is m.up_proj.fused
            and m.gate_proj.index == 0 and isinstance(getattr(m, "down_proj", None), torch.nn.Module)]
    if not mods:
        return 0
    first = mods[0]
    gen = torch.Generator().manual_seed(0)
    try:
        for rows in sorted({1, 3, 16, batch_hint, 2 * batch_hint + 1}):
            x = torch.randn(1, rows, first.gate_proj.in_features, generator=gen).to(first.gate_proj.fused.packed.dtype)
            if not torch.equal(SerialGatedMLP(first)(x), first(x)):
                log.info("gated MLP left as is: the serial form differs from %s", type(first).__name__)
                return 0
    except Exception as e:
        log.info("gated MLP left as is (%s)", e)
        return 0
    for m in mods:
        m.forward = SerialGatedMLP(m)
    return len(mods)


def fuse_siblings(model: torch.nn.Module, batch_hint: int = 32, threads: int | None = None,
                  dtype: torch.dtype = torch.bfloat16) -> int:
    """Run q/k/v and gate/up (with two threads or more) of every module as one packed GEMM each (`dtype` linears
    on CPU); returns how many groups.
    A kind of group is fused only if, on the first such group of the model, the fused slices equal the
    separate packed outputs bit for bit."""
    if not can_pack(dtype):
        return 0
    count = 0
    with torch.inference_mode():
        for names, single_thread in FUSE_GROUPS:
            if (threads or torch.get_num_threads()) < 2 and not single_thread:
                continue
            groups = [(mod, subs) for mod in model.modules() if (subs := _siblings(mod, names, dtype)) is not None]
            if not groups:
                continue
            try:
                if not _fused_equal(groups[0][1], batch_hint):
                    log.info("not fusing %s: fused GEMM differs from the separate ones", "/".join(names))
                    continue
            except Exception as e:  # an op missing from this build
                log.info("not fusing %s (%s)", "/".join(names), e)
                continue
            for mod, subs in groups:
                fused = FusedLinears(subs, batch_hint)
                for i, (name, sub) in enumerate(zip(names, subs)):
                    setattr(mod, name, FusedPart(fused, i, sub))
                count += 1
        _serial_mlps(model, batch_hint)
    return count


def pack_linears(model: torch.nn.Module, batch_hint: int = 32, dtype: torch.dtype = torch.bfloat16) -> int:
    """Replace every `dtype` CPU `nn.Linear` of `model` by a PackedLinear; returns how many (0 when oneDNN is
    unavailable or the packed result would differ: bf16 must match F.linear bit for bit; fp32, which MKL sums in
    another order, within fp32 rounding)."""
    if not can_pack(dtype):
        return 0
    try:  # one trial, checked against the plain op, before touching the model
        probe = torch.nn.Linear(64, 48, bias=True).to(dtype)
        x = torch.randn(5, 64, dtype=dtype)
        got, ref = PackedLinear(probe, batch_hint)(x), probe(x)
        if not (torch.equal(got, ref) if dtype == torch.bfloat16 else torch.allclose(got, ref, rtol=1e-4, atol=1e-5)):
            return 0
    except Exception as e:  # an op missing from this build
        log.info("no packed %s linears (%s)", dtype, e)
        return 0
    fuse_siblings(model, batch_hint, dtype=dtype)
    targets = [(name, mod) for name, mod in model.named_modules()
               if type(mod) is torch.nn.Linear and mod.weight.dtype == dtype and mod.weight.device.type == "cpu"]
    for name, mod in targets:
        parent_name, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, attr, PackedLinear(mod, batch_hint))
    return len(targets)


FP32_MIN_WEIGHTS = 16 << 20   # linear weights of a model whose fp32 linears are packed (see pack_fp32_linears)


def pack_fp32_linears(model: torch.nn.Module, batch_hint: int = 32) -> int:
    """pack_linears for an fp32 model on CPU whose linears hold at least FP32_MIN_WEIGHTS weights; returns how many.

    NOTE: measured, not assumed. On a Zen 3 core (AVX2, no AVX-512, where the loader computes a bf16 checkpoint in
    fp32) the W1 model's decode step at batch 32 took 87.6 ms with F.linear (MKL) for the layers' linears and
    78.7 ms with all of them packed (benchmarks/gemm_fraction.py --dtype float32). The sums run in another order
    than MKL's, so greedy ties can resolve differently than through F.linear: small models (the tests' references)
    keep F.linear."""
    total = sum(m.weight.numel() for m in model.modules() if type(m) is torch.nn.Linear)
    if total < FP32_MIN_WEIGHTS:
        return 0
    return pack_linears(model, batch_hint, dtype=torch.float32)

