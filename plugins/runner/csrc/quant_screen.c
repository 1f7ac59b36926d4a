/* A greedy lm_head screened at int8: the first maximum of the logits a head would compute, without computing most
 * of them (runner/head_screen.py).
 *
 * Gemma 3 270M's head is 262,144 x 640: 63% of a decode step's multiply-adds. A greedy row needs only the index of
 * its first maximum. Here every logit is first estimated at int8 (the head's Q8_0 bytes, or a Q8_0 copy of an
 * F16/BF16 head, against x quantized to Q8_0: quant_qmatmul_int8's numerics, one dot product where the head's own
 * int16 x takes two, none of the F16 kernel's widening), each estimate with a proven bound on its distance from the
 * logit the head computes; then only the tiles (16 rows) whose upper bound reaches the row's best lower bound are
 * computed by the head's own kernel, and the first maximum is taken over those. The answer is the head's, bit for
 * bit, because a logit outside those tiles is below some logit inside them:
 *
 *   exact_j <= S_j + B_j < L = max_i (S_i - B_i) <= exact_i     (rnd(x): the logits' dtype, fp32 or bf16, rounds
 *   monotonically, so rnd(S_j + B_j) < rnd(L) keeps rnd(exact_j) < rnd(exact_i): no tie is lost either)
 *
 * The bound (Cauchy-Schwarz on each difference, w' the screen's weights, w the head's, x' and x16 x as each kernel
 * quantizes it, every norm an upper bound):
 *   |S - exact| <= ||w'|| ||x' - x|| + ||w' - w|| ||x|| + ||w|| ||x16 - x|| + fp32 rounding of both kernels
 * with ||w|| <= ||w'|| + ||w' - w||; the rounding, at most (K / 4 + G + 8) 2^-24 ||w|| ||x|| for each kernel's
 * sums (FMA chains of K / 4, G group terms), is taken twice over so that it also covers S +- B's own rounding.
 * On real decode rows (SmolLM2, Gemma 3: /tmp scripts of issue 38) the bound is ~50x the actual error, yet a row
 * keeps few tiles: medians 12 of SmolLM2's 3,072 and 1 of Gemma's 16,384 on prompts of text, means 14 and 16 over
 * 16 streams of random-token prompts (flatter logits).
 *
 * screen_t (norms from head_screen.py, rounded up): norm[n] = ||w'_n||, err[n] = ||w'_n - w_n|| (NULL: the screen's
 * weights are the head's, a Q8_0 head). */

#define SCREEN_MAX_ROWS 64   /* x rows of one call */

typedef struct {
    int base;                 /* the head's format: GT_Q8_0, GT_F16 or GT_BF16, in its r16 layout */
    const uint8_t *w;         /* the head (N x row_bytes, r16) */
    int64_t row_bytes;
    const uint8_t *sw;        /* the screen: Q8_0 in the r16 layout (the head itself for a Q8_0 head) */
    int64_t s_row_bytes;
    const float *norm, *err;  /* [N] each */
    int64_t N, K;
} screen_t;

#if defined(QV512) && defined(__AVX512VNNI__)
/* the 16 logits of tile t for x row b, as the head's own kernel computes them (quant_qmatmul on the head: int16 x
 * for Q8_0, r16f_tile / r16f_rows for F16 and BF16 by the call's rows) */
static void screen_exact_tile(const screen_t *h, int64_t t, int64_t b, int64_t B, const int8_t *x16,
                              const float *dx16, const int32_t *sq16, const int32_t *sh16, const float *xf,
                              int64_t xfs, float *o) {
    const int64_t K = h->K, G = K / 32;
    if (h->base == GT_Q8_0) {
        r16_kernel(GT_Q8_0, 1)(h->w + t * 16 * h->row_bytes, G, 16 * 34, 1, x16 + 2 * b * K, 2 * K, dx16 + b * G,
                               sq16 + b * G, sh16 + b * G, o);
        return;
    }
    const uint16_t *p = (const uint16_t *)h->w + t * 16 * K;
    const float *xr = xf + b * xfs;
    if (B <= R16F_ROWWISE) {   /* a decode batch's rows: r16f_tile's sums; above it r16f_rows' (k in order) */
        if (h->base == GT_F16) r16f_tile(GT_F16, p, K, xr, o);
        else r16f_tile(GT_BF16, p, K, xr, o);
    } else if (h->base == GT_F16) r16f_rows(GT_F16, 1, p, K, xr, 0, o, p);
    else r16f_rows(GT_BF16, 1, p, K, xr, 0, o, p);
}

