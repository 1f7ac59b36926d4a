/* y = x @ W.T over quantized rows, dequantize_rows and quantize_rows: the exported functions, one code for every
 * format (the group decoders of quant_legacy.c / quant_k.c, specialized by always-inline per format and batch).
 *
 * qmatmul reads each weight row once for up to 8 activation rows ("bt"), widening every group of 32 weights to
 * fp32 in registers once and adding it into bt x 2 accumulators; more rows take more passes over the (by then
 * cached) row. Rows of W run in parallel (OpenMP, static chunks) when the call is large enough (PAR_MIN). */

/* weights * activation rows below which a call runs on the calling thread. NOTE: not measured on a quiet machine:
 * a 576 x 576 Q4_1 matvec is ~20 us on one thread (Zen 4), a parallel region's wake-up some microseconds; on the
 * shared 2-core machine (load ~13) the region cost ~20 ms (a worker waiting for a core), so no figure here says
 * what two threads win; benchmarks/quant_matmul.py measures it where cores are free. */
#define PAR_MIN (1 << 18)
#define ROW_TILE 16

#if defined(QV512)
typedef __m512 vf;
#define NV 2
#define VL 16
#define vload(p) _mm512_loadu_ps(p)
#define vstore(p, v) _mm512_storeu_ps(p, v)
#define vfma(a, b, c) _mm512_fmadd_ps(a, b, c)
#define vzero() _mm512_setzero_ps()
#define vadd(a, b) _mm512_add_ps(a, b)
#define vsum(a) _mm512_reduce_add_ps(a)
INLINE vf cvt16(__m128i q) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)); }
INLINE void widen(__m256i q, const qscale *s, vf *w) {
    const vf m = _mm512_set1_ps(s->m);
    w[0] = _mm512_fmadd_ps(cvt16(_mm256_castsi256_si128(q)), _mm512_set1_ps(s->dlo), m);
    w[1] = _mm512_fmadd_ps(cvt16(_mm256_extracti128_si256(q, 1)), _mm512_set1_ps(s->dhi), m);
}
INLINE void fwiden(const int qt, const uint8_t *row, int64_t k, vf *w) {   /* 32 floats from element k */
    for (int i = 0; i < 2; i++) {
        if (qt == GT_F32) w[i] = _mm512_loadu_ps((const float *)row + k + 16 * i);
        else {
            const __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + k + 16 * i));
            w[i] = qt == GT_F16 ? _mm512_cvtph_ps(h)
                                : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
        }
    }
}
/* 16 floats -> bf16, round to nearest even, NaN kept quiet: f2bf's arithmetic on 16 lanes */
INLINE void vstore_bf16(uint16_t *p, vf v) {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                                        _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)))), 16);
    const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                  _mm512_set1_epi32(0x7f800000));
    const __m512i q = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, r, q)));
}
#elif defined(QV256)
typedef __m256 vf;
#define NV 4
#define VL 8
#define vload(p) _mm256_loadu_ps(p)
#define vstore(p, v) _mm256_storeu_ps(p, v)
#define vfma(a, b, c) _mm256_fmadd_ps(a, b, c)
#define vzero() _mm256_setzero_ps()
#define vadd(a, b) _mm256_add_ps(a, b)
INLINE float vsum(__m256 a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
INLINE vf cvt8(__m128i q) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)); }
INLINE void widen(__m256i q, const qscale *s, vf *w) {
    const vf m = _mm256_set1_ps(s->m), dlo = _mm256_set1_ps(s->dlo), dhi = _mm256_set1_ps(s->dhi);
    const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    w[0] = _mm256_fmadd_ps(cvt8(lo), dlo, m);
    w[1] = _mm256_fmadd_ps(cvt8(_mm_srli_si128(lo, 8)), dlo, m);
    w[2] = _mm256_fmadd_ps(cvt8(hi), dhi, m);
    w[3] = _mm256_fmadd_ps(cvt8(_mm_srli_si128(hi, 8)), dhi, m);
}
INLINE void vstore_bf16(uint16_t *p, vf v) {   /* as the AVX-512 one, on 8 lanes */
    const __m256i u = _mm256_castps_si256(v);
    const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff),
                                        _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1)))), 16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                           _mm256_set1_epi32(0x7f800000));
    const __m256i q = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    const __m256i m = _mm256_blendv_epi8(r, q, nan);
    _mm_storeu_si128((__m128i *)p, _mm_packus_epi32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1)));
}
INLINE void fwiden(const int qt, const uint8_t *row, int64_t k, vf *w) {
    for (int i = 0; i < 4; i++) {
        if (qt == GT_F32) w[i] = _mm256_loadu_ps((const float *)row + k + 8 * i);
        else {
            const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + k + 8 * i));
            w[i] = qt == GT_F16 ? _mm256_cvtph_ps(h)
                                : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
        }
    }
}
#endif

