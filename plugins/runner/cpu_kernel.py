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

With AVX-512, `block_attention` takes many query rows over one run of keys at once (a long prefill chunk, or the
rows sharing a cached prefix: cascade.py): per KV head, K and V are converted once and met by 32 query lanes at a
time as two register-tiled GEMMs; 1.5-2.2x torch's CPU flash attention at prefill shapes (one thread, bf16).
Either path can return each head's log-sum-exp, so two parts of one softmax can be merged.
"""
from __future__ import annotations

import ctypes

import torch

from modelcall.plugins.runner import cbuild


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
        int64_t i = 0;
#if defined(__AVX512F__)
        for (; i + 16 <= d; i += 16)
            _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(
                _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(src + i))), 16)));
#endif
        for (; i < d; i++) {
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

/* softmax of each head's `len` scores (rows of `scores`), in place; with `lse`, each head's log-sum-exp of its
 * scores there (lse[hh] = max + log(sum of exp(s - max))): what merging with another part's softmax needs */
static inline void softmax_rows(float *scores, int64_t hq, int64_t len, float *lse) {
    for (int64_t hh = 0; hh < hq; hh++) {
        float *sc = scores + hh * len;
        float m = -INFINITY, sum = 0.f;
        for (int64_t j = 0; j < len; j++) m = sc[j] > m ? sc[j] : m;
        for (int64_t j = 0; j < len; j++) { sc[j] = expf(sc[j] - m); sum += sc[j]; }
        const float inv = 1.f / sum;
        for (int64_t j = 0; j < len; j++) sc[j] *= inv;
        if (lse) lse[hh] = m + logf(sum);
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
                       float *scores, float *lse) {
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
    softmax_rows(scores, hq, len, lse);
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
                             float *scores, float *part, float *lse) {
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
    softmax_rows(scores, hq, len, lse);
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
                   const float *sinks, float *scores, float *row, float *lse) {
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
        if (lse) lse[hh] = m + logf(sum);   /* the sink's term included */
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

#if defined(__AVX512F__)
/* e^x for 16 lanes (x <= 0 here: scores minus their maximum), |relative error| ~1e-7: x = n ln2 + r, |r| <= ln2/2,
 * e^r by its Taylor polynomial to r^7, times 2^n */
static inline __m512 exp16(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
    __m512 p = _mm512_set1_ps(1.f / 5040.f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 720.f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120.f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24.f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6.f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
    return _mm512_scalef_ps(p, n);
}

/* dst[k][0..32) = sum over t < n of b[k * ks + t * ts] * v[t][0..32), for k < nk <= 8: 8 x 32 accumulators in
 * registers, one row of v loaded per t, each b value broadcast into its FMA (block_attention's two GEMMs) */
static inline void tile8x32(const float *b, int64_t ks, int64_t ts, int64_t nk, const float *v, int64_t n,
                            float *dst) {
    __m512 a[8][2];
    for (int k = 0; k < 8; k++) a[k][0] = a[k][1] = _mm512_setzero_ps();
    for (int64_t t = 0; t < n; t++) {
        const __m512 v0 = _mm512_load_ps(v + t * 32), v1 = _mm512_load_ps(v + t * 32 + 16);
        for (int k = 0; k < 8; k++) {
            const __m512 x = _mm512_set1_ps(b[(k < nk ? k : 0) * ks + t * ts]);
            a[k][0] = _mm512_fmadd_ps(x, v0, a[k][0]);
            a[k][1] = _mm512_fmadd_ps(x, v1, a[k][1]);
        }
    }
    for (int k = 0; k < nk; k++) {
        _mm512_store_ps(dst + k * 32, a[k][0]);
        _mm512_store_ps(dst + k * 32 + 16, a[k][1]);
    }
}

#if defined(__AVX512BF16__)
/* tile8x32 on bf16 pairs: dst[k][0..32) = scale * sum over t < n of pair rows[k][t * ts] . pair v[t][0..32) (each
 * 32-bit value two bf16), AVX512-BF16 dot products: S = K Q^T (keys straight from a bf16 cache, query pairs along
 * the head dim; bf16 x bf16 products are exact in fp32) and O^T = V^T P (V and P paired along the keys) */
static inline void tile8x32_bf16(const uint32_t *const *rows, int64_t ts, int64_t nk, const uint32_t *v, int64_t n,
                                 float scale, float *dst) {
    __m512 a[8][2];
    for (int k = 0; k < 8; k++) a[k][0] = a[k][1] = _mm512_setzero_ps();
    for (int64_t p = 0; p < n; p++) {
        const __m512bh q0 = (__m512bh)_mm512_load_si512((const void *)(v + p * 32));
        const __m512bh q1 = (__m512bh)_mm512_load_si512((const void *)(v + p * 32 + 16));
        for (int k = 0; k < 8; k++) {
            const __m512bh x = (__m512bh)_mm512_set1_epi32((int)rows[k < nk ? k : 0][p * ts]);
            a[k][0] = _mm512_dpbf16_ps(a[k][0], x, q0);
            a[k][1] = _mm512_dpbf16_ps(a[k][1], x, q1);
        }
    }
    const __m512 vs = _mm512_set1_ps(scale);
    for (int k = 0; k < nk; k++) {
        _mm512_store_ps(dst + k * 32, _mm512_mul_ps(a[k][0], vs));
        _mm512_store_ps(dst + k * 32 + 16, _mm512_mul_ps(a[k][1], vs));
    }
}
#endif

/* Attention of a block of query rows over one run of keys (slots sl[0..len)), as two small GEMMs per KV head with
 * the queries along the vector lanes, so each K/V value is converted once and used by every query of its head from
 * registers. Row r sees keys 0..lim[r] (lim NULL: all): the shared prefix of cascade.py (every row, every key) and
 * long prefill chunks (row r at position start + r of its request, causal).
 *   Kf, Vf [len][d] fp32: the head's keys and values
 *   for each tile of 32 lanes (lane = row r, group head gi: i = r * g + gi; keys up to the tile's last lim):
 *     S[j][lane] = Kf[j] . Qt[.][lane] * scale, masked past lim; P = e^(S - max), sum; lse = max + log(sum)
 *     Ot[e][lane] = sum_j Vf[j][e] P[j][lane];  out[r][h*g+gi] = Ot[.][lane] / sum
 * fp32 math throughout (the products of bf16 values are exact in fp32), like the row-by-row paths. With bf16 queries
 * (qb) over a bf16 cache, S comes from AVX512-BF16 pair dot products of the cache's own bits (no Kf). */
void block_attention(const float *q, const uint16_t *qb, float *out, float *lse, const void *kc, const void *vc,
                     int bf16,
                     const int64_t *sl, int64_t len, const int64_t *lim, int64_t m, int64_t hq, int64_t hkv, int64_t d,
                     float scale, int nthreads) {
    const int64_t g = hq / hkv, mq = m * g, kp = (len + 1) / 2;
#if defined(__AVX512BF16__)
    /* bf16 queries over a bf16 cache: both GEMMs on bf16 pairs; P is rounded to bf16 for O = P V, as torch's flash
     * attention does for bf16 (the sums and the softmax stay fp32). First, in one pass over the cache rows in order
     * (each slot's K and V rows read whole, front to back), every head's keys next to each other, kall[h][j][d], and
     * its values paired along the keys, vall[h][j/2][e] = V[j][e] | V[j+1][e] << 16 (a zero row past the end):
     * reading them head by head from the cache took one 2*d-byte piece of each row per head, about half the time
     * of a shared-prefix call when the rows came from memory. */
    const int pairs = qb && bf16 && d % 2 == 0;
    uint16_t *kall = pairs ? (uint16_t *)malloc(sizeof(uint16_t) * (size_t)(hkv * len * d)) : NULL;
    uint32_t *vall = pairs ? (uint32_t *)malloc(sizeof(uint32_t) * (size_t)(hkv * kp * d)) : NULL;
    if (pairs) {
        #pragma omp parallel for num_threads(nthreads) schedule(static)
        for (int64_t jp = 0; jp < kp; jp++) {
            const int64_t j0 = 2 * jp, j1 = 2 * jp + 1;
            const uint16_t *k0 = (const uint16_t *)kc + sl[j0] * hkv * d, *v0 = (const uint16_t *)vc + sl[j0] * hkv * d;
            const uint16_t *k1 = j1 < len ? (const uint16_t *)kc + sl[j1] * hkv * d : NULL;
            const uint16_t *v1 = j1 < len ? (const uint16_t *)vc + sl[j1] * hkv * d : NULL;
            for (int64_t h = 0; h < hkv; h++) {
                memcpy(kall + (h * len + j0) * d, k0 + h * d, sizeof(uint16_t) * (size_t)d);
                if (k1) memcpy(kall + (h * len + j1) * d, k1 + h * d, sizeof(uint16_t) * (size_t)d);
                uint32_t *vp = vall + (h * kp + jp) * d;
                int64_t e = 0;
                for (; e + 16 <= d; e += 16) {
                    const __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(v0 + h * d + e)));
                    const __m512i hi = v1 ? _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(v1 + h * d + e)))
                                          : _mm512_setzero_si512();
                    _mm512_storeu_si512((void *)(vp + e), _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
                }
                for (; e < d; e++) vp[e] = (uint32_t)v0[h * d + e] | (v1 ? (uint32_t)v1[h * d + e] << 16 : 0u);
            }
        }
    }
#else
    const int pairs = 0;
#endif
    #pragma omp parallel for num_threads(nthreads) schedule(static, 1)
    for (int64_t h = 0; h < hkv; h++) {
        /* lenp: every buffer below starts 64-byte aligned (the tiles' aligned loads) */
        const int64_t lenp = (len + 15) & ~(int64_t)15;
        float *kf = (float *)aligned_alloc(64, sizeof(float) * (size_t)(2 * lenp * d + 2 * d * 32 + lenp * 32
                                                                           + lenp * 16 + 64));
        float *vf = kf + lenp * d, *qt = vf + lenp * d, *ot = qt + d * 32, *s = ot + d * 32, *mx = s + lenp * 32;
        float *sum = mx + 32;   /* then pp: P paired along the keys, [kp][32] */
#if defined(__AVX512BF16__)
        uint32_t *qp = (uint32_t *)qt, *pp = (uint32_t *)(mx + 64);
        const uint16_t *kh = pairs ? kall + h * len * d : NULL;
        const uint32_t *vp = pairs ? vall + h * kp * d : NULL;
#endif
        for (int64_t j = 0; j < len && !pairs; j++) {
            load_row(kf + j * d, kc, sl[j] * hkv + h, d, bf16);
            load_row(vf + j * d, vc, sl[j] * hkv + h, d, bf16);
        }
        for (int64_t i0 = 0; i0 < mq; i0 += 32) {
            const int64_t nl = mq - i0 < 32 ? mq - i0 : 32;
            int32_t lane_lim[32];
            int64_t keys = 0;
            for (int64_t l = 0; l < 32; l++) {
                /* padding lanes (zero queries) see every key of the tile: finite, and dropped */
                const int64_t lv = l < nl ? (lim ? lim[(i0 + l) / g] : len - 1) : -2;
                lane_lim[l] = (int32_t)lv;
                keys = lv + 1 > keys ? lv + 1 : keys;
            }
            for (int64_t l = nl; l < 32; l++) lane_lim[l] = (int32_t)(keys - 1);
            if (!pairs) {
                memset(qt, 0, sizeof(float) * (size_t)(d * 32));
                for (int64_t l = 0; l < nl; l++) {
                    const int64_t i = i0 + l;
                    const float *qi = q + ((i / g) * hq + h * g + i % g) * d;
                    for (int64_t e = 0; e < d; e++) qt[e * 32 + l] = qi[e] * scale;
                }
            }
            /* S = K Q^T, 8 keys at a time */
#if defined(__AVX512BF16__)
            if (pairs) {
                memset(qp, 0, sizeof(uint32_t) * (size_t)(d / 2 * 32));
                for (int64_t l = 0; l < nl; l++) {
                    const int64_t i = i0 + l;
                    const uint32_t *qi = (const uint32_t *)(qb + ((i / g) * hq + h * g + i % g) * d);
                    for (int64_t p = 0; p < d / 2; p++) qp[p * 32 + l] = qi[p];
                }
                for (int64_t j0 = 0; j0 < keys; j0 += 8) {
                    const uint32_t *kr[8];
                    const int64_t nk = keys - j0 < 8 ? keys - j0 : 8;
                    for (int64_t k = 0; k < nk; k++)
                        kr[k] = (const uint32_t *)(kh + (j0 + k) * d);
                    tile8x32_bf16(kr, 1, nk, qp, d / 2, scale, s + j0 * 32);
                }
            } else
#endif
            for (int64_t j0 = 0; j0 < keys; j0 += 8)
                tile8x32(kf + j0 * d, d, 1, keys - j0 < 8 ? keys - j0 : 8, qt, d, s + j0 * 32);
            for (int64_t half = 0; half < 32; half += 16) {
                const __m512i lv = _mm512_loadu_si512((const void *)(lane_lim + half));
                int32_t lo = lane_lim[half];
                for (int l = 1; l < 16; l++) lo = lane_lim[half + l] < lo ? lane_lim[half + l] : lo;
                __m512 top = _mm512_set1_ps(-INFINITY), tot = _mm512_setzero_ps();
                for (int64_t j = 0; j < keys; j++) {   /* keys past a lane's lim: -inf, e^-inf = 0 */
                    __m512 x = _mm512_load_ps(s + j * 32 + half);
                    if (j > lo)
                        x = _mm512_mask_blend_ps(_mm512_cmpge_epi32_mask(lv, _mm512_set1_epi32((int32_t)j)),
                                                 _mm512_set1_ps(-INFINITY), x);
                    _mm512_store_ps(s + j * 32 + half, x);
                    top = _mm512_max_ps(top, x);
                }
                for (int64_t j = 0; j < keys; j++) {
                    const __m512 p = exp16(_mm512_sub_ps(_mm512_load_ps(s + j * 32 + half), top));
                    _mm512_store_ps(s + j * 32 + half, p);
                    tot = _mm512_add_ps(tot, p);
                }
                _mm512_store_ps(mx + half, top);
                _mm512_store_ps(sum + half, tot);
            }
            /* O^T = V^T P, 8 output dims at a time over the tile's keys */
#if defined(__AVX512BF16__)
            if (pairs) {
                const int64_t tp = (keys + 1) / 2;
                for (int64_t jp = 0; jp < tp; jp++)
                    for (int64_t half = 0; half < 32; half += 16) {
                        const __m512i p0 = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(_mm512_load_ps(s + 2 * jp * 32 + half)));
                        const __m512i p1 = 2 * jp + 1 < keys
                            ? _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(_mm512_load_ps(s + (2 * jp + 1) * 32 + half)))
                            : _mm512_setzero_si512();
                        _mm512_store_si512((void *)(pp + jp * 32 + half), _mm512_or_si512(p0, _mm512_slli_epi32(p1, 16)));
                    }
                for (int64_t e0 = 0; e0 < d; e0 += 8) {
                    const uint32_t *vr[8];
                    for (int k = 0; k < 8; k++) vr[k] = vp + e0 + (e0 + k < d ? k : 0);
                    tile8x32_bf16(vr, d, d - e0 < 8 ? d - e0 : 8, pp, tp, 1.f, ot + e0 * 32);
                }
            } else
#endif
            for (int64_t e0 = 0; e0 < d; e0 += 8)
                tile8x32(vf + e0, 1, d, d - e0 < 8 ? d - e0 : 8, s, keys, ot + e0 * 32);
            for (int64_t l = 0; l < nl; l++) {
                const int64_t i = i0 + l, at = (i / g) * hq + h * g + i % g;
                const float inv = 1.f / sum[l];
                for (int64_t e = 0; e < d; e++) out[at * d + e] = ot[e * 32 + l] * inv;
                if (lse) lse[at] = mx[l] + logf(sum[l]);
            }
        }
        free(kf);
    }
    free(kall);
    free(vall);
}
#endif

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
                     float softcap, const float *sinks, float *lse, int nthreads) {
    #pragma omp parallel num_threads(nthreads)
    {
        /* per-thread scratch: every head's scores over the longest context, one row, 16 keys' partial dots per head */
        float *scores = (float *)malloc(sizeof(float) * (size_t)(hq * max_ctx + d + hq * 256));
        #pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < n; t++) {
            const int64_t len = tok_pos[t] + 1, first = window > 0 && len > window ? len - window : 0;
            float *lt = lse ? lse + t * hq : NULL;
#if defined(__AVX512F__)
#if defined(__AVX512BF16__)
            if (qb && bf16 && d % 32 == 0 && softcap == 0.f && !sinks) {
                attend_rows_bf16(qb + t * hq * d, out + t * hq * d, (const uint16_t *)kc, (const uint16_t *)vc,
                                 slots + tok_seq[t] * max_ctx + first, len - first, hq, hkv, d, scale, scores,
                                 scores + hq * max_ctx + d, lt);
                continue;
            }
#endif
            if (d % 16 == 0 && d <= 256 && softcap == 0.f && !sinks) {
                attend_vec(q + t * hq * d, qb && d % 32 == 0 ? qb + t * hq * d : NULL, out + t * hq * d, kc, vc, bf16,
                           slots + tok_seq[t] * max_ctx + first, len - first, hq, hkv, d, scale, scores, lt);
                continue;
            }
#endif
            attend(q + t * hq * d, out + t * hq * d, kc, vc, bf16, slots + tok_seq[t] * max_ctx + first, len - first,
                   hq, hkv, d, scale, softcap, sinks, scores, scores + hq * max_ctx, lt);
        }
        free(scores);
    }
}
"""

