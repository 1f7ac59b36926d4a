/* The r16 layout of 16-bit float weights (F16, BF16): 16 rows interleaved, for decode steps over an F16/BF16 GGUF.
 *
 * Row by row (row_dot, quant_matmul.c), every weight row ends in a horizontal sum and an indirect call: a decode
 * step over SmolLM2's F16 weights makes 205k of them. Here a tile is 16 rows stored column by column (element k of
 * the tile: the 16 rows' weights k, 32 bytes), so one widened 512-bit vector of weights times x[k] broadcast adds
 * into the 16 rows' sums at once, the tile is one sequential stream, and the 16 sums leave in one store. One token's
 * matvecs over SmolLM2-shaped F16 weights on 2 MiB pages, one Zen 4 thread: 9.0-9.5 ms against row_dot's
 * 10.3-11.7 ms (29-30 GB/s against 23-26; the machine's read rate is ~31).
 *
 *   tile t (rows 16t..16t+15), element k: dst[(t * K + k) * 16 + r] = W[16t + r, k]   (r < 16)
 *
 * Each output is the same fp32 sum of the same products as row_dot's, in another order (4 partial sums over k). */

/* rows of x in a call above which r16f_matmul takes R16F_MR rows at a time (a prefill chunk); up to it each row
 * takes r16f_tile, whose sums do not depend on the other rows of the call (a decode batch's rows keep their bits) */
#define R16F_ROWWISE 16
#define R16F_MR 12

static void r16f_repack(const uint8_t *src, int64_t N, int64_t K, uint8_t *dst, int nt) {
    const uint16_t *s = (const uint16_t *)src;
    uint16_t *d = (uint16_t *)dst;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1 && N * K >= PAR_MIN)
    for (int64_t t = 0; t < N / 16; t++)
        for (int64_t k = 0; k < K; k++)
            for (int r = 0; r < 16; r++) d[(t * K + k) * 16 + r] = s[(t * 16 + r) * K + k];
}

static void r16f_dequantize_row(int base, const uint8_t *w, int64_t r, int64_t K, void *out, int bf16) {
    const uint16_t *tile = (const uint16_t *)w + (r / 16) * 16 * K;
    const int l = (int)(r % 16);
    for (int64_t k = 0; k < K; k++) {
        const uint16_t h = tile[k * 16 + l];
        if (bf16 && base == GT_BF16) ((uint16_t *)out)[k] = h;
        else {
            const float v = base == GT_F16 ? h2f_fast((const uint8_t *)&h) : bf2f(h);
            if (bf16) ((uint16_t *)out)[k] = f2bf(v);
            else ((float *)out)[k] = v;
        }
    }
}

#if defined(QV512)
/* r[i] = row i of a 16 x 16 block -> r[j] = column j: unpack pairs, then pairs of pairs, then 128-bit lanes */
INLINE void transpose16(__m512 *r) {
    __m512 t[16], u[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {   /* u[4i + c], lane L: column 4L + c of rows 4i..4i+3 */
        const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 2]);
        const __m512d c = _mm512_castps_pd(t[4 * i + 1]), d = _mm512_castps_pd(t[4 * i + 3]);
        u[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
        u[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
        u[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(c, d));
        u[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(c, d));
    }
    for (int c = 0; c < 4; c++) {   /* column 4L + c gathers lane L of u[c], u[4 + c], u[8 + c], u[12 + c] */
        const __m512 x0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x44), x1 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xEE);
        const __m512 y0 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x44);
        const __m512 y1 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xEE);
        r[c] = _mm512_shuffle_f32x4(x0, y0, 0x88);
        r[4 + c] = _mm512_shuffle_f32x4(x0, y0, 0xDD);
        r[8 + c] = _mm512_shuffle_f32x4(x1, y1, 0x88);
        r[12 + c] = _mm512_shuffle_f32x4(x1, y1, 0xDD);
    }
}
#endif

/* rows 16t..16t+15 (one whole tile) to fp32 or bf16 at out (row stride os), 16 x 16 blocks transposed in
 * registers: one strided scalar a weight made a prefill's dequantized GEMMs over SmolLM2's F16 weights 3x slower */