/* ||a - b|| of x row b's K values and their quantized copy q * d (per 32 values), rounded up */
static double screen_gap(const void *x, int x_bf16, int64_t xs, int64_t b, int64_t K, const int8_t *q8,
                         const int8_t *q16, const float *d) {
    double s = 0.0;
    for (int64_t g = 0; g < K / 32; g++) {
        float v[32];
        const float *src = x_group(x, x_bf16, xs, b, g, v);
        for (int j = 0; j < 32; j++) {
            /* int16 x as r16_split_group lays it out: [q >> 8: 32 bytes][q & 255: 32 bytes] a group */
            const double q = q8 ? (double)q8[32 * g + j]
                                : 256.0 * (double)q16[64 * g + j] + (double)(uint8_t)q16[64 * g + 32 + j];
            const double e = (double)src[j] - q * (double)d[g];
            s += e * e;
        }
    }
    return sqrt(s) * (1.0 + 0x1p-40);
}
#endif

/* A norm (float64) as a float32 at or above it: 2^-20 more, far above float32's rounding */
static float screen_up(double v) { return (float)(v * (1.0 + 0x1p-20)); }

/* What screen_t needs beside the head (base + R16_OFF, r16): norm[n] = ||w'_n|| for every row; for an F16 / BF16
 * head (sw not NULL) also the screen itself, the head's rows quantized to Q8_0 in the r16 layout at sw, and err[n]
 * = ||w'_n - w_n||. A tile at a time, nothing the size of the head allocated (a float copy of Gemma 3's is 671 MB).
 * Returns 0; -2: shapes; -3: memory. */
int quant_screen_prepare(int base, const uint8_t *w, int64_t row_bytes, int64_t N, int64_t K, uint8_t *sw,
                         float *norm, float *err, int nt) {
    if (K % 32 || N % 16) return -2;
    const int64_t qrb = K / 32 * 34;   /* a Q8_0 row's bytes, plain and r16 alike */
    int fail = 0;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1 && N >= 1024)
    for (int64_t t = 0; t < N / 16; t++) {
        float *rows = (float *)malloc((size_t)(17 * K) * sizeof(float)), *approx = rows ? rows + 16 * K : NULL;
        uint8_t *q = sw ? (uint8_t *)malloc((size_t)(16 * qrb)) : NULL;
        if (!rows || (sw && !q)) {
            free(rows); free(q);
#pragma omp atomic write
            fail = 1;
            continue;
        }
        for (int r = 0; r < 16; r++) r16_dequantize_row(base, w, row_bytes, 16 * t + r, K, rows + r * K, 0);
        if (sw) {
            quant_quantize_rows(GT_Q8_0, rows, 16, K, K, q, 1);
            quant_r16_repack(GT_Q8_0, q, 16, K, sw + t * 16 * qrb, 1);
        }
        for (int r = 0; r < 16; r++) {
            const float *exact = rows + r * K;
            if (sw) dequantize_row(GT_Q8_0, q + r * qrb, K, approx, 0);
            double n2 = 0.0, e2 = 0.0;
            for (int64_t k = 0; k < K; k++) {
                const double a = sw ? approx[k] : exact[k];
                n2 += a * a;
                e2 += (a - exact[k]) * (a - exact[k]);
            }
            norm[16 * t + r] = screen_up(sqrt(n2));
            if (err) err[16 * t + r] = screen_up(sqrt(e2));
        }
        free(rows); free(q);
    }
    return fail ? -3 : 0;
}

/* ids[b] = the index of the first maximum of rnd(x_b . W) for b < B, W the head (no bias; y_bf16: rnd rounds to
 * bf16, as logits in bf16; else fp32): quant_qmatmul's logits and the sampler's argmax, without the most of them.
 * Returns 0; -2: shapes (K not whole groups, N not whole tiles, B outside 1..SCREEN_MAX_ROWS); -3: memory; -5: no
 * r16 kernels in this build. */