def _declare(lib: ctypes.CDLL) -> None:
    fn = lib.paged_attention
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    fn.argtypes = [p, p, p, p, p, ctypes.c_int, p, p, p, i64, i64, i64, i64, i64, ctypes.c_float, i64, ctypes.c_float,
                   p, p, ctypes.c_int]
    fn.restype = None
    if hasattr(lib, "block_attention"):   # AVX-512 machines only
        lib.block_attention.argtypes = [p, p, p, p, p, p, ctypes.c_int, p, i64, p, i64, i64, i64, i64, ctypes.c_float,
                                        ctypes.c_int]
        lib.block_attention.restype = None
    lib.bind_threads.argtypes = [p, ctypes.c_int]
    lib.bind_threads.restype = ctypes.c_int


_LIB = cbuild.OnceLibrary("paged_attention", SOURCE, _declare, "using the portable path")


def load() -> ctypes.CDLL | None:
    """The compiled kernel, or None when it cannot be built here (no compiler, not x86/arm Linux...)."""
    return _LIB.get()


def usable(q_rows: torch.Tensor, kc: torch.Tensor) -> bool:
    return (q_rows.device.type == "cpu" and q_rows.dtype in (torch.float32, torch.bfloat16)
            and kc.dtype in (torch.float32, torch.bfloat16) and load() is not None)