static void r16f_dequantize_tile(int base, const uint8_t *w, int64_t t, int64_t K, void *out, int bf16, int64_t os) {
    const uint16_t *p = (const uint16_t *)w + t * 16 * K;
    int64_t k0 = 0;
#if defined(QV512)
    for (; k0 + 16 <= K; k0 += 16) {
        __m512 v[16];
        for (int i = 0; i < 16; i++) {
            const __m256i h = _mm256_loadu_si256((const __m256i *)(p + (k0 + i) * 16));
            v[i] = base == GT_F16 ? _mm512_cvtph_ps(h)
                                  : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
        }
        transpose16(v);
        for (int r = 0; r < 16; r++) {
            if (bf16) vstore_bf16((uint16_t *)out + r * os + k0, v[r]);
            else _mm512_storeu_ps((float *)out + r * os + k0, v[r]);
        }
    }
#endif
    for (; k0 < K; k0++)
        for (int r = 0; r < 16; r++) {
            const uint16_t h = p[k0 * 16 + r];
            const float v = base == GT_F16 ? h2f_fast((const uint8_t *)&h) : bf2f(h);
            if (bf16) ((uint16_t *)out)[r * os + k0] = f2bf(v);
            else ((float *)out)[r * os + k0] = v;
        }
}

#if defined(QV512)
/* one k's 16 weights of a tile, widened to fp32 (F16 by cvtph, BF16 by a shift into the high half) */
INLINE __m512 r16f_widen(const int base, const uint16_t *p) {
    const __m256i h = _mm256_loadu_si256((const __m256i *)p);
    return base == GT_F16 ? _mm512_cvtph_ps(h) : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
#endif

#if defined(QV512)
#define R16F_TR 6   /* rows of a decode batch r16f_tile_rows takes at once: 4 sums each, 24 of the 32 registers */
/* MR rows of x (row stride xs) times one tile, each row's sums in one order whatever MR (4 partial sums over k mod 4,
 * the tail into the first, then (a0 + a1) + (a2 + a3)): r16f_tile is MR 1, so a row's bits do not depend on the batch; each weight vector
 * is widened once for the MR rows, where a row at a time widened it for every row. NOTE: the widening, a 16-row
 * step's as many cvtph as fmadd, held a W4-shaped F16 decode step at about half the FMA rate. pf: the next tile,
 * prefetched into L2 during this pass: from memory (SmolLM2's 30 layers of F16 weights, 16 rows, one thread) 34.7 ->
 * 49.2 GMAC/s, 6 rows 25.0 -> 38.0; 55 with the weights in cache (/tmp script, best of 5). */
INLINE void r16f_tile_rows(const int base, const int MR, const uint16_t *p, int64_t K, const float *x, int64_t xs,
                           float *o, const uint16_t *pf) {
    __m512 a[R16F_TR][4];
#pragma GCC unroll 6
    for (int i = 0; i < MR; i++) a[i][0] = a[i][1] = a[i][2] = a[i][3] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 4 <= K; k += 4) {
        if (pf) {   /* the next tile's same 128 bytes into L2, at the pace this pass reads its own */
            _mm_prefetch((const char *)(pf + 16 * k), _MM_HINT_T1);
            _mm_prefetch((const char *)(pf + 16 * k) + 64, _MM_HINT_T1);
        }
        const __m512 w0 = r16f_widen(base, p + 16 * k), w1 = r16f_widen(base, p + 16 * (k + 1));
        const __m512 w2 = r16f_widen(base, p + 16 * (k + 2)), w3 = r16f_widen(base, p + 16 * (k + 3));
#pragma GCC unroll 6
        for (int i = 0; i < MR; i++) {
            const float *xi = x + i * xs + k;
            a[i][0] = _mm512_fmadd_ps(w0, _mm512_set1_ps(xi[0]), a[i][0]);
            a[i][1] = _mm512_fmadd_ps(w1, _mm512_set1_ps(xi[1]), a[i][1]);
            a[i][2] = _mm512_fmadd_ps(w2, _mm512_set1_ps(xi[2]), a[i][2]);
            a[i][3] = _mm512_fmadd_ps(w3, _mm512_set1_ps(xi[3]), a[i][3]);
        }
    }
    for (; k < K; k++) {
        const __m512 w = r16f_widen(base, p + 16 * k);
#pragma GCC unroll 6
        for (int i = 0; i < MR; i++) a[i][0] = _mm512_fmadd_ps(w, _mm512_set1_ps(x[i * xs + k]), a[i][0]);
    }
#pragma GCC unroll 6
    for (int i = 0; i < MR; i++)
        _mm512_storeu_ps(o + 16 * i, _mm512_add_ps(_mm512_add_ps(a[i][0], a[i][1]), _mm512_add_ps(a[i][2], a[i][3])));
}

