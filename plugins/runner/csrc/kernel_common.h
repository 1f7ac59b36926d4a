/* The attention kernel's shared C code (every attention_*.c includes it; cpu_kernel.py builds them as one library):
 * headers; software prefetch into L2; fp32 -> bf16 rounded as torch rounds (one value, 16, a row); one K/V row as
 * fp32, 16 values as fp32; the 16-way transposing horizontal sum; a row softmax with its log-sum-exp; bf16 pair dot
 * products; a vector e^x; the fp8 cache's codes (KV_*: rounding fp32 into E4M3 or E5M2 and reading them back, as
 * attention_fp8.c says); the AVX2 forms of the helpers; and the row kernels one file defines and another calls.
 *
 * fp8 codes, as torch's float8_e4m3fn and float8_e5m2 hold them (one byte per value, no scale: vLLM's default scale of
 * 1.0 when a checkpoint brings none). Writes round to nearest, ties to even, and saturate: past +-448 (E4M3) or
 * +-57,344 (E5M2) a value is stored as that largest finite one, as torch's E4M3 conversion does (its E5M2 conversion
 * gives inf, so the portable path clamps first). */

#ifndef MODELCALL_KERNEL_COMMON_H
#define MODELCALL_KERNEL_COMMON_H
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

/* e^x's steps for one vector width (V: the type, S: the intrinsics' prefix, _mm512 or _mm256; ROUND: to the nearest
 * integer), shared by exp16 and exp8: x clamped at -87 (so 2^n stays a normal number), x = n ln2 + r with ln2 in two
 * parts, |r| <= ln2/2, and p = e^r by its Taylor polynomial to r^7; the caller multiplies p by 2^n its own way */
