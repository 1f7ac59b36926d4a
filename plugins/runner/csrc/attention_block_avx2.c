/* `block_attention` for CPUs with AVX2 and FMA but no AVX-512: the same entry and contract as attention_block.c's, in
 * fp32, with 16 query lanes per tile (two 256-bit registers) and six keys (or output dims) per register tile: 12
 * accumulators, two loads and a broadcast per step; the keys in blocks of 256 with an online softmax so a block's K and
 * V stay in L2 while every tile passes. Long prefill chunks, fresh prompts and cascade's shared prefixes take it
 * instead of torch's flash attention. W3's shape on a Zen 3 core, one thread (1,920 causal queries over a bf16 cache,
 * 8 x 64 heads, fp32 queries): 73-85 ms against SDPA's 79-98 in the same runs, 1.11-1.16x in three. */

#include "kernel_common.h"

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
/* dst[k][0..16) (+)= sum over t < n of b[k * ks + t * ts] * v[t][0..16), for k < nk <= 6 (acc: added to dst).
 * NOTE: twelve named accumulators, not an array: with a[6][2] gcc stored every accumulator to the stack on each step
 * when the strides were run-time values (29 GFLOP/s on a Zen 3 core, against 86 with them in registers) */
static inline void tile6x16(const float *b, int64_t ks, int64_t ts, int64_t nk, const float *v, int64_t n,
                            float *dst, int acc) {
    const float *b0 = b, *b1 = b + (nk > 1) * ks, *b2 = b + (nk > 2) * 2 * ks, *b3 = b + (nk > 3) * 3 * ks;
    const float *b4 = b + (nk > 4) * 4 * ks, *b5 = b + (nk > 5) * 5 * ks;
#define T6_INIT(k) __m256 a##k##0 = acc && k < nk ? _mm256_load_ps(dst + k * 16) : _mm256_setzero_ps(), \
                          a##k##1 = acc && k < nk ? _mm256_load_ps(dst + k * 16 + 8) : _mm256_setzero_ps();
    T6_INIT(0) T6_INIT(1) T6_INIT(2) T6_INIT(3) T6_INIT(4) T6_INIT(5)
#undef T6_INIT
    for (int64_t t = 0; t < n; t++) {
        const __m256 v0 = _mm256_load_ps(v + t * 16), v1 = _mm256_load_ps(v + t * 16 + 8);
        const int64_t o = t * ts;
#define T6_STEP(k) { const __m256 x = _mm256_broadcast_ss(b##k + o); \
                     a##k##0 = _mm256_fmadd_ps(x, v0, a##k##0); a##k##1 = _mm256_fmadd_ps(x, v1, a##k##1); }
        T6_STEP(0) T6_STEP(1) T6_STEP(2) T6_STEP(3) T6_STEP(4) T6_STEP(5)
#undef T6_STEP
    }
#define T6_STORE(k) if (k < nk) { _mm256_store_ps(dst + k * 16, a##k##0); _mm256_store_ps(dst + k * 16 + 8, a##k##1); }
    T6_STORE(0) T6_STORE(1) T6_STORE(2) T6_STORE(3) T6_STORE(4) T6_STORE(5)
#undef T6_STORE
}

/* Many query rows over one run of keys (slots sl[0..len)); row r sees keys 0..lim[r] (lim NULL: all). Per KV head:
 * its K and V as fp32 copies; the keys in blocks of BLK_KEYS (K and V of a block stay in L2), and for each block
 * every tile of 16 lanes (lane = (row, group head)) still seeing keys there: S = K Q^T, masked, then the online
 * softmax (running max and sum; the tile's output rescaled when the max grows) and O^T += V^T P. Each tile's queries
 * and output live in per-tile state; out = O / sum (fp32 or bf16 rows), lse = max + log(sum) when asked.
 * NOTE: the blocks keep K and V in L2 for every tile, but measured on a Zen 3 core they moved nothing by
 * themselves (one pass of each tile over all keys: 26.9 GFLOP/s, blocked: 25.2); the gain came from tile6x16's
 * named accumulators (50-52 GFLOP/s). q fp32, or NULL and qb bf16. */
