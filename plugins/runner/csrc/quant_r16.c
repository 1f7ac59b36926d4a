/* "r16" layouts: the legacy 32-weight formats (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1; the K formats in quant_r16k.c) with 16
 * rows interleaved, for decode steps with integer dot products: x quantized per 32 values to int16 (quant_qmatmul:
 * an error of |x| / 65534, the default) or to int8 as Q8_0 (quant_qmatmul_int8: llama.cpp's numerics).
 *
 * quant_int8.c reads one row at a time: per group a 256-bit vpdpbusd, a scale built from scalars, and one horizontal
 * sum per row at the end; at batch 1 that is compute-bound far below the memory's rate. Here a "tile" is 16 rows, and
 * for each group the tile's bytes sit together so that one 512-bit vpdpbusd covers 4 weights of each of the 16 rows
 * (lane r = row r) against 4 x values broadcast to every lane: 8 of them sum a group, the 16 lanes are the 16 rows'
 * sums, the 16 scales are one vector load, and no horizontal sum is left. int16 x is split into its two bytes, each
 * a vpdpbusd of its own (r16_tile16). A tile's codes are loaded once for up to R16_NB x rows.
 *
 *   tile-group (16 rows x 32 weights), bytes = 16 x the format's block size, so a weight keeps its size:
 *     d[16] fp16 | m[16] fp16 (Q4_1, Q5_1) | codes
 *     Q8_0 codes: 8 chunks of 64 bytes; chunk c, lane r = weights 4c..4c+3 of row r as q + 128 (unsigned)
 *     4/5-bit codes: 4 chunks of 64 bytes; chunk c, lane r byte j = weight 4c+j (low nibble), 16+4c+j (high)
 *     Q5_0, Q5_1: then 8 masks of 64 bits (chunk c's low nibbles, then its high ones): bit 4r+j = the fifth bit
 *
 *   an unsigned code u times a signed x sums exactly in int32 (vpdpbusd takes u8 x s8); the format's offset is
 *   taken out per group with the x group's sum: Q8_0 u = q + 128, Q4_0 u = q + 8, Q5_0 u = q + 16 (then
 *   sum(q x) = sum(u x) - c sum(x)); Q4_1 / Q5_1 add m dx sum(x).
 *
 * Types: base + R16_OFF (the Python side names them "Q8_0/r16"...). Rows must be a multiple of 16. The same bytes are
 * dequantized (prefill tiles, embedding rows) by r16_dequantize_row, to the bits of the plain layout's. */
INLINE int r16_has_m(int base) { return base == GT_Q4_1 || base == GT_Q5_1; }
INLINE int r16_has_hbit(int base) { return base == GT_Q5_0 || base == GT_Q5_1; }
/* bytes before a tile-group's codes: d[16] (and m[16]) */
INLINE int r16_hdr(int base) { return r16_has_m(base) ? 64 : 32; }
/* c in u = q + c: what the unsigned codes of a format without an offset carry */
INLINE int r16_code_offset(int base) {
    return base == GT_Q8_0 ? 128 : base == GT_Q4_0 ? 8 : base == GT_Q5_0 ? 16 : 0;
}

INLINE int r16_k_format(int base) { return base == GT_Q4_K || base == GT_Q6_K; }

/* 1 where base is a format r16 takes (the K formats' layouts: quant_r16k.c) */
int quant_r16_format(int base) {
    return base == GT_Q8_0 || base == GT_Q4_0 || base == GT_Q4_1 || base == GT_Q5_0 || base == GT_Q5_1 ||
           r16_k_format(base) || r16f_format(base);
}

/* weights and bytes a row's block holds in base's r16 layout (the K formats' differ from their plain blocks) */
static int r16_block(int base, int *weights, int *bytes) {
    if (!quant_r16_format(base) || !quant_block_info(base, weights, bytes)) return 0;
    if (base == GT_Q4_K) *bytes = 148;   /* quant_r16k.c: R16K_Q4K_BYTES */
    return 1;
}

static void r16k_repack(int base, const uint8_t *src, int64_t N, int64_t K, uint8_t *dst, int nt);
static void r16k_dequantize_row(int base, const uint8_t *w, int64_t row_bytes, int64_t r, int64_t K, void *out,
                                int bf16);