#define EXP_STEPS(V, S, ROUND)                                          \
    x = S##_max_ps(x, S##_set1_ps(-87.f));                              \
    const V n = ROUND(S##_mul_ps(x, S##_set1_ps(1.44269504f)));         \
    V r = S##_fnmadd_ps(n, S##_set1_ps(0.693145751953125f), x);         \
    r = S##_fnmadd_ps(n, S##_set1_ps(1.428606765330187e-06f), r);       \
    V p = S##_set1_ps(1.f / 5040.f);                                    \
    p = S##_fmadd_ps(p, r, S##_set1_ps(1.f / 720.f));                   \
    p = S##_fmadd_ps(p, r, S##_set1_ps(1.f / 120.f));                   \
    p = S##_fmadd_ps(p, r, S##_set1_ps(1.f / 24.f));                    \
    p = S##_fmadd_ps(p, r, S##_set1_ps(1.f / 6.f));                     \
    p = S##_fmadd_ps(p, r, S##_set1_ps(0.5f));                          \
    p = S##_fmadd_ps(p, r, S##_set1_ps(1.f));                           \
    p = S##_fmadd_ps(p, r, S##_set1_ps(1.f));

/* Ask for `bytes` from p (cache rows ahead of their use) into L2: __builtin_prefetch's locality 2 (prefetcht1).
 * NOTE: into L1 (prefetcht0) the requests wait for L1's few miss buffers, and the decode kernels gained nothing over
 * no prefetch at all on a Zen 4 (benchmarks/decode_kernel.sh; PF_DECODE below, attention_rows_avx2.c's PF_KEYS) */
static inline void prefetch_l2(const void *p, int64_t bytes) {
    for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch((const char *)p + b, 0, 2);
}

/* The K or V rows (rowb bytes each) of keys from..to-1 (those < len) at slots sl, into L2: the row kernels' prefetch
 * of the keys a few blocks ahead (attention_rows.c, attention_rows_avx2.c) */
static inline void prefetch_rows(const void *cache, const int64_t *sl, int64_t from, int64_t to, int64_t len,
                                 int64_t rowb) {
    for (int64_t k = from; k < to && k < len; k++) prefetch_l2((const char *)cache + sl[k] * rowb, rowb);
}

/* Software prefetch in the blocked decode row kernels (attention_decode.c's decode_row_bf16, attention_decode_avx2.c's
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

/* bf16 bits -> fp32 (exact: the high half of the fp32 bits) */
static inline float bf16_to_f32(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
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
        for (; i < d; i++) dst[i] = bf16_to_f32(src[i]);
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

/* q . (d values of a K row at `off`, fp32 or bf16), d % 16 == 0: one key's score against one query head */
static inline float dot_key16(const float *q, const void *kc, int64_t off, int64_t d, int bf16) {
    __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(q), load16(kc, off, bf16));
    for (int64_t v = 16; v < d; v += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + v), load16(kc, off + v, bf16), acc);
    return _mm512_reduce_add_ps(acc);
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

/* e^x for 16 lanes (x <= 0 here: scores minus their maximum), |relative error| ~1e-7 (EXP_STEPS), times 2^n */
#define ROUND16(v) _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT)
static inline __m512 exp16(__m512 x) {
    EXP_STEPS(__m512, _mm512, ROUND16)
    return _mm512_scalef_ps(p, n);
}

/* A block's 16 scores to dst (the first nk of them when nk < 16: the last block of a row) */
static inline void store_scores16(float *dst, __m512 s, int64_t nk) {
    if (nk == 16) _mm512_storeu_ps(dst, s);
    else _mm512_mask_storeu_ps(dst, (__mmask16)((1u << nk) - 1), s);
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

/* The cache's element type (the kernels' `kvt`): fp32, bf16, fp8 E4M3, fp8 E5M2 */
enum { KV_F32 = 0, KV_BF16 = 1, KV_E4M3 = 2, KV_E5M2 = 3 };

static inline int64_t kv_bytes(int kvt) { return kvt == KV_F32 ? 4 : kvt == KV_BF16 ? 2 : 1; }

/* fp32 -> an fp8 code, to nearest, ties to even, saturating (NaN: the format's NaN code) */
static inline uint8_t f32_to_fp8(float f, int kvt) {
    uint32_t u;
    memcpy(&u, &f, 4);
    const uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    const uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint8_t)(sign | 0x7f);   /* both formats' NaN */
    float mag;
    memcpy(&mag, &a, 4);
    if (kvt == KV_E4M3) {
        if (a >= 0x43e00000u) return sign | 0x7e;                           /* >= 448 */
        if (a < 0x3c800000u) return sign | (uint8_t)lrintf(mag * 512.f);    /* < 2^-6: m * 2^-9 (8: 2^-6 itself) */
        return sign | (uint8_t)(((a + 0x7ffffu + ((a >> 20) & 1u)) >> 20) - (120u << 3));
    }
    if (a >= 0x47600000u) return sign | 0x7b;                               /* >= 57,344 */
    if (a < 0x38800000u) return sign | (uint8_t)lrintf(mag * 65536.f);      /* < 2^-14: m * 2^-16 */
    return sign | (uint8_t)(((a + 0xfffffu + ((a >> 21) & 1u)) >> 21) - (112u << 2));
}

/* fp8 code -> fp16 bits: E5M2 exactly; E4M3 as its value times 2^-8 (fp8_unit's 256 multiplies it back) */
static inline uint16_t fp8_to_half_bits(uint8_t b, int kvt) {
    return kvt == KV_E5M2 ? (uint16_t)(b << 8) : (uint16_t)(((b & 0x7fu) << 7) | ((b & 0x80u) << 8));
}

static inline float fp8_unit(int kvt) { return kvt == KV_E4M3 ? 256.f : 1.f; }

/* fp16 bits -> fp32 (normal, subnormal and zero; fp8 codes never make inf or NaN here) */
static inline float half_bits_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    float f;
    if (e == 0) {
        f = (float)m * 5.9604644775390625e-8f;   /* m * 2^-24 */
        uint32_t u;
        memcpy(&u, &f, 4);
        u |= sign;
        memcpy(&f, &u, 4);
        return f;
    }
    const uint32_t u = sign | ((e + 112u) << 23) | (m << 13);
    memcpy(&f, &u, 4);
    return f;
}

