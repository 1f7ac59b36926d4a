/* r16 layouts of the 256-weight K formats Q4_K and Q6_K (quant_r16.c has the legacy ones, the matmul and the idea).
 *
 *   tile-block (16 rows x 256 weights = 8 groups of 32):
 *     Q4_K (148 bytes a row, 4 more than the plain 144: the 6-bit scales unpacked to bytes)
 *       d[16] fp16 | dmin[16] fp16 | sc[8][16] u8 | mn[8][16] u8 | 8 x codes (as Q4_0's: 256 bytes)
 *       weight = d * sc[g] * u - dmin * mn[g]
 *     Q6_K (210 bytes a row, as plain)
 *       d[16] fp16 | sc[16][16] int8 (one per 16 weights) | 8 x (codes as Q4_0's low 4 bits: 256 bytes,
 *       then 8 masks of bit 4 and 8 masks of bit 5, chunk order as Q5_0's: 128 bytes)
 *       weight = d * sc[s] * (u - 32), s the 16-weight sub-block: the low nibbles of a group's codes are its first
 *       16 weights, the high nibbles its last 16, so each half keeps its own sum.
 */
#define R16K_Q4K_BYTES 148
#define R16K_Q6K_BYTES 210

/* rows of a plain Q4_K / Q6_K weight (N % 16 == 0, K % 256 == 0) to r16 at dst (N * K / 256 * the r16 bytes) */
static void r16k_repack(int base, const uint8_t *src, int64_t N, int64_t K, uint8_t *dst, int nt) {
    const int64_t SB = K / 256, src_row = SB * (base == GT_Q4_K ? 144 : 210);
    const int64_t tb = 16 * (int64_t)(base == GT_Q4_K ? R16K_Q4K_BYTES : R16K_Q6K_BYTES);
    const int hdr = base == GT_Q4_K ? 320 : 288, gbytes = base == GT_Q4_K ? 256 : 384;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1 && N * K >= PAR_MIN)
    for (int64_t t = 0; t < N / 16; t++)
        for (int64_t sb = 0; sb < SB; sb++) {
            uint8_t *p = dst + (t * SB + sb) * tb;
            memset(p, 0, (size_t)tb);
            for (int r = 0; r < 16; r++) {
                const uint8_t *row = src + (t * 16 + r) * src_row, *b = row + sb * (base == GT_Q4_K ? 144 : 210);
                if (base == GT_Q4_K) {
                    memcpy(p + 2 * r, b, 2);
                    memcpy(p + 32 + 2 * r, b + 2, 2);
                    for (int s = 0; s < 8; s++) {
                        int sc, mn;
                        k4_scale_min(b + 4, s, &sc, &mn);
                        p[64 + 16 * s + r] = (uint8_t)sc;
                        p[192 + 16 * s + r] = (uint8_t)mn;
                    }
                } else {
                    memcpy(p + 2 * r, b + 208, 2);
                    for (int s = 0; s < 16; s++) p[32 + 16 * s + r] = b[192 + s];
                }
                for (int s = 0; s < 8; s++) {
                    int8_t q[32];
                    qscale unused;
                    uint8_t u[32];
                    if (base == GT_Q4_K) sdec_q4_k(row, sb * 8 + s, q, &unused);
                    else sdec_q6_k(row, sb * 8 + s, q, &unused);
                    for (int j = 0; j < 32; j++) u[j] = (uint8_t)(q[j] + (base == GT_Q6_K ? 32 : 0));
                    uint8_t *codes = p + hdr + s * gbytes;
                    for (int c = 0; c < 4; c++)
                        for (int j = 0; j < 4; j++)
                            codes[c * 64 + r * 4 + j] = (uint8_t)((u[4 * c + j] & 15) | (u[16 + 4 * c + j] & 15) << 4);
                    if (base != GT_Q6_K) continue;
                    uint64_t *masks = (uint64_t *)(codes + 256);   /* [bit 4: 8][bit 5: 8], 8-byte aligned */
                    for (int c = 0; c < 4; c++)
                        for (int j = 0; j < 4; j++)
                            for (int bit = 0; bit < 2; bit++) {
                                masks[8 * bit + 2 * c] |= (uint64_t)((u[4 * c + j] >> (4 + bit)) & 1) << (4 * r + j);
                                masks[8 * bit + 2 * c + 1] |=
                                    (uint64_t)((u[16 + 4 * c + j] >> (4 + bit)) & 1) << (4 * r + j);
                            }
                }
            }
        }
}

