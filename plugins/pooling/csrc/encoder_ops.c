/* The encoder's non-GEMM ops on packed (unpadded) rows, called through ctypes by plugins/pooling/encoder_ops.py:
 *
 *     varlen_attention   each sequence's softmax(Q K^T * scale) V per head, bidirectional, from the rows of one
 *                        QKV GEMM ([tokens, 3 * hidden]: q | k | v), sequences given by their row offsets
 *     add_layernorm      out = LayerNorm(x + res) * w + b per row (BERT's residual and norm after each sublayer),
 *                        the residual stream kept in fp32
 *
 * Rows of every sequence lie back to back, so nothing is computed on padding and no mask is read. The math is
 * fp32 (bf16 inputs widened, the result rounded once to bf16 as torch rounds: nearest, ties to even). (sequence,
 * head) pairs and rows run in parallel when there are threads and work enough. */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <omp.h>

#include "bf16.h"   /* core/csrc: bf2f, f2bf, ld, st */

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define VECTOR_ATTENTION 1
#include <immintrin.h>

#define RB 8   /* query rows per block: 8 accumulators of 16 lanes keep both FMA pipes busy */

/* e^x, 16 lanes: 2^n * e^r with n = round(x / ln 2), |r| <= ln 2 / 2, e^r a degree-6 polynomial (~1 ulp) */
static inline __m512 exp16(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-6f), r);
    __m512 p = _mm512_set1_ps(1.f / 720);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
    return _mm512_scalef_ps(p, n);
}

/* 16 fp32 lanes to dst (fp32, or bf16 rounded as f2bf rounds: nearest, ties to even) under mask m */
static inline void store16(void *dst, __m512 v, __mmask16 m, const int bf) {
    if (!bf) { _mm512_mask_storeu_ps(dst, m, v); return; }
    __m512i u = _mm512_castps_si512(v);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    u = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
    _mm256_mask_storeu_epi16(dst, m, _mm512_cvtepi32_epi16(u));
}

static inline __mmask16 tail(int64_t n) { return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1); }

/* one bf16 or fp32 row of n (a multiple of 16) values as fp32 */
static inline void widen_row(float *dst, const void *src, int64_t at, int64_t n, const int bf) {
    for (int64_t c = 0; c < n; c += 16) {
        __m512 x;
        if (bf) x = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(
                        _mm256_loadu_si256((const __m256i *)((const uint16_t *)src + at + c))), 16));
        else x = _mm512_loadu_ps((const float *)src + at + c);
        _mm512_storeu_ps(dst + c, x);
    }
}

/* each of the RB rows of sc ([RB][lp]) replaced by e^(s - its max) over its len keys (0 past them); inv[r] gets
 * 1 / the row's sum, applied to the output instead of to every probability */
static inline void exp_rows(float *sc, int64_t lp, int64_t len, float *inv) {
    for (int r = 0; r < RB; r++) {
        float *p = sc + r * lp;
        __m512 m = _mm512_set1_ps(-INFINITY);
        for (int64_t j = 0; j < lp; j += 16) m = _mm512_mask_max_ps(m, tail(len - j), m, _mm512_loadu_ps(p + j));
        const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(m));
        __m512 sum = _mm512_setzero_ps();
        for (int64_t j = 0; j < lp; j += 16) {
            const __m512 e = _mm512_maskz_mov_ps(tail(len - j), exp16(_mm512_sub_ps(_mm512_loadu_ps(p + j), mx)));
            _mm512_storeu_ps(p + j, e);
            sum = _mm512_add_ps(sum, e);
        }
        inv[r] = 1.f / _mm512_reduce_add_ps(sum);
    }
}

/* out rows i0 .. i0 + RB - 1 (those below len) = (sc rows . V) * inv: V fp32 [len][d] */
static inline void weigh_values(const float *sc, int64_t lp, const float *inv, const float *v, int64_t len,
                                int64_t d, void *out, int64_t os, int64_t first, int64_t rows, const int bf) {
    for (int64_t c = 0; c < d; c += 16) {
        __m512 acc[RB];
        for (int r = 0; r < RB; r++) acc[r] = _mm512_setzero_ps();
        for (int64_t j = 0; j < len; j++) {
            const __m512 vj = _mm512_loadu_ps(v + j * d + c);
            for (int r = 0; r < RB; r++) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(sc[r * lp + j]), vj, acc[r]);
        }
        for (int r = 0; r < RB && r < rows; r++) {
            const int64_t at = (first + r) * os + c;
            store16(bf ? (void *)((uint16_t *)out + at) : (void *)((float *)out + at),
                    _mm512_mul_ps(acc[r], _mm512_set1_ps(inv[r])), 0xffff, bf);
        }
    }
}

/* one head of one sequence of `len` rows (d a multiple of 16); buf holds attention_floats(len, d) floats.
 * Scores in fp32 from fp32 copies: q (scaled) [lq][d] and K transposed [d][lp], so 16 keys' scores take one FMA per
 * head dimension; with AVX512_BF16 and bf16 rows, from the rows themselves: bf16 pairs of dimensions, two
 * multiply-adds per lane per instruction (vdpbf16ps, exact products summed in fp32), then scaled. */