/* 1 where this build has the r16 kernels (AVX-512 with VNNI), else 0: r16 weights are then never made */
int quant_r16_available(void) {
#if defined(QV512) && defined(__AVX512VNNI__)
    return 1;
#else
    return 0;
#endif
}

/* the unsigned codes of one plain block (group g of a row) and its raw fp16 d, m */
static void r16_codes(int base, const uint8_t *row, int64_t g, uint8_t *u, uint16_t *d, uint16_t *m) {
    int8_t q[32];
    qscale s;
    int c = 0;
    const uint8_t *b;
    switch (base) {
    case GT_Q8_0: sdec_q8_0(row, g, q, &s); c = 128; b = row + g * 34; break;
    case GT_Q4_0: sdec_q4_0(row, g, q, &s); c = 8; b = row + g * 18; break;
    case GT_Q4_1: sdec_q4_1(row, g, q, &s); b = row + g * 20; break;
    case GT_Q5_0: sdec_q5_0(row, g, q, &s); c = 16; b = row + g * 22; break;
    default: sdec_q5_1(row, g, q, &s); b = row + g * 24; break;
    }
    for (int j = 0; j < 32; j++) u[j] = (uint8_t)(q[j] + c);
    *d = rd16(b);
    *m = r16_has_m(base) ? rd16(b + 2) : 0;
}

/* rows of the plain layout (N x K, N % 16 == 0) to r16 at dst (N x the r16 row's bytes: the same size but for Q4_K).
 * Returns 0, -1 (not a format r16 takes), -2 (K not whole blocks or N not whole tiles). */
int quant_r16_repack(int base, const uint8_t *src, int64_t N, int64_t K, uint8_t *dst, int nt) {
    int bs, bpb;
    if (!r16_block(base, &bs, &bpb)) return -1;
    if (K % bs || N % 16) return -2;
    if (r16_k_format(base)) { r16k_repack(base, src, N, K, dst, nt); return 0; }
    if (r16f_format(base)) { r16f_repack(src, N, K, dst, nt); return 0; }
    const int64_t G = K / 32, row_bytes = G * bpb, tg = 16 * (int64_t)bpb;
    const int hdr = r16_hdr(base);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1 && N * K >= PAR_MIN)
    for (int64_t t = 0; t < N / 16; t++)
        for (int64_t g = 0; g < G; g++) {
            uint8_t *p = dst + (t * G + g) * tg, *codes = p + hdr;
            memset(p, 0, (size_t)tg);
            for (int r = 0; r < 16; r++) {
                uint8_t u[32];
                uint16_t d, m;
                r16_codes(base, src + (t * 16 + r) * row_bytes, g, u, &d, &m);
                memcpy(p + 2 * r, &d, 2);
                if (r16_has_m(base)) memcpy(p + 32 + 2 * r, &m, 2);
                for (int c = 0; c < 8 && base == GT_Q8_0; c++)
                    for (int j = 0; j < 4; j++) codes[c * 64 + r * 4 + j] = u[4 * c + j];
                if (base == GT_Q8_0) continue;
                for (int c = 0; c < 4; c++)
                    for (int j = 0; j < 4; j++)
                        codes[c * 64 + r * 4 + j] = (uint8_t)((u[4 * c + j] & 15) | (u[16 + 4 * c + j] & 15) << 4);
                if (!r16_has_hbit(base)) continue;
                uint64_t *masks = (uint64_t *)(codes + 256);   /* 8-byte aligned: tile-groups are 352 or 384 bytes */
                for (int c = 0; c < 4; c++)
                    for (int j = 0; j < 4; j++) {
                        masks[2 * c] |= (uint64_t)((u[4 * c + j] >> 4) & 1) << (4 * r + j);
                        masks[2 * c + 1] |= (uint64_t)((u[16 + 4 * c + j] >> 4) & 1) << (4 * r + j);
                    }
            }
        }
    return 0;
}

