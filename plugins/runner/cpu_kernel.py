"""A small C kernel for paged attention on CPU, compiled on first use and called through ctypes.

Why: the portable path gathers every request's context out of the block pool into a padded copy
before attention (read + write + read again of every cached byte, per layer, per step). At W1's
decode shapes that copy costs more than the attention itself; this kernel reads each K/V row once,
straight from its slot. It is plain C (no torch headers: builds in about a second), parallel over
tokens with OpenMP, fp32 or bf16 K/V, fp32 math. Without a C compiler the runner keeps
the portable path. The layer's variant rides along: a sliding window (keys pos-W+1..pos only),
logit soft-capping (s = cap * tanh(s / cap)) and per-head sink logits that join the softmax.

    for each token t (in parallel):           keys max(0, pos[t]-W+1)..pos[t] of t's request, by slot
        for each context slot j: K[slot(j)] is one run of Hkv*D values (every head): read once
            scores[hh][j] = q[t, hh] · K[slot(j), hh // G] * scale      G = Hq / Hkv share a K/V head
        out[t, hh] = softmax(scores[hh]) @ V[slot(.), hh // G]
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import subprocess
import sys
import tempfile
import threading

import torch

log = logging.getLogger("modelcall.runner")

SOURCE = r"""
#define _GNU_SOURCE
#include <sched.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#define PF_AHEAD 4
#ifndef PF_BLOCKS
#define PF_BLOCKS 2
#endif
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

/* One K/V row (d values, fp32 or bf16 bits) of slot `row` as fp32 into dst. */
static inline void load_row(float *dst, const void *base, int64_t row, int64_t d, int bf16) {
    if (bf16) {
        const uint16_t *src = (const uint16_t *)base + row * d;
        for (int64_t i = 0; i < d; i++) {
            uint32_t u = (uint32_t)src[i] << 16;
            memcpy(&dst[i], &u, 4);
        }
    } else {
        memcpy(dst, (const float *)base + row * d, (size_t)d * 4);
    }
}

#if defined(__AVX512F__)
static inline __m512 load16(const void *base, int64_t off, int bf16) {
    if (bf16) {
        __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)base + off));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    return _mm512_loadu_ps((const float *)base + off);
}
#endif

#if defined(__AVX512F__)
/* out[k] = sum of v[k]'s 16 lanes: four rounds of shuffles and adds, then one permutation. */
static inline __m512 hsum16(__m512 *v) {
    __m512 w[8], x[4], y[2];
    for (int i = 0; i < 8; i++)
        w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
    for (int i = 0; i < 4; i++)
        x[i] = _mm512_add_ps(_mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], 0xDD));
    for (int i = 0; i < 2; i++)
        y[i] = _mm512_add_ps(_mm512_shuffle_ps(x[2 * i], x[2 * i + 1], 0x44),
                             _mm512_shuffle_ps(x[2 * i], x[2 * i + 1], 0xEE));
    const __m512 z = _mm512_add_ps(_mm512_shuffle_ps(y[0], y[1], 0x88), _mm512_shuffle_ps(y[0], y[1], 0xDD));
    /* z[4 * L + e] holds key 4 * e + L's sum (L: 128-bit lane) */
    const __m512i idx = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
    return _mm512_permutexvar_ps(idx, z);
}

/* softmax of each head's `len` scores (rows of `scores`), in place */
static inline void softmax_rows(float *scores, int64_t hq, int64_t len) {
    for (int64_t hh = 0; hh < hq; hh++) {
        float *sc = scores + hh * len;
        float m = -INFINITY, sum = 0.f;
        for (int64_t j = 0; j < len; j++) m = sc[j] > m ? sc[j] : m;
        for (int64_t j = 0; j < len; j++) { sc[j] = expf(sc[j] - m); sum += sc[j]; }
        const float inv = 1.f / sum;
        for (int64_t j = 0; j < len; j++) sc[j] *= inv;
    }
}

#if defined(__AVX512BF16__)
/* 16 fp32 partial sums of q . k over d bf16 values (d % 32 == 0); their sum is the dot product */
static inline __m512 dot_bf16(const uint16_t *q, const uint16_t *k, int64_t d) {
    __m512 a = _mm512_setzero_ps();
    for (int64_t w = 0; w < d; w += 32)
        a = _mm512_dpbf16_ps(a, (__m512bh)_mm512_loadu_si512((const void *)(q + w)),
                             (__m512bh)_mm512_loadu_si512((const void *)(k + w)));
    return a;
}
#endif