def paged_attention(q_rows: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, step, scale: float, window: int = 0,
                    softcap: float = 0.0, sinks: torch.Tensor | None = None,
                    slots: torch.Tensor | None = None) -> torch.Tensor:
    """[n, Hq, D] attention of the paged group's tokens (cache [slots, Hkv, D]); math in fp32. `window` 0 and
    `softcap` 0 mean none; `sinks` is one logit per query head or None."""
    slots = step.paged_slots if slots is None else slots   # [S, max_ctx] of the layer's KV group
    out = attend_tokens(q_rows, kc, vc, step.paged_token_seq, step.paged_token_pos, slots, scale, window, softcap,
                        sinks)
    return out.to(q_rows.dtype)


def attend_tokens(q_rows: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, tok_seq: torch.Tensor,
                  tok_pos: torch.Tensor, slots: torch.Tensor, scale: float, window: int = 0, softcap: float = 0.0,
                  sinks: torch.Tensor | None = None, lse: torch.Tensor | None = None) -> torch.Tensor:
    """[n, Hq, D] fp32: token t attends to the keys at `slots[tok_seq[t], 0..tok_pos[t]]` (the last `window` of
    them when `window` > 0). With `lse` ([n, Hq] fp32, contiguous) each head's log-sum-exp of its scores is
    written there, so the result can be merged with attention over other keys (cascade.py)."""
    lib = load()
    assert lib is not None
    q = q_rows.float().contiguous()
    n, hq, d = q.shape
    out = torch.empty_like(q)
    sink = sinks.detach().float().contiguous() if sinks is not None else None
    # bf16 queries over a bf16 cache: the C kernel's scores take bf16 pair dot products (AVX512-BF16) of the
    # same bits (bf16 x bf16 products are exact in fp32), read from this copy
    qb = q_rows.contiguous() if q_rows.dtype == torch.bfloat16 and kc.dtype == torch.bfloat16 else None
    lib.paged_attention(q.data_ptr(), qb.data_ptr() if qb is not None else None, out.data_ptr(), kc.data_ptr(),
                        vc.data_ptr(), int(kc.dtype == torch.bfloat16), tok_seq.data_ptr(), tok_pos.data_ptr(),
                        slots.data_ptr(), slots.shape[1], n, hq, kc.shape[1], d, scale, window, softcap,
                        sink.data_ptr() if sink is not None else None, lse.data_ptr() if lse is not None else None,
                        torch.get_num_threads())
    return out


def has_block_attention() -> bool:
    """Whether the kernel has `block_attention` (built with AVX-512)."""
    lib = load()
    return lib is not None and hasattr(lib, "block_attention")


def block_attention(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, slots: torch.Tensor,
                    scale: float, last_key: torch.Tensor | None = None,
                    with_lse: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """([m, Hq, D] fp32, [m, Hq] fp32 log-sum-exp or None): the m query rows `q` ([m, Hq, D]) over the keys at
    the cache slots `slots` ([L] int64); row r sees keys 0..last_key[r] (int64 [m]; None: all of them)."""
    lib = load()
    assert lib is not None
    qb = q.contiguous() if q.dtype == torch.bfloat16 and kc.dtype == torch.bfloat16 else None   # pair dot products
    q = q.float().contiguous()
    m, hq, d = q.shape
    out = torch.empty_like(q)
    lse = torch.empty(m, hq) if with_lse else None
    slots = slots.contiguous()
    lib.block_attention(q.data_ptr(), qb.data_ptr() if qb is not None else None, out.data_ptr(), lse.data_ptr() if lse is not None else None, kc.data_ptr(),
                        vc.data_ptr(), int(kc.dtype == torch.bfloat16), slots.data_ptr(), slots.numel(),
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
