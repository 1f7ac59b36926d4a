"""A small C kernel for paged attention on CPU, compiled on first use and called through ctypes.

Why: the portable path gathers every request's context out of the block pool into a padded copy
before attention (read + write + read again of every cached byte, per layer, per step). At W1's
decode shapes that copy costs more than the attention itself; this kernel reads each K/V row once,
straight from its slot. It is plain C (no torch headers: builds in about a second), parallel over
tokens with OpenMP, fp32, bf16 or fp8 (E4M3, E5M2: attention_fp8.c) K/V, fp32 math. Without a C compiler the runner keeps
the portable path. The layer's variant rides along: a sliding window (keys pos-W+1..pos only),
logit soft-capping (s = cap * tanh(s / cap)) and per-head sink logits that join the softmax.

    for each token t (in parallel):           keys max(0, pos[t]-W+1)..pos[t] of t's request, by slot
        for each context slot j: K[slot(j)] is one run of Hkv*D values (every head): read once
            scores[hh][j] = q[t, hh] · K[slot(j), hh // G] * scale      G = Hq / Hkv share a K/V head
        out[t, hh] = softmax(scores[hh]) @ V[slot(.), hh // G]

With AVX-512, `block_attention` takes many query rows over one run of keys at once (a long prefill chunk, or the
rows sharing a cached prefix: cascade.py): per KV head, K and V are converted once and met by 32 query lanes at a
time as two register-tiled GEMMs, on bf16 pairs where those pay, else widened to fp32 (`block_uses_pairs`);
1.5-2.2x torch's CPU flash attention at prefill shapes on a Zen 4 (pairs), 2.0-2.4x on an Intel Xeon model 207
(widened; one thread, bf16).
Either path can return each head's log-sum-exp, so two parts of one softmax can be merged.

The C source is in plugins/runner/csrc/, one file per kernel family, the helpers they share in kernel_common.h:
attention_rows.c (the fp32 and variant row kernels), attention_rows_avx2.c (the row kernels for AVX2 without AVX-512),
attention_fp8.c (the fp8 cache's row kernel), attention_decode.c (the entry: cache writes, the bf16 decode row kernel,
rows split across threads), attention_decode_avx2.c, attention_block.c (block_attention) and attention_block_avx2.c.
The decode call reads q in place from the packed QKV rows and writes the output in the model's dtype, so attention.py
makes no copies around it.

NOTE (measured here, one core): the pool's 16-token blocks (16 KB of K per block at W1's 8 x 64 heads) sit anywhere,
and one core reads 16 KB blocks in random order at ~9.5 GB/s against ~22 GB/s in order (32 KB blocks ~12.4, 64 KB
~16); the bf16 decode kernel runs at ~8.5 GB/s of K/V per CPU-second from DRAM, so block size and huge pages
(THP_MEM_ALLOC_ENABLE=1 for torch's allocations: ~1.1x here) move it more than the arithmetic does.
"""
from __future__ import annotations

import ctypes
import os

import torch

from modelcall.core import native

CSRC = os.path.join(os.path.dirname(__file__), "csrc")
# One library, one file per kernel family (each file's head comment says which)
SOURCES = tuple(os.path.join(CSRC, f"attention_{family}.c")
                for family in ("rows", "rows_avx2", "fp8", "decode", "decode_avx2", "block", "block_avx2"))
# The same files as one translation unit, for a C program that includes the kernel (benchmarks/decode_kernel.sh)
SOURCE = "".join(f'#include "{path}"\n' for path in SOURCES)

# Keys per part when a row's keys are split across threads (few rows, more threads); 0: never split, whole rows go
# to threads. NOTE: off by default: on this shared 2-core machine (load 4-6) splitting 1 x 4,096 and 4 x 4,096
# decode rows over two threads was 0.81-0.98x the whole-row wall time in every interleaved run
# (benchmarks/decode_attention.py --threads 2); 256 turns it on (tests/test_attention_decode.py covers it).
MIN_SPLIT = 0