/* The scores of 16 keys (rows sl[0..16)) against one query head: fp32 math, or bf16 pairs (q and K both bf16). */
static inline __m512 dot16(const float *qq, const uint16_t *qb, const void *kc, int bf16, const int64_t *sl,
                           int64_t rowlen, int64_t off, int64_t d) {
    __m512 acc[16];
#if defined(__AVX512BF16__)
    if (qb) {
        for (int k = 0; k < 16; k++) acc[k] = dot_bf16(qb, (const uint16_t *)kc + sl[k] * rowlen + off, d);
        return hsum16(acc);
    }
#endif
    for (int k = 0; k < 16; k++) {
        const int64_t base = sl[k] * rowlen + off;
        __m512 a = _mm512_mul_ps(_mm512_loadu_ps(qq), load16(kc, base, bf16));
        for (int64_t v = 16; v < d; v += 16) a = _mm512_fmadd_ps(_mm512_loadu_ps(qq + v), load16(kc, base + v, bf16), a);
        acc[k] = a;
    }
    return hsum16(acc);
}

/* attend() for d % 16 == 0, d <= 256: keys in blocks of 16 (one block of the cache when block_size is 16), every
 * head's scores of a block from one transposing reduction instead of one horizontal sum per key and head; the
 * weighted sum of V keeps each head's output in registers over a block. */
static void attend_vec(const float *qt, const uint16_t *qbt, float *ot, const void *kc, const void *vc, int bf16,
                       const int64_t *sl, int64_t len, int64_t hq, int64_t hkv, int64_t d, float scale,
                       float *scores) {
    const int64_t g = hq / hkv, rowlen = hkv * d, es = bf16 ? 2 : 4, nv = d / 16;
    const int64_t full = len & ~(int64_t)15;
    const __m512 vs = _mm512_set1_ps(scale);
    for (int64_t j0 = 0; j0 < full; j0 += 16) {
        for (int64_t k = j0 + 16 * PF_BLOCKS; k < j0 + 16 * PF_BLOCKS + 16 && k < len; k++)   /* every line, early */
            for (int64_t b = 0; b < rowlen * es; b += 64) __builtin_prefetch((const char *)kc + sl[k] * rowlen * es + b);
        for (int64_t hh = 0; hh < hq; hh++)
            _mm512_storeu_ps(scores + hh * len + j0,
                             _mm512_mul_ps(dot16(qt + hh * d, qbt ? qbt + hh * d : NULL, kc, bf16, sl + j0, rowlen,
                                                 (hh / g) * d, d), vs));
    }
    for (int64_t j = full; j < len; j++)
        for (int64_t hh = 0; hh < hq; hh++) {
            const int64_t base = sl[j] * rowlen + (hh / g) * d;
            __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(qt + hh * d), load16(kc, base, bf16));
            for (int64_t v = 16; v < d; v += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(qt + hh * d + v), load16(kc, base + v, bf16), acc);
            scores[hh * len + j] = _mm512_reduce_add_ps(acc) * scale;
        }
    softmax_rows(scores, hq, len);
    memset(ot, 0, sizeof(float) * (size_t)(hq * d));
    for (int64_t j0 = 0; j0 < len; j0 += 16) {
        const int64_t j1 = j0 + 16 < len ? j0 + 16 : len;
        for (int64_t k = j0 + 16 * PF_BLOCKS; k < j0 + 16 * PF_BLOCKS + 16 && k < len; k++)
            for (int64_t b = 0; b < rowlen * es; b += 64) __builtin_prefetch((const char *)vc + sl[k] * rowlen * es + b);
        for (int64_t hh = 0; hh < hq; hh++) {
            __m512 o[16];
            float *op = ot + hh * d;
            const float *sc = scores + hh * len;
            const int64_t off = (hh / g) * d;
            for (int64_t v = 0; v < nv; v++) o[v] = _mm512_loadu_ps(op + 16 * v);
            for (int64_t j = j0; j < j1; j++) {
                const __m512 p = _mm512_set1_ps(sc[j]);
                const int64_t base = sl[j] * rowlen + off;
                for (int64_t v = 0; v < nv; v++) o[v] = _mm512_fmadd_ps(p, load16(vc, base + 16 * v, bf16), o[v]);
            }
            for (int64_t v = 0; v < nv; v++) _mm512_storeu_ps(op + 16 * v, o[v]);
        }
    }
}
#endif

#if defined(__AVX512BF16__)
/* attend_vec for bf16 queries over a bf16 cache, reading memory in order: each slot's K row (every head's keys,
 * hkv*d contiguous values) is read once, front to back, its per-head partial dot products parked in `part`
 * ([hq][16 keys][16 lanes], in L1) and reduced 16 keys at a time; V likewise row by row into `ot`. Reading a block
 * head by head (attend_vec) walks it at a stride of one row per key, which streamed K/V at ~6 GB/s here. */