INLINE int is_float_type(int qt) { return qt == GT_F32 || qt == GT_F16 || qt == GT_BF16; }
INLINE float fscalar(const int qt, const uint8_t *row, int64_t k) {
    if (qt == GT_F32) return ((const float *)row)[k];
    const uint16_t h = ((const uint16_t *)row)[k];
    return qt == GT_F16 ? h2f(h) : bf2f(h);
}

/* the 32 weights of group g, portable: the same values the vector paths make */
INLINE void sgroup(const int qt, const uint8_t *row, int64_t g, float *w) {
    int8_t q[32];
    qscale s;
    switch (qt) {
    case GT_Q8_0: sdec_q8_0(row, g, q, &s); break;
    case GT_Q4_0: sdec_q4_0(row, g, q, &s); break;
    case GT_Q4_1: sdec_q4_1(row, g, q, &s); break;
    case GT_Q5_0: sdec_q5_0(row, g, q, &s); break;
    case GT_Q5_1: sdec_q5_1(row, g, q, &s); break;
    case GT_Q4_K: sdec_q4_k(row, g, q, &s); break;
    case GT_Q5_K: sdec_q5_k(row, g, q, &s); break;
    case GT_Q6_K: sdec_q6_k(row, g, q, &s); break;
    default:
        for (int j = 0; j < 32; j++) w[j] = fscalar(qt, row, 32 * g + j);
        return;
    }
    for (int j = 0; j < 16; j++) w[j] = (float)q[j] * s.dlo + s.m;
    for (int j = 16; j < 32; j++) w[j] = (float)q[j] * s.dhi + s.m;
}

#if defined(QVEC)
INLINE void vgroup(const int qt, const uint8_t *row, int64_t g, vf *w) {
    qscale s;
    __m256i q;
    switch (qt) {
    case GT_Q8_0: q = vdec_q8_0(row, g, &s); break;
    case GT_Q4_0: q = vdec_q4_0(row, g, &s); break;
    case GT_Q4_1: q = vdec_q4_1(row, g, &s); break;
    case GT_Q5_0: q = vdec_q5_0(row, g, &s); break;
    case GT_Q5_1: q = vdec_q5_1(row, g, &s); break;
    case GT_Q4_K: q = vdec_q4_k(row, g, &s); break;
    case GT_Q5_K: q = vdec_q5_k(row, g, &s); break;
    case GT_Q6_K: q = vdec_q6_k(row, g, &s); break;
    default: fwiden(qt, row, 32 * g, w); return;
    }
    widen(q, &s, w);
}
#endif

/* out[b] = row . x[b] for b < bt (constant after inlining: the accumulators stay in registers) */
INLINE void row_dot(const int qt, const int bt, const uint8_t *row, int64_t K, const float *x, int64_t xs,
                    float *out) {
    const int64_t G = K / 32;
#if defined(QVEC)
    vf acc[8][2];
#pragma GCC unroll 8
    for (int b = 0; b < bt; b++) acc[b][0] = acc[b][1] = vzero();
    for (int64_t g = 0; g < G; g++) {
        vf w[NV];
        vgroup(qt, row, g, w);
        const float *xg = x + 32 * g;
#pragma GCC unroll 8
        for (int b = 0; b < bt; b++) {
#pragma GCC unroll 4
            for (int i = 0; i < NV; i++) acc[b][i & 1] = vfma(w[i], vload(xg + b * xs + i * VL), acc[b][i & 1]);
        }
    }
#pragma GCC unroll 8
    for (int b = 0; b < bt; b++) out[b] = vsum(vadd(acc[b][0], acc[b][1]));
#else
    float acc[8] = {0};
    for (int64_t g = 0; g < G; g++) {
        float w[32];
        sgroup(qt, row, g, w);
        for (int b = 0; b < bt; b++) {
            const float *xg = x + b * xs + 32 * g;
            float s = 0.0f;
            for (int j = 0; j < 32; j++) s += w[j] * xg[j];
            acc[b] += s;
        }
    }
    for (int b = 0; b < bt; b++) out[b] = acc[b];
#endif
    if (is_float_type(qt))
        for (int64_t k = 32 * G; k < K; k++) {
            const float wk = fscalar(qt, row, k);
            for (int b = 0; b < bt; b++) out[b] += wk * x[b * xs + k];
        }
}