def _declare(lib: ctypes.CDLL) -> None:
    p, i64, i32, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
    lib.paged_attention.argtypes = [p, i32, i64, p, i32, p, p, i32, p, p, p, i64, i64, i64, i64, i64, f32, i64, f32,
                                    p, p, i32, i64]
    lib.paged_attention.restype = None
    lib.write_kv.argtypes = [p, p, i64, i32, p, p, i32, p, i64, i64]
    lib.write_kv.restype = None
    if hasattr(lib, "block_attention"):   # AVX-512 or AVX2 + FMA machines
        lib.block_attention.argtypes = [p, p, p, i32, p, p, p, i32, p, i64, p, i64, i64, i64, i64, f32, i32]
        lib.block_attention.restype = None
    if hasattr(lib, "block_pairs"):      # AVX-512: which GEMMs bf16 inputs take (attention_block.c's pairs_pay)
        lib.block_pairs.argtypes = []
        lib.block_pairs.restype = i32
    lib.decode_layer_attention.argtypes = [p, p, p, p]
    lib.decode_layer_attention.restype = None
    lib.bind_threads.argtypes = [p, i32]
    lib.bind_threads.restype = i32


_LIB = native.OnceLibrary("paged_attention", declare=_declare, fallback="using the portable path",
                          sources=SOURCES, include_dirs=(CSRC,))


def load() -> ctypes.CDLL | None:
    """The compiled kernel, or None when it cannot be built here (no compiler, not x86/arm Linux...)."""
    return _LIB.get()


# The cache's element type as the kernel numbers it (kernel_common.h's KV_*)
KV_TYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float8_e4m3fn: 2, torch.float8_e5m2: 3}


def usable(q_rows: torch.Tensor, kc: torch.Tensor) -> bool:
    return (q_rows.device.type == "cpu" and q_rows.dtype in (torch.float32, torch.bfloat16)
            and kc.dtype in KV_TYPES and load() is not None)