static void attend_rows_bf16(const uint16_t *qb, float *ot, const uint16_t *kc, const uint16_t *vc,
                             const int64_t *sl, int64_t len, int64_t hq, int64_t hkv, int64_t d, float scale,
                             float *scores, float *part) {
    const int64_t g = hq / hkv, rowlen = hkv * d, full = len & ~(int64_t)15;
    const __m512 vs = _mm512_set1_ps(scale);
    for (int64_t j0 = 0; j0 < full; j0 += 16) {
        for (int64_t k = 0; k < 16; k++) {
            const uint16_t *kr = kc + sl[j0 + k] * rowlen;
            for (int64_t hh = 0; hh < hq; hh++) {
                const uint16_t *kh = kr + (hh / g) * d, *qh = qb + hh * d;
                _mm512_storeu_ps(part + (hh * 16 + k) * 16, dot_bf16(qh, kh, d));
            }
        }
        for (int64_t hh = 0; hh < hq; hh++) {
            __m512 v[16];
            for (int k = 0; k < 16; k++) v[k] = _mm512_loadu_ps(part + (hh * 16 + k) * 16);
            _mm512_storeu_ps(scores + hh * len + j0, _mm512_mul_ps(hsum16(v), vs));
        }
    }
    for (int64_t j = full; j < len; j++) {
        const uint16_t *kr = kc + sl[j] * rowlen;
        for (int64_t hh = 0; hh < hq; hh++) {
            const uint16_t *kh = kr + (hh / g) * d, *qh = qb + hh * d;
            scores[hh * len + j] = _mm512_reduce_add_ps(dot_bf16(qh, kh, d)) * scale;
        }
    }
    softmax_rows(scores, hq, len);
    memset(ot, 0, sizeof(float) * (size_t)(hq * d));
    for (int64_t j = 0; j < len; j++) {
        const uint16_t *vr = vc + sl[j] * rowlen;
        for (int64_t hh = 0; hh < hq; hh++) {
            const __m512 p = _mm512_set1_ps(scores[hh * len + j]);
            const uint16_t *vh = vr + (hh / g) * d;
            float *o = ot + hh * d;
            for (int64_t v = 0; v < d; v += 16)
                _mm512_storeu_ps(o + v, _mm512_fmadd_ps(p, load16(vh, v, 1), _mm512_loadu_ps(o + v)));
        }
    }
}
#endif

/* One query token over its whole context, all heads at once: for each context slot the K (then V)
 * rows of every head are one contiguous run of hkv*d values, so the reads stream through memory.
 * scores[hh*len + j] = q_hh . K[j, hh / g] * scale; softmax over j; out_hh = sum_j p_j V[j, hh / g]. */