typedef void (*row_fn)(const uint8_t *, int64_t, const float *, int64_t, float *);
#define RK(qt, bt) \
    static void rk_##qt##_##bt(const uint8_t *r, int64_t K, const float *x, int64_t xs, float *o) { \
        row_dot(qt, bt, r, K, x, xs, o); }
#define RK8(qt) RK(qt, 1) RK(qt, 2) RK(qt, 3) RK(qt, 4) RK(qt, 5) RK(qt, 6) RK(qt, 7) RK(qt, 8) \
    static const row_fn rk_##qt[8] = {rk_##qt##_1, rk_##qt##_2, rk_##qt##_3, rk_##qt##_4, \
                                      rk_##qt##_5, rk_##qt##_6, rk_##qt##_7, rk_##qt##_8};
RK8(GT_Q8_0) RK8(GT_Q4_0) RK8(GT_Q4_1) RK8(GT_Q5_0) RK8(GT_Q5_1) RK8(GT_Q4_K) RK8(GT_Q5_K) RK8(GT_Q6_K)
RK8(GT_F32) RK8(GT_F16) RK8(GT_BF16)

static const row_fn *row_kernels(int qt) {
    switch (qt) {
    case GT_Q8_0: return rk_GT_Q8_0;
    case GT_Q4_0: return rk_GT_Q4_0;
    case GT_Q4_1: return rk_GT_Q4_1;
    case GT_Q5_0: return rk_GT_Q5_0;
    case GT_Q5_1: return rk_GT_Q5_1;
    case GT_Q4_K: return rk_GT_Q4_K;
    case GT_Q5_K: return rk_GT_Q5_K;
    case GT_Q6_K: return rk_GT_Q6_K;
    case GT_F32: return rk_GT_F32;
    case GT_F16: return rk_GT_F16;
    case GT_BF16: return rk_GT_BF16;
    default: return 0;
    }
}

/* (weights per block, bytes per block); 0 for a type this library does not know */
int quant_block_info(int qt, int *block, int *bytes) {
    static const int t[][3] = {{GT_F32, 1, 4}, {GT_F16, 1, 2}, {GT_BF16, 1, 2}, {GT_Q8_0, 32, 34},
                               {GT_Q4_0, 32, 18}, {GT_Q4_1, 32, 20}, {GT_Q5_0, 32, 22}, {GT_Q5_1, 32, 24},
                               {GT_Q4_K, 256, 144}, {GT_Q5_K, 256, 176}, {GT_Q6_K, 256, 210}};
    for (unsigned i = 0; i < sizeof t / sizeof t[0]; i++)
        if (t[i][0] == qt) { *block = t[i][1]; *bytes = t[i][2]; return 1; }
    return 0;
}

/* 1 = AVX-512, 2 = AVX2, 0 = portable C: which path this build took (the tests check each build is the one wanted) */
int quant_path(void) {
#if defined(QV512)
    return 1;
#elif defined(QV256)
    return 2;
#else
    return 0;
#endif
}

static int check_shape(int qt, int64_t K) {
    int bs, bytes;
    if (!quant_block_info(qt, &bs, &bytes)) return -1;
    return K % bs == 0 ? 0 : -2;
}

