/* The attention kernel's fp8 KV cache in C: rounding fp32 into fp8 codes (E4M3, or E5M2), reading them back, and
 * `decode_row_fp8`, the decode row kernel over an fp8 cache (AVX-512).
 *
 * Codes, as torch's float8_e4m3fn and float8_e5m2 hold them (one byte per value, no scale: vLLM's default scale of 1.0
 * when a checkpoint brings none). Writes round to nearest, ties to even, and saturate: past +-448 (E4M3) or +-57,344
 * (E5M2) a value is stored as that largest finite one, as torch's E4M3 conversion does (its E5M2 conversion gives
 * inf, so the portable path clamps first).
 *
 * Reading: a code becomes fp16 bits with two shifts and a mask, and fp16 becomes fp32 in one instruction
 * (vcvtph2ps). E5M2 is fp16's top byte. E4M3's exponent and mantissa bits, placed in fp16's, read as the value times
 * 2^-8, subnormals included; the kernel multiplies the 256 back into the score scale (K) and the final normalization
 * (V), so no per-value multiply is spent on it.
 *
 * Why: decode attention streams every request's whole context from memory each step. At W1's batch-32 decode step
 * the bf16 cache is 102 MB per step against 84 MB of weights; half the bytes is half the least time attention can
 * take (benchmarks/gemm_fraction.py prints that floor). */

#include "kernel_common.h"

#if defined(__AVX512F__)
/* nk (<= 16) cache rows of rowlen fp8 codes (rowlen % 16 == 0), at slots sl[0..nk), into buf as fp32 (unit
 * not applied): one block of keys converted once, then read by every query head that shares it (GQA) */
static inline void widen_fp8_rows(float *buf, const uint8_t *cache, const int64_t *sl, int64_t nk, int64_t rowlen,
                                  int kvt) {
    for (int64_t k = 0; k < nk; k++) {
        const uint8_t *r = cache + sl[k] * rowlen;
        for (int64_t e = 0; e < rowlen; e += 16) _mm512_storeu_ps(buf + k * rowlen + e, load16_fp8(r + e, kvt));
    }
}

/* One query token (fp32 q, every head) over its keys sl[0..len) of an fp8 cache, plain attention (d % 16 == 0,
 * d <= 256). Keys in blocks of 16: a block's K rows widened to fp32 once, every head's 16 scores from one
 * transposing sum; then the block's V rows, each head's output held in registers over the block. Writes each head's
 * normalized output (fp32) to dst and, with lse, its log-sum-exp. buf: 16 * hkv * d floats of scratch. */
void decode_row_fp8(const float *qt, float *dst, float *lse, const uint8_t *kc, const uint8_t *vc,
                           const int64_t *sl, int64_t len, int64_t hq, int64_t hkv, int64_t d, float scale, int kvt,
                           float *scores, float *buf) {
    const int64_t g = hq / hkv, rowlen = hkv * d, nv = d / 16;
    const float unit = fp8_unit(kvt);
    const __m512 vs = _mm512_set1_ps(scale * unit);
    for (int64_t j0 = 0; j0 < len; j0 += 16) {
        const int64_t nk = len - j0 < 16 ? len - j0 : 16;
        widen_fp8_rows(buf, kc, sl + j0, nk, rowlen, kvt);
        for (int64_t hh = 0; hh < hq; hh++) {
            const float *qq = qt + hh * d, *kb = buf + (hh / g) * d;
            __m512 acc[16];
            for (int64_t k = 0; k < 16; k++) {
                if (k >= nk) { acc[k] = _mm512_setzero_ps(); continue; }
                __m512 a = _mm512_mul_ps(_mm512_loadu_ps(qq), _mm512_loadu_ps(kb + k * rowlen));
                for (int64_t v = 1; v < nv; v++)
                    a = _mm512_fmadd_ps(_mm512_loadu_ps(qq + 16 * v), _mm512_loadu_ps(kb + k * rowlen + 16 * v), a);
                acc[k] = a;
            }
            const __m512 s = _mm512_mul_ps(hsum16(acc), vs);
            store_scores16(scores + hh * len + j0, s, nk);
        }
    }
    float inv[256 + 1];   /* hq <= 256 (checked by the caller) */
    softmax_exp_rows(scores, hq, len, lse, inv);
    memset(dst, 0, sizeof(float) * (size_t)(hq * d));
    for (int64_t j0 = 0; j0 < len; j0 += 16) {
        const int64_t nk = len - j0 < 16 ? len - j0 : 16;
        widen_fp8_rows(buf, vc, sl + j0, nk, rowlen, kvt);
        for (int64_t hh = 0; hh < hq; hh++) {
            __m512 o[16];
            float *op = dst + hh * d;
            const float *sc = scores + hh * len + j0, *vb = buf + (hh / g) * d;
            for (int64_t v = 0; v < nv; v++) o[v] = _mm512_loadu_ps(op + 16 * v);
            for (int64_t k = 0; k < nk; k++) {
                const __m512 p = _mm512_set1_ps(sc[k]);
                for (int64_t v = 0; v < nv; v++) o[v] = _mm512_fmadd_ps(p, _mm512_loadu_ps(vb + k * rowlen + 16 * v), o[v]);
            }
            for (int64_t v = 0; v < nv; v++) _mm512_storeu_ps(op + 16 * v, o[v]);
        }
    }
    for (int64_t hh = 0; hh < hq; hh++) {
        const __m512 s = _mm512_set1_ps(inv[hh] * unit);
        for (int64_t e = 0; e < d; e += 16) _mm512_storeu_ps(dst + hh * d + e, _mm512_mul_ps(_mm512_loadu_ps(dst + hh * d + e), s));
    }
}
#endif
