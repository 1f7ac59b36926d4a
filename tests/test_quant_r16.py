"""r16 layouts (plugins/runner/csrc/quant_r16.c): the legacy GGML formats with 16 rows interleaved for decode.

A repacked weight dequantizes to the plain layout's bits; its matmul with int16 activations stays within 1e-4 of the
exact product (x as it is, the weight dequantized by gguf's own code), and with int8 activations equals x's Q8_0
reconstruction times the weight (llama.cpp's numerics) to fp32 rounding."""
from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from modelcall.plugins.runner import quant

from test_quant_kernels import weight_bytes

pytestmark = pytest.mark.skipif(not quant.r16_available(), reason="no AVX-512 VNNI r16 kernels on this CPU")

FORMATS = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q6_K")
LEGACY_SHAPES = ((16, 32), (64, 96), (960, 576), (576, 1536))
K_SHAPES = ((16, 256), (64, 512), (640, 2048), (576, 1536))


def shapes(name: str) -> tuple[tuple[int, int], ...]:
    return K_SHAPES if name.endswith("_K") else LEGACY_SHAPES


def plain(name: str, n: int, k: int, seed: int = 0) -> quant.QWeight:
    """A random weight quantized by gguf's own quantizer (the bytes llama.cpp writes); K formats, which gguf cannot
    quantize, as random blocks with sane scales (test_quant_kernels.weight_bytes)."""
    return quant.qweight_from_bytes(torch.from_numpy(weight_bytes(name, n, k, seed)), quant.GGML_TYPES[name], n, k)


def reference(w: quant.QWeight) -> torch.Tensor:
    """The weight as gguf's NumPy dequantizer gives it, in float64."""
    return torch.from_numpy(gguf.quants.dequantize(w.data.numpy(), gguf.GGMLQuantizationType(w.qtype))).double()


def q8_0_of(x: torch.Tensor) -> torch.Tensor:
    blocks = gguf.quants.quantize(x.numpy(), gguf.GGMLQuantizationType.Q8_0)
    return torch.from_numpy(gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType.Q8_0)).reshape(x.shape)


def activations(b: int, k: int, seed: int = 1) -> torch.Tensor:
    """Rows with a few large features, as a decoder's hidden states have."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, k, generator=g) * (torch.rand(1, k, generator=g) * 4) ** 2


@pytest.mark.parametrize("name", FORMATS)
def test_a_repacked_weight_dequantizes_to_the_plain_layouts_bits(name):
    for n, k in shapes(name):
        w = plain(name, n, k)
        r = quant.repack_r16(w)
        assert r is not None and quant.type_name(r.qtype) == f"{name}/r16"
        assert r.nbytes == (w.nbytes * 148 // 144 if name == "Q4_K" else w.nbytes)   # Q4_K: scales as bytes
        assert not torch.equal(r.data, w.data)   # another order of the same bytes' information
        assert torch.equal(r.dequantize(), w.dequantize())
        assert torch.equal(r.dequantize(torch.bfloat16), w.dequantize(torch.bfloat16))
        ids = torch.tensor([[0, n - 1], [n // 2, 5 % n]])
        assert torch.equal(r.rows(ids), w.rows(ids))


@pytest.mark.parametrize("name", FORMATS)
def test_int16_activations_stay_within_1e_4_of_the_exact_product(name):
    for n, k in shapes(name):
        w, bias = plain(name, n, k), torch.randn(n)
        r = quant.repack_r16(w)
        for b in (1, 3, 9):
            x = activations(b, k)
            exact = x.double() @ reference(w).T + bias.double()
            got = quant.qmatmul(x, r, bias).double()
            assert ((got - exact).abs().max() / exact.abs().max()).item() < 1e-4, (n, k, b)
            got_bf16 = quant.qmatmul(x.bfloat16(), r, bias).double()   # bf16 rows in and out
            exact_bf16 = x.bfloat16().double() @ reference(w).T + bias.double()
            assert ((got_bf16 - exact_bf16).abs().max() / exact_bf16.abs().max()).item() < 1e-2


@pytest.mark.parametrize("name", FORMATS)
def test_int8_activations_give_llama_cpp_numerics(name):
    for n, k in shapes(name)[1:]:
        w = plain(name, n, k)
        r = quant.repack_r16(w)
        x = activations(4, k)
        want = q8_0_of(x).double() @ reference(w).T
        got = quant.qmatmul(x, r, int8=True).double()
        assert ((got - want).abs().max() / want.abs().max()).item() < 1e-5
        plain_int8 = quant.qmatmul(x, w, int8=True).double()   # the row-at-a-time int8 kernel: the same numbers
        assert ((got - plain_int8).abs().max() / want.abs().max()).item() < 1e-5


def int16_of(x: torch.Tensor) -> torch.Tensor:
    """x as the int16 kernels quantize it, per 32 values: d = amax / 32767 (fp32), q = x * (1 / d) rounded half away
    from zero, back as q * d in float64."""
    g = x.float().reshape(x.shape[0], -1, 32)
    d = g.abs().amax(-1, keepdim=True) / 32767.0
    inv = torch.where(d != 0, 1.0 / torch.where(d != 0, d, torch.ones_like(d)), torch.zeros_like(d))
    v = g * inv
    t = v.trunc()
    q = t + (v - t >= 0.5).float() - (v - t <= -0.5).float()
    return (q.double() * d.double()).reshape(x.shape)


@pytest.mark.parametrize("name", ("Q8_0", "Q4_0", "Q4_1", "Q5_1", "Q4_K", "Q6_K"))
def test_int16_activations_give_their_reconstruction_times_the_weight(name):
    """The exact int16 activations: the product is x's int16 reconstruction times the weight to fp32 rounding (a
    value off by one int16 step, such as a tie rounded the other way, is ~5e-6 of its row's largest output), at one row
    (decode), a few, and enough rows for the threads to share quantizing them."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        products_within(name, 2e-6)
    finally:
        torch.set_num_threads(threads)