static void attend(const float *qt, float *ot, const void *kc, const void *vc, int bf16, const int64_t *sl,
                   int64_t len, int64_t hq, int64_t hkv, int64_t d, float scale, float softcap,
                   const float *sinks, float *scores, float *row) {
    const int64_t g = hq / hkv, rowlen = hkv * d;
#if defined(__AVX512F__)
    const int vec = d % 16 == 0 && d <= 256;
#else
    const int vec = 0;
#endif
    for (int64_t j = 0; j < len; j++) {
        const int64_t base = sl[j] * rowlen;
        if (j + PF_AHEAD < len) {  /* the next rows sit in another block, somewhere else: ask early */
            const char *nk = (const char *)kc + sl[j + PF_AHEAD] * rowlen * (bf16 ? 2 : 4);
            for (int64_t b = 0; b < rowlen * (bf16 ? 2 : 4); b += 64) __builtin_prefetch(nk + b);
        }
        for (int64_t h = 0; h < hkv; h++) {
#if defined(__AVX512F__)
            if (vec) {
                const int64_t nv = d / 16;
                __m512 k[16];
                for (int64_t v = 0; v < nv; v++) k[v] = load16(kc, base + h * d + 16 * v, bf16);
                for (int64_t gi = 0; gi < g; gi++) {
                    const float *qq = qt + (h * g + gi) * d;
                    __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(qq), k[0]);
                    for (int64_t v = 1; v < nv; v++) acc = _mm512_fmadd_ps(_mm512_loadu_ps(qq + 16 * v), k[v], acc);
                    scores[(h * g + gi) * len + j] = _mm512_reduce_add_ps(acc) * scale;
                }
                continue;
            }
#endif
            load_row(row, kc, sl[j] * hkv + h, d, bf16);
            for (int64_t gi = 0; gi < g; gi++) {
                const float *qq = qt + (h * g + gi) * d;
                float s = 0.f;
                for (int64_t i = 0; i < d; i++) s += qq[i] * row[i];
                scores[(h * g + gi) * len + j] = s * scale;
            }
        }
    }
    for (int64_t hh = 0; hh < hq; hh++) {
        float *sc = scores + hh * len;
        if (softcap > 0.f)
            for (int64_t j = 0; j < len; j++) sc[j] = softcap * tanhf(sc[j] / softcap);
        float m = sinks ? sinks[hh] : -INFINITY, sum = 0.f;
        for (int64_t j = 0; j < len; j++) m = sc[j] > m ? sc[j] : m;
        if (sinks) sum = expf(sinks[hh] - m);  /* the sink takes its share of the mass, then is dropped */
        for (int64_t j = 0; j < len; j++) { sc[j] = expf(sc[j] - m); sum += sc[j]; }
        const float inv = 1.f / sum;
        for (int64_t j = 0; j < len; j++) sc[j] *= inv;
    }
    memset(ot, 0, sizeof(float) * (size_t)(hq * d));
    for (int64_t j = 0; j < len; j++) {
        const int64_t base = sl[j] * rowlen;
        if (j + PF_AHEAD < len) {
            const char *nv = (const char *)vc + sl[j + PF_AHEAD] * rowlen * (bf16 ? 2 : 4);
            for (int64_t b = 0; b < rowlen * (bf16 ? 2 : 4); b += 64) __builtin_prefetch(nv + b);
        }
        for (int64_t h = 0; h < hkv; h++) {
#if defined(__AVX512F__)
            if (vec) {
                const int64_t nv = d / 16;
                __m512 v16[16];
                for (int64_t v = 0; v < nv; v++) v16[v] = load16(vc, base + h * d + 16 * v, bf16);
                for (int64_t gi = 0; gi < g; gi++) {
                    const __m512 p = _mm512_set1_ps(scores[(h * g + gi) * len + j]);
                    float *o = ot + (h * g + gi) * d;
                    for (int64_t v = 0; v < nv; v++)
                        _mm512_storeu_ps(o + 16 * v, _mm512_fmadd_ps(p, v16[v], _mm512_loadu_ps(o + 16 * v)));
                }
                continue;
            }
#endif
            load_row(row, vc, sl[j] * hkv + h, d, bf16);
            for (int64_t gi = 0; gi < g; gi++) {
                const float p = scores[(h * g + gi) * len + j];
                float *o = ot + (h * g + gi) * d;
                for (int64_t i = 0; i < d; i++) o[i] += p * row[i];
            }
        }
    }
}

/* Pin the calling thread and the OpenMP team it leads (torch's too: one runtime) to cpus[0..n).
 * Returns how many threads were pinned. */
int bind_threads(const int *cpus, int n) {
    int ok = 0;
    #pragma omp parallel num_threads(n) reduction(+:ok)
    {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(cpus[omp_get_thread_num()], &set);
        ok += sched_setaffinity(0, sizeof(set), &set) == 0;
    }
    return ok;
}