static void head_attention(const void *qkv, int64_t qs, void *out, int64_t os, int64_t base, int64_t len,
                           int64_t hidden, int64_t h, int64_t d, float scale, float *buf, const int bf) {
    const int64_t lp = (len + 15) / 16 * 16, lq = (len + RB - 1) / RB * RB;
    float *kt = buf, *v = kt + d * lp, *q = v + len * d, *sc = q + lq * d, inv[RB];
    for (int64_t j = 0; j < len; j++) widen_row(v + j * d, qkv, (base + j) * qs + h * d + 2 * hidden, d, bf);
#if defined(__AVX512BF16__)
    if (bf) {
        uint32_t *k2 = (uint32_t *)kt, zero[d / 2];   /* [d / 2][lp] pairs of K's dimensions, zero past len */
        memset(zero, 0, sizeof zero);
        for (int64_t j = 0; j < lp; j++) {
            const uint32_t *k = (const uint32_t *)((const uint16_t *)qkv + (base + j) * qs + hidden + h * d);
            for (int64_t c = 0; c < d / 2; c++) k2[c * lp + j] = j < len ? k[c] : 0u;
        }
        const __m512 sv = _mm512_set1_ps(scale);
        for (int64_t i0 = 0; i0 < lq; i0 += RB) {
            const uint32_t *qr[RB];   /* rows past len read zeros: computed, never stored */
            for (int r = 0; r < RB; r++)
                qr[r] = i0 + r < len ? (const uint32_t *)((const uint16_t *)qkv + (base + i0 + r) * qs + h * d) : zero;
            for (int64_t j = 0; j < lp; j += 16) {
                __m512 acc[RB];
                for (int r = 0; r < RB; r++) acc[r] = _mm512_setzero_ps();
                for (int64_t c = 0; c < d / 2; c++) {
                    const __m512bh k = (__m512bh)_mm512_loadu_si512(k2 + c * lp + j);
                    for (int r = 0; r < RB; r++)
                        acc[r] = _mm512_dpbf16_ps(acc[r], (__m512bh)_mm512_set1_epi32((int)qr[r][c]), k);
                }
                for (int r = 0; r < RB; r++) _mm512_storeu_ps(sc + r * lp + j, _mm512_mul_ps(acc[r], sv));
            }
            exp_rows(sc, lp, len, inv);
            weigh_values(sc, lp, inv, v, len, d, (char *)out + 2 * h * d, os, base + i0, len - i0, bf);
        }
        return;
    }
#endif
    for (int64_t j = 0; j < lp; j++) {
        const int64_t row = (base + j) * qs + h * d;
        for (int64_t c = 0; c < d; c++) kt[c * lp + j] = j < len ? ld(qkv, row + hidden + c, bf) : 0.f;
    }
    for (int64_t i = 0; i < lq; i++) {
        const int64_t row = (base + i) * qs + h * d;
        for (int64_t c = 0; c < d; c++) q[i * d + c] = i < len ? ld(qkv, row + c, bf) * scale : 0.f;
    }
    for (int64_t i0 = 0; i0 < lq; i0 += RB) {
        const float *qb = q + i0 * d;
        for (int64_t j = 0; j < lp; j += 16) {
            __m512 acc[RB];
            for (int r = 0; r < RB; r++) acc[r] = _mm512_setzero_ps();
            for (int64_t c = 0; c < d; c++) {
                const __m512 k = _mm512_loadu_ps(kt + c * lp + j);
                for (int r = 0; r < RB; r++) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(qb[r * d + c]), k, acc[r]);
            }
            for (int r = 0; r < RB; r++) _mm512_storeu_ps(sc + r * lp + j, acc[r]);
        }
        exp_rows(sc, lp, len, inv);
        weigh_values(sc, lp, inv, v, len, d, (char *)out + (bf ? 2 : 4) * h * d, os, base + i0, len - i0, bf);
    }
}

static int64_t attention_floats(int64_t len, int64_t d) {
    const int64_t lp = (len + 15) / 16 * 16, lq = (len + RB - 1) / RB * RB;
    return d * lp + len * d + lq * d + RB * lp;
}
#define VECTOR_HEAD(d) ((d) % 16 == 0)
#else
#define VECTOR_HEAD(d) 0   /* the portable loops only */
#endif

