/* The row kernels for CPUs with AVX2 and FMA but no AVX-512 (AMD Zen 2/3, Intel before Skylake-SP): `attend_vec8`,
 * plain attention of one fp32 query token over its context in an fp32 or bf16 cache (d % 8 == 0, d <= 256), eight
 * keys' scores per transposing sum, a vector e^x and softmax (kernel_common.h's AVX2 helpers, which
 * attention_decode_avx2.c's decode_row8 shares). Without them those machines ran `attend`, one horizontal sum per
 * key and head and a scalar expf per score.
 *
 * Measured on a Zen 3 core (benchmarks/decode_attention.py --q-dtype float32 --base 7547015, one thread, while
 * another process ran the test suite on the second core): W1's decode (32 x 192) 1.14-1.24x `attend` in three runs;
 * W3's (16 x 2,048) 0.88-1.14x, within this machine's noise there. In place in the W1 decode step
 * (benchmarks/gemm_fraction.py --dtype float32) attention went from 15.9 to 13.9-15.1 ms. (Those figures are of
 * attend_vec8 and attend_pairs8, the bf16 kernel decode_row8 replaced.) */

#include "kernel_common.h"

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
#ifndef PF_KEYS
#define PF_KEYS 32   /* keys ahead whose K (then V) rows are prefetched */
/* NOTE: prefetched into L2 (locality 2: prefetcht1), here and in attention_rows.c: into L1 the requests waited for L1's
 * few miss buffers. Measured on an AMD Zen 4 built without AVX-512 (benchmarks/decode_kernel.sh with
 * CFLAGS_EXTRA=-mno-avx512f QF32=1), one thread, 8 layers' scattered caches, fp32 queries: W1's 32 x 192 rows
 * 14.7-15.0 -> 9.3-9.6 ms per step, W3's 16 x 2,048 89-94 -> 50-52 ms; the AVX-512 fp32 rows (attend_vec)
 * 14.4-15.4 -> 10.4-11.1 and 89.4 -> 62-69 ms. Not measured on a Zen 3. */
#endif
/* One query token (fp32 q, every head) over its context (slots sl[0..len)), d % 8 == 0, d <= 256, plain attention:
 * S = q K^T eight keys at a time (one transposing sum for the eight, not one per key), the softmax, then
 * out = P V with each head's output held in registers 64 dims at a time over a block of keys. */
void attend_vec8(const float *qt, float *ot, const void *kc, const void *vc, int bf16, const int64_t *sl,
                        int64_t len, int64_t hq, int64_t hkv, int64_t d, float scale, float *scores, float *lse) {
    const int64_t g = hq / hkv, rowlen = hkv * d, es = bf16 ? 2 : 4;
    const int64_t full = len & ~(int64_t)7;
    const __m256 vs = _mm256_set1_ps(scale);
    for (int64_t j0 = 0; j0 < full; j0 += 8) {
        prefetch_rows(kc, sl, j0 + PF_KEYS, j0 + PF_KEYS + 8, len, rowlen * es);   /* every line, early */
        for (int64_t hh = 0; hh < hq; hh++) {
            const float *qq = qt + hh * d;
            const int64_t off = (hh / g) * d;
            /* the eight keys' sums side by side: eight independent FMA chains, not one chain per key */
            __m256 acc[8];
            int64_t base[8];
            for (int k = 0; k < 8; k++) { acc[k] = _mm256_setzero_ps(); base[k] = sl[j0 + k] * rowlen + off; }
            for (int64_t v = 0; v < d; v += 8) {
                const __m256 qv = _mm256_loadu_ps(qq + v);
                for (int k = 0; k < 8; k++) acc[k] = _mm256_fmadd_ps(qv, load8(kc, base[k] + v, bf16), acc[k]);
            }
            _mm256_storeu_ps(scores + hh * len + j0, _mm256_mul_ps(hsum8(acc), vs));
        }
    }
    for (int64_t j = full; j < len; j++)   /* the keys past the last block of 8, one at a time */
        for (int64_t hh = 0; hh < hq; hh++)
            scores[hh * len + j] = dot_key8(qt + hh * d, kc, sl[j] * rowlen + (hh / g) * d, d, bf16) * scale;
    softmax8_rows(scores, hq, len, lse);
    memset(ot, 0, sizeof(float) * (size_t)(hq * d));
    for (int64_t j0 = 0; j0 < len; j0 += 16) {
        const int64_t j1 = j0 + 16 < len ? j0 + 16 : len;
        prefetch_rows(vc, sl, j0 + PF_KEYS, j0 + PF_KEYS + 16, len, rowlen * es);
        for (int64_t hh = 0; hh < hq; hh++) {
            float *op = ot + hh * d;
            const float *sc = scores + hh * len;
            const int64_t off = (hh / g) * d;
            for (int64_t e0 = 0; e0 < d; e0 += 64) {   /* 8 registers of output at a time */
                const int64_t nv = (d - e0 < 64 ? d - e0 : 64) / 8;
                __m256 o[8];
                for (int64_t v = 0; v < nv; v++) o[v] = _mm256_loadu_ps(op + e0 + 8 * v);
                for (int64_t j = j0; j < j1; j++) {
                    const __m256 p = _mm256_set1_ps(sc[j]);
                    const int64_t base = sl[j] * rowlen + off + e0;
                    for (int64_t v = 0; v < nv; v++) o[v] = _mm256_fmadd_ps(p, load8(vc, base + 8 * v, bf16), o[v]);
                }
                for (int64_t v = 0; v < nv; v++) _mm256_storeu_ps(op + e0 + 8 * v, o[v]);
            }
        }
    }
}
#endif