int quant_screen_argmax(const screen_t *h, const void *x, int x_bf16, int64_t xs, int64_t B, int y_bf16,
                        int64_t *ids, int nt) {
#if defined(QV512) && defined(__AVX512VNNI__)
    const int64_t N = h->N, K = h->K, G = K / 32, T = N / 16;
    if (K % 32 || N % 16 || B < 1 || B > SCREEN_MAX_ROWS) return -2;
    const int q8 = h->base == GT_Q8_0;
    int8_t *x8 = (int8_t *)malloc((size_t)(B * K * (q8 ? 3 : 1) + 64));   /* int8 x, then (Q8_0) int16 x */
    float *dx = (float *)malloc((size_t)(2 * B * G + 1) * sizeof(float));
    int32_t *sq = (int32_t *)malloc((size_t)(6 * B * G + 1) * sizeof(int32_t));
    float *lohi = (float *)malloc((size_t)(2 * B * T) * sizeof(float));   /* per row and tile: max(S - B), max(S + B) */
    float *tmp = NULL;
    int64_t xfs = xs;
    const float *xf = q8 ? NULL : x_fp32(x, x_bf16, &xfs, B, K, &tmp);
    if (!x8 || !dx || !sq || !lohi || (!q8 && !xf)) {
        free(x8); free(dx); free(sq); free(lohi); free(tmp);
        return -3;
    }
    int8_t *x16 = x8 + B * K;
    float *dx16 = dx + B * G;
    int32_t *sh8 = sq + B * G, *sq16 = sq + 3 * B * G, *sh16 = sq + 4 * B * G;
    float P[SCREEN_MAX_ROWS], Q[SCREEN_MAX_ROWS];
    /* 2 x each kernel's rounding (see the top), relative to ||w|| ||x|| */
    const double fp = 2.0 * (double)(K / 4 + G + 8) * 0x1p-24;
    for (int64_t b = 0; b < B; b++) {
        r16_quantize_row(GT_Q8_0, 0, x, x_bf16, xs, b, K, x8, dx, sq, sh8);
        double d16 = 0.0, x2 = 0.0;
        if (q8) {
            r16_quantize_row(GT_Q8_0, 1, x, x_bf16, xs, b, K, x16, dx16, sq16, sh16);
            d16 = screen_gap(x, x_bf16, xs, b, K, NULL, x16 + 2 * b * K, dx16 + b * G);
        }
        for (int64_t g = 0; g < G; g++) {
            float v[32];
            const float *src = x_group(x, x_bf16, xs, b, g, v);
            for (int j = 0; j < 32; j++) x2 += (double)src[j] * src[j];
        }
        x2 = sqrt(x2) * (1.0 + 0x1p-40);
        const double d8 = screen_gap(x, x_bf16, xs, b, K, x8 + b * K, NULL, dx + b * G);
        /* B_n = norm_n P + err_n Q; 2^-8 more covers computing B itself in fp32 */
        P[b] = (float)((d8 + d16 + fp * (2.0 * x2 + d8 + d16)) * (1.0 + 0x1p-8));
        Q[b] = (float)((x2 + d16 + fp * (x2 + d16)) * (1.0 + 0x1p-8));
    }
    const r16_fn screen = r16_kernel(GT_Q8_0, 0);
    const int par = nt > 1 && T >= 2 * nt;
    /* pass 1: every tile's estimates at int8, kept as the tile's highest upper bound and highest lower bound a row */
#pragma omp parallel for num_threads(nt) schedule(static) if (par)
    for (int64_t t = 0; t < T; t++) {
        const __m512 a = _mm512_loadu_ps(h->norm + 16 * t);
        const __m512 e = h->err ? _mm512_loadu_ps(h->err + 16 * t) : _mm512_setzero_ps();
        for (int64_t b0 = 0; b0 < B; b0 += R16_NB) {
            const int nb = B - b0 < R16_NB ? (int)(B - b0) : R16_NB;
            float o[16 * R16_NB];
            screen(h->sw + t * 16 * h->s_row_bytes, G, 16 * 34, nb, x8 + b0 * K, K, dx + b0 * G, sq + b0 * G,
                   sh8 + 2 * b0 * G, o);
            for (int i = 0; i < nb; i++) {
                const int64_t b = b0 + i;
                const __m512 s = _mm512_loadu_ps(o + 16 * i);
                const __m512 bound = _mm512_fmadd_ps(a, _mm512_set1_ps(P[b]), _mm512_mul_ps(e, _mm512_set1_ps(Q[b])));
                lohi[2 * (b * T + t)] = _mm512_reduce_max_ps(_mm512_sub_ps(s, bound));
                lohi[2 * (b * T + t) + 1] = _mm512_reduce_max_ps(_mm512_add_ps(s, bound));
            }
        }
    }
    /* pass 2, a row at a time: the best lower bound, then the head's own logits of every tile that reaches it */
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1) if (nt > 1 && B > 1)
    for (int64_t b = 0; b < B; b++) {
        const float *r = lohi + 2 * b * T;
        float low = r[0];
        for (int64_t t = 1; t < T; t++) low = r[2 * t] > low ? r[2 * t] : low;
        const float lim = y_bf16 ? bf2f(f2bf(low)) : low;
        float best = 0.0f;
        int64_t id = -1;
        for (int64_t t = 0; t < T; t++) {
            const float up = r[2 * t + 1];
            if ((y_bf16 ? bf2f(f2bf(up)) : up) < lim) continue;
            float o[16];
            screen_exact_tile(h, t, b, B, x16, dx16, sq16, sh16, xf, xfs, o);
            for (int l = 0; l < 16; l++) {
                const float v = y_bf16 ? bf2f(f2bf(o[l])) : o[l];
                if (id < 0 || v > best) { best = v; id = 16 * t + l; }
            }
        }
        ids[b] = id;
    }
    free(x8); free(dx); free(sq); free(lohi); free(tmp);
    return 0;
#else
    (void)h; (void)x; (void)x_bf16; (void)xs; (void)B; (void)y_bf16; (void)ids; (void)nt;
    return -5;
#endif
}