/* row r of an r16 Q4_K / Q6_K weight as fp32 (or bf16): the plain decoder's q * scale + m, so the same bits */
static void r16k_dequantize_row(int base, const uint8_t *w, int64_t row_bytes, int64_t r, int64_t K, void *out,
                                int bf16) {
    const int64_t SB = K / 256, tb = 16 * (int64_t)(base == GT_Q4_K ? R16K_Q4K_BYTES : R16K_Q6K_BYTES), l = r % 16;
    const int hdr = base == GT_Q4_K ? 320 : 288, gbytes = base == GT_Q4_K ? 256 : 384;
    const uint8_t *tile = w + (r / 16) * 16 * row_bytes;
    for (int64_t sb = 0; sb < SB; sb++) {
        const uint8_t *p = tile + sb * tb;
        const float d = h2f(rd16(p + 2 * l));
        for (int s = 0; s < 8; s++) {
            const uint8_t *codes = p + hdr + s * gbytes;
            for (int j = 0; j < 32; j++) {
                const int c = (j % 16) / 4, k = j % 4;
                const uint8_t byte = codes[c * 64 + l * 4 + k];
                int u = j < 16 ? byte & 15 : byte >> 4;
                float v;
                if (base == GT_Q4_K) {
                    const float scale = d * (float)p[64 + 16 * s + l];
                    const float m = -(h2f(rd16(p + 32 + 2 * l)) * (float)p[192 + 16 * s + l]);
                    v = (float)u * scale + m;
                } else {
                    uint64_t m4, m5;
                    memcpy(&m4, codes + 256 + 8 * (2 * c + (j >= 16)), 8);
                    memcpy(&m5, codes + 320 + 8 * (2 * c + (j >= 16)), 8);
                    u |= (int)((m4 >> (4 * l + k)) & 1) << 4 | (int)((m5 >> (4 * l + k)) & 1) << 5;
                    v = (float)(u - 32) * (d * (float)(int8_t)p[32 + 16 * (2 * s + (j >= 16)) + l]) + -0.0f;
                }
                const int64_t at = 256 * sb + 32 * s + j;
                if (bf16) ((uint16_t *)out)[at] = f2bf(v);
                else ((float *)out)[at] = v;
            }
        }
    }
}

#if defined(QV512) && defined(__AVX512VNNI__)
/* chunk c of a Q6_K tile-group: the low nibbles' weights plus their bits 4 and 5 */
INLINE void r16k_codes6(const uint8_t *codes, int c, __m512i *lo, __m512i *hi) {
    r16_nibbles(GT_Q4_0, codes, c, lo, hi);
    const uint64_t *m = (const uint64_t *)(codes + 256);
    const __m512i b4 = _mm512_set1_epi8(16), b5 = _mm512_set1_epi8(32);
    *lo = _mm512_mask_add_epi8(*lo, _cvtu64_mask64(m[2 * c]), *lo, b4);
    *hi = _mm512_mask_add_epi8(*hi, _cvtu64_mask64(m[2 * c + 1]), *hi, b4);
    *lo = _mm512_mask_add_epi8(*lo, _cvtu64_mask64(m[8 + 2 * c]), *lo, b5);
    *hi = _mm512_mask_add_epi8(*hi, _cvtu64_mask64(m[8 + 2 * c + 1]), *hi, b5);
}
INLINE void r16k_codes(const int base, const uint8_t *codes, int c, __m512i *lo, __m512i *hi) {
    if (base == GT_Q4_K) r16_nibbles(GT_Q4_0, codes, c, lo, hi);
    else r16k_codes6(codes, c, lo, hi);
}
INLINE __m512 bytes16_ps(const uint8_t *p, int sign) {   /* 16 bytes (u8 or int8) as floats */
    const __m128i v = _mm_loadu_si128((const __m128i *)p);
    return _mm512_cvtepi32_ps(sign ? _mm512_cvtepi8_epi32(v) : _mm512_cvtepu8_epi32(v));
}

/* a group's products with int16 x (r16_tile16's split: x's high bytes against the codes, its low bytes with them),
 * lanes = rows: ah, al the first 16 weights' (the codes' low nibbles), bh, bl the last 16's, each added to what the
 * caller put there. Four sums, so each chain of dependent vpdpbusd is 4 long, not 8 (the time at one x row). */
INLINE void r16k_dot16(const int base, const int nb, const uint8_t *codes, const int8_t *xg, int64_t xrow,
                       __m512i *ah, __m512i *al, __m512i *bh, __m512i *bl) {
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        __m512i lo, hi;
        r16k_codes(base, codes, c, &lo, &hi);
        for (int b = 0; b < nb; b++) {
            const int32_t *x4 = (const int32_t *)(xg + b * xrow);   /* [high: 8][low: 8] */
            ah[b] = _mm512_dpbusd_epi32(ah[b], lo, _mm512_set1_epi32(x4[c]));
            al[b] = _mm512_dpbusd_epi32(al[b], _mm512_set1_epi32(x4[8 + c]), lo);
            bh[b] = _mm512_dpbusd_epi32(bh[b], hi, _mm512_set1_epi32(x4[4 + c]));
            bl[b] = _mm512_dpbusd_epi32(bl[b], _mm512_set1_epi32(x4[12 + c]), hi);
        }
    }
}