/* row r of an r16 weight as fp32 (or bf16) at out: weight = (u - c) * d + m, as the plain layout's decoder */
static void r16_dequantize_row(int base, const uint8_t *w, int64_t row_bytes, int64_t r, int64_t K, void *out,
                               int bf16) {
    if (r16_k_format(base)) { r16k_dequantize_row(base, w, row_bytes, r, K, out, bf16); return; }
    if (r16f_format(base)) { r16f_dequantize_row(base, w, r, K, out, bf16); return; }
    int bs, bpb;
    quant_block_info(base, &bs, &bpb);
    const int64_t G = K / 32, tg = 16 * (int64_t)bpb, l = r % 16;
    const int hdr = r16_hdr(base), c0 = r16_code_offset(base);
    const uint8_t *tile = w + (r / 16) * 16 * row_bytes;
    for (int64_t g = 0; g < G; g++) {
        const uint8_t *p = tile + g * tg, *codes = p + hdr;
        const float d = h2f(rd16(p + 2 * l)), m = r16_has_m(base) ? h2f(rd16(p + 32 + 2 * l)) : -0.0f;
        for (int j = 0; j < 32; j++) {
            int u;
            if (base == GT_Q8_0) u = codes[(j / 4) * 64 + l * 4 + j % 4];
            else {
                const int c = (j % 16) / 4, k = j % 4;
                const uint8_t byte = codes[c * 64 + l * 4 + k];
                u = j < 16 ? byte & 15 : byte >> 4;
                if (r16_has_hbit(base)) {
                    uint64_t mask;
                    memcpy(&mask, codes + 256 + 8 * (2 * c + (j >= 16)), 8);
                    u |= (int)((mask >> (4 * l + k)) & 1) << 4;
                }
            }
            const float v = (float)(u - c0) * d + m;
            if (bf16) ((uint16_t *)out)[32 * g + j] = f2bf(v);
            else ((float *)out)[32 * g + j] = v;
        }
    }
}

#if defined(QV512) && defined(__AVX512VNNI__)
/* chunk c of a tile-group's 4/5-bit codes: 16 rows x 4 weights from 4c (lo) and from 16 + 4c (hi), one byte each */
INLINE void r16_nibbles(const int base, const uint8_t *codes, int c, __m512i *lo, __m512i *hi) {
    const __m512i v = _mm512_loadu_si512(codes + 64 * c), m4 = _mm512_set1_epi8(0x0f), b4 = _mm512_set1_epi8(0x10);
    *lo = _mm512_and_si512(v, m4);
    *hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
    if (r16_has_hbit(base)) {   /* the fifth bits: codes <= 15 plus 16 */
        const uint64_t *masks = (const uint64_t *)(codes + 256);
        *lo = _mm512_mask_add_epi8(*lo, _cvtu64_mask64(masks[2 * c]), *lo, b4);
        *hi = _mm512_mask_add_epi8(*hi, _cvtu64_mask64(masks[2 * c + 1]), *hi, b4);
    }
}

#define R16_NB 4   /* x rows a tile's codes are loaded for at once */
#define R16_ROW_BLOCK 64   /* x rows a pass over the tiles takes (r16_qmatmul) */

/* one tile (16 rows) against nb x rows (int8 groups: row b's at xq + b * xrow, its scales dx and sums sq at b * G):
 * the 16 sums of row b at out + 16 b. The tile's codes are loaded once for the nb rows. */