/* y[b * ys + n] = sum_k x[b * xs + k] * W[n, k] (+ bias[n]), b < B, n < N; x and y fp32, or bf16 where flagged.
 * Returns 0, -1 (unknown type), -2 (K not a whole number of blocks), -3 (out of memory). */
int quant_qmatmul(int qt, const uint8_t *w, int64_t row_bytes, int64_t N, int64_t K, const void *x, int x_bf16,
                  int64_t xs, int64_t B, void *y, int y_bf16, int64_t ys, const float *bias, int nt) {
    if (qt >= R16_OFF && r16f_format(qt - R16_OFF))
        return r16f_matmul(qt - R16_OFF, w, N, K, x, x_bf16, xs, B, y, y_bf16, ys, bias, nt);
    if (qt >= R16_OFF) return r16_qmatmul(qt - R16_OFF, w, row_bytes, N, K, x, x_bf16, xs, B, y, y_bf16, ys, bias, nt, 1);
    const int err = check_shape(qt, K);
    if (err) return err;
    const row_fn *tab = row_kernels(qt);
    float *tmp;
    const float *xf = x_fp32(x, x_bf16, &xs, B, K, &tmp);
    if (!xf) return -3;
    /* NOTE: rows in tiles of ROW_TILE, each tile's rows once per 8 activation rows: the tile's weights and the
     * 8 x rows stay in L1/L2 while the tile runs. Row by row (every x row re-read for each weight row), 32 rows of
     * 576 features took 4.5x the time of 16 (the x rows out of L1): 1030 vs 226 us, 1536 x 576 Q4_1, Zen 4. */
    const int64_t tiles = (N + ROW_TILE - 1) / ROW_TILE;
    const int par = nt > 1 && tiles >= 2 && N * K * (B < 8 ? B : 8) >= PAR_MIN;
#pragma omp parallel for num_threads(nt) schedule(static) if (par)
    for (int64_t t = 0; t < tiles; t++) {
        const int64_t n1 = (t + 1) * ROW_TILE < N ? (t + 1) * ROW_TILE : N;
        for (int64_t b0 = 0; b0 < B; b0 += 8) {
            const int bt = B - b0 < 8 ? (int)(B - b0) : 8;
            for (int64_t n = t * ROW_TILE; n < n1; n++) {
                const float bn = bias ? bias[n] : 0.0f;
                float o[8];
                tab[bt - 1](w + n * row_bytes, K, xf + b0 * xs, xs, o);
                for (int b = 0; b < bt; b++) {
                    const float v = o[b] + bn;
                    if (y_bf16) ((uint16_t *)y)[(b0 + b) * ys + n] = f2bf(v);
                    else ((float *)y)[(b0 + b) * ys + n] = v;
                }
            }
        }
    }
    free(tmp);
    return 0;
}

/* one row to fp32 (bf16 == 0) or bf16 at out */
INLINE void dequantize_row(int qt, const uint8_t *row, int64_t K, void *out, const int bf16) {
    const int64_t G = K / 32;
    for (int64_t g = 0; g < G; g++) {
#if defined(QVEC)
        vf w[NV];
        switch (qt) {   /* specialized per format, as in the matmul */
        case GT_Q8_0: vgroup(GT_Q8_0, row, g, w); break;
        case GT_Q4_0: vgroup(GT_Q4_0, row, g, w); break;
        case GT_Q4_1: vgroup(GT_Q4_1, row, g, w); break;
        case GT_Q5_0: vgroup(GT_Q5_0, row, g, w); break;
        case GT_Q5_1: vgroup(GT_Q5_1, row, g, w); break;
        case GT_Q4_K: vgroup(GT_Q4_K, row, g, w); break;
        case GT_Q5_K: vgroup(GT_Q5_K, row, g, w); break;
        case GT_Q6_K: vgroup(GT_Q6_K, row, g, w); break;
        case GT_F16: vgroup(GT_F16, row, g, w); break;
        case GT_BF16: vgroup(GT_BF16, row, g, w); break;
        default: vgroup(GT_F32, row, g, w); break;
        }
        for (int i = 0; i < NV; i++) {
            if (bf16) vstore_bf16((uint16_t *)out + 32 * g + i * VL, w[i]);
            else vstore((float *)out + 32 * g + i * VL, w[i]);
        }
#else
        float w[32];
        sgroup(qt, row, g, w);
        for (int j = 0; j < 32; j++) {
            if (bf16) ((uint16_t *)out)[32 * g + j] = f2bf(w[j]);
            else ((float *)out)[32 * g + j] = w[j];
        }
#endif
    }
    if (is_float_type(qt))
        for (int64_t k = 32 * G; k < K; k++) {
            const float v = fscalar(qt, row, k);
            if (bf16) ((uint16_t *)out)[k] = f2bf(v);
            else ((float *)out)[k] = v;
        }
}

