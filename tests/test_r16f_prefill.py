"""Prefill chunks over 16-bit float weights in their r16 layout (plugins/runner/csrc/quant_r16f.c's r16f_rows).

Above 16 rows of fp32 activations an F16 / BF16 weight is multiplied straight from its r16 tiles, each widened weight
vector used for 12 rows at once, instead of being dequantized for torch's GEMM: the products stay within fp32
rounding of the exact ones whatever the number of rows (whole blocks of 12, the 4 / 2 / 1 tails, spans of rows that
split a long chunk), with a bias, x in bf16 and the output in bf16 too; QuantLinear takes that path for a chunk."""
from __future__ import annotations

import pytest
import torch

from modelcall.plugins.runner import quant

pytestmark = pytest.mark.skipif(not quant.r16_available(), reason="no AVX-512 r16 kernels on this CPU")


def r16_float(name: str, n: int, k: int, seed: int = 0) -> tuple[quant.QWeight, torch.Tensor]:
    """A random F16 / BF16 weight in its r16 layout, and its exact values in float64."""
    g = torch.Generator().manual_seed(seed)
    dense = torch.randn(n, k, generator=g) * 0.05
    half = dense.half() if name == "F16" else dense.bfloat16()
    w = quant.qweight_from_bytes(half.view(torch.int16).view(torch.uint8).reshape(n, -1).clone(),
                                 quant.GGML_TYPES[name], n, k)
    r = quant.repack_r16(w)
    assert r is not None
    return r, half.double()


def activations(b: int, k: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, k, generator=g) * (torch.rand(1, k, generator=g) * 4) ** 2


@pytest.mark.parametrize("name", ("F16", "BF16"))
def test_prefill_rows_give_the_exact_products_to_fp32_rounding(name):
    # (64, 2048): 60 rows a span (x in L2), so 128 rows are spans of 60, 60 and 8; (48, 77): k not a multiple of 4
    for n, k in ((64, 2048), (48, 77), (960, 576)):
        r, exact = r16_float(name, n, k)
        bias = torch.randn(n, generator=torch.Generator().manual_seed(2))
        for rows in (17, 23, 29, 128):   # 12 + 4 + 1, 12 + 4 + 4 + 2 + 1, 2 x 12 + 4 + 1, and spans
            x = activations(rows, k)
            want = x.double() @ exact.T
            tol = 1e-5 * float(want.abs().max())
            got = quant.qmatmul(x, r)
            assert (got.double() - want).abs().max() <= tol, (n, k, rows)
            got = quant.qmatmul(x, r, bias)
            assert (got.double() - (want + bias.double())).abs().max() <= tol + 1e-6, (n, k, rows)
            xb = x.bfloat16()
            want_b = xb.double() @ exact.T
            got_b = quant.qmatmul(xb, r)
            assert got_b.dtype == torch.bfloat16
            assert (got_b.double() - want_b).abs().max() <= 1e-2 * float(want_b.abs().max()), (n, k, rows)


def test_a_prefill_chunk_through_quant_linear_reads_the_r16_tiles(monkeypatch):
    r, exact = r16_float("F16", 640, 1024)
    linear = quant.QuantLinear(r)
    x = activations(128, 1024)
    assert quant.dense_from_tokens(torch.float32, r.qtype) > 128
    assert quant.dense_from_tokens(torch.bfloat16, r.qtype) == quant.DENSE_FROM_TOKENS

    def no_copy(*args, **kwargs):
        raise AssertionError("a prefill chunk over r16 float weights dequantized them")

    monkeypatch.setattr(quant.QWeight, "dequantize", no_copy)
    got = linear(x)
    assert torch.equal(got, quant.qmatmul(x, r))
    want = x.double() @ exact.T
    assert (got.double() - want).abs().max() <= 1e-5 * float(want.abs().max())