/* n fp8 codes as fp32 values (the true values: the unit applied) */
static inline void load_row_fp8(float *dst, const uint8_t *src, int64_t n, int kvt) {
    const float unit = fp8_unit(kvt);
    for (int64_t i = 0; i < n; i++) dst[i] = half_bits_to_f32(fp8_to_half_bits(src[i], kvt)) * unit;
}

#if defined(__AVX512F__)
/* 16 fp32 values -> 16 fp8 codes at dst (f32_to_fp8, 16 lanes) */
static inline void store16_fp8(uint8_t *dst, __m512 x, int kvt) {
    const __m512i u = _mm512_castps_si512(x), a = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
    const __m512i sign = _mm512_and_si512(_mm512_srli_epi32(u, 24), _mm512_set1_epi32(0x80));
    const __m512 mag = _mm512_castsi512_ps(a);
    const int e4 = kvt == KV_E4M3;
    const int shift = e4 ? 20 : 21;
    const __m512i one = _mm512_set1_epi32(1);
    const __m512i half = _mm512_set1_epi32(e4 ? 0x7ffff : 0xfffff);
    __m512i code = _mm512_add_epi32(a, _mm512_add_epi32(half, _mm512_and_si512(_mm512_srli_epi32(a, shift), one)));
    code = _mm512_sub_epi32(_mm512_srli_epi32(code, shift), _mm512_set1_epi32(e4 ? 120 << 3 : 112 << 2));
    const __mmask16 sub = _mm512_cmplt_epu32_mask(a, _mm512_set1_epi32(e4 ? 0x3c800000 : 0x38800000));
    code = _mm512_mask_mov_epi32(code, sub, _mm512_cvtps_epi32(_mm512_mul_ps(mag, _mm512_set1_ps(e4 ? 512.f : 65536.f))));
    const __mmask16 big = _mm512_cmpge_epu32_mask(a, _mm512_set1_epi32(e4 ? 0x43e00000 : 0x47600000));
    code = _mm512_mask_mov_epi32(code, big, _mm512_set1_epi32(e4 ? 0x7e : 0x7b));
    code = _mm512_mask_mov_epi32(code, _mm512_cmpgt_epu32_mask(a, _mm512_set1_epi32(0x7f800000)),
                                 _mm512_set1_epi32(0x7f));
    _mm_storeu_si128((__m128i *)dst, _mm512_cvtepi32_epi8(_mm512_or_si512(code, sign)));
}

/* 16 fp8 codes at p as fp32, E4M3 times 2^-8 (fp8_unit) */
static inline __m512 load16_fp8(const uint8_t *p, int kvt) {
    const __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p));
    const __m256i h = kvt == KV_E5M2 ? _mm256_slli_epi16(b, 8)
        : _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x7f)), 7),
                          _mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x80)), 8));
    return _mm512_cvtph_ps(h);
}
#endif

#if defined(__AVX512BF16__)
/* fp8 E4M3 / E5M2 subnormals (magnitude codes 1..7 / 1..3) as bf16 bits: m * 2^-9 / m * 2^-16 */
static const uint16_t FP8_SUB_BF16[2][32] = {
    {0, 0x3b00, 0x3b80, 0x3bc0, 0x3c00, 0x3c20, 0x3c40, 0x3c60},
    {0, 0x3780, 0x3800, 0x3840},
};

/* 32 fp8 codes as 32 bf16 values, exactly (every E4M3 and E5M2 value is a bf16 one): exponent rebiased by one add
 * (E4M3: +120, E5M2: +112), mantissa shifted into place; subnormals (exponent bits zero) from a table, one masked
 * permutation; the sign moved to bit 15 */
