"""Quantized weights (GGML block formats) kept quantized in memory, and the C kernels that use them.

A weight is N rows (output features) of K values (input features); each row is K / block consecutive blocks, and
the raw bytes are a uint8 tensor [N, row_bytes], so rows can be permuted or concatenated freely. `qmatmul` reads
those bytes and widens them in registers (fp32 accumulation); `QWeight.dequantize` / `.rows` give fp32 or bf16
rows (embedding lookups, prefill tiles); `quantize` makes Q8_0, Q4_0 (bit for bit as gguf.quants) and Q4_K from
a float weight. The C source is csrc/quant_*.{h,c} (format decoders and the one matmul); where it cannot be built,
gguf's NumPy dequantizer and torch's matmul keep every result correct, only slower.
"""
from __future__ import annotations

import ctypes
import os
import warnings
from dataclasses import dataclass

import numpy as np
import torch

from modelcall.core.native import OnceLibrary

GGML_TYPES: dict[str, int] = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8,
                              "Q4_K": 12, "Q5_K": 13, "Q6_K": 14, "BF16": 30}
_NAMES = {v: k for k, v in GGML_TYPES.items()}
# (weights per block, bytes per block), as gguf.constants.GGML_QUANT_SIZES
_BLOCKS: dict[int, tuple[int, int]] = {0: (1, 4), 1: (1, 2), 30: (1, 2), 8: (32, 34), 2: (32, 18), 3: (32, 20),
                                       6: (32, 22), 7: (32, 24), 12: (256, 144), 13: (256, 176), 14: (256, 210)}
_FLOAT_TYPES = (0, 1, 30)
QUANTIZABLE = (GGML_TYPES["Q8_0"], GGML_TYPES["Q4_0"], GGML_TYPES["Q4_K"])

_CSRC = os.path.join(os.path.dirname(__file__), "csrc")
_FILES = ("quant_common.h", "quant_legacy.c", "quant_k.c", "quant_matmul.c", "quant_int8.c", "quant_r16.c",
          "quant_r16k.c", "quant_r16f.c", "quant_screen.c")