/* r16f_tile_rows with MR (1..R16F_TR) and the format made constants: the sums stay in registers */
static void r16f_batch_rows(int base, int mr, const uint16_t *p, int64_t K, const float *x, int64_t xs, float *o,
                            const uint16_t *pf) {
#define R16F_MRS(B) \
    switch (mr) { \
    case 1: r16f_tile_rows(B, 1, p, K, x, xs, o, pf); break; \
    case 2: r16f_tile_rows(B, 2, p, K, x, xs, o, pf); break; \
    case 3: r16f_tile_rows(B, 3, p, K, x, xs, o, pf); break; \
    case 4: r16f_tile_rows(B, 4, p, K, x, xs, o, pf); break; \
    case 5: r16f_tile_rows(B, 5, p, K, x, xs, o, pf); break; \
    default: r16f_tile_rows(B, 6, p, K, x, xs, o, pf); }
    if (base == GT_F16) { R16F_MRS(GT_F16) }
    else { R16F_MRS(GT_BF16) }
#undef R16F_MRS
}

#endif

/* o[r] = tile row r . x, r < 16: with AVX-512 r16f_tile_rows' one-row case (4 partial sums over k mod 4), the sums a
 * decode batch's rows keep */
INLINE void r16f_tile(const int base, const uint16_t *p, int64_t K, const float *x, float *o) {
#if defined(QV512)
    r16f_tile_rows(base, 1, p, K, x, 0, o, NULL);
#else
    for (int r = 0; r < 16; r++) o[r] = 0.0f;
    for (int64_t k = 0; k < K; k++)
        for (int r = 0; r < 16; r++) o[r] += (base == GT_F16 ? h2f(p[16 * k + r]) : bf2f(p[16 * k + r])) * x[k];
#endif
}

#if defined(QV512)
/* MR rows of x (row stride xs) times one tile: o[i * 16 + r] = tile row r . x row i. Each weight vector is widened
 * once for the MR rows (MR sums in registers), where r16f_tile widens it again for every row: a prefill chunk's
 * matmul straight from the r16 layout, which is already a GEMM's packed 16-column panel (MKL packs its dequantized
 * copy into the same shape). Each row's sum runs over k in order, as a GEMM's does. MR a constant: registers.
 * pf: prefetched into L2 as r16f_tile_rows' (the next tile during a tile's first pass over a span; from memory, 512
 * rows of SmolLM2's 30 layers, one thread: 51.0 -> 55.2 GMAC/s). */
INLINE void r16f_rows(const int base, const int MR, const uint16_t *p, int64_t K, const float *x, int64_t xs,
                      float *o, const uint16_t *pf) {
    __m512 a[R16F_MR];
#pragma GCC unroll 12
    for (int i = 0; i < MR; i++) a[i] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        if (!(k & 1)) _mm_prefetch((const char *)(pf + 16 * k), _MM_HINT_T1);   /* pf: as r16f_tile_rows' */
        const __m512 wv = r16f_widen(base, p + 16 * k);
#pragma GCC unroll 12
        for (int i = 0; i < MR; i++) a[i] = _mm512_fmadd_ps(wv, _mm512_set1_ps(x[i * xs + k]), a[i]);
    }
#pragma GCC unroll 12
    for (int i = 0; i < MR; i++) _mm512_storeu_ps(o + 16 * i, a[i]);
}
#endif

/* y rows b0.. of one tile's 16 columns from o[(b - b0) * 16 + r] (+ bias) */
INLINE void r16f_put(const float *o, int64_t rows, int64_t t, int64_t b0, void *y, int y_bf16, int64_t ys,
                     const float *bias) {
    for (int64_t i = 0; i < rows; i++)
        for (int r = 0; r < 16; r++) {
            const int64_t n = t * 16 + r;
            const float v = o[i * 16 + r] + (bias ? bias[n] : 0.0f);
            if (y_bf16) ((uint16_t *)y)[(b0 + i) * ys + n] = f2bf(v);
            else ((float *)y)[(b0 + i) * ys + n] = v;
        }
}

