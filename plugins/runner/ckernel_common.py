"""The attention kernel's shared C helpers (cpu_kernel.py puts the pieces together): headers, fp32 -> bf16 rounded as
torch rounds (one value, 16, a row), one K/V row as fp32,
16 values as fp32, the 16-way transposing horizontal sum, a row softmax with its log-sum-exp, bf16 pair dot products,
a vector e^x, and pinning the OpenMP team to CPUs."""

SOURCE = r"""
#define _GNU_SOURCE
#include <sched.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

/* Ask for `bytes` from p (cache rows ahead of their use) into L2: __builtin_prefetch's locality 2 (prefetcht1).
 * NOTE: into L1 (prefetcht0) the requests wait for L1's few miss buffers, and the decode kernels gained nothing over
 * no prefetch at all on a Zen 4 (benchmarks/decode_kernel.sh; ckernel_decode's PF_DECODE, ckernel_avx2's PF_KEYS) */
static inline void prefetch_l2(const void *p, int64_t bytes) {
    for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch((const char *)p + b, 0, 2);
}

/* Software prefetch in the blocked decode row kernels (ckernel_decode's decode_row_bf16, ckernel_decode_avx2's
 * decode_row8): while a head runs over a block of 16 keys, its lines of the rows PF_DECODE blocks ahead are asked for
 * into L2 (prefetcht1: __builtin_prefetch's locality 2), so the requests are spread over the block and do not wait
 * for L1's few miss buffers; 0: none.
 * NOTE: measured on an AMD Zen 4, one thread, 8 layers' caches with blocks scattered over the pool, best of runs
 * (benchmarks/decode_kernel.sh: paged_attention from C): W1's 32 x 192 rows 10.0 -> 6.1 ms per step (16.5 GB/s)
 * and W3's 16 x 2,048 rows 57 -> 29.5-32.8 ms; into L1 instead (prefetcht0): no gain over none (9.8 GB/s), the L1
 * miss buffers are the limit; two blocks ahead: 0.9x of one. decode_row8 (AVX2) spreads the same lines over the
 * block instead (pf_stream): on a Zen 3 W1's rows 1.5x faster than with prefetch_head's bursts. */
#ifndef PF_DECODE
#define PF_DECODE 1
#endif
/* One block of 16 keys from key j0 of a row (len keys at slots sl) in `cache` (rows of rowb bytes): the rows' first
 * bytes into r (a last block of nk < 16 keys repeats key 0 in the rest: what is computed of them is not kept) and
 * into `ahead` the rows PF_DECODE blocks ahead in the stream of blocks the kernel reads: this pass's own, then the
 * next stream's (`nxt` at slots nsl, nlen keys; NULL: none): the V pass after the K pass, the next row's K after the
 * V pass. Returns how many rows ahead there are (0..16). */
static inline int64_t block_rows(const char **r, const char **ahead, const char *cache, const int64_t *sl,
                                 int64_t j0, int64_t len, int64_t rowb, const char *nxt, const int64_t *nsl,
                                 int64_t nlen) {
    const int64_t nk = len - j0 < 16 ? len - j0 : 16;
    for (int64_t k = 0; k < 16; k++) r[k] = cache + sl[j0 + (k < nk ? k : 0)] * rowb;
    int64_t a = j0 + 16 * PF_DECODE;
    if (PF_DECODE == 0) return 0;
    if (a >= len) {   /* past this pass: into the next stream, its blocks counted from its key 0 */
        a -= (len + 15) & ~(int64_t)15;
        if (!nxt || a >= nlen) return 0;
        cache = nxt, sl = nsl, len = nlen;
    }
    const int64_t nn = len - a < 16 ? len - a : 16;
    for (int64_t k = 0; k < nn; k++) ahead[k] = cache + sl[a + k] * rowb;
    return nn;
}

/* The lines of the nn rows ahead (rowb bytes each) as one stream in address order, asked for into L2 (prefetcht1) a
 * few at a time at `points` places spread over a block's work: pf_start, then pf_some at each place */
typedef struct { const char **rows; int64_t nn, lpr, r, l, per; } pf_stream;
static inline __attribute__((always_inline)) pf_stream pf_start(const char **ahead, int64_t nn, int64_t rowb,
                                                                int64_t points) {
    pf_stream s = {ahead, nn, (rowb + 63) / 64, 0, 0, 0};
    s.per = (nn * s.lpr + points - 1) / points;
    return s;
}
static inline __attribute__((always_inline)) void pf_some(pf_stream *s) {
    for (int64_t x = 0; x < s->per && s->r < s->nn; x++) {
        __builtin_prefetch(s->rows[s->r] + 64 * s->l, 0, 2);
        if (++s->l == s->lpr) { s->l = 0; s->r++; }
    }
}

/* Head `off` (its byte offset in a row, hb bytes) of the nn rows ahead, asked for into L2 (prefetcht1) */
static inline void prefetch_head(const char **ahead, int64_t nn, int64_t off, int64_t hb) {
    for (int64_t k = 0; k < nn; k++) prefetch_l2(ahead[k] + off, hb);
}

/* fp32 -> bf16 as torch's .to(torch.bfloat16) rounds: to nearest, ties to even; a NaN becomes 0x7fc0 (a bit test,
 * not isnan: the kernels build with -ffast-math) */
static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

#if defined(__AVX512F__)
/* 16 fp32 values to dst as fp32 or as bf16 rounded the way torch's .to(torch.bfloat16) rounds (nearest, ties to
 * even; a NaN becomes 0x7fc0) */
static inline void store16(void *dst, int bf16, __m512 x) {
    if (!bf16) { _mm512_storeu_ps((float *)dst, x); return; }
    const __m512i u = _mm512_castps_si512(x);
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                                  _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)))), 16);
    r = _mm512_mask_mov_epi32(r, _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                         _mm512_set1_epi32(0x7f800000)), _mm512_set1_epi32(0x7fc0));
    _mm256_storeu_si256((__m256i *)dst, _mm512_cvtepi32_epi16(r));
}
#endif

/* n values of an fp32 row into dst as fp32 or bf16 (rounded as f32_to_bf16 rounds) */
static inline void store_row(void *dst, int dst_bf16, const float *src, int64_t n) {
    if (!dst_bf16) { memcpy(dst, src, sizeof(float) * (size_t)n); return; }
    uint16_t *o = (uint16_t *)dst;
    int64_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16) store16(o + i, 1, _mm512_loadu_ps(src + i));
#endif
    for (; i < n; i++) o[i] = f32_to_bf16(src[i]);
}

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

/* Each head's `len` scores (rows of `scores`) become e^(s - max) in place (exp16), their sums' inverses go to
 * inv[hh] (the caller normalizes its output once) and, with lse, each head's log-sum-exp to lse[hh] */
static inline void softmax_exp_rows(float *scores, int64_t hq, int64_t len, float *lse, float *inv) {
    for (int64_t hh = 0; hh < hq; hh++) {
        float *sc = scores + hh * len;
        __m512 top = _mm512_set1_ps(-3.0e38f);
        int64_t j = 0;
        for (; j + 16 <= len; j += 16) top = _mm512_max_ps(top, _mm512_loadu_ps(sc + j));
        float m = _mm512_reduce_max_ps(top);
        for (; j < len; j++) m = sc[j] > m ? sc[j] : m;
        const __m512 mv = _mm512_set1_ps(m);
        __m512 tot = _mm512_setzero_ps();
        for (j = 0; j + 16 <= len; j += 16) {
            const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(sc + j), mv));
            _mm512_storeu_ps(sc + j, e);
            tot = _mm512_add_ps(tot, e);
        }
        float sum = _mm512_reduce_add_ps(tot);
        if (j < len) {
            const __mmask16 mk = (__mmask16)((1u << (len - j)) - 1);
            const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, sc + j), mv));
            _mm512_mask_storeu_ps(sc + j, mk, e);
            sum += _mm512_mask_reduce_add_ps(mk, e);
        }
        inv[hh] = 1.f / sum;
        if (lse) lse[hh] = m + logf(sum);
    }
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
"""