/* out[i * os ..] = W[ids ? ids[i] : r0 + i] as fp32 (or bf16), i < nrows. Returns 0, -1, -2, or -4 (an id
 * out of [0, n_total)). */
int quant_dequantize_rows(int qt, const uint8_t *w, int64_t row_bytes, int64_t n_total, int64_t K,
                          const int64_t *ids, int64_t r0, int64_t nrows, void *out, int out_bf16, int64_t os,
                          int nt) {
    const int err = check_shape(qt >= R16_OFF ? qt - R16_OFF : qt, K);
    if (err) return err;
    for (int64_t i = 0; i < nrows; i++) {
        const int64_t r = ids ? ids[i] : r0 + i;
        if (r < 0 || r >= n_total) return -4;
    }
    if (qt >= R16_OFF && r16f_format(qt - R16_OFF) && !ids && r0 % 16 == 0 && nrows % 16 == 0) {
        if (n_total % 16) return -2;   /* whole tiles of 16-bit floats: transposed a block at a time */
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1 && nrows >= 32 * nt && nrows * K >= PAR_MIN)
        for (int64_t t = 0; t < nrows / 16; t++)
            r16f_dequantize_tile(qt - R16_OFF, w, r0 / 16 + t, K,
                                 out_bf16 ? (void *)((uint16_t *)out + 16 * t * os) : (void *)((float *)out + 16 * t * os),
                                 out_bf16, os);
        return 0;
    }
    if (qt >= R16_OFF) {
        if (n_total % 16) return -2;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1 && nrows >= 2 * nt && nrows * K >= PAR_MIN)
        for (int64_t i = 0; i < nrows; i++)
            r16_dequantize_row(qt - R16_OFF, w, row_bytes, ids ? ids[i] : r0 + i, K,
                               out_bf16 ? (void *)((uint16_t *)out + i * os) : (void *)((float *)out + i * os),
                               out_bf16);
        return 0;
    }
    const int par = nt > 1 && nrows >= 2 * nt && nrows * K >= PAR_MIN;
#pragma omp parallel for num_threads(nt) schedule(static) if (par)
    for (int64_t i = 0; i < nrows; i++) {
        const uint8_t *row = w + (ids ? ids[i] : r0 + i) * row_bytes;
        if (out_bf16) dequantize_row(qt, row, K, (uint16_t *)out + i * os, 1);
        else dequantize_row(qt, row, K, (float *)out + i * os, 0);
    }
    return 0;
}

/* out rows [nrows, K / block * bytes] from fp32 x rows (stride xs): Q8_0 and Q4_0 as gguf.quants makes them, Q4_K
 * by quantize_block_q4_k. Returns 0, -1 (no quantizer for the type), -2. */
int quant_quantize_rows(int qt, const float *x, int64_t nrows, int64_t K, int64_t xs, uint8_t *out, int nt) {
    void (*blk)(const float *, uint8_t *) = qt == GT_Q8_0 ? quantize_block_q8_0
                                          : qt == GT_Q4_0 ? quantize_block_q4_0
                                          : qt == GT_Q4_K ? quantize_block_q4_k : 0;
    if (!blk) return -1;
    int bs, bytes;
    quant_block_info(qt, &bs, &bytes);
    if (K % bs) return -2;
    const int64_t nb = K / bs;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1 && nrows * K >= PAR_MIN)
    for (int64_t i = 0; i < nrows; i++)
        for (int64_t j = 0; j < nb; j++) blk(x + i * xs + j * bs, out + (i * nb + j) * bytes);
    return 0;
}