/* one tile against nb x rows (as r16_tile), int8 or (Q6_K only: Q4_K's is r16k_q4k_tile16) int16 (x16) x. sh: the
 * x groups' half sums (first 16, last 16), which Q6_K's per-16 scales need. Q4_K's two halves share a scale, so
 * they share accumulators. */
INLINE void r16k_tile(const int base, const int x16, const int32_t *sh, const int nb, const uint8_t *p, int64_t G,
                      int64_t tb, const int8_t *xq, int64_t xrow, const float *dx, const int32_t *sq, float *out) {
    const int hdr = base == GT_Q4_K ? 320 : 288, gbytes = base == GT_Q4_K ? 256 : 384, q6 = base == GT_Q6_K;
    __m512 tot[R16_NB];
    for (int b = 0; b < nb; b++) tot[b] = _mm512_setzero_ps();
    for (int64_t g = 0; g < G; g++) {
        const uint8_t *sbp = p + (g >> 3) * tb, *codes = sbp + hdr + (g & 7) * gbytes;
        const int s = (int)(g & 7);
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)sbp));
        /* per row: the scale of the group's first 16 weights (sa) and last 16 (sb), before x's */
        const __m512 sa = _mm512_mul_ps(d, q6 ? bytes16_ps(sbp + 32 + 32 * s, 1) : bytes16_ps(sbp + 64 + 16 * s, 0));
        const __m512 sb = q6 ? _mm512_mul_ps(d, bytes16_ps(sbp + 48 + 32 * s, 1)) : sa;
        const __m512 dmn = q6 ? sa : _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sbp + 32))),
                                                   bytes16_ps(sbp + 192 + 16 * s, 1));   /* Q4_K: dmin * mn */
        /* the offsets: Q4_K - dmin mn dx sum(x); Q6_K - 32 dx (sa sum_a + sb sum_b), which int16 x takes out of
         * its int32 sums instead (below) */
        for (int b = 0; b < nb && !(q6 && x16); b++) {
            const float xd = dx[b * G + g];
            const int32_t *h = sh + 2 * (b * G + g);
            tot[b] = q6 ? _mm512_fmadd_ps(sa, _mm512_set1_ps(-32.0f * xd * (float)h[0]),
                                          _mm512_fmadd_ps(sb, _mm512_set1_ps(-32.0f * xd * (float)h[1]), tot[b]))
                        : _mm512_fmadd_ps(dmn, _mm512_set1_ps(-xd * (float)sq[b * G + g]), tot[b]);
        }
        if (!x16) {   /* lanes = rows */
            __m512i a[R16_NB], bb[R16_NB];
            for (int b = 0; b < nb; b++) a[b] = bb[b] = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
                __m512i lo, hi;
                r16k_codes(base, codes, c, &lo, &hi);
                for (int b = 0; b < nb; b++) {
                    const int32_t *x4 = (const int32_t *)(xq + b * xrow + 32 * g);
                    a[b] = _mm512_dpbusd_epi32(a[b], lo, _mm512_set1_epi32(x4[c]));
                    bb[b] = _mm512_dpbusd_epi32(bb[b], hi, _mm512_set1_epi32(x4[4 + c]));
                }
            }
            for (int b = 0; b < nb; b++) {
                const __m512 xs = _mm512_set1_ps(dx[b * G + g]);
                tot[b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a[b]), _mm512_mul_ps(sa, xs),
                                         _mm512_fmadd_ps(_mm512_cvtepi32_ps(bb[b]), _mm512_mul_ps(sb, xs), tot[b]));
            }
        } else {      /* Q6_K (Q4_K: r16k_q4k_tile16), x split into its bytes (r16_tile16): high against the codes,
                       * low with them; lanes = rows */
            __m512i ah[R16_NB], al[R16_NB], bh[R16_NB], bl[R16_NB];
            /* Q6_K's u = q + 32: each half's low-byte sum starts at -32 sum(x) of its 16 x, exact in int32
             * (|32 sum| < 2^24): two fused multiply-adds a group fewer, and one row from memory ~18 -> ~23 GB/s */
            for (int b = 0; b < nb; b++) {
                const int32_t *h = sh + 2 * (b * G + g);
                ah[b] = bh[b] = _mm512_setzero_si512();
                al[b] = _mm512_set1_epi32(-32 * h[0]);
                bl[b] = _mm512_set1_epi32(-32 * h[1]);
            }
            r16k_dot16(base, nb, codes, xq + 64 * g, xrow, ah, al, bh, bl);
            for (int b = 0; b < nb; b++) {
                const __m512 xs = _mm512_set1_ps(dx[b * G + g]);
                const __m512i a = _mm512_add_epi32(_mm512_slli_epi32(ah[b], 8), al[b]);
                const __m512i bb = _mm512_add_epi32(_mm512_slli_epi32(bh[b], 8), bl[b]);
                tot[b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), _mm512_mul_ps(sa, xs), tot[b]);
                tot[b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(bb), _mm512_mul_ps(sb, xs), tot[b]);
            }
        }
    }
    for (int b = 0; b < nb; b++) _mm512_storeu_ps(out + 16 * b, tot[b]);
}

