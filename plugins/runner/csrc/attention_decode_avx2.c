/* The decode row kernel for CPUs with AVX2 and FMA but no AVX-512 (AMD Zen 2/3, Intel Haswell to Comet Lake):
 * `decode_row8`, one fp32 query token over its context in a bf16 or fp8 (E4M3, E5M2) cache, plain attention,
 * d % 16 == 0 and d <= 256. It walks the keys by blocks of 16, head by head (the shape of attention_decode.c's
 * decode_row_bf16), and asks for the lines of the next block (kernel_common.h's PF_DECODE, block_rows) into L2 a few
 * at a time, in address order, spread over the block's work (pf_stream: a few lines per 16 values of a head's K, per
 * key of its V), the stream running on from the K pass into the V pass and from the V pass into the next row's K.
 *
 * Each 16 cache values are read as two fp32 vectors by a few integer ops, with no shuffle:
 * - bf16: one 256-bit load; (w << 16) and (w & 0xffff0000) are the even and the odd values (attend_pairs8's trick), so
 *   the query is split into its even and odd values once per row and the output is interleaved back at the end;
 * - fp8 (with F16C, as every AVX2 CPU has): 16 codes become fp16 bits (E5M2: the code is fp16's top byte; E4M3: its
 *   value times 2^-8, subnormals included, as in attention_fp8.c) and vcvtph2ps widens eight at a time, in order; the
 *   2^8 is folded into the score scale (K) and the final normalization (V).
 *
 * Why: before it, an fp8 cache on these CPUs took the portable path (each row's context widened to fp32 rows in memory,
 * then `attend`): W1's decode attention over an fp8 cache cost more than over bf16, though it reads half the bytes.
 * Measured on an AMD Zen 3 core (benchmarks/decode_kernel.sh with QF32=1, one thread, 8 layers' scattered caches, means
 * of alternating runs): over fp8 E4M3 (KVT=2) W1's 32 x 192 rows 47.0-47.7 -> 11.2-11.5 ms per step and W3's 16 x
 * 2,048 rows 237-274 -> 62-66 ms; over bf16 against attend_pairs8 (which it replaced) 21.0-25.1 -> 20.6-22.5 ms and
 * 116-126 -> 113-115 ms. From L3 this core runs the bf16 rows at 25 GB/s and the fp8 ones at 9 GB/s (the widening
 * is the work).
 *
 * Why the prefetches are spread: a whole head's lines of the next block asked for at once (32 prefetcht1 in a burst,
 * as decode_row_bf16 does on AVX-512) fill L1's miss buffers, the loads behind them wait, and the work and the memory
 * traffic took turns: W1's rows ran at 10-11 GB/s, what 25 GB/s of work and 18.5 GB/s of plain reads of scattered
 * 16 KB blocks (huge pages) give one after the other. Spread over the block (QF32=1 decode_kernel.sh, huge pages, three
 * alternating rounds on the Zen 3, means): W1's 32 x 192 rows 9.9-10.8 -> 6.9-7.1 ms per step (best 5.8-6.0 ms,
 * 17 GB/s) and W3's 16 x 2,048 rows 59-63 -> 38-39 ms; over fp8 no change (the widening, not memory, is the limit).
 * Coarser spreads gave less: a whole row per head and eight keys 7.8-9.2 ms, a run of lines per head and eight keys
 * (K) and per head (V) 6.3-8.4 ms. */

#include "kernel_common.h"

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
/* 16 cache values at p (bf16, or fp8 codes: kvt) as two fp32 vectors: bf16 -> (even values, odd values), fp8 ->
 * (values 0-7, values 8-15), E4M3 as its values times 2^-8 */