def products_within(name: str, bound: float) -> None:
    for n, k in ((960, 576), (576, 1536)) if not name.endswith("_K") else ((640, 2048), (576, 1536)):
        w = plain(name, n, k)
        r = quant.repack_r16(w)
        for b in (1, 5, 16):
            x = activations(b, k, seed=b)
            x[0, :32] = torch.arange(32) * 0.25   # amax 7.75: 0.25 is 1056.9 steps, ties and near-ties
            want = int16_of(x) @ reference(w).T
            got = quant.qmatmul(x, r).double()
            err = ((got - want).abs().amax(1) / want.abs().amax(1)).max().item()
            assert err < bound, (n, k, b, err)


@pytest.mark.parametrize("name", ("Q8_0", "Q4_1", "Q5_0", "Q4_K", "Q6_K"))
def test_one_nibble_moved_in_the_repacked_bytes_changes_exactly_its_row(name):
    n, k = (64, 256) if name.endswith("_K") else (64, 96)
    w = plain(name, n, k)
    r = quant.repack_r16(w)
    x = activations(1, k)
    before = quant.qmatmul(x, r)
    data = r.data.clone()
    # the first code byte of row 5 in the first tile-group: after the header (d, m; the K formats' scales), 4 a lane
    at = {"Q4_1": 64, "Q4_K": 320, "Q6_K": 288}.get(name, 32) + 4 * 5
    data.view(-1)[at] ^= 0x10
    broken = quant.QWeight(data, r.qtype, r.shape)
    after = quant.qmatmul(x, broken)
    changed = (after != before).nonzero()[:, 1].tolist()
    assert changed == [5]
    assert not torch.equal(broken.dequantize()[5], w.dequantize()[5])


def test_weights_r16_does_not_take_stay_as_they_are():
    assert quant.repack_r16(plain("Q8_0", 24, 64)) is None   # rows not a multiple of 16
    g = torch.Generator().manual_seed(0)
    k_quant = quant.quantize(torch.randn(24, 256, generator=g), quant.GGML_TYPES["Q4_K"])
    assert quant.repack_r16(k_quant) is None   # 24 rows again
    assert quant.repack_r16(plain("Q5_K", 32, 256)) is None   # a format without an r16 layout
    w = plain("Q8_0", 32, 64)
    with pytest.raises(ValueError, match="a Q8_0/r16 row holds a multiple of 32"):
        quant.qweight_from_bytes(w.data.view(-1)[:32 * 34], quant.GGML_TYPES["Q8_0"] + quant.R16_OFF, 32, 30)