/* one head of one sequence of `len` rows, any d, portable; buf holds (2 * len * d + len + d) floats */
static void head_attention_portable(const void *qkv, int64_t qs, void *out, int64_t os, int64_t base, int64_t len,
                                    int64_t hidden, int64_t h, int64_t d, float scale, float *buf, const int bf) {
    float *kt = buf, *v = kt + len * d, *p = v + len * d, *q = p + len;
    /* K transposed ([d][len]) so a query's scores are d broadcast multiply-adds across all keys at once */
    for (int64_t j = 0; j < len; j++) {
        const int64_t row = (base + j) * qs + h * d;
        for (int64_t c = 0; c < d; c++) {
            kt[c * len + j] = ld(qkv, row + hidden + c, bf);
            v[j * d + c] = ld(qkv, row + 2 * hidden + c, bf);
        }
    }
    for (int64_t i = 0; i < len; i++) {
        const int64_t row = (base + i) * qs + h * d;
        for (int64_t c = 0; c < d; c++) q[c] = ld(qkv, row + c, bf) * scale;
        for (int64_t j = 0; j < len; j++) p[j] = 0.f;
        for (int64_t c = 0; c < d; c++) {
            const float qc = q[c];
            const float *k = kt + c * len;
            for (int64_t j = 0; j < len; j++) p[j] += qc * k[j];
        }
        float m = p[0];
        for (int64_t j = 1; j < len; j++) m = p[j] > m ? p[j] : m;
        float sum = 0.f;
        for (int64_t j = 0; j < len; j++) { p[j] = expf(p[j] - m); sum += p[j]; }
        const float inv = 1.f / sum;
        float *o = q;   /* q is spent: the output row accumulates in its place */
        for (int64_t c = 0; c < d; c++) o[c] = 0.f;
        for (int64_t j = 0; j < len; j++) {
            const float w = p[j] * inv;
            const float *vj = v + j * d;
            for (int64_t c = 0; c < d; c++) o[c] += w * vj[c];
        }
        const int64_t orow = (base + i) * os + h * d;
        for (int64_t c = 0; c < d; c++) st(out, orow + c, o[c], bf);
    }
}

/* qkv: [tokens, qs] rows (q at column 0, k at hidden, v at 2 * hidden); out: [tokens, os], heads * d columns written;
 * cu: num_seqs + 1 row offsets (sequence s is rows cu[s] .. cu[s + 1] - 1). Returns 0, or -1 when out of memory. */
int varlen_attention(const void *qkv, int64_t qs, void *out, int64_t os, const int64_t *cu, int64_t num_seqs,
                     int64_t heads, int64_t d, float scale, int bf, int nt) {
    int64_t longest = 0;
    for (int64_t s = 0; s < num_seqs; s++) longest = cu[s + 1] - cu[s] > longest ? cu[s + 1] - cu[s] : longest;
    const int64_t hidden = heads * d, tasks = num_seqs * heads;
    int failed = 0;
    #pragma omp parallel num_threads(nt) if (nt > 1 && tasks > 1)
    {
        int64_t floats = 2 * longest * d + longest + d;
#ifdef VECTOR_ATTENTION
        const int vec = VECTOR_HEAD(d);
        if (vec) floats = attention_floats(longest, d);
#endif
        float *buf = malloc(sizeof(float) * (size_t)floats);
        if (!buf) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp for schedule(dynamic, 4)
        for (int64_t t = 0; t < tasks; t++) {
            if (!buf) continue;
            const int64_t s = t / heads, h = t % heads;
#ifdef VECTOR_ATTENTION
            if (vec) { head_attention(qkv, qs, out, os, cu[s], cu[s + 1] - cu[s], hidden, h, d, scale, buf, bf); continue; }
#endif
            head_attention_portable(qkv, qs, out, os, cu[s], cu[s + 1] - cu[s], hidden, h, d, scale, buf, bf);
        }
        free(buf);
    }
    return failed ? -1 : 0;
}

/* out[r] = LayerNorm(x[r] + res[r]) * w + b, and the same unrounded into res_out[r] (when given); x and out in the
 * rows' dtype (bf), res and res_out fp32, w and b fp32; row strides in elements. Returns 0, or -1 when out of memory.
 * NOTE: the residual stream stays fp32 (res -> res_out): only the GEMMs' inputs are rounded to bf16. */
int add_layernorm(const void *x, int64_t xs, const float *res, int64_t rs, void *out, int64_t os, float *res_out,
                  const float *w, const float *b, int64_t rows, int64_t n, float eps, int bf, int nt) {
    int failed = 0;
    #pragma omp parallel num_threads(nt) if (nt > 1 && rows * n >= (1 << 16))
    {
        float *v = malloc(sizeof(float) * (size_t)n);
        if (!v) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp for
        for (int64_t r = 0; r < rows; r++) {
            if (!v) continue;
            float mean = 0.f;
            for (int64_t i = 0; i < n; i++) {
                v[i] = ld(x, r * xs + i, bf) + res[r * rs + i];
                mean += v[i];
            }
            mean /= (float)n;
            float var = 0.f;
            for (int64_t i = 0; i < n; i++) { const float c = v[i] - mean; var += c * c; }
            const float rstd = 1.f / sqrtf(var / (float)n + eps);
            for (int64_t i = 0; i < n; i++) {
                const float y = (v[i] - mean) * rstd * w[i] + b[i];
                st(out, r * os + i, y, bf);
                if (res_out) res_out[r * n + i] = y;
            }
        }
        free(v);
    }
    return failed ? -1 : 0;
}
