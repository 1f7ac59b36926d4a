"""The row kernels for CPUs with AVX2 and FMA but no AVX-512 (AMD Zen 2/3, Intel before Skylake-SP): `attend_vec8`,
plain attention of one fp32 query token over its context in an fp32 or bf16 cache (d % 8 == 0, d <= 256), eight keys'
scores per transposing sum, a vector e^x and softmax; and the helpers ckernel_decode_avx2's decode_row8 (bf16 and
fp8 caches, d % 16 == 0) shares with it. Without them those machines ran `attend`, one horizontal sum per key and head
and a scalar expf per score.

Measured on a Zen 3 core (benchmarks/decode_attention.py --q-dtype float32 --base 7547015, one thread, while
another process ran the test suite on the second core): W1's decode (32 x 192) 1.14-1.24x `attend` in three runs;
W3's (16 x 2,048) 0.88-1.14x, within this machine's noise there. In place in the W1 decode step
(benchmarks/gemm_fraction.py --dtype float32) attention went from 15.9 to 13.9-15.1 ms. (Those figures are of
attend_vec8 and attend_pairs8, the bf16 kernel decode_row8 replaced.)"""

SOURCE = r"""
#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
#ifndef PF_KEYS
#define PF_KEYS 32   /* keys ahead whose K (then V) rows are prefetched */
/* NOTE: prefetched into L2 (locality 2: prefetcht1), here and in ckernel_rows: into L1 the requests waited for L1's
 * few miss buffers. Measured on an AMD Zen 4 built without AVX-512 (benchmarks/decode_kernel.sh with
 * CFLAGS_EXTRA=-mno-avx512f QF32=1), one thread, 8 layers' scattered caches, fp32 queries: W1's 32 x 192 rows
 * 14.7-15.0 -> 9.3-9.6 ms per step, W3's 16 x 2,048 89-94 -> 50-52 ms; the AVX-512 fp32 rows (attend_vec)
 * 14.4-15.4 -> 10.4-11.1 and 89.4 -> 62-69 ms. Not measured on a Zen 3. */
#endif
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

/* e^x for 8 lanes (x <= 0: scores minus their maximum), as exp16: x = n ln2 + r, e^r to r^7, times 2^n (n >= -126
 * after the clamp, so 2^n is a normal number built in the exponent bits) */
static inline __m256 exp8(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187e-06f), r);
    __m256 p = _mm256_set1_ps(1.f / 5040.f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 720.f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 120.f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 24.f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 6.f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
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

/* One query token (fp32 q, every head) over its context (slots sl[0..len)), d % 8 == 0, d <= 256, plain attention:
 * S = q K^T eight keys at a time (one transposing sum for the eight, not one per key), the softmax, then
 * out = P V with each head's output held in registers 64 dims at a time over a block of keys. */
static void attend_vec8(const float *qt, float *ot, const void *kc, const void *vc, int bf16, const int64_t *sl,
                        int64_t len, int64_t hq, int64_t hkv, int64_t d, float scale, float *scores, float *lse) {
    const int64_t g = hq / hkv, rowlen = hkv * d, es = bf16 ? 2 : 4;
    const int64_t full = len & ~(int64_t)7;
    const __m256 vs = _mm256_set1_ps(scale);
    for (int64_t j0 = 0; j0 < full; j0 += 8) {
        for (int64_t k = j0 + PF_KEYS; k < j0 + PF_KEYS + 8 && k < len; k++)   /* every line, early */
            prefetch_l2((const char *)kc + sl[k] * rowlen * es, rowlen * es);
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
    for (int64_t j = full; j < len; j++)
        for (int64_t hh = 0; hh < hq; hh++) {
            const int64_t base = sl[j] * rowlen + (hh / g) * d;
            __m256 a = _mm256_mul_ps(_mm256_loadu_ps(qt + hh * d), load8(kc, base, bf16));
            for (int64_t v = 8; v < d; v += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(qt + hh * d + v), load8(kc, base + v, bf16), a);
            scores[hh * len + j] = hadd8(a) * scale;
        }
    softmax8_rows(scores, hq, len, lse);
    memset(ot, 0, sizeof(float) * (size_t)(hq * d));
    for (int64_t j0 = 0; j0 < len; j0 += 16) {
        const int64_t j1 = j0 + 16 < len ? j0 + 16 : len;
        for (int64_t k = j0 + PF_KEYS; k < j0 + PF_KEYS + 16 && k < len; k++)
            prefetch_l2((const char *)vc + sl[k] * rowlen * es, rowlen * es);
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
"""