INLINE void r16_tile(const int base, const int nb, const uint8_t *p, int64_t G, int64_t tg, const int8_t *xq,
                     int64_t xrow, const float *dx, const int32_t *sq, float *out) {
    const int hdr = r16_hdr(base), c0 = r16_code_offset(base), S = nb <= 2 ? 2 : 1;
    __m512 tot[R16_NB], tot2[R16_NB];
    for (int b = 0; b < nb; b++) tot[b] = tot2[b] = _mm512_setzero_ps();
    for (int64_t g = 0; g < G; g++, p += tg) {
        const uint8_t *codes = p + hdr;
        for (int64_t at = 0; nb == R16_NB && at < tg; at += 64)   /* as r16_tile16's: Gemma 3's head 102 -> 158 */
            _mm_prefetch((const char *)(p + 2 * G * tg + at), _MM_HINT_T1);
        /* S sets of accumulators, chunk c in set c % S (as r16_tile16's: two chains at one or two x rows); the
         * first starts at -c sum(x), the format's offset taken out with no instruction more. The int32 sums are
         * the same whatever S. */
        __m512i acc[2][R16_NB];
        for (int b = 0; b < nb; b++) {
            acc[0][b] = c0 ? _mm512_set1_epi32(-c0 * sq[b * G + g]) : _mm512_setzero_si512();
            acc[1][b] = _mm512_setzero_si512();
        }
#define X4(b, i) _mm512_set1_epi32(((const int32_t *)(xq + (b) * xrow + 32 * g))[i])
        if (base == GT_Q8_0) {
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++) {
                const __m512i v = _mm512_loadu_si512(codes + 64 * c);
                for (int b = 0; b < nb; b++)
                    acc[S > 1 ? c & 1 : 0][b] = _mm512_dpbusd_epi32(acc[S > 1 ? c & 1 : 0][b], v, X4(b, c));
            }
        } else {
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
                __m512i lo, hi;
                r16_nibbles(base, codes, c, &lo, &hi);
                for (int b = 0; b < nb; b++) {
                    acc[0][b] = _mm512_dpbusd_epi32(acc[0][b], lo, X4(b, c));
                    acc[S - 1][b] = _mm512_dpbusd_epi32(acc[S - 1][b], hi, X4(b, 4 + c));
                }
            }
        }
#undef X4
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
        for (int b = 0; b < nb; b++) {
            const __m512i a = S > 1 ? _mm512_add_epi32(acc[0][b], acc[1][b]) : acc[0][b];
            tot[b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), _mm512_mul_ps(d, _mm512_set1_ps(dx[b * G + g])), tot[b]);
            if (r16_has_m(base))
                tot2[b] = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 32))),
                                          _mm512_set1_ps(dx[b * G + g] * (float)sq[b * G + g]), tot2[b]);
        }
    }
    for (int b = 0; b < nb; b++) _mm512_storeu_ps(out + 16 * b, _mm512_add_ps(tot[b], tot2[b]));
}


/* As r16_tile with x as int16 per 32 values (scale amax / 32767: an error of |x| / 65534, 256x below int8's, so
 * results stay within ~3e-5 of the fp32 path's), each value split into bytes, x = 256 xh + xl (xh = x >> 8 signed,
 * xl unsigned), so the products stay 512-bit vpdpbusd with lanes = rows, two per chunk where int8 x takes one:
 *   hi: u x xh (u unsigned, xh signed);  lo: xl x w (xl unsigned, w signed: the 4/5-bit codes u are below 128 as
 *   they are; Q8_0's u = q + 128 becomes q with one xor a chunk, for all nb rows)
 *   sum(q x) = 256 hi + lo - off, off = c sum(x) (Q4_0, Q5_0: lo took u), 32768 sum(xh) (Q8_0: lo took q), 0
 * all exact in int32 (|256 hi| < 2^28), one int32 a row and group as int8 x has. x's group g sits at xq + 64 g as
 * [xh: 32 bytes][xl: 32 bytes]; off is sh[b * G + g] (r16_quantize_row).
 * NOTE: vpdpwssd on codes widened to 16 bits takes as many dot-product instructions, but with two widenings a chunk
 * and each row's sum in two lanes (folded per group and tile): 70 against 85-89 GMAC/s here (Zen 4 peak: 116, one
 * 512-bit dot product a cycle at 3.6 GHz), Q8_0, SmolLM2's four matrices x 30 layers, 128 rows, one thread. */