void paged_attention(const float *q, const uint16_t *qb, float *out, const void *kc, const void *vc, int bf16,
                     const int64_t *tok_seq, const int64_t *tok_pos, const int64_t *slots, int64_t max_ctx,
                     int64_t n, int64_t hq, int64_t hkv, int64_t d, float scale, int64_t window,
                     float softcap, const float *sinks, int nthreads) {
    #pragma omp parallel num_threads(nthreads)
    {
        /* per-thread scratch: every head's scores over the longest context, one row, 16 keys' partial dots per head */
        float *scores = (float *)malloc(sizeof(float) * (size_t)(hq * max_ctx + d + hq * 256));
        #pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < n; t++) {
            const int64_t len = tok_pos[t] + 1, first = window > 0 && len > window ? len - window : 0;
#if defined(__AVX512F__)
#if defined(__AVX512BF16__)
            if (qb && bf16 && d % 32 == 0 && softcap == 0.f && !sinks) {
                attend_rows_bf16(qb + t * hq * d, out + t * hq * d, (const uint16_t *)kc, (const uint16_t *)vc,
                                 slots + tok_seq[t] * max_ctx + first, len - first, hq, hkv, d, scale, scores,
                                 scores + hq * max_ctx + d);
                continue;
            }
#endif
            if (d % 16 == 0 && d <= 256 && softcap == 0.f && !sinks) {
                attend_vec(q + t * hq * d, qb && d % 32 == 0 ? qb + t * hq * d : NULL, out + t * hq * d, kc, vc, bf16,
                           slots + tok_seq[t] * max_ctx + first, len - first, hq, hkv, d, scale, scores);
                continue;
            }
#endif
            attend(q + t * hq * d, out + t * hq * d, kc, vc, bf16, slots + tok_seq[t] * max_ctx + first, len - first,
                   hq, hkv, d, scale, softcap, sinks, scores, scores + hq * max_ctx);
        }
        free(scores);
    }
}
"""

_lib: ctypes.CDLL | None = None
_tried = False
_lock = threading.Lock()


def _cache_dir() -> str:
    root = os.environ.get("MODELCALL_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "modelcall")
    return os.path.join(root, "kernels")


def _build() -> ctypes.CDLL | None:
    cc = os.environ.get("CC", "cc")
    flags = ["-O3", "-march=native", "-ffast-math", "-fopenmp", "-shared", "-fPIC"]
    key = hashlib.sha256("\0".join([SOURCE, cc, *flags, "-lm", platform.machine(), sys.platform]).encode()).hexdigest()[:16]
    out_dir = _cache_dir()
    lib_path = os.path.join(out_dir, f"paged_attention_{key}.so")
    if not os.path.exists(lib_path):
        os.makedirs(out_dir, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
            src = os.path.join(tmp, "paged_attention.c")
            with open(src, "w") as f:
                f.write(SOURCE)
            tmp_lib = os.path.join(tmp, "lib.so")
            subprocess.run([cc, *flags, src, "-o", tmp_lib, "-lm"], check=True, capture_output=True, timeout=120)
            os.replace(tmp_lib, lib_path)   # atomic: concurrent builders never see half a file
    lib = ctypes.CDLL(lib_path)
    fn = lib.paged_attention
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    fn.argtypes = [p, p, p, p, p, ctypes.c_int, p, p, p, i64, i64, i64, i64, i64, ctypes.c_float, i64, ctypes.c_float,
                   p, ctypes.c_int]
    fn.restype = None
    lib.bind_threads.argtypes = [p, ctypes.c_int]
    lib.bind_threads.restype = ctypes.c_int
    return lib


def load() -> ctypes.CDLL | None:
    """The compiled kernel, or None when it cannot be built here (no compiler, not x86/arm Linux...)."""
    global _lib, _tried
    if not _tried:
        with _lock:
            if not _tried:
                if os.environ.get("MODELCALL_CPU_KERNEL", "1") != "0":
                    try:
                        _lib = _build()
                    except Exception as e:  # no compiler, or it failed: the portable path still works
                        log.warning("CPU paged-attention kernel unavailable (%s); using the portable path", e)
                _tried = True
    return _lib


def usable(q_rows: torch.Tensor, kc: torch.Tensor) -> bool:
    return (q_rows.device.type == "cpu" and q_rows.dtype in (torch.float32, torch.bfloat16)
            and kc.dtype in (torch.float32, torch.bfloat16) and load() is not None)


def paged_attention(q_rows: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, step, scale: float, window: int = 0,
                    softcap: float = 0.0, sinks: torch.Tensor | None = None,
                    slots: torch.Tensor | None = None) -> torch.Tensor:
    """[n, Hq, D] attention of the paged group's tokens (cache [slots, Hkv, D]); math in fp32. `window` 0 and
    `softcap` 0 mean none; `sinks` is one logit per query head or None."""
    lib = load()
    assert lib is not None
    q = q_rows.float().contiguous()
    n, hq, d = q.shape
    out = torch.empty_like(q)
    slots = step.paged_slots if slots is None else slots   # [S, max_ctx] of the layer's KV group
    sink = sinks.detach().float().contiguous() if sinks is not None else None
    # bf16 queries over a bf16 cache: the C kernel's scores take bf16 pair dot products (AVX512-BF16) of the
    # same bits (bf16 x bf16 products are exact in fp32), read from this copy
    qb = q_rows.contiguous() if q_rows.dtype == torch.bfloat16 and kc.dtype == torch.bfloat16 else None
    lib.paged_attention(q.data_ptr(), qb.data_ptr() if qb is not None else None, out.data_ptr(), kc.data_ptr(), vc.data_ptr(), int(kc.dtype == torch.bfloat16),
                        step.paged_token_seq.data_ptr(), step.paged_token_pos.data_ptr(), slots.data_ptr(),
                        slots.shape[1], n, hq, kc.shape[1], d, scale, window, softcap,
                        sink.data_ptr() if sink is not None else None, torch.get_num_threads())
    return out.to(q_rows.dtype)


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
