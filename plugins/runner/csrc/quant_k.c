/* The 256-weight "K" formats (8 groups of 32 per block): Q4_K, Q5_K, Q6_K. Layouts, bytes per block:
 *
 *   Q4_K  144  d:f16  dmin:f16  scales[12]  qs[128]              w = d * sc[s] * nibble - dmin * mn[s]
 *   Q5_K  176  d:f16  dmin:f16  scales[12]  qh[32]  qs[128]      w = d * sc[s] * (nibble | bit << 4) - dmin * mn[s]
 *   Q6_K  210  ql[128]  qh[64]  sc:int8[16]  d:f16               w = d * sc[i / 16] * ((nibble | 2 bits << 4) - 32)
 *
 * Q4_K / Q5_K, group s (0..7): nibbles from qs[32 * (s / 2) ..], low half for even s, high for odd; Q5_K's fifth
 * bit is bit s of qh[0..31]. The 6-bit sc[s] / mn[s] are packed in scales[12]:
 *
 *     s < 4:  sc = scales[s] & 63                               mn = scales[s + 4] & 63
 *     s >= 4: sc = scales[s + 4] & 15 | (scales[s - 4] >> 6) << 4   mn = scales[s + 4] >> 4 | (scales[s] >> 6) << 4
 *
 * Q6_K, group g (0..7), half h = g / 4: low 4 bits from ql[64 h + 32 (g & 1) ..], the low nibble for (g & 2) == 0,
 * else the high; the top 2 bits are bits 2 (g & 3) of qh[32 h ..]; scales sc[2 g] (first 16) and sc[2 g + 1].
 */

INLINE void k4_scale_min(const uint8_t *sc, int s, int *d, int *m) {
    if (s < 4) { *d = sc[s] & 63; *m = sc[s + 4] & 63; }
    else { *d = (sc[s + 4] & 15) | ((sc[s - 4] >> 6) << 4); *m = (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4); }
}
INLINE void k4_scale(const uint8_t *b, int s, qscale *out) {
    int sc, mn;
    k4_scale_min(b + 4, s, &sc, &mn);
    out->dlo = out->dhi = h2f_fast(b) * (float)sc;
    out->m = -(h2f_fast(b + 2) * (float)mn);
}
INLINE void k6_scale(const uint8_t *b, int g, qscale *out) {
    const float d = h2f_fast(b + 208);
    out->dlo = d * (float)(int8_t)b[192 + 2 * g];
    out->dhi = d * (float)(int8_t)b[193 + 2 * g];
    out->m = -0.0f;
}

INLINE void sdec_q4_k(const uint8_t *row, int64_t g, int8_t *q, qscale *s) {
    const uint8_t *b = row + (g >> 3) * 144, *qs = b + 16 + 32 * ((g & 7) >> 1);
    const int sh = (g & 1) * 4;
    k4_scale(b, (int)(g & 7), s);
    for (int j = 0; j < 32; j++) q[j] = (int8_t)((qs[j] >> sh) & 15);
}
INLINE void sdec_q5_k(const uint8_t *row, int64_t g, int8_t *q, qscale *s) {
    const int sub = (int)(g & 7), sh = (g & 1) * 4;
    const uint8_t *b = row + (g >> 3) * 176, *qh = b + 16, *qs = b + 48 + 32 * (sub >> 1);
    k4_scale(b, sub, s);
    for (int j = 0; j < 32; j++) q[j] = (int8_t)(((qs[j] >> sh) & 15) | (((qh[j] >> sub) & 1) << 4));
}
INLINE void sdec_q6_k(const uint8_t *row, int64_t g, int8_t *q, qscale *s) {
    const int sub = (int)(g & 7), h = sub >> 2, sh = (sub & 2) * 2, hs = (sub & 3) * 2;
    const uint8_t *b = row + (g >> 3) * 210, *ql = b + 64 * h + 32 * (sub & 1), *qh = b + 128 + 32 * h;
    k6_scale(b, sub, s);
    for (int j = 0; j < 32; j++) q[j] = (int8_t)((((ql[j] >> sh) & 15) | (((qh[j] >> hs) & 3) << 4)) - 32);
}