static inline __attribute__((always_inline)) void load_piece16(const char *p, int kvt, __m256 *a, __m256 *b) {
    if (kvt == KV_BF16) {
        const __m256i x = _mm256_loadu_si256((const __m256i *)p);
        *a = _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
        *b = _mm256_castsi256_ps(_mm256_and_si256(x, _mm256_set1_epi32((int)0xffff0000u)));
        return;
    }
#if ROW8_FP8
    /* each code in a 16-bit lane's top byte; E4M3: an arithmetic shift by one puts the exponent and mantissa bits
     * where fp16's low exponent bits and top mantissa bits are, and the sign's copy in bit 14 is cleared */
    __m256i h = _mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p)), 8);
    if (kvt == KV_E4M3) h = _mm256_and_si256(_mm256_srai_epi16(h, 1), _mm256_set1_epi16((short)0xbfff));
    *a = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
    *b = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
#else
    (void)p; *a = *b = _mm256_setzero_ps();   /* not reached: paged_attention sends fp8 elsewhere without F16C */
#endif
}

/* One decode row, fp32 queries over a bf16 or fp8 cache (kvt; d = D, D % 16 == 0, <= 256): keys sl[0..len), by blocks
 * of 16 keys, head by head within a block. Scores: eight keys' partial dot products side by side in registers, one
 * transposing sum (hsum8) per eight. Softmax: softmax8_rows (normalized scores, and the log-sum-exp with lse). V pass:
 * a head's output, 64 values at a time, stays in registers over the block. qx and ox: hq * D floats of scratch each,
 * the query and the output in the order load_piece16 gives (per 16 values: its a, then its b). Writes each head's
 * output (fp32, in order) to dst. */