#define BLK_KEYS 256
void block_attention(const float *q, const uint16_t *qb, void *out, int out_bf16, float *lse, const void *kc,
                     const void *vc, int bf16,
                     const int64_t *sl, int64_t len, const int64_t *lim, int64_t m, int64_t hq, int64_t hkv, int64_t d,
                     float scale, int nthreads) {
    const int64_t g = hq / hkv, mq = m * g, nt = (mq + 15) / 16;
    #pragma omp parallel for num_threads(nthreads) schedule(static, 1)
    for (int64_t h = 0; h < hkv; h++) {
        const int64_t lenp = (len + 15) & ~(int64_t)15, de = d + 6;   /* tiles of 6 dims write up to d + 5 */
        /* kf, vf [lenp][d]; per tile: qt [d][16], ot [de][16], mx, sum, lim [16] each; s [BLK_KEYS + 6][16] */
        const int64_t per = d * 16 + de * 16 + 48;
        float *kf = (float *)aligned_alloc(64, sizeof(float) * (size_t)(2 * lenp * d + nt * per + (BLK_KEYS + 6) * 16 + 64));
        float *vf = kf + lenp * d, *state = vf + lenp * d, *s = state + nt * per;
        int64_t *keys = (int64_t *)malloc(sizeof(int64_t) * (size_t)(nt > 0 ? nt : 1));
        for (int64_t j = 0; j < len; j++) {
            load_row(kf + j * d, kc, sl[j] * hkv + h, d, bf16);
            load_row(vf + j * d, vc, sl[j] * hkv + h, d, bf16);
        }
        for (int64_t ti = 0; ti < nt; ti++) {   /* each tile's queries (transposed, scaled) and empty state */
            float *qt = state + ti * per, *ot = qt + d * 16, *mx = ot + de * 16, *sum = mx + 16;
            int32_t *ll = (int32_t *)(sum + 16);
            const int64_t i0 = ti * 16, nl = mq - i0 < 16 ? mq - i0 : 16;
            int64_t kk = 0;
            for (int64_t l = 0; l < nl; l++) {
                ll[l] = (int32_t)(lim ? lim[(i0 + l) / g] : len - 1);
                kk = ll[l] + 1 > kk ? ll[l] + 1 : kk;
            }
            for (int64_t l = nl; l < 16; l++) ll[l] = (int32_t)(kk - 1);   /* padding lanes: zero queries, dropped */
            keys[ti] = kk;
            memset(qt, 0, sizeof(float) * (size_t)(d * 16));
            for (int64_t l = 0; l < nl; l++) {
                const int64_t at = ((i0 + l) / g) * hq + h * g + (i0 + l) % g;
                for (int64_t e = 0; e < d; e++) {
                    float x;
                    if (q) x = q[at * d + e];
                    else x = bf16_to_f32(qb[at * d + e]);
                    qt[e * 16 + l] = x * scale;
                }
            }
            memset(ot, 0, sizeof(float) * (size_t)(de * 16));
            for (int l = 0; l < 16; l++) { mx[l] = -3.0e38f; sum[l] = 0.f; }
        }
        for (int64_t b0 = 0; b0 < len; b0 += BLK_KEYS)
            for (int64_t ti = 0; ti < nt; ti++) {
                if (keys[ti] <= b0) continue;
                float *qt = state + ti * per, *ot = qt + d * 16, *mx = ot + de * 16, *sum = mx + 16;
                const int32_t *ll = (const int32_t *)(sum + 16);
                const int64_t b1 = keys[ti] < b0 + BLK_KEYS ? keys[ti] : b0 + BLK_KEYS, nb = b1 - b0;
                for (int64_t j0 = 0; j0 < nb; j0 += 6)
                    tile6x16(kf + (b0 + j0) * d, d, 1, nb - j0 < 6 ? nb - j0 : 6, qt, d, s + j0 * 16, 0);
                for (int half = 0; half < 16; half += 8) {
                    const __m256i lv = _mm256_loadu_si256((const __m256i *)(ll + half));
                    int32_t lo = ll[half];
                    for (int l = 1; l < 8; l++) lo = ll[half + l] < lo ? ll[half + l] : lo;
                    const __m256 old = _mm256_loadu_ps(mx + half);
                    __m256 top = old;
                    for (int64_t j = 0; j < nb; j++) {   /* keys past a lane's lim: a large negative, weight ~0 */
                        __m256 x = _mm256_load_ps(s + j * 16 + half);
                        if (b0 + j > lo) {
                            const __m256 past = _mm256_castsi256_ps(
                                _mm256_cmpgt_epi32(_mm256_set1_epi32((int32_t)(b0 + j)), lv));
                            x = _mm256_blendv_ps(x, _mm256_set1_ps(-3.0e38f), past);
                            _mm256_store_ps(s + j * 16 + half, x);
                        }
                        top = _mm256_max_ps(top, x);
                    }
                    const __m256 c = exp8(_mm256_sub_ps(old, top));   /* the earlier blocks' share, rescaled */
                    __m256 tot = _mm256_mul_ps(_mm256_loadu_ps(sum + half), c);
                    for (int64_t j = 0; j < nb; j++) {
                        const __m256 p = exp8(_mm256_sub_ps(_mm256_load_ps(s + j * 16 + half), top));
                        _mm256_store_ps(s + j * 16 + half, p);
                        tot = _mm256_add_ps(tot, p);
                    }
                    if (b0 > 0)
                        for (int64_t e = 0; e < d; e++)
                            _mm256_store_ps(ot + e * 16 + half, _mm256_mul_ps(_mm256_load_ps(ot + e * 16 + half), c));
                    _mm256_storeu_ps(mx + half, top);
                    _mm256_storeu_ps(sum + half, tot);
                }
                for (int64_t e0 = 0; e0 < d; e0 += 6)
                    tile6x16(vf + b0 * d + e0, 1, d, d - e0 < 6 ? d - e0 : 6, s, nb, ot + e0 * 16, 1);
            }
        for (int64_t ti = 0; ti < nt; ti++) {
            const float *qt = state + ti * per, *ot = qt + d * 16, *mx = ot + de * 16, *sum = mx + 16;
            const int64_t i0 = ti * 16, nl = mq - i0 < 16 ? mq - i0 : 16;
            for (int64_t l = 0; l < nl; l++) {
                const int64_t at = ((i0 + l) / g) * hq + h * g + (i0 + l) % g;
                const float inv = 1.f / sum[l];
                for (int64_t e = 0; e < d; e++) {
                    const float x = ot[e * 16 + l] * inv;
                    if (out_bf16) ((uint16_t *)out)[at * d + e] = f32_to_bf16(x);
                    else ((float *)out)[at * d + e] = x;
                }
                if (lse) lse[at] = mx[l] + logf(sum[l]);
            }
        }
        free(keys);
        free(kf);
    }
}
#endif