INLINE void r16_tile16(const int base, const int nb, const uint8_t *p, int64_t G, int64_t tg, const int8_t *xq,
                       int64_t xrow, const float *dx, const int32_t *sq, const int32_t *off, float *out) {
    const int hdr = r16_hdr(base), S = nb <= 2 ? 2 : 1;
    __m512 tot[R16_NB], tm[R16_NB];
    for (int b = 0; b < nb; b++) tot[b] = tm[b] = _mm512_setzero_ps();
    for (int64_t g = 0; g < G; g++, p += tg) {
        const uint8_t *codes = p + hdr;
        const int8_t *xg = xq + 64 * g;
        /* the same group two tiles ahead, into L2. NOTE: one tile ahead into L1 was 1.1x at 16 rows, yet from memory
         * a 16-row pass still waited on each tile: Gemma 3's head (262,144 x 640 Q8_0, 16 rows, one thread, 2 MiB
         * pages, /tmp script) 73 -> 92 GMAC/s, as fast as from cache (93); SmolLM2's 30 layers 70 -> 73-76 */
        for (int64_t at = 0; nb == R16_NB && at < tg; at += 64)
            _mm_prefetch((const char *)(p + 2 * G * tg + at), _MM_HINT_T1);
        /* S sets of accumulators, chunk c in set c % S: at one or two x rows a group's chains of 8 dependent
         * vpdpbusd were its time (latency, not throughput); S = 2 halves them. The int32 sums are the same. */
        __m512i hi[2][R16_NB], lo[2][R16_NB];
        for (int b = 0; b < nb; b++) {   /* lo starts at -off: the offset taken out with no instruction more */
            hi[0][b] = hi[1][b] = lo[1][b] = _mm512_setzero_si512();
            lo[0][b] = _mm512_set1_epi32(r16_code_offset(base) ? -off[b * G + g] : 0);
        }
#define X4(b, i) _mm512_set1_epi32(((const int32_t *)(xg + (b) * xrow))[i])
#define DOT(u, w, i, s)                                                                                   \
        for (int b = 0; b < nb; b++) {                                                                    \
            hi[s][b] = _mm512_dpbusd_epi32(hi[s][b], u, X4(b, i));                                        \
            lo[s][b] = _mm512_dpbusd_epi32(lo[s][b], X4(b, 8 + (i)), w);                                  \
        }
        if (base == GT_Q8_0) {
            const __m512i flip = _mm512_set1_epi8((char)0x80);
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++) {
                const __m512i u = _mm512_loadu_si512(codes + 64 * c), q = _mm512_xor_si512(u, flip);
                DOT(u, q, c, S > 1 ? c & 1 : 0)
            }
        } else {
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
                __m512i a, bb;
                r16_nibbles(base, codes, c, &a, &bb);
                DOT(a, a, c, 0)
                DOT(bb, bb, 4 + c, S > 1 ? 1 : 0)
            }
        }
#undef DOT
#undef X4
        if (S > 1)
            for (int b = 0; b < nb; b++) {
                hi[0][b] = _mm512_add_epi32(hi[0][b], hi[1][b]);
                lo[0][b] = _mm512_add_epi32(lo[0][b], lo[1][b]);
            }
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
        for (int b = 0; b < nb; b++) {
            const float xd = dx[b * G + g];
            const __m512i a = _mm512_add_epi32(_mm512_slli_epi32(hi[0][b], 8), lo[0][b]);
            tot[b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), _mm512_mul_ps(d, _mm512_set1_ps(xd)), tot[b]);
            if (r16_has_m(base))   /* m * dx * sum(x) */
                tm[b] = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 32))),
                                        _mm512_set1_ps(xd * (float)sq[b * G + g]), tm[b]);
        }
    }
    for (int b = 0; b < nb; b++) _mm512_storeu_ps(out + 16 * b, _mm512_add_ps(tot[b], tm[b]));
}

/* a tile against nb <= R16_NB x rows (see r16_tile); sh: the x groups' half sums (the K formats') */
typedef void (*r16_fn)(const uint8_t *, int64_t, int64_t, int, const int8_t *, int64_t, const float *,
                       const int32_t *, const int32_t *, float *);
#define R16_ARGS const uint8_t *p, int64_t G, int64_t tg, int nb, const int8_t *xq, int64_t xrow, const float *dx, \
                 const int32_t *sq, const int32_t *sh, float *o
/* nb made a constant in each case, so the per-row loops unroll and their accumulators stay in registers */
#define R16_ROWS(tile, ...) \
    switch (nb) { \
    case 1: tile(__VA_ARGS__, 1, p, G, tg, xq, xrow, dx, sq, o); break; \
    case 2: tile(__VA_ARGS__, 2, p, G, tg, xq, xrow, dx, sq, o); break; \
    case 3: tile(__VA_ARGS__, 3, p, G, tg, xq, xrow, dx, sq, o); break; \
    default: tile(__VA_ARGS__, 4, p, G, tg, xq, xrow, dx, sq, o); }