static inline __m512i fp8x32_to_bf16(__m256i codes, int kvt) {
    const int e4 = kvt == KV_E4M3;
    const __m512i x = _mm512_cvtepu8_epi16(codes), mag = _mm512_and_si512(x, _mm512_set1_epi16(0x7f));
    __m512i r = _mm512_add_epi16(e4 ? _mm512_slli_epi16(mag, 4) : _mm512_slli_epi16(mag, 5),
                                 _mm512_set1_epi16(e4 ? 0x3c00 : 0x3800));
    const __mmask32 sub = _mm512_testn_epi16_mask(x, _mm512_set1_epi16(e4 ? 0x78 : 0x7c));
    r = _mm512_mask_permutexvar_epi16(r, sub, mag, _mm512_loadu_si512((const void *)FP8_SUB_BF16[e4 ? 0 : 1]));
    return _mm512_or_si512(r, _mm512_slli_epi16(_mm512_and_si512(x, _mm512_set1_epi16(0x80)), 8));
}

/* 32 cache values at p (bf16, or fp8 codes) as 32 bf16 values: what the bf16 pair kernels read */
static inline __m512i load_pairs32(const char *p, int kvt) {
    if (kvt == KV_BF16) return _mm512_loadu_si512((const void *)p);
    return fp8x32_to_bf16(_mm256_loadu_si256((const __m256i *)p), kvt);
}
#endif

/* n fp32 values into fp8 codes */
static inline void store_row_fp8(uint8_t *dst, const float *src, int64_t n, int kvt) {
    int64_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16) store16_fp8(dst + i, _mm512_loadu_ps(src + i), kvt);
#endif
    for (; i < n; i++) dst[i] = f32_to_fp8(src[i], kvt);
}

/* The AVX2 helpers (CPUs with AVX2 and FMA, no AVX-512) */
#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
/* 8 fp32 values of a K/V row (fp32, or bf16 bits widened: exact) at `off` */
static inline __m256 load8(const void *base, int64_t off, int bf16) {
    if (bf16) {
        const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)base + off));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    return _mm256_loadu_ps((const float *)base + off);
}

/* out[k] = sum of v[k]'s 8 lanes: three rounds of pairwise adds that transpose as they go */
static inline __m256 hsum8(const __m256 *v) {
    const __m256 a0 = _mm256_hadd_ps(v[0], v[1]), a1 = _mm256_hadd_ps(v[2], v[3]);
    const __m256 a2 = _mm256_hadd_ps(v[4], v[5]), a3 = _mm256_hadd_ps(v[6], v[7]);
    const __m256 b0 = _mm256_hadd_ps(a0, a1), b1 = _mm256_hadd_ps(a2, a3);
    /* b0: lanes 0-3 keys 0-3 (low halves), 4-7 keys 0-3 (high halves); b1 the same for keys 4-7 */
    return _mm256_add_ps(_mm256_permute2f128_ps(b0, b1, 0x20), _mm256_permute2f128_ps(b0, b1, 0x31));
}

/* e^x for 8 lanes (x <= 0: scores minus their maximum), as exp16 (EXP_STEPS), times 2^n built in the exponent bits
 * (n >= -126 after the clamp) */
#define ROUND8(v) _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
static inline __m256 exp8(__m256 x) {
    EXP_STEPS(__m256, _mm256, ROUND8)
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

static inline float hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}

static inline float hadd8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

/* dot_key16 for 8 lanes, d % 8 == 0 */
static inline float dot_key8(const float *q, const void *kc, int64_t off, int64_t d, int bf16) {
    __m256 a = _mm256_mul_ps(_mm256_loadu_ps(q), load8(kc, off, bf16));
    for (int64_t v = 8; v < d; v += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(q + v), load8(kc, off + v, bf16), a);
    return hadd8(a);
}