def test_a_repacked_model_weight_keeps_its_size_and_serves_its_rows(tmp_path):
    """A tied embedding / lm_head weight is repacked once and stays shared (quant_repack.repack_model)."""
    from modelcall.plugins.runner import gguf_weights, quant_repack
    w = plain("Q8_0", 128, 64)
    emb = gguf_weights.QuantEmbedding(w, torch.float32)
    head = quant.QuantLinear(w)
    model = torch.nn.ModuleDict({"embed": emb, "head": head})
    assert quant_repack.repack_model(model) == 1
    assert emb.qweight is head.qweight and emb.qweight.qtype == w.qtype + quant.R16_OFF
    ids = torch.tensor([3, 127, 64])
    assert torch.equal(emb(ids), w.rows(ids))
    x = activations(2, 64)
    assert torch.allclose(head(x), quant.qmatmul(x, w), rtol=0, atol=1e-4 * float(quant.qmatmul(x, w).abs().max()))
    np.testing.assert_array_equal(head.qweight.dequantize().numpy(), w.dequantize().numpy())


@pytest.mark.parametrize("name", ("F16", "BF16"))
def test_16_bit_float_weights_in_r16_give_the_plain_kernels_products_and_bits(name):
    """F16 / BF16 weights (an F16 GGUF) in their r16 layout (csrc/quant_r16f.c): the same bits back, whole tiles
    (a prefill's dequantized GEMM) and single rows (embedding lookups) alike, and the same products as the plain
    row kernel to fp32 rounding, at one activation row (decode) and at several (short chunks), x fp32 or bf16."""
    g = torch.Generator().manual_seed(3)
    for n, k in ((16, 32), (960, 576), (48, 77), (64, 2048)):
        dense = torch.randn(n, k, generator=g) * 0.05
        half = dense.half() if name == "F16" else dense.bfloat16()
        w = quant.qweight_from_bytes(half.view(torch.int16).view(torch.uint8).reshape(n, -1).clone(),
                                     quant.GGML_TYPES[name], n, k)
        r = quant.repack_r16(w)
        assert r is not None and quant.type_name(r.qtype) == f"{name}/r16" and r.nbytes == w.nbytes
        assert not torch.equal(r.data, w.data)
        for dtype in (torch.float32, torch.bfloat16):
            assert torch.equal(r.dequantize(dtype), w.dequantize(dtype))
        ids = torch.tensor([[0, n - 1], [n // 2, 17 % n]])
        assert torch.equal(r.rows(ids), w.rows(ids))
        exact = half.double()
        for rows in (1, 3, 16):
            x = activations(rows, k)
            want = x.double() @ exact.T
            got = quant.qmatmul(x, r)
            assert (got.double() - want).abs().max() <= 1e-5 * want.abs().max(), (n, k, rows)
            xb = x.bfloat16()
            assert torch.allclose(quant.qmatmul(xb, r).float(), quant.qmatmul(xb, w).float(), rtol=0,
                                  atol=1e-2 * float(want.abs().max()))
        assert quant.dense_from_tokens(torch.bfloat16, r.qtype) == quant.DENSE_FROM_TOKENS   # bf16 prefill: a GEMM


@pytest.mark.parametrize("name", ("F16", "BF16"))
def test_16_bit_float_rows_of_a_decode_batch_keep_their_bits(name):
    """A decode batch (2-16 rows, the rows a few streams decode together) over F16 / BF16 r16 weights: every row's
    result is bit for bit the row alone (the batch's rows take each weight vector widened once, their sums in the
    one-row kernel's order), and within fp32 rounding of the exact product; K not a multiple of 4 included."""
    g = torch.Generator().manual_seed(7)
    for n, k in ((16, 32), (960, 576), (48, 77), (64, 1538)):
        dense = torch.randn(n, k, generator=g) * 0.05
        half = dense.half() if name == "F16" else dense.bfloat16()
        w = quant.repack_r16(quant.qweight_from_bytes(half.view(torch.int16).view(torch.uint8).reshape(n, -1).clone(),
                                                      quant.GGML_TYPES[name], n, k))
        x = activations(16, k, seed=n)
        alone = torch.cat([quant.qmatmul(x[i:i + 1], w) for i in range(16)])
        want = x.double() @ half.double().T
        assert (alone.double() - want).abs().max() <= 1e-5 * want.abs().max(), (n, k)
        for rows in (2, 5, 6, 7, 13, 16):
            got = quant.qmatmul(x[:rows], w)
            assert torch.equal(got, alone[:rows]), (n, k, rows)