#define R16_ROWS16(tile, ...) \
    switch (nb) { \
    case 1: tile(__VA_ARGS__, 1, p, G, tg, xq, xrow, dx, sq, sh, o); break; \
    case 2: tile(__VA_ARGS__, 2, p, G, tg, xq, xrow, dx, sq, sh, o); break; \
    case 3: tile(__VA_ARGS__, 3, p, G, tg, xq, xrow, dx, sq, sh, o); break; \
    default: tile(__VA_ARGS__, 4, p, G, tg, xq, xrow, dx, sq, sh, o); }
#define R16_KERNELS(qt) \
    static void r16x8_##qt(R16_ARGS) { (void)sh; R16_ROWS(r16_tile, qt) } \
    static void r16x16_##qt(R16_ARGS) { R16_ROWS16(r16_tile16, qt) }
R16_KERNELS(GT_Q8_0) R16_KERNELS(GT_Q4_0) R16_KERNELS(GT_Q4_1) R16_KERNELS(GT_Q5_0) R16_KERNELS(GT_Q5_1)
static void r16k_q4k_8(R16_ARGS);
static void r16k_q4k_16(R16_ARGS);
static void r16k_q6k_8(R16_ARGS);
static void r16k_q6k_16(R16_ARGS);

static r16_fn r16_kernel(int base, int x16) {
    if (base == GT_Q4_K) return x16 ? r16k_q4k_16 : r16k_q4k_8;
    if (base == GT_Q6_K) return x16 ? r16k_q6k_16 : r16k_q6k_8;
    if (x16) switch (base) {
    case GT_Q8_0: return r16x16_GT_Q8_0;
    case GT_Q4_0: return r16x16_GT_Q4_0;
    case GT_Q4_1: return r16x16_GT_Q4_1;
    case GT_Q5_0: return r16x16_GT_Q5_0;
    default: return r16x16_GT_Q5_1;
    }
    switch (base) {
    case GT_Q8_0: return r16x8_GT_Q8_0;
    case GT_Q4_0: return r16x8_GT_Q4_0;
    case GT_Q4_1: return r16x8_GT_Q4_1;
    case GT_Q5_0: return r16x8_GT_Q5_0;
    default: return r16x8_GT_Q5_1;
    }
}

/* x's 32 values at src as r16_tile16 and r16k_tile take them: quantize_group(src, 32767) (vectorized, the same bits:
 * outside -ffast-math as it is, where 1 / (amax / 32767) became 32767 / amax and moved ties), then split at out as
 * [q >> 8: 32 bytes][q & 255: 32 bytes]; the scale at *d, the sums of the first and last 16 values at half[0..1];
 * returns the sum of the high bytes */
#pragma GCC push_options
#pragma GCC optimize("no-fast-math", "fp-contract=off")
static int32_t r16_split_group(const float *src, int8_t *out, float *d, int32_t *half) {
    const __m512 a = _mm512_loadu_ps(src), b = _mm512_loadu_ps(src + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
    *d = amax / 32767.0f;
    const __m512 id = _mm512_set1_ps(*d != 0.0f ? 1.0f / *d : 0.0f), half_step = _mm512_set1_ps(0.5f);
    __m512i q[2];
    for (int h = 0; h < 2; h++) {   /* as quantize_group: truncate, then round half away from zero */
        const __m512 v = _mm512_mul_ps(h ? b : a, id);
        const __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC), f = _mm512_sub_ps(v, t);
        const __m512i one = _mm512_set1_epi32(1);
        q[h] = _mm512_cvttps_epi32(t);
        q[h] = _mm512_mask_add_epi32(q[h], _mm512_cmp_ps_mask(f, half_step, _CMP_GE_OQ), q[h], one);
        q[h] = _mm512_mask_sub_epi32(q[h], _mm512_cmp_ps_mask(f, _mm512_sub_ps(_mm512_setzero_ps(), half_step),
                                                                _CMP_LE_OQ), q[h], one);
    }
    const __m512i hi0 = _mm512_srai_epi32(q[0], 8), hi1 = _mm512_srai_epi32(q[1], 8);
    _mm_storeu_si128((__m128i *)out, _mm512_cvtepi32_epi8(hi0));
    _mm_storeu_si128((__m128i *)(out + 16), _mm512_cvtepi32_epi8(hi1));
    _mm_storeu_si128((__m128i *)(out + 32), _mm512_cvtepi32_epi8(q[0]));   /* the low bytes: q & 255 */
    _mm_storeu_si128((__m128i *)(out + 48), _mm512_cvtepi32_epi8(q[1]));
    half[0] = _mm512_reduce_add_epi32(q[0]);
    half[1] = _mm512_reduce_add_epi32(q[1]);
    return _mm512_reduce_add_epi32(_mm512_add_epi32(hi0, hi1));
}
#pragma GCC pop_options