/* quant_qmatmul's contract for base (F16 or BF16) + R16_OFF weights: N % 16 == 0; x fp32 or bf16 */
static int r16f_matmul(int base, const uint8_t *w, int64_t N, int64_t K, const void *x, int x_bf16, int64_t xs,
                       int64_t B, void *y, int y_bf16, int64_t ys, const float *bias, int nt) {
    if (N % 16) return -2;
    float *tmp;
    const float *xf = x_fp32(x, x_bf16, &xs, B, K, &tmp);
    if (!xf) return -3;
    const int64_t tiles = N / 16;
    const int par = nt > 1 && tiles >= 2 && N * K * (B < 8 ? B : 8) >= PAR_MIN;
#if defined(QV512)
    if (B > R16F_ROWWISE) {   /* a prefill chunk: R16F_MR rows at a time (r16f_rows), the rest by 4, 2 and 1 */
        /* rows by spans whose x stays in L2 (~512 KB) while every tile passes over it: 2,048 rows of x at once
         * (16 MB at K = 2,048) came from memory for every tile, slower than the dequantized GEMM */
        int64_t span = (int64_t)(512 << 10) / (4 * K) / R16F_MR * R16F_MR;
        span = span < R16F_MR ? R16F_MR : span;
        for (int64_t b0 = 0; b0 < B; b0 += span) {
            const int64_t b1 = b0 + span < B ? b0 + span : B;
#pragma omp parallel for num_threads(nt) schedule(static) if (par)
            for (int64_t t = 0; t < tiles; t++) {
                const uint16_t *p = (const uint16_t *)w + t * 16 * K;
                float o[R16F_MR * 16];
                int64_t b = b0;
                for (; b + R16F_MR <= b1; b += R16F_MR) {
                    /* the next tile streamed into L2 during this tile's first pass (else a no-op on this one) */
                    const uint16_t *pf = b == b0 && t + 1 < tiles ? p + 16 * K : p;
                    if (base == GT_F16) r16f_rows(GT_F16, R16F_MR, p, K, xf + b * xs, xs, o, pf);
                    else r16f_rows(GT_BF16, R16F_MR, p, K, xf + b * xs, xs, o, pf);
                    r16f_put(o, R16F_MR, t, b, y, y_bf16, ys, bias);
                }
                for (int mr = 4; mr >= 1; mr /= 2)
                    for (; b + mr <= b1; b += mr) {
                        if (base == GT_F16 && mr == 4) r16f_rows(GT_F16, 4, p, K, xf + b * xs, xs, o, p);
                        else if (base == GT_F16 && mr == 2) r16f_rows(GT_F16, 2, p, K, xf + b * xs, xs, o, p);
                        else if (base == GT_F16) r16f_rows(GT_F16, 1, p, K, xf + b * xs, xs, o, p);
                        else if (mr == 4) r16f_rows(GT_BF16, 4, p, K, xf + b * xs, xs, o, p);
                        else if (mr == 2) r16f_rows(GT_BF16, 2, p, K, xf + b * xs, xs, o, p);
                        else r16f_rows(GT_BF16, 1, p, K, xf + b * xs, xs, o, p);
                        r16f_put(o, mr, t, b, y, y_bf16, ys, bias);
                    }
            }
        }
        free(tmp);
        return 0;
    }
#endif
#if defined(QV512)
    if (B > 1) {   /* a decode batch: R16F_TR rows at a time, each row's bits r16f_tile's */
#pragma omp parallel for num_threads(nt) schedule(static) if (par)
        for (int64_t t = 0; t < tiles; t++) {
            const uint16_t *p = (const uint16_t *)w + t * 16 * K;
            float o[R16F_TR * 16];
            for (int64_t b = 0; b < B; b += R16F_TR) {
                const int mr = B - b < R16F_TR ? (int)(B - b) : R16F_TR;
                /* the first pass over a tile streams it from memory: the next tile is prefetched meanwhile */
                r16f_batch_rows(base, mr, p, K, xf + b * xs, xs, o, b == 0 && t + 1 < tiles ? p + 16 * K : NULL);
                r16f_put(o, mr, t, b, y, y_bf16, ys, bias);
            }
        }
        free(tmp);
        return 0;
    }
#endif
#pragma omp parallel for num_threads(nt) schedule(static) if (par)
    for (int64_t t = 0; t < tiles; t++) {
        const uint16_t *p = (const uint16_t *)w + t * 16 * K;
        for (int64_t b = 0; b < B; b++) {   /* a tile of K <= 2048 is <= 64 KB: from L2 again for the next row */
            float o[16];
            if (base == GT_F16) r16f_tile(GT_F16, p, K, xf + b * xs, o);
            else r16f_tile(GT_BF16, p, K, xf + b * xs, o);
            for (int r = 0; r < 16; r++) {
                const int64_t n = t * 16 + r;
                const float v = o[r] + (bias ? bias[n] : 0.0f);
                if (y_bf16) ((uint16_t *)y)[b * ys + n] = f2bf(v);
                else ((float *)y)[b * ys + n] = v;
            }
        }
    }
    free(tmp);
    return 0;
}