/* Q4_K against int16 x (as r16k_tile's Q6_K x16 branch): weight = d sc u - dmin mn, so per tile-block (8 groups) the
 * groups' sums are gathered before d and dmin: acc += (sc dx) sum(u x), off += mn (-dx sum(x)), then
 * tot += d acc + dmin off. Five vector operations a group fewer than scaling each group by d sc and dmin mn
 * (one row, kernel alone, from cache 35 -> 40 GB/s); the int32 sums are the same, the fp32 ones round in another
 * order. */
INLINE void r16k_q4k_tile16(const int nb, const uint8_t *p, int64_t G, int64_t tb, const int8_t *xq, int64_t xrow,
                            const float *dx, const int32_t *sq, float *out) {
    __m512 tot[R16_NB];
    for (int b = 0; b < nb; b++) tot[b] = _mm512_setzero_ps();
    for (int64_t g0 = 0; g0 < G; g0 += 8, p += tb) {
        __m512 acc[R16_NB], off[R16_NB];
        for (int b = 0; b < nb; b++) acc[b] = off[b] = _mm512_setzero_ps();
        for (int s = 0; s < 8; s++) {
            const int64_t g = g0 + s;
            const uint8_t *codes = p + 320 + 256 * s;
            const __m512 sc = bytes16_ps(p + 64 + 16 * s, 0), mn = bytes16_ps(p + 192 + 16 * s, 0);
            __m512i ah[R16_NB], al[R16_NB], bh[R16_NB], bl[R16_NB];
            for (int b = 0; b < nb; b++) ah[b] = al[b] = bh[b] = bl[b] = _mm512_setzero_si512();
            r16k_dot16(GT_Q4_K, nb, codes, xq + 64 * g, xrow, ah, al, bh, bl);
            for (int b = 0; b < nb; b++) {
                const float xd = dx[b * G + g];
                const __m512i a = _mm512_add_epi32(_mm512_slli_epi32(_mm512_add_epi32(ah[b], bh[b]), 8),
                                                   _mm512_add_epi32(al[b], bl[b]));
                acc[b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), _mm512_mul_ps(sc, _mm512_set1_ps(xd)), acc[b]);
                off[b] = _mm512_fmadd_ps(mn, _mm512_set1_ps(-xd * (float)sq[b * G + g]), off[b]);
            }
        }
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)),
                     dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 32)));
        for (int b = 0; b < nb; b++) tot[b] = _mm512_fmadd_ps(d, acc[b], _mm512_fmadd_ps(dmin, off[b], tot[b]));
    }
    for (int b = 0; b < nb; b++) _mm512_storeu_ps(out + 16 * b, tot[b]);
}

static void r16k_q4k_8(R16_ARGS) { R16_ROWS(r16k_tile, GT_Q4_K, 0, sh) }
static void r16k_q4k_16(R16_ARGS) {
    (void)sh;
    switch (nb) {   /* nb a constant in each case (R16_ROWS) */
    case 1: r16k_q4k_tile16(1, p, G, tg, xq, xrow, dx, sq, o); break;
    case 2: r16k_q4k_tile16(2, p, G, tg, xq, xrow, dx, sq, o); break;
    case 3: r16k_q4k_tile16(3, p, G, tg, xq, xrow, dx, sq, o); break;
    default: r16k_q4k_tile16(4, p, G, tg, xq, xrow, dx, sq, o);
    }
}
static void r16k_q6k_8(R16_ARGS) { R16_ROWS(r16k_tile, GT_Q6_K, 0, sh) }
static void r16k_q6k_16(R16_ARGS) { R16_ROWS(r16k_tile, GT_Q6_K, 1, sh) }
#endif