/* row b of x quantized per 32 values for r16_qmatmul's kernels: int16 (x16) split into bytes, or int8; per group
 * its scale (dx), sum (sq) and at sh: the K formats' half sums (2 a group), the 32-weight formats' offset (int16
 * x: r16_tile16's; int8 x: the half sums, unread) */
static void r16_quantize_row(int base, int x16, const void *x, int x_bf16, int64_t xs, int64_t b, int64_t K,
                             int8_t *xq, float *dx, int32_t *sq, int32_t *sh) {
    const int64_t G = K / 32;
    for (int64_t g = 0; g < G; g++) {
        float v[32];
        const float *src = x_group(x, x_bf16, xs, b, g, v);
        const int64_t i = b * G + g;
        int32_t half[2];
        if (x16) {
            const int32_t sum_hi = r16_split_group(src, xq + 2 * b * K + 64 * g, dx + i, half);
            sq[i] = half[0] + half[1];
            if (!r16_k_format(base)) {
                sh[i] = base == GT_Q8_0 ? 32768 * sum_hi : r16_code_offset(base) * sq[i];
                continue;
            }
        } else {
            uint16_t dh;
            int8_t *q = xq + b * K + 32 * g;
            sq[i] = quantize_x_group(src, q, &dh);
            dx[i] = h2f(dh);
            half[0] = 0;
            for (int j = 0; j < 16; j++) half[0] += q[j];
            half[1] = sq[i] - half[0];
        }
        sh[2 * i] = half[0];
        sh[2 * i + 1] = half[1];
    }
}

#define R16_PAR_PREP 8   /* x rows from which the threads share quantizing them */
#define R16_STACK_K 4096   /* x values (rows x K) up to which the quantized x sits on the stack, not the heap */

/* what one r16_qmatmul call hands each tile: the weight, the quantized x rows and where the results go */
typedef struct {
    r16_fn fn;
    const uint8_t *w;
    int64_t row_bytes, G, tg, xrow;
    const int8_t *xq;
    const float *dx, *bias;
    const int32_t *sq, *sh;
    int split, y_bf16;
    void *y;
    int64_t ys;
} r16_call;

/* tile t (16 rows) against x rows [bb, be), R16_NB at a time, into y */
static void r16_tile_rows(const r16_call *c, int64_t t, int64_t bb, int64_t be) {
    const int64_t G = c->G;
    for (int64_t b0 = bb; b0 < be; b0 += R16_NB) {
        const int nb = be - b0 < R16_NB ? (int)(be - b0) : R16_NB;
        float o[16 * R16_NB];
        c->fn(c->w + t * 16 * c->row_bytes, G, c->tg, nb, c->xq + b0 * c->xrow, c->xrow, c->dx + b0 * G,
              c->sq + b0 * G, c->sh + (c->split ? 1 : 2) * b0 * G, o);
        for (int b = 0; b < nb; b++)
            for (int r = 0; r < 16; r++) {
                const int64_t n = t * 16 + r;
                const float v = o[16 * b + r] + (c->bias ? c->bias[n] : 0.0f);
                if (c->y_bf16) ((uint16_t *)c->y)[(b0 + b) * c->ys + n] = f2bf(v);
                else ((float *)c->y)[(b0 + b) * c->ys + n] = v;
            }
    }
}