# r16 layouts (csrc/quant_r16.c, quant_r16k.c): a weight with 16 rows interleaved, for decode with integer dot
# products; its type number is the plain format's + R16_OFF
R16_OFF = 100
R16_FORMATS = tuple(GGML_TYPES[t] for t in ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q6_K", "F16", "BF16"))
# (weights, bytes) a row's block holds in the r16 layout: the plain format's, but Q4_K's 6-bit scales unpacked to bytes
_BLOCKS.update({t + R16_OFF: _BLOCKS[t] for t in R16_FORMATS})
_BLOCKS[GGML_TYPES["Q4_K"] + R16_OFF] = (256, 148)


def _read_source() -> str:
    parts = []
    for name in _FILES:
        with open(os.path.join(_CSRC, name)) as f:
            parts.append(f"/* ---- {name} ---- */\n{f.read()}")
    return "\n".join(parts)


SOURCE = _read_source()


def _declare(lib: ctypes.CDLL) -> None:
    i64, i32, p = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p
    lib.quant_qmatmul.argtypes = [i32, p, i64, i64, i64, p, i32, i64, i64, p, i32, i64, p, i32]
    lib.quant_dequantize_rows.argtypes = [i32, p, i64, i64, i64, p, i64, i64, p, i32, i64, i32]
    lib.quant_quantize_rows.argtypes = [i32, p, i64, i64, i64, p, i32]
    lib.quant_qmatmul_int8.argtypes = lib.quant_qmatmul.argtypes
    lib.quant_r16_repack.argtypes = [i32, p, i64, i64, p, i32]
    lib.quant_r16_available.argtypes = []
    lib.quant_screen_argmax.argtypes = [p, p, i32, i64, i64, i32, p, i32]
    lib.quant_screen_prepare.argtypes = [i32, p, i64, i64, i64, p, p, p, i32]
    lib.quant_path.argtypes = []
    lib.quant_int8_available.argtypes = []
    for fn in (lib.quant_qmatmul, lib.quant_dequantize_rows, lib.quant_quantize_rows, lib.quant_path,
               lib.quant_qmatmul_int8, lib.quant_int8_available, lib.quant_r16_repack, lib.quant_r16_available,
               lib.quant_screen_argmax, lib.quant_screen_prepare):
        fn.restype = i32


_LIB = OnceLibrary("quant_kernels", SOURCE, _declare, "quantized weights are dequantized by gguf's NumPy code")


def load() -> ctypes.CDLL | None:
    """The compiled library, or None where it cannot be built (tests swap in other builds through this)."""
    return _LIB.get()


def type_name(qtype: int) -> str:
    """The GGML name of a type number (gguf's where this module does not know it)."""
    if qtype in _NAMES:
        return _NAMES[qtype]
    if qtype - R16_OFF in R16_FORMATS:
        return f"{_NAMES[qtype - R16_OFF]}/r16"
    try:
        import gguf
        return gguf.GGMLQuantizationType(qtype).name
    except (ImportError, ValueError):
        return f"type {qtype}"


def block_info(qtype: int) -> tuple[int, int]:
    """(weights per block, bytes per block) of a supported type; ValueError naming the type otherwise."""
    if qtype not in _BLOCKS:
        raise ValueError(f"GGML type {type_name(qtype)} ({qtype}) is not supported by the quantized kernels; "
                         f"supported: {', '.join(sorted(GGML_TYPES))}")
    return _BLOCKS[qtype]


def supported(qtype: int) -> bool:
    """Whether the kernels read this GGML type."""
    return qtype in _BLOCKS


def row_bytes(qtype: int, k: int) -> int:
    """Bytes of one row of k weights; ValueError when k is not a whole number of blocks."""
    block, size = block_info(qtype)
    if k <= 0 or k % block:
        raise ValueError(f"a {type_name(qtype)} row holds a multiple of {block} weights, not {k}")
    return k // block * size


@dataclass(frozen=True, eq=False)
class QWeight:
    """A quantized [N, K] weight: `data` uint8 [N, row_bytes] contiguous on the CPU, `qtype` its GGML type.
    (Compared by identity: two weights are the same object, not equal bytes.)"""

    data: torch.Tensor
    qtype: int
    shape: tuple[int, int]

    def __post_init__(self) -> None:
        n, k = self.shape
        rb = row_bytes(self.qtype, k)
        d = self.data
        if d.dtype != torch.uint8 or tuple(d.shape) != (n, rb) or not d.is_contiguous() or d.device.type != "cpu":
            raise ValueError(f"a {type_name(self.qtype)} weight {n} x {k} holds contiguous CPU uint8 [{n}, {rb}], "
                             f"not {d.dtype} {tuple(d.shape)} on {d.device}")

    @property
    def nbytes(self) -> int:
        """Bytes the weight holds in memory."""
        return self.data.numel()

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The whole weight as a [N, K] tensor of fp32 (bit for bit gguf's dequantize) or bf16."""
        return _dequantize(self, None, dtype)

    def rows(self, ids: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Rows `ids` (any shape of integers in [0, N)) as [*ids.shape, K]: an embedding lookup."""
        flat = ids.reshape(-1).to(torch.int64).contiguous()
        return _dequantize(self, flat, dtype).reshape(*ids.shape, self.shape[1])


def qweight_from_bytes(data: torch.Tensor | np.ndarray, qtype: int, n: int, k: int) -> QWeight:
    """A QWeight over `data`'s bytes (n rows of k weights of GGML type `qtype`), shared, not copied, when already a
    contiguous uint8 CPU tensor; ValueError when the sizes do not match."""
    rb = row_bytes(qtype, k)
    if isinstance(data, np.ndarray):
        arr = np.ascontiguousarray(data).view(np.uint8)
        with warnings.catch_warnings():   # a read-only memmap (GGUFReader's) is shared as is; nothing writes it
            warnings.simplefilter("ignore", UserWarning)
            data = torch.from_numpy(arr)
    if data.device.type != "cpu":
        raise ValueError(f"quantized weights live on the CPU, not {data.device}")
    if data.dtype != torch.uint8:
        data = data.contiguous().view(torch.uint8)
    if data.numel() != n * rb:
        raise ValueError(f"a {type_name(qtype)} weight of {n} x {k} is {n * rb} bytes ({rb} a row), "
                         f"not {data.numel()}")
    return QWeight(data.contiguous().reshape(n, rb), qtype, (n, k))


def _threads() -> int:
    return max(1, torch.get_num_threads())


def _check(rc: int, what: str, w: QWeight) -> None:
    if rc:
        raise RuntimeError(f"{what} on a {type_name(w.qtype)} weight {w.shape} failed (code {rc})")


def _dequantize(w: QWeight, ids: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    if dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"dequantize gives float32 or bfloat16, not {dtype}")
    n, k = w.shape
    count = n if ids is None else ids.numel()
    if ids is not None and count and (int(ids.min()) < 0 or int(ids.max()) >= n):
        raise ValueError(f"row ids must be in [0, {n}); got {int(ids.min())}..{int(ids.max())}")
    lib = load()
    if lib is None:
        rows = w.data if ids is None else w.data[ids]
        return torch.from_numpy(_np_dequantize(rows.numpy(), w.qtype).reshape(count, k)).to(dtype)
    out = torch.empty(count, k, dtype=dtype)
    rc = lib.quant_dequantize_rows(w.qtype, w.data.data_ptr(), w.data.shape[1], n, k,
                                   None if ids is None else ids.data_ptr(), 0, count, out.data_ptr(),
                                   int(dtype == torch.bfloat16), k, _threads())
    _check(rc, "dequantize", w)
    return out


def _np_dequantize(data: np.ndarray, qtype: int) -> np.ndarray:
    import gguf
    if qtype == GGML_TYPES["BF16"]:
        return (data.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return gguf.quants.dequantize(data, gguf.GGMLQuantizationType(qtype))


def int8_available() -> bool:
    """Whether qmatmul(..., int8=True) has its kernel here (a CPU with vpdpbusd: AVX512-VNNI or AVX-VNNI)."""
    lib = load()
    return bool(lib is not None and lib.quant_int8_available())


def r16_available() -> bool:
    """Whether this CPU and build have the r16 kernels (AVX-512 with VNNI)."""
    lib = load()
    return bool(lib is not None and lib.quant_r16_available())


def repack_r16(w: QWeight) -> QWeight | None:
    """`w` in its r16 layout (csrc/quant_r16.c, quant_r16k.c: 16 rows interleaved; the same size, Q4_K 3% more), or
    None where that does not apply: a format r16 does not take, rows not a multiple of 16, or no r16 kernels here.
    Every function of this module takes the result; qmatmul on it quantizes x per 32 values to int16 (int8=True:
    int8, llama.cpp's numerics)."""
    n, k = w.shape
    if w.qtype not in R16_FORMATS or n % 16 or not r16_available():
        return None
    out = torch.empty(n, row_bytes(w.qtype + R16_OFF, k), dtype=torch.uint8)
    rc = load().quant_r16_repack(w.qtype, w.data.data_ptr(), n, k, out.data_ptr(), _threads())
    _check(rc, "r16 repack", w)
    return QWeight(out, w.qtype + R16_OFF, (n, k))


def qmatmul(x: torch.Tensor, w: QWeight, bias: torch.Tensor | None = None,
            out: torch.Tensor | None = None, *, int8: bool = False) -> torch.Tensor:
    """x @ W.T (+ bias): x [..., K] fp32 or bf16 (last dim contiguous, rows any stride), W quantized [N, K];
    the result [..., N] in x's dtype, or written into `out` (fp32 or bf16, last dim contiguous, rows any stride,
    e.g. a column slice of a wider buffer), which is returned.

    int8=True: x quantized per 32 values to Q8_0 on the fly and integer dot products (llama.cpp's way; an error
    of about |x| / 254 per value); where that kernel is not built, or W is a float type, the fp32 path runs. An r16
    weight (repack_r16) takes its integer kernels either way: x as int16 per 32 values, or as int8 with int8=True.

    NOTE: kept lean (each torch call here costs ~1 us, the whole wrapper ~5 us): a 192 x 576 Q4_1 matvec is ~5 us
    of kernel time."""
    n, k = w.shape
    dt = x.dtype
    if x.shape[-1] != k:
        raise ValueError(f"x has {x.shape[-1]} features; the {type_name(w.qtype)} weight takes {k}")
    if dt is not torch.float32 and dt is not torch.bfloat16:
        raise ValueError(f"qmatmul takes float32 or bfloat16 activations, not {dt}")
    x2 = x if x.dim() == 2 else x.reshape(-1, k)
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    b = x2.shape[0]
    if out is None:
        y2 = out = torch.empty(b, n, dtype=dt)
        if x.dim() != 2:
            out = out.view(*x.shape[:-1], n)
    else:
        if out.shape[:-1] != x.shape[:-1] or out.shape[-1] != n or (
                out.dtype is not torch.float32 and out.dtype is not torch.bfloat16):
            raise ValueError(f"out must be float32 or bfloat16 of shape {(*x.shape[:-1], n)}, "
                             f"not {out.dtype} {tuple(out.shape)}")
        y2 = out if out.dim() == 2 else out.view(-1, n)
        if b and y2.stride(1) != 1:
            raise ValueError("out's last dimension must be contiguous")
    if bias is not None and (bias.dtype is not torch.float32 or bias.requires_grad or not bias.is_contiguous()):
        bias = bias.detach().to(torch.float32).contiguous()
    if bias is not None and bias.shape != (n,):
        raise ValueError(f"bias must have shape ({n},), not {tuple(bias.shape)}")
    if b == 0:
        return out
    lib = load()
    if lib is None:
        y2.copy_(torch.nn.functional.linear(x2.float(), w.dequantize(), bias))
        return out
    fn = lib.quant_qmatmul_int8 if int8 and w.qtype not in _FLOAT_TYPES and lib.quant_int8_available() \
        else lib.quant_qmatmul
    rc = fn(w.qtype, w.data.data_ptr(), w.data.shape[1], n, k, x2.data_ptr(),
                           dt is torch.bfloat16, x2.stride(0), b, y2.data_ptr(),
                           y2.dtype is torch.bfloat16, y2.stride(0),
                           None if bias is None else bias.data_ptr(), torch.get_num_threads())
    if rc:
        _check(rc, "qmatmul", w)
    return out


def quantize(w: torch.Tensor, qtype: int) -> QWeight:
    """A float [N, K] weight (fp32 or bf16) quantized to Q8_0 or Q4_0 (the same bytes as gguf.quants.quantize) or
    Q4_K (per 32-weight scale and minimum, 6-bit multiples of fp16 block scales, nearest of 16 levels)."""
    if qtype not in QUANTIZABLE:
        raise ValueError(f"quantize makes {', '.join(type_name(t) for t in QUANTIZABLE)}, not {type_name(qtype)}")
    if w.dim() != 2:
        raise ValueError(f"quantize takes a [N, K] weight, not shape {tuple(w.shape)}")
    n, k = w.shape
    rb = row_bytes(qtype, k)
    x = w.detach().to("cpu", torch.float32).contiguous()
    if not torch.isfinite(x).all():
        raise ValueError("quantize: the weight holds inf or NaN")
    data = torch.empty(n, rb, dtype=torch.uint8)
    lib = load()
    if lib is None:
        if qtype == GGML_TYPES["Q4_K"]:
            raise RuntimeError("quantizing to Q4_K needs the C kernels (no C compiler here); use q8_0")
        import gguf
        data.copy_(torch.from_numpy(gguf.quants.quantize(x.numpy(), gguf.GGMLQuantizationType(qtype))))
    else:
        rc = lib.quant_quantize_rows(qtype, x.data_ptr(), n, k, k, data.data_ptr(), _threads())
        if rc:
            raise RuntimeError(f"quantize to {type_name(qtype)} failed (code {rc})")
    return QWeight(data, qtype, (n, k))


# tokens (rows of x) above which QuantLinear dequantizes the weight per call and uses torch's matmul, by the
# activations' dtype. NOTE: one thread, Zen 4, benchmarks/quant_matmul.py --crossover (CPU time, shared machine):
# qmatmul / dequantize + bf16 linear, Q4_1 1536x576: 8 tokens 144 / 220 us, 16: 253 / 284, 32: 555 / 317;
# Q4_K 640x2048: 8: 371 / 542, 16: 717 / 553. With fp32 activations the dense path is an fp32 linear, slower:
# Q4_1 1536x576, 128 tokens 2275 / 2775 us, 256: 4239 / 6025; Q4_K 640x2048, 128: 5621 / 4101.
# Float weights (F16, BF16, F32) have no integer dot products to gain from: their kernel converts each weight per
# row of x, so from 16-32 rows torch's GEMM over a converted copy wins with fp32 activations too. NOTE: one
# thread, Zen 4, /tmp script of issue 38 (min of 15 calls, loaded machine), F16 kernel / dequantize + fp32
# linear: 576x1536 16 rows 532 / 435 us, 32: 1057 / 717, 128: 12683 / 2618; 576x576 16: 148 / 168, 32: 291 / 268.
# r16 weights of quantized blocks (quant_repack.py) with fp32 activations keep the kernel at every size: its integer dot products on
# 16 rows at once beat an fp32 GEMM over a dequantized copy at prefill sizes too. NOTE: one thread, Zen 4, /tmp
# script of issue 38 (min of 7 calls, loaded machine), kernel / dequantize + fp32 linear: Q8_0 1536x576 128 rows
# 1438 / 4092 us, 512: 10609 / 28055, 1024: 16433 / 32244; Q4_0 576x1536 512: 6340 / 19261; Q4_K 640x2048 512:
# 17901 / 30518.
# r16 floats (F16, BF16) with fp32 activations keep their kernel too: above 16 rows it widens each weight vector once
# for 12 rows (csrc/quant_r16f.c's r16f_rows). NOTE: one thread, Zen 4, loaded machine, one layer's four F16 matmuls
# (min of 9, alternated), kernel / dequantize + fp32 linear: Gemma 3 270M 128 rows 15.95 / 23.71 ms, 2,048 rows
# 259 / 271; SmolLM2 128 rows 9.73 / 12.73, 2,048 rows 141 / 158.
DENSE_FROM_TOKENS = 16          # bf16 activations, and plain float weights with any activations
DENSE_FROM_TOKENS_FP32 = 128    # fp32 activations over quantized blocks in their plain layouts
NEVER_DENSE = 1 << 40           # fp32 activations over r16 weights


def dense_from_tokens(dtype: torch.dtype, qtype: int | None = None) -> int:
    """Tokens above which a matmul with activations of `dtype` over weights of `qtype` (None: a block type in its
    plain layout) is faster dequantized + torch's (see the NOTEs)."""
    if qtype is not None and qtype - R16_OFF in _FLOAT_TYPES:
        return NEVER_DENSE if dtype == torch.float32 else DENSE_FROM_TOKENS
    if dtype != torch.float32 or qtype in _FLOAT_TYPES:
        return DENSE_FROM_TOKENS
    return NEVER_DENSE if qtype is not None and qtype >= R16_OFF else DENSE_FROM_TOKENS_FP32


class QuantLinear(torch.nn.Module):
    """nn.Linear over a quantized weight: qmatmul for few tokens (decode), dequantize + torch matmul for many.

    NOTE: above dense_from_tokens(x.dtype) the weight is dequantized on each call (no dense copy is kept: that would undo
    the memory saving)."""

    def __init__(self, qweight: QWeight, bias: torch.Tensor | None = None, int8: bool = False) -> None:
        super().__init__()
        self.qweight, self.int8 = qweight, int8
        self.out_features, self.in_features = qweight.shape
        self.bias = None if bias is None else torch.nn.Parameter(bias.detach().float(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in_features] fp32 or bf16 -> [..., out_features] in x's dtype."""
        tokens = x.numel() // max(1, self.in_features)
        if tokens <= dense_from_tokens(x.dtype, self.qweight.qtype):
            return qmatmul(x, self.qweight, self.bias, int8=self.int8)
        w = self.qweight.dequantize(x.dtype)
        return torch.nn.functional.linear(x, w, None if self.bias is None else self.bias.to(x.dtype))

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"qtype={type_name(self.qweight.qtype)}, bias={self.bias is not None}")
