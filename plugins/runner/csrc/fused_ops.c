/* Fused elementwise ops of a Llama-like decoder layer on CPU (fused_ops.py calls them through ctypes):
 *
 *     add_rmsnorm   h += x; out = w * norm(h)
 *     rope          q, k of the packed QKV rows rotated in place from a cos/sin table row per token position
 *                   (after Qwen3's per-head RMSNorm when its weights are given)
 *     silu_mul      out = silu(gate) * up
 *     gelu_tanh_mul out = gelu_tanh(gate) * up (Gemma's gelu_pytorch_tanh)
 *
 * The arithmetic is transformers': fp32 math, rounded to the activation dtype wherever the HF module rounds
 * (bf16: after the residual add, the normalized value before the weight, each rotary product and their sum,
 * silu before the product). Rows run in parallel only when large (prefill). Built with -lmvec: with -ffast-math
 * gcc turns silu's expf loop into calls of glibc's vector expf. */

#include <stdint.h>
#include <string.h>
#include <math.h>
#include <omp.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

/* elements: below this, rows run on the calling thread (a one-row decode step's ops). NOTE: 1 << 12 made W1 on two
 * threads 0.92x on an Intel Xeon model 207 (benchmarks/runner_before_after.py --base HEAD --runs 5, 2026-12-02),
 * though the ops' own time in the step fell 1.8 -> 1.4 ms. On the Zen 4 every figure since is measured on, 1 << 16
 * left a 16-row decode step's norms, rotary and silu * up (~1.2 ms of its ~19) on one thread while the other
 * waited in the OpenMP barrier: 1 << 13 splits them from 16 rows of SmolLM2 (see docs/benchmarks.md, W4). */
#define PAR_MIN (1 << 13)

#include "bf16.h"   /* core/csrc: bf2f, f2bf, ld, st */
static inline float rnd(float v, const int bf) { return bf ? bf2f(f2bf(v)) : v; }   /* the dtype's rounding */

static inline void norm_row(const float *v, int64_t n, const void *w, float eps, void *out, const int bf) {
    float ss = 0.f;
    for (int64_t i = 0; i < n; i++) ss += v[i] * v[i];
    const float inv = 1.f / sqrtf(ss / (float)n + eps);
    for (int64_t i = 0; i < n; i++) st(out, i, ld(w, i, bf) * rnd(v[i] * inv, bf), bf);
}

static inline void add_norm_row(const void *x, void *res, void *out, const void *w, int64_t n, float eps, int has_x,
                                float *buf, const int bf) {
    for (int64_t i = 0; i < n; i++) {
        float v = ld(res, i, bf);
        if (has_x) { v = rnd(v + ld(x, i, bf), bf); st(res, i, v, bf); }
        buf[i] = v;
    }
    norm_row(buf, n, w, eps, out, bf);
}

/* res[r] += x[r] (when x is given), then out[r] = w * rmsnorm(res[r]); row strides in elements */
void add_rmsnorm(const void *x, int64_t xs, void *res, int64_t rs, void *out, int64_t os, const void *w, int64_t rows,
                 int64_t n, float eps, int bf, int nt) {
    const int es = bf ? 2 : 4;
    #pragma omp parallel for num_threads(nt) if (nt > 1 && rows * n >= PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        float buf[n];
        const void *xr = x ? (const char *)x + r * xs * es : 0;
        void *rr = (char *)res + r * rs * es, *orow = (char *)out + r * os * es;
        if (bf) add_norm_row(xr, rr, orow, w, n, eps, x != 0, buf, 1);
        else add_norm_row(xr, rr, orow, w, n, eps, x != 0, buf, 0);
    }
}

static inline void rope_head(char *x, const void *c, const void *s, const void *nw, float eps, int64_t d,
                             float *v, const int bf) {
    for (int64_t i = 0; i < d; i++) v[i] = ld(x, i, bf);
    if (nw) {   /* per-head RMSNorm before the rotation (Qwen3's q_norm / k_norm) */
        norm_row(v, d, nw, eps, x, bf);
        for (int64_t i = 0; i < d; i++) v[i] = ld(x, i, bf);
    }
    const int64_t h = d / 2;
    for (int64_t i = 0; i < h; i++) {   /* x * cos + rotate_half(x) * sin, rotate_half(x) = (-x2, x1) */
        st(x, i, rnd(v[i] * ld(c, i, bf), bf) + rnd(-v[i + h] * ld(s, i, bf), bf), bf);
        st(x, i + h, rnd(v[i + h] * ld(c, i + h, bf), bf) + rnd(v[i] * ld(s, i + h, bf), bf), bf);
    }
}

#if defined(__AVX512F__)
/* 16 values at p (bf16 or fp32) as fp32 */
static inline __m512 ld16(const void *p, const int bf) {
    if (!bf) return _mm512_loadu_ps((const float *)p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

/* rnd() on 16 lanes: f2bf's integer rounding (the same bits), back as fp32 */
static inline __m512 rnd16(__m512 v, const int bf) {
    if (!bf) return v;
    const __m512i u = _mm512_castps_si512(v);
    const __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                                       _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1))));
    return _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32((int)0xffff0000u)));
}