/* softmax_rows with exp8: each head's scores in place, and its log-sum-exp when `lse` */
static inline void softmax8_rows(float *scores, int64_t hq, int64_t len, float *lse) {
    const int64_t full = len & ~(int64_t)7;
    for (int64_t hh = 0; hh < hq; hh++) {
        float *sc = scores + hh * len;
        __m256 top = _mm256_set1_ps(-3.0e38f);
        for (int64_t j = 0; j < full; j += 8) top = _mm256_max_ps(top, _mm256_loadu_ps(sc + j));
        float m = hmax8(top);
        for (int64_t j = full; j < len; j++) m = sc[j] > m ? sc[j] : m;
        const __m256 mv = _mm256_set1_ps(m);
        __m256 tot = _mm256_setzero_ps();
        for (int64_t j = 0; j < full; j += 8) {
            const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(sc + j), mv));
            _mm256_storeu_ps(sc + j, e);
            tot = _mm256_add_ps(tot, e);
        }
        float sum = hadd8(tot);
        for (int64_t j = full; j < len; j++) { sc[j] = expf(sc[j] - m); sum += sc[j]; }
        const float inv = 1.f / sum;
        const __m256 iv = _mm256_set1_ps(inv);
        for (int64_t j = 0; j < full; j += 8) _mm256_storeu_ps(sc + j, _mm256_mul_ps(_mm256_loadu_ps(sc + j), iv));
        for (int64_t j = full; j < len; j++) sc[j] *= inv;
        if (lse) lse[hh] = m + logf(sum);
    }
}
#endif

/* The row kernels one file defines and attention_decode.c's paged_attention calls (hidden: not the library's API).
 * qt: one query token's heads (fp32), dst/ot: its output rows (fp32), sl: its keys' cache slots, lse: each head's
 * log-sum-exp or NULL, scores: [hq][len] scratch. */
#define KERNEL_LOCAL __attribute__((visibility("hidden")))
/* The library's one entry with two bodies: block_attention, attention_block.c's with AVX-512 (its head comment is the
 * contract), attention_block_avx2.c's with AVX2 and FMA, none elsewhere (cpu_kernel.has_block_attention) */
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
void block_attention(const float *q, const uint16_t *qb, void *out, int out_bf16, float *lse, const void *kc,
                     const void *vc, int bf16, const int64_t *sl, int64_t len, const int64_t *lim, int64_t m,
                     int64_t hq, int64_t hkv, int64_t d, float scale, int nthreads);
#endif
/* attention_rows.c: every variant (window, soft-capping, sinks), any CPU */
KERNEL_LOCAL void attend(const float *qt, float *ot, const void *kc, const void *vc, int bf16, const int64_t *sl,
                         int64_t len, int64_t hq, int64_t hkv, int64_t d, float scale, float softcap,
                         const float *sinks, float *scores, float *row, float *lse);
#if defined(__AVX512F__)
/* attention_rows.c: plain attention, d % 16 == 0, d <= 256 */
KERNEL_LOCAL void attend_vec(const float *qt, const uint16_t *qbt, float *ot, const void *kc, const void *vc, int bf16,
                             const int64_t *sl, int64_t len, int64_t hq, int64_t hkv, int64_t d, float scale,
                             float *scores, float *lse);
/* attention_fp8.c: plain attention over an fp8 cache, d % 16 == 0, d <= 256 */
KERNEL_LOCAL void decode_row_fp8(const float *qt, float *dst, float *lse, const uint8_t *kc, const uint8_t *vc,
                                 const int64_t *sl, int64_t len, int64_t hq, int64_t hkv, int64_t d, float scale,
                                 int kvt, float *scores, float *buf);
#endif
#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
#define HAVE_DECODE_ROW8 1
/* fp8 codes are widened by F16C's vcvtph2ps (every AVX2 CPU has it; without it an fp8 cache takes the portable path) */
#if defined(__F16C__)
#define ROW8_FP8 1
#else
#define ROW8_FP8 0
#endif
/* attention_rows_avx2.c: plain attention, d % 8 == 0, d <= 256 */
KERNEL_LOCAL void attend_vec8(const float *qt, float *ot, const void *kc, const void *vc, int bf16, const int64_t *sl,
                              int64_t len, int64_t hq, int64_t hkv, int64_t d, float scale, float *scores, float *lse);
/* attention_decode_avx2.c: fp32 queries over a bf16 or fp8 cache, plain attention, d % 16 == 0, d <= 256 */
KERNEL_LOCAL void decode_row8(const float *qt, float *dst, float *lse, const char *kc, const char *vc, int kvt,
                              const int64_t *sl, int64_t len, int64_t hq, int64_t hkv, int64_t d, float scale,
                              float *scores, float *qx, float *ox, const int64_t *next_sl, int64_t next_len);
#endif

#endif
