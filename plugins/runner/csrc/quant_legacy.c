/* The 32-weight formats (one group per block): Q8_0, Q4_0, Q4_1, Q5_0, Q5_1. Layouts, bytes per block:
 *
 *   Q8_0  34  d:f16  q:int8[32]                            w = d * q
 *   Q4_0  18  d:f16  qs[16]                                w = d * (nibble - 8)
 *   Q4_1  20  d:f16  m:f16  qs[16]                         w = d * nibble + m
 *   Q5_0  22  d:f16  qh:u32  qs[16]                        w = d * ((nibble | bit << 4) - 16)
 *   Q5_1  24  d:f16  m:f16  qh:u32  qs[16]                 w = d * (nibble | bit << 4) + m
 *
 * nibble j < 16 is the low half of qs[j], j >= 16 the high half of qs[j - 16]; bit j is bit j of qh.
 * sdec_* (portable) and vdec_* (AVX2 integer ops, used by both vector paths) decode group g of a row.
 */

INLINE void sdec_q8_0(const uint8_t *row, int64_t g, int8_t *q, qscale *s) {
    const uint8_t *b = row + g * 34;
    s->dlo = s->dhi = h2f(rd16(b)); s->m = -0.0f;
    memcpy(q, b + 2, 32);
}
INLINE void sdec_q4_0(const uint8_t *row, int64_t g, int8_t *q, qscale *s) {
    const uint8_t *b = row + g * 18, *qs = b + 2;
    s->dlo = s->dhi = h2f(rd16(b)); s->m = -0.0f;
    for (int j = 0; j < 16; j++) { q[j] = (int8_t)((qs[j] & 15) - 8); q[j + 16] = (int8_t)((qs[j] >> 4) - 8); }
}
INLINE void sdec_q4_1(const uint8_t *row, int64_t g, int8_t *q, qscale *s) {
    const uint8_t *b = row + g * 20, *qs = b + 4;
    s->dlo = s->dhi = h2f(rd16(b)); s->m = h2f(rd16(b + 2));
    for (int j = 0; j < 16; j++) { q[j] = (int8_t)(qs[j] & 15); q[j + 16] = (int8_t)(qs[j] >> 4); }
}
INLINE void sdec_q5(const uint8_t *qs, uint32_t qh, int off, int8_t *q) {
    for (int j = 0; j < 16; j++) {
        q[j] = (int8_t)(((qs[j] & 15) | (((qh >> j) & 1u) << 4)) - off);
        q[j + 16] = (int8_t)(((qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4)) - off);
    }
}
INLINE void sdec_q5_0(const uint8_t *row, int64_t g, int8_t *q, qscale *s) {
    const uint8_t *b = row + g * 22;
    s->dlo = s->dhi = h2f(rd16(b)); s->m = -0.0f;
    sdec_q5(b + 6, rd32(b + 2), 16, q);
}
INLINE void sdec_q5_1(const uint8_t *row, int64_t g, int8_t *q, qscale *s) {
    const uint8_t *b = row + g * 24;
    s->dlo = s->dhi = h2f(rd16(b)); s->m = h2f(rd16(b + 2));
    sdec_q5(b + 8, rd32(b + 4), 0, q);
}

#if defined(QVEC)
INLINE __m256i vdec_q8_0(const uint8_t *row, int64_t g, qscale *s) {
    const uint8_t *b = row + g * 34;
    s->dlo = s->dhi = h2f_fast(b); s->m = -0.0f;
    return _mm256_loadu_si256((const __m256i *)(b + 2));
}
INLINE __m256i vdec_q4_0(const uint8_t *row, int64_t g, qscale *s) {
    const uint8_t *b = row + g * 18;
    s->dlo = s->dhi = h2f_fast(b); s->m = -0.0f;
    return _mm256_sub_epi8(nibbles_split16(b + 2), _mm256_set1_epi8(8));
}
INLINE __m256i vdec_q4_1(const uint8_t *row, int64_t g, qscale *s) {
    const uint8_t *b = row + g * 20;
    s->dlo = s->dhi = h2f_fast(b); s->m = h2f_fast(b + 2);
    return nibbles_split16(b + 4);
}
INLINE __m256i vdec_q5_0(const uint8_t *row, int64_t g, qscale *s) {
    const uint8_t *b = row + g * 22;
    s->dlo = s->dhi = h2f_fast(b); s->m = -0.0f;
    const __m256i q = _mm256_or_si256(nibbles_split16(b + 6), bits_to_0x10(rd32(b + 2)));
    return _mm256_sub_epi8(q, _mm256_set1_epi8(16));
}
INLINE __m256i vdec_q5_1(const uint8_t *row, int64_t g, qscale *s) {
    const uint8_t *b = row + g * 24;
    s->dlo = s->dhi = h2f_fast(b); s->m = h2f_fast(b + 2);
    return _mm256_or_si256(nibbles_split16(b + 8), bits_to_0x10(rd32(b + 4)));
}
#endif

/* ---- quantizers, bit for bit gguf.quants' (the NumPy port of ggml-quants.c's reference ones) ----
 * NOTE: compiled without -ffast-math and without contraction: 1/127 for "/ 127", a fused x * id + 8.5, or an
 * approximate reciprocal would each move some values across a rounding boundary. */
#pragma GCC push_options
#pragma GCC optimize("no-fast-math", "fp-contract=off")

static void quantize_block_q8_0(const float *x, uint8_t *out) {
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) { const float a = fabsf(x[j]); if (a > amax) amax = a; }
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    const uint16_t dh = f2h(d);
    memcpy(out, &dh, 2);
    for (int j = 0; j < 32; j++) out[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);   /* half away from zero */
}

static void quantize_block_q4_0(const float *x, uint8_t *out) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; j++) { const float a = fabsf(x[j]); if (a > amax) { amax = a; max = x[j]; } }
    const float d = max / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    const uint16_t dh = f2h(d);
    memcpy(out, &dh, 2);
    uint8_t q[32];
    for (int j = 0; j < 32; j++) {
        const float t = truncf(x[j] * id + 8.5f);
        q[j] = t >= 15.0f ? 15 : (uint8_t)t;
    }
    for (int j = 0; j < 16; j++) out[2 + j] = (uint8_t)(q[j] | (q[j + 16] << 4));
}

#pragma GCC pop_options