static inline __attribute__((always_inline)) void row8(const float *qt, float *dst, float *lse, const char *kc,
        const char *vc, int kvt, const int64_t *sl, int64_t len, int64_t hq, int64_t hkv, const int64_t D, float scale,
        float *scores, float *qx, float *ox, const int64_t *next_sl, int64_t next_len) {
    const int64_t g = hq / hkv, es = kv_bytes(kvt), rowb = hkv * D * es, hb = D * es, P = D / 16;
    const int pairs = kvt == KV_BF16;
    const float unit = fp8_unit(kvt);
    const float *q = qt;
    if (pairs) {   /* even and odd values of each 16, apart */
        for (int64_t i = 0; i < hq * D; i += 16)
            for (int64_t w = 0; w < 8; w++) { qx[i + w] = qt[i + 2 * w]; qx[i + 8 + w] = qt[i + 2 * w + 1]; }
        q = qx;
    }
    const __m256 vs = _mm256_set1_ps(scale * unit);
    for (int64_t j0 = 0; j0 < len; j0 += 16) {
        const int64_t nk = len - j0 < 16 ? len - j0 : 16;
        const char *kr[16], *pr[16];
        const int64_t nn = block_rows(kr, pr, kc, sl, j0, len, rowb, vc, sl, len);
        pf_stream pf = pf_start(pr, nn, rowb, hq * ((nk + 7) / 8) * P);   /* a few lines per piece */
        for (int64_t hh = 0; hh < hq; hh++) {
            const int64_t off = (hh / g) * hb;
            const float *qh = q + hh * D;
            for (int64_t half = 0; half < 16 && half < nk; half += 8) {
                __m256 acc[8];
                for (int k = 0; k < 8; k++) acc[k] = _mm256_setzero_ps();
                for (int64_t p = 0; p < P; p++) {
                    pf_some(&pf);
                    const __m256 qa = _mm256_loadu_ps(qh + 16 * p), qb = _mm256_loadu_ps(qh + 16 * p + 8);
                    for (int k = 0; k < 8; k++) {
                        __m256 a, b;
                        load_piece16(kr[half + k] + off + 16 * p * es, kvt, &a, &b);
                        acc[k] = _mm256_fmadd_ps(qa, a, acc[k]);
                        acc[k] = _mm256_fmadd_ps(qb, b, acc[k]);
                    }
                }
                const __m256 s = _mm256_mul_ps(hsum8(acc), vs);
                if (nk - half >= 8) _mm256_storeu_ps(scores + hh * len + j0 + half, s);
                else {
                    float tmp[8];
                    _mm256_storeu_ps(tmp, s);
                    for (int64_t k = 0; k < nk - half; k++) scores[hh * len + j0 + half + k] = tmp[k];
                }
            }
        }
    }
    softmax8_rows(scores, hq, len, lse);
    for (int64_t j0 = 0; j0 < len; j0 += 16) {
        const int64_t nk = len - j0 < 16 ? len - j0 : 16;
        const char *vr[16], *pr[16];
        const int64_t nn = block_rows(vr, pr, vc, sl, j0, len, rowb, next_sl ? kc : NULL, next_sl, next_len);
        pf_stream pf = pf_start(pr, nn, rowb, hq * nk);   /* a few lines per key */
        for (int64_t hh = 0; hh < hq; hh++) {
            const int64_t off = (hh / g) * hb;
            const float *pp = scores + hh * len + j0;
            for (int64_t p0 = 0; p0 < P; p0 += 4) {   /* 64 values: eight accumulators */
                const int64_t np = P - p0 < 4 ? P - p0 : 4;
                float *o = ox + hh * D + 16 * p0;
                __m256 acc[8];
                for (int64_t v = 0; v < 2 * np; v++) acc[v] = j0 ? _mm256_loadu_ps(o + 8 * v) : _mm256_setzero_ps();
                for (int64_t k = 0; k < nk; k++) {
                    if (p0 == 0) pf_some(&pf);
                    const __m256 pj = _mm256_set1_ps(pp[k]);
                    for (int64_t p = 0; p < np; p++) {
                        __m256 a, b;
                        load_piece16(vr[k] + off + 16 * (p0 + p) * es, kvt, &a, &b);
                        acc[2 * p] = _mm256_fmadd_ps(pj, a, acc[2 * p]);
                        acc[2 * p + 1] = _mm256_fmadd_ps(pj, b, acc[2 * p + 1]);
                    }
                }
                for (int64_t v = 0; v < 2 * np; v++) _mm256_storeu_ps(o + 8 * v, acc[v]);
            }
        }
    }
    const __m256 u = _mm256_set1_ps(unit);
    for (int64_t i = 0; i < hq * D; i += 16) {
        const __m256 a = _mm256_mul_ps(_mm256_loadu_ps(ox + i), u), b = _mm256_mul_ps(_mm256_loadu_ps(ox + i + 8), u);
        if (pairs) {   /* a holds values 0, 2, .. 14 and b 1, 3, .. 15: interleave */
            const __m256 lo = _mm256_unpacklo_ps(a, b), hi = _mm256_unpackhi_ps(a, b);
            _mm256_storeu_ps(dst + i, _mm256_permute2f128_ps(lo, hi, 0x20));
            _mm256_storeu_ps(dst + i + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
        } else {
            _mm256_storeu_ps(dst + i, a);
            _mm256_storeu_ps(dst + i + 8, b);
        }
    }
}

/* row8 with the head size a constant where it is a common one, so the loops over pieces unroll */
void decode_row8(const float *qt, float *dst, float *lse, const char *kc, const char *vc, int kvt,
                        const int64_t *sl, int64_t len, int64_t hq, int64_t hkv, int64_t d, float scale,
                        float *scores, float *qx, float *ox, const int64_t *next_sl, int64_t next_len) {
    if (d == 64) row8(qt, dst, lse, kc, vc, kvt, sl, len, hq, hkv, 64, scale, scores, qx, ox, next_sl, next_len);
    else if (d == 128) row8(qt, dst, lse, kc, vc, kvt, sl, len, hq, hkv, 128, scale, scores, qx, ox, next_sl, next_len);
    else row8(qt, dst, lse, kc, vc, kvt, sl, len, hq, hkv, d, scale, scores, qx, ox, next_sl, next_len);
}
#endif