#if defined(QVEC)
INLINE __m256i nibble32(const uint8_t *qs, int high) {
    const __m256i v = _mm256_loadu_si256((const __m256i *)qs);
    return _mm256_and_si256(high ? _mm256_srli_epi16(v, 4) : v, _mm256_set1_epi8(0x0f));
}
INLINE __m256i vdec_q4_k(const uint8_t *row, int64_t g, qscale *s) {
    const uint8_t *b = row + (g >> 3) * 144;
    k4_scale(b, (int)(g & 7), s);
    return nibble32(b + 16 + 32 * ((g & 7) >> 1), (int)(g & 1));
}
INLINE __m256i vdec_q5_k(const uint8_t *row, int64_t g, qscale *s) {
    const int sub = (int)(g & 7);
    const uint8_t *b = row + (g >> 3) * 176;
    k4_scale(b, sub, s);
    const __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 16));
    const __m256i bit = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(sub)), _mm256_set1_epi8(1));
    return _mm256_or_si256(nibble32(b + 48 + 32 * (sub >> 1), sub & 1), _mm256_slli_epi16(bit, 4));
}
INLINE __m256i vdec_q6_k(const uint8_t *row, int64_t g, qscale *s) {
    const int sub = (int)(g & 7), h = sub >> 2;
    const uint8_t *b = row + (g >> 3) * 210;
    k6_scale(b, sub, s);
    const __m256i lo = nibble32(b + 64 * h + 32 * (sub & 1), sub & 2);
    const __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * h));
    const __m256i hi = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128((sub & 3) * 2)), _mm256_set1_epi8(3));
    return _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)), _mm256_set1_epi8(32));
}
#endif

/* ---- Q4_K quantizer (gguf has none in NumPy). Per group s: the offset covers the group's minimum (clamped to
 * <= 0, as the format's "- dmin * mn" needs), the scale its whole range, both 6-bit multiples of the block's fp16
 * d / dmin rounded UP, so every weight falls inside [-dmin mn, -dmin mn + 15 d sc] and is rounded to the nearest of
 * the 16 levels: |error| <= d sc / 2, with d sc <= (range + dmin) / 15 + d. Not llama.cpp's error-minimizing
 * search (a few % larger RMS error), but with a bound the tests check. */
static void quantize_block_q4_k(const float *x, uint8_t *out) {
    float negmin[8], mx[8], maxneg = 0.0f;
    for (int s = 0; s < 8; s++) {
        float lo = 0.0f, hi = -INFINITY;
        for (int j = 0; j < 32; j++) { const float v = x[32 * s + j]; lo = v < lo ? v : lo; hi = v > hi ? v : hi; }
        negmin[s] = -lo;
        mx[s] = hi;
        maxneg = negmin[s] > maxneg ? negmin[s] : maxneg;
    }
    uint16_t dmin16 = f2h(maxneg / 63.0f);
    while (h2f(dmin16) * 63.0f < maxneg && dmin16 < 0x7bffu) dmin16++;
    const float dmin = h2f(dmin16);
    int mq[8], sc[8];
    float dm[8], range[8], maxr = 0.0f;
    for (int s = 0; s < 8; s++) {
        mq[s] = dmin > 0.0f ? (int)ceilf(negmin[s] / dmin) : 0;
        mq[s] = mq[s] > 63 ? 63 : mq[s];
        dm[s] = dmin * (float)mq[s];
        range[s] = mx[s] + dm[s];
        range[s] = range[s] > 0.0f ? range[s] : 0.0f;
        maxr = range[s] > maxr ? range[s] : maxr;
    }
    uint16_t d16 = f2h(maxr / (15.0f * 63.0f));
    while (h2f(d16) * (15.0f * 63.0f) < maxr && d16 < 0x7bffu) d16++;
    const float d = h2f(d16);
    uint8_t q[256];
    for (int s = 0; s < 8; s++) {
        sc[s] = d > 0.0f ? (int)ceilf(range[s] / (15.0f * d)) : 0;
        sc[s] = sc[s] > 63 ? 63 : sc[s];
        const float ds = d * (float)sc[s], ids = ds > 0.0f ? 1.0f / ds : 0.0f;
        for (int j = 0; j < 32; j++) {
            const float t = rintf((x[32 * s + j] + dm[s]) * ids);
            q[32 * s + j] = (uint8_t)(t < 0.0f ? 0 : t > 15.0f ? 15 : t);
        }
    }
    memcpy(out, &d16, 2);
    memcpy(out + 2, &dmin16, 2);
    uint8_t *scales = out + 4;
    for (int s = 0; s < 4; s++) {
        scales[s] = (uint8_t)(sc[s] | ((sc[s + 4] >> 4) << 6));
        scales[s + 4] = (uint8_t)(mq[s] | ((mq[s + 4] >> 4) << 6));
        scales[s + 8] = (uint8_t)((sc[s + 4] & 15) | ((mq[s + 4] & 15) << 4));
    }
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) out[16 + 32 * c + l] = (uint8_t)(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
}
