"""The attention kernel's fp8 KV cache in C: rounding fp32 into fp8 codes (E4M3, or E5M2), reading them back, and
`decode_row_fp8`, the decode row kernel over an fp8 cache (AVX-512).

Codes, as torch's float8_e4m3fn and float8_e5m2 hold them (one byte per value, no scale: vLLM's default scale of 1.0
when a checkpoint brings none). Writes round to nearest, ties to even, and saturate: past +-448 (E4M3) or +-57,344
(E5M2) a value is stored as that largest finite one, as torch's E4M3 conversion does (its E5M2 conversion gives
inf, so the portable path clamps first).

Reading: a code becomes fp16 bits with two shifts and a mask, and fp16 becomes fp32 in one instruction
(vcvtph2ps). E5M2 is fp16's top byte. E4M3's exponent and mantissa bits, placed in fp16's, read as the value times
2^-8, subnormals included; the kernel multiplies the 256 back into the score scale (K) and the final normalization
(V), so no per-value multiply is spent on it.

Why: decode attention streams every request's whole context from memory each step. At W1's batch-32 decode step
the bf16 cache is 102 MB per step against 84 MB of weights; half the bytes is half the least time attention can
take (benchmarks/gemm_fraction.py prints that floor).
"""

SOURCE = r"""
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
static void decode_row_fp8(const float *qt, float *dst, float *lse, const uint8_t *kc, const uint8_t *vc,
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
            if (nk == 16) _mm512_storeu_ps(scores + hh * len + j0, s);
            else _mm512_mask_storeu_ps(scores + hh * len + j0, (__mmask16)((1u << nk) - 1), s);
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
"""
