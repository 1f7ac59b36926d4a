/* The row-by-row attention kernels for every variant, in fp32 math: `attend` (any head size, sliding window,
 * logit soft-capping, sink logits) and `attend_vec` (AVX-512, d % 16 == 0, plain attention, 16 keys per block). One
 * query token over its context, every head at once; the fp32 path (the parity reference) runs these. */

#include "kernel_common.h"

#define PF_AHEAD 4
#ifndef PF_BLOCKS
#define PF_BLOCKS 2
#endif

#if defined(__AVX512F__)
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

/* Head hh's share (per rows) of the rows PF_BLOCKS blocks ahead of key j0, into L2: spread over a block's heads
 * instead of one burst at its start; the rows past the last key are `next`'s first ones (V's, which the V pass
 * starts on). NOTE: Gemma 3 270M's F16 GGUF (4 query heads over one KV head of 256, fp32 cache, contexts 128-256),
 * one thread, loaded machine, decode_layer_attention alternated with the burst in one process: 42.1 against
 * 49.4 us a layer (median of 13,716 calls each), the same greedy tokens; 1 or 4 blocks ahead: no better than 2. */
static inline void prefetch_share(const void *cache, const void *next, const int64_t *sl, int64_t j0, int64_t hh,
                                  int64_t per, int64_t len, int64_t rowb) {
    const int64_t ahead = j0 + 16 * PF_BLOCKS, a = ahead + hh * per, e = a + per < ahead + 16 ? a + per : ahead + 16;
    if (a < len) prefetch_rows(cache, sl, a, e, len, rowb);
    else if (next && a - len < 16 * PF_BLOCKS) prefetch_rows(next, sl, a - len, e - len, len, rowb);
}

/* attend() for d % 16 == 0, d <= 256: keys in blocks of 16 (one block of the cache when block_size is 16), every
 * head's scores of a block from one transposing reduction instead of one horizontal sum per key and head; the
 * weighted sum of V keeps each head's output in registers over a block. */
void attend_vec(const float *qt, const uint16_t *qbt, float *ot, const void *kc, const void *vc, int bf16,
                       const int64_t *sl, int64_t len, int64_t hq, int64_t hkv, int64_t d, float scale,
                       float *scores, float *lse) {
    const int64_t g = hq / hkv, rowlen = hkv * d, es = bf16 ? 2 : 4, nv = d / 16;
    const int64_t full = len & ~(int64_t)15;
    const __m512 vs = _mm512_set1_ps(scale);
    const int64_t per = (16 + hq - 1) / hq;
    for (int64_t j0 = 0; j0 < full; j0 += 16)
        for (int64_t hh = 0; hh < hq; hh++) {
            prefetch_share(kc, vc, sl, j0, hh, per, len, rowlen * es);
            _mm512_storeu_ps(scores + hh * len + j0,
                             _mm512_mul_ps(dot16(qt + hh * d, qbt ? qbt + hh * d : NULL, kc, bf16, sl + j0, rowlen,
                                                 (hh / g) * d, d), vs));
        }
    for (int64_t j = full; j < len; j++)   /* the keys past the last block of 16, one at a time */
        for (int64_t hh = 0; hh < hq; hh++)
            scores[hh * len + j] = dot_key16(qt + hh * d, kc, sl[j] * rowlen + (hh / g) * d, d, bf16) * scale;
    softmax_rows(scores, hq, len, lse);
    memset(ot, 0, sizeof(float) * (size_t)(hq * d));
    for (int64_t j0 = 0; j0 < len; j0 += 16) {
        const int64_t j1 = j0 + 16 < len ? j0 + 16 : len;
        for (int64_t hh = 0; hh < hq; hh++) {
            prefetch_share(vc, NULL, sl, j0, hh, per, len, rowlen * es);
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

#if defined(__AVX512F__)
/* One head's d values (d % 16 == 0, <= 256) at `off` into registers; returns how many vectors (d / 16). */
static inline int64_t load_head(__m512 *dst, const void *cache, int64_t off, int64_t d, int bf16) {
    for (int64_t v = 0; v < d / 16; v++) dst[v] = load16(cache, off + 16 * v, bf16);
    return d / 16;
}
#endif

/* One query token over its whole context, all heads at once: for each context slot the K (then V)
 * rows of every head are one contiguous run of hkv*d values, so the reads stream through memory.
 * scores[hh*len + j] = q_hh . K[j, hh / g] * scale; softmax over j; out_hh = sum_j p_j V[j, hh / g]. */
void attend(const float *qt, float *ot, const void *kc, const void *vc, int bf16, const int64_t *sl,
                   int64_t len, int64_t hq, int64_t hkv, int64_t d, float scale, float softcap,
                   const float *sinks, float *scores, float *row, float *lse) {
    const int64_t g = hq / hkv, rowlen = hkv * d, rowb = rowlen * (bf16 ? 2 : 4);
#if defined(__AVX512F__)
    const int vec = d % 16 == 0 && d <= 256;
#endif
    for (int64_t j = 0; j < len; j++) {
        prefetch_rows(kc, sl, j + PF_AHEAD, j + PF_AHEAD + 1, len, rowb);   /* the next rows sit in another block */
        for (int64_t h = 0; h < hkv; h++) {
#if defined(__AVX512F__)
            if (vec) {
                __m512 k[16];
                const int64_t nv = load_head(k, kc, sl[j] * rowlen + h * d, d, bf16);
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
        prefetch_rows(vc, sl, j + PF_AHEAD, j + PF_AHEAD + 1, len, rowb);
        for (int64_t h = 0; h < hkv; h++) {
#if defined(__AVX512F__)
            if (vec) {
                __m512 v16[16];
                const int64_t nv = load_head(v16, vc, sl[j] * rowlen + h * d, d, bf16);
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