def paged_attention(q_rows: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, step, scale: float, window: int = 0,
                    softcap: float = 0.0, sinks: torch.Tensor | None = None,
                    slots: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """[n, Hq, D] attention of the paged group's tokens (cache [slots, Hkv, D]) in q_rows' dtype, into `out` when
    given; math in fp32. `window` 0 and `softcap` 0 mean none; `sinks` is one logit per query head or None."""
    slots = step.paged_slots if slots is None else slots   # [S, max_ctx] of the layer's KV group
    return attend_tokens(q_rows, kc, vc, step.paged_token_seq, step.paged_token_pos, slots, scale, window, softcap,
                         sinks, out=out, dtype=q_rows.dtype)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x ([n, H, D]) itself when each row's heads lie contiguous (a view into packed QKV rows), else a copy."""
    if x.stride(2) == 1 and x.stride(1) == x.shape[2]:
        return x
    return x.contiguous()


def attend_tokens(q_rows: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, tok_seq: torch.Tensor,
                  tok_pos: torch.Tensor, slots: torch.Tensor, scale: float, window: int = 0, softcap: float = 0.0,
                  sinks: torch.Tensor | None = None, lse: torch.Tensor | None = None, out: torch.Tensor | None = None,
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[n, Hq, D] in `dtype` (fp32 or bf16; into `out`, contiguous, when given): token t attends to the keys at
    `slots[tok_seq[t], 0..tok_pos[t]]` (the last `window` of them when `window` > 0). q_rows is read in place (any
    row stride, fp32 or bf16). With `lse` ([n, Hq] fp32, contiguous) each head's log-sum-exp of its scores is
    written there, so the result can be merged with attention over other keys (cascade.py)."""
    lib = load()
    assert lib is not None
    q = _rows(q_rows)
    n, hq, d = q.shape
    if out is None:
        out = torch.empty(n, hq, d, dtype=dtype)
    assert out.is_contiguous() and out.dtype in (torch.float32, torch.bfloat16)
    sink = sinks.detach().float().contiguous() if sinks is not None else None
    lib.paged_attention(q.data_ptr(), int(q.dtype == torch.bfloat16), q.stride(0), out.data_ptr(),
                        int(out.dtype == torch.bfloat16), kc.data_ptr(), vc.data_ptr(), KV_TYPES[kc.dtype],
                        tok_seq.data_ptr(), tok_pos.data_ptr(), slots.data_ptr(), slots.shape[1], n, hq, kc.shape[1], d,
                        scale, window, softcap, sink.data_ptr() if sink is not None else None,
                        lse.data_ptr() if lse is not None else None, torch.get_num_threads(), MIN_SPLIT)
    return out


def write_kv(k_new: torch.Tensor, v_new: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """kc[slot_mapping[t]] = k_new[t] (and V), converted to the cache's dtype as `.to()` does: one C pass
    instead of two index_copy_ and their dtype copies. k_new/v_new [T, Hkv, D], read in place when each row's
    heads lie contiguous and K and V share a row stride (views into packed QKV rows)."""
    lib = load()
    assert lib is not None
    k, v = _rows(k_new), _rows(v_new)
    if k.stride(0) != v.stride(0) or k.dtype != v.dtype:
        k, v = k.contiguous(), v.contiguous()
    assert kc.is_contiguous() and vc.is_contiguous() and slot_mapping.dtype == torch.int64
    sm = slot_mapping.contiguous()
    lib.write_kv(k.data_ptr(), v.data_ptr(), k.stride(0), int(k.dtype == torch.bfloat16), kc.data_ptr(), vc.data_ptr(),
                 KV_TYPES[kc.dtype], sm.data_ptr(), sm.numel(), kc.shape[1] * kc.shape[2])


def has_block_attention(kc: torch.Tensor | None = None) -> bool:
    """Whether the kernel has `block_attention` (built with AVX-512, or AVX2 + FMA: attention_block_avx2.c), and, given
    the cache `kc`, whether it reads that cache (fp32 or bf16: an fp8 cache's long chunks go through torch)."""
    lib = load()
    return (lib is not None and hasattr(lib, "block_attention")
            and (kc is None or kc.dtype in (torch.float32, torch.bfloat16)))


def block_uses_pairs() -> bool:
    """Whether block_attention computes bf16 inputs as bf16 pair dot products in this process (P rounded to bf16),
    rather than widened to fp32 (AVX-512 only: measured once, or MODELCALL_BLOCK_PAIRS=1 / 0; attention_block.c)."""
    lib = load()
    return lib is not None and hasattr(lib, "block_pairs") and bool(lib.block_pairs())


def block_attention(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, slots: torch.Tensor,
                    scale: float, last_key: torch.Tensor | None = None,
                    with_lse: bool = True, out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """([m, Hq, D] output, [m, Hq] fp32 log-sum-exp or None): the m query rows `q` ([m, Hq, D]) over the keys at
    the cache slots `slots` ([L] int64); row r sees keys 0..last_key[r] (int64 [m]; None: all of them). The output
    is written into `out` (contiguous, fp32 or bf16) when given, else into a new fp32 tensor."""
    lib = load()
    assert lib is not None and kc.dtype in (torch.float32, torch.bfloat16)
    m, hq, d = q.shape
    # NOTE: bf16 queries over a bf16 cache are read as bf16 pairs (the dot products' own operands): no fp32 copy
    pairs = q.dtype == torch.bfloat16 and kc.dtype == torch.bfloat16 and d % 2 == 0
    qb = q.contiguous() if pairs else None
    qf = None if pairs else q.float().contiguous()
    if out is None:
        out = torch.empty(m, hq, d)
    assert out.is_contiguous() and out.shape == q.shape and out.dtype in (torch.float32, torch.bfloat16)
    lse = torch.empty(m, hq) if with_lse else None
    slots = slots.contiguous()
    lib.block_attention(qf.data_ptr() if qf is not None else None, qb.data_ptr() if qb is not None else None,
                        out.data_ptr(), int(out.dtype == torch.bfloat16), lse.data_ptr() if lse is not None else None,
                        kc.data_ptr(), vc.data_ptr(), int(kc.dtype == torch.bfloat16), slots.data_ptr(), slots.numel(),
                        last_key.data_ptr() if last_key is not None else None, m, hq, kc.shape[1], d, scale,
                        torch.get_num_threads())
    return out, lse


def bind_threads(cpus: list[int]) -> bool:
    """Pin the calling thread and its OpenMP team (torch's intra-op threads) one per CPU in `cpus`.

    On a shared machine an unpinned compute thread got about half a core here while a pinned one
    got all of it (W1: 410 -> 770 tok/s on one thread); vLLM's CPU backend pins the same way.
    """
    lib = load()
    if lib is None or not cpus:
        return False
    arr = (ctypes.c_int * len(cpus))(*cpus)
    return lib.bind_threads(arr, len(cpus)) == len(cpus)