/* 16 lanes of an already rounded value to p (bf16: its top half, exact; fp32 as is) */
static inline void st16(void *p, __m512 v, const int bf) {
    if (!bf) { _mm512_storeu_ps((float *)p, v); return; }
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(v), 16)));
}

/* rope_head without a norm for h = d / 2 a multiple of 16: the scalar arithmetic on 16 lanes, the same bits */
static inline void rope_head16(char *x, const void *c, const void *s, int64_t d, const int bf) {
    const int64_t h = d / 2, es = bf ? 2 : 4;
    for (int64_t i = 0; i < h; i += 16) {
        const __m512 v1 = ld16(x + i * es, bf), v2 = ld16(x + (i + h) * es, bf);
        const __m512 c1 = ld16((const char *)c + i * es, bf), c2 = ld16((const char *)c + (i + h) * es, bf);
        const __m512 s1 = ld16((const char *)s + i * es, bf), s2 = ld16((const char *)s + (i + h) * es, bf);
        const __m512 neg = _mm512_sub_ps(_mm512_setzero_ps(), v2);
        const __m512 o1 = _mm512_add_ps(rnd16(_mm512_mul_ps(v1, c1), bf), rnd16(_mm512_mul_ps(neg, s1), bf));
        const __m512 o2 = _mm512_add_ps(rnd16(_mm512_mul_ps(v2, c2), bf), rnd16(_mm512_mul_ps(v1, s2), bf));
        st16(x + i * es, rnd16(o1, bf), bf);
        st16(x + (i + h) * es, rnd16(o2, bf), bf);
    }
}
#endif

/* In place on rows of [nq query heads | nk key heads | ...] of d values: optional per-head norm, then rotary
 * from row pos[r] of the [positions, d] cos/sin tables. */
void rope(void *qkv, int64_t rows, int64_t rs, int64_t nq, int64_t nk, int64_t d, const int64_t *pos,
          const void *cos, const void *sin, const void *qw, const void *kw, float eps, int bf, int nt) {
    const int es = bf ? 2 : 4;
    #pragma omp parallel for num_threads(nt) if (nt > 1 && rows * (nq + nk) * d >= PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        float v[d];
        const char *c = (const char *)cos + pos[r] * d * es, *s = (const char *)sin + pos[r] * d * es;
        for (int64_t hh = 0; hh < nq + nk; hh++) {
            char *x = (char *)qkv + (r * rs + hh * d) * es;
            const void *nw = hh < nq ? qw : kw;
#if defined(__AVX512F__)
            /* NOTE: the scalar loop did not vectorize: 170 us for W1's 32 rows x 16 heads x 64 (bf16), ~1.4 ms of a
             * batch-32 decode step */
            if (!nw && d % 32 == 0) {
                if (bf) rope_head16(x, c, s, d, 1);
                else rope_head16(x, c, s, d, 0);
                continue;
            }
#endif
            if (bf) rope_head(x, c, s, nw, eps, d, v, 1);
            else rope_head(x, c, s, nw, eps, d, v, 0);
        }
    }
}

static inline void silu_mul_row(const void *g, const void *u, void *out, int64_t n, const int bf) {
    #pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        const float a = ld(g, i, bf);
        st(out, i, rnd(a / (1.f + expf(-a)), bf) * ld(u, i, bf), bf);
    }
}

/* out[r] = silu(g[r]) * u[r] */
void silu_mul(const void *g, int64_t gs, const void *u, int64_t us, void *out, int64_t os, int64_t rows, int64_t n,
              int bf, int nt) {
    const int es = bf ? 2 : 4;
    #pragma omp parallel for num_threads(nt) if (nt > 1 && rows * n >= PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const void *gr = (const char *)g + r * gs * es, *ur = (const char *)u + r * us * es;
        void *orow = (char *)out + r * os * es;
        if (bf) silu_mul_row(gr, ur, orow, n, 1);
        else silu_mul_row(gr, ur, orow, n, 0);
    }
}

static inline void gelu_tanh_mul_row(const void *g, const void *u, void *out, int64_t n, const int bf) {
    /* torch's gelu(approximate="tanh"): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
    const float beta = 0.7978845608028654f, kappa = 0.044715f;
    #pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        const float a = ld(g, i, bf);
        const float inner = beta * (a + kappa * a * a * a);
        st(out, i, rnd(0.5f * a * (1.f + tanhf(inner)), bf) * ld(u, i, bf), bf);
    }
}

/* out[r] = gelu_tanh(g[r]) * u[r] */
void gelu_tanh_mul(const void *g, int64_t gs, const void *u, int64_t us, void *out, int64_t os, int64_t rows,
                   int64_t n, int bf, int nt) {
    const int es = bf ? 2 : 4;
    #pragma omp parallel for num_threads(nt) if (nt > 1 && rows * n >= PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const void *gr = (const char *)g + r * gs * es, *ur = (const char *)u + r * us * es;
        void *orow = (char *)out + r * os * es;
        if (bf) gelu_tanh_mul_row(gr, ur, orow, n, 1);
        else gelu_tanh_mul_row(gr, ur, orow, n, 0);
    }
}