/* quant_qmatmul's contract for an r16 weight (type base + R16_OFF), x quantized to int8 groups first */
static int r16_qmatmul(int base, const uint8_t *w, int64_t row_bytes, int64_t N, int64_t K, const void *x,
                       int x_bf16, int64_t xs, int64_t B, void *y, int y_bf16, int64_t ys, const float *bias,
                       int nt, int x16) {
    int bs, bpb;
    if (!r16_block(base, &bs, &bpb)) return -1;
    if (K % bs || N % 16) return -2;
    const int64_t G = K / 32, tg = 16 * (int64_t)bpb;   /* bytes of a tile-block: a group, or a K format's 8 */
    /* NOTE: a decode step's calls (one x row) keep their quantized x on the stack: three mallocs and frees were
     * ~0.1 us of a call whose weights stream in ~2 us (192 x 576) */
    int8_t xq_s[2 * R16_STACK_K + 64];
    float dx_s[R16_STACK_K / 32 + 1];
    int32_t sq_s[3 * (R16_STACK_K / 32) + 1];
    const int small = B * K <= R16_STACK_K;
    int8_t *xq = small ? xq_s : (int8_t *)malloc((size_t)(B * K * (x16 ? 2 : 1) + 64));   /* int16 x where x16 */
    float *dx = small ? dx_s : (float *)malloc((size_t)(B * G + 1) * sizeof(float));
    int32_t *sq = small ? sq_s : (int32_t *)malloc((size_t)(3 * B * G + 1) * sizeof(int32_t)), *sh = sq + B * G;
    if (!xq || !dx || !sq) {   /* sh: halves */
        if (!small) { free(xq); free(dx); free(sq); }
        return -3;
    }
    const int split = x16 && !r16_k_format(base);   /* r16_tile16's: one offset a group at sh */
    const r16_call c = {r16_kernel(base, x16), w, row_bytes, G, tg, x16 ? 2 * K : K, xq, dx, bias, sq, sh, split,
                        y_bf16, y, ys};   /* xrow: bytes of one quantized x row */
    const int64_t tiles = N / 16;
    const int par = nt > 1 && tiles >= 2 && N * K >= PAR_MIN;
    /* x rows in blocks of R16_ROW_BLOCK, each block against every tile: a block's quantized x stays in L2 while
     * the tiles stream past (a whole prefill chunk's x, re-read from L3 for every tile, made the kernel's time grow
     * faster than its rows: 3.0 ms at 256 rows, 10.2 ms at 512, 1536x576 Q8_0); static tiles, so each thread keeps
     * the same tiles for every block */
    const int par_prep = par && B >= R16_PAR_PREP;
    for (int64_t b = 0; b < B && !par_prep; b++) r16_quantize_row(base, x16, x, x_bf16, xs, b, K, xq, dx, sq, sh);
    if (!par) {   /* no OpenMP region: one thread's call skips its fixed cost (~0.1 us, a decode step's ~200 calls) */
        for (int64_t bb = 0; bb < B; bb += R16_ROW_BLOCK)
            for (int64_t t = 0; t < tiles; t++)
                r16_tile_rows(&c, t, bb, B - bb < R16_ROW_BLOCK ? B : bb + R16_ROW_BLOCK);
    } else {
#pragma omp parallel num_threads(nt)
        {
            if (par_prep) {
#pragma omp for schedule(static)
                for (int64_t b = 0; b < B; b++) r16_quantize_row(base, x16, x, x_bf16, xs, b, K, xq, dx, sq, sh);
            }
            for (int64_t bb = 0; bb < B; bb += R16_ROW_BLOCK) {
                const int64_t be = B - bb < R16_ROW_BLOCK ? B : bb + R16_ROW_BLOCK;
#pragma omp for schedule(static) nowait
                for (int64_t t = 0; t < tiles; t++) r16_tile_rows(&c, t, bb, be);
            }
        }
    }
    if (!small) {
        free(xq);
        free(dx);
        free(sq);
    }
    return 0;
}
#else
static int r16_qmatmul(int base, const uint8_t *w, int64_t row_bytes, int64_t N, int64_t K, const void *x,
                       int x_bf16, int64_t xs, int64_t B, void *y, int y_bf16, int64_t ys, const float *bias,
                       int nt, int x16) {
    (void)base; (void)w; (void)row_bytes; (void)N; (void)K; (void)x; (void)x_bf16; (void)xs; (void)B; (void)y;
    (void)y_bf16; (void)ys; (void)bias; (void)nt; (void)x16;
    return -5;
}
#endif
