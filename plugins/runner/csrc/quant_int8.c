/* qmatmul with int8 activations (llama.cpp's way): each 32 values of an x row quantized as a Q8_0 block (the same
 * bytes as gguf.quants.quantize), then every group's 32 products summed exactly in int32 by one vpdpbusd
 * (u8 x s8: a signed q as |q| times x with q's sign), scaled by d * dx in fp32; an offset m adds m * dx * sum(xq).
 * The result is x's Q8_0 reconstruction @ W.T (to fp32 rounding): an error of x / 254 per value, so a flag.
 *
 * Built where vpdpbusd on 256 bits exists: AVX512-VNNI + VL, or AVX-VNNI (the AVX2 build on such a CPU).
 *
 * NOTE: not the default, because it is not faster here. One thread, Zen 4 (CPU time, shared machine), fp32 path /
 * int8, SmolLM2 shapes: Q4_1 batch 1 1.10-1.20x (576x576 28.5 / 25.3 us, 49152x576 1976 / 1650), batch 8
 * 0.71-0.85x (576x576 52 / 70 us) except 49152x576 1.01x; Q8_0 batch 1 0.93-1.02x, batch 8 0.80-0.97x, 49152x576
 * 1.51x. Per group and activation row it spends dpbusd + int->float + a scale multiply + FMA (+ sign for signed q):
 * as many FP-pipe slots as the fp32 path's two 512-bit FMAs on Zen 4, whose weight widening is shared by 8 rows. */
#if defined(QVEC) && ((defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__))
#define QINT8 1
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define DPBUSD(acc, a, b) _mm256_dpbusd_epi32(acc, a, b)
#else
#define DPBUSD(acc, a, b) _mm256_dpbusd_avx_epi32(acc, a, b)
#endif

INLINE __m256i vdec(const int qt, const uint8_t *row, int64_t g, qscale *s) {
    switch (qt) {
    case GT_Q8_0: return vdec_q8_0(row, g, s);
    case GT_Q4_0: return vdec_q4_0(row, g, s);
    case GT_Q4_1: return vdec_q4_1(row, g, s);
    case GT_Q5_0: return vdec_q5_0(row, g, s);
    case GT_Q5_1: return vdec_q5_1(row, g, s);
    case GT_Q4_K: return vdec_q4_k(row, g, s);
    case GT_Q5_K: return vdec_q5_k(row, g, s);
    default: return vdec_q6_k(row, g, s);
    }
}
INLINE int has_offset(int qt) { return qt == GT_Q4_1 || qt == GT_Q5_1 || qt == GT_Q4_K || qt == GT_Q5_K; }
INLINE float hsum8(__m256 a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 32 values as a Q8_0 block, the bytes quantize_block_q8_0 makes, without its libm roundf per value: round half
 * away from zero as t + (|v - t| >= 0.5) with t the truncation (v - t is exact), which the compiler vectorizes.
 * NOTE: 8 x 576 activations took ~20 us through roundf, as long as the matmul. Outside -ffast-math for the same
 * reason as the quantizers (amax / 127 must not become amax * (1 / 127)). */
#pragma GCC push_options
#pragma GCC optimize("no-fast-math", "fp-contract=off")
/* the 32 values at x rounded to integers q of at most qmax in magnitude on the scale d = amax / qmax, as
 * quantize_block_q8_0 rounds (qmax 127: its bytes; quant_r16.c takes qmax 32767 for int16); returns the sum of q */
static int quantize_group(const float *x, float qmax, int16_t *q, float *d) {
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) { const float a = fabsf(x[j]); amax = a > amax ? a : amax; }
    *d = amax / qmax;
    const float id = *d != 0.0f ? 1.0f / *d : 0.0f;
    int sum = 0;
    for (int j = 0; j < 32; j++) {
        const float v = x[j] * id;
        const int t = (int)v;
        const float f = v - (float)t;
        q[j] = (int16_t)(t + (f >= 0.5f) - (f <= -0.5f));
        sum += q[j];
    }
    return sum;
}
/* the 32 values at x as int8 q and their scale's fp16 bits; returns the sum of q */
static int quantize_x_group(const float *x, int8_t *q, uint16_t *dh) {
    int16_t q16[32];
    float d;
    const int sum = quantize_group(x, 127.0f, q16, &d);
    *dh = f2h(d);
    for (int j = 0; j < 32; j++) q[j] = (int8_t)q16[j];
    return sum;
}
static void quantize_x_q8_0(const float *x, uint8_t *out, float *dx, float *sx) {
    int8_t q[32];
    uint16_t dh;
    const int sum = quantize_x_group(x, q, &dh);
    memcpy(out, &dh, 2);
    memcpy(out + 2, q, 32);
    *dx = h2f(dh);
    *sx = *dx * (float)sum;
}
#pragma GCC pop_options

/* x rows as Q8_0 blocks: xb [b][g] 34 bytes, dx / sx [b][g] (the block's scale and dx * sum of its q) */
INLINE void row_dot_i8(const int qt, const int bt, const uint8_t *row, int64_t G, const uint8_t *xb,
                       const float *dx, const float *sx, float *out) {
    __m256 acc[8];
    float moff[8];
#pragma GCC unroll 8
    for (int b = 0; b < bt; b++) { acc[b] = _mm256_setzero_ps(); moff[b] = 0.0f; }
    for (int64_t g = 0; g < G; g++) {
        qscale s;
        const __m256i q = vdec(qt, row, g, &s);
        const int sign = !has_offset(qt);   /* the offset formats' q are >= 0: used as they are */
        const __m256i a = sign ? _mm256_sign_epi8(q, q) : q;
        const __m256 dv = _mm256_set_m128(_mm_set1_ps(s.dhi), _mm_set1_ps(s.dlo));
#pragma GCC unroll 8
        for (int b = 0; b < bt; b++) {
            const __m256i xv = _mm256_loadu_si256((const __m256i *)(xb + (b * G + g) * 34 + 2));
            const __m256i p = DPBUSD(_mm256_setzero_si256(), a, sign ? _mm256_sign_epi8(xv, q) : xv);
            acc[b] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(dv, _mm256_set1_ps(dx[b * G + g])),
                                     acc[b]);
            if (has_offset(qt)) moff[b] += s.m * sx[b * G + g];
        }
    }
#pragma GCC unroll 8
    for (int b = 0; b < bt; b++) out[b] = hsum8(acc[b]) + moff[b];
}

typedef void (*row_i8_fn)(const uint8_t *, int64_t, const uint8_t *, const float *, const float *, float *);
#define RI(qt, bt) \
    static void ri_##qt##_##bt(const uint8_t *r, int64_t G, const uint8_t *xb, const float *dx, const float *sx, \
                               float *o) { row_dot_i8(qt, bt, r, G, xb, dx, sx, o); }
#define RI8(qt) RI(qt, 1) RI(qt, 2) RI(qt, 3) RI(qt, 4) RI(qt, 5) RI(qt, 6) RI(qt, 7) RI(qt, 8) \
    static const row_i8_fn ri_##qt[8] = {ri_##qt##_1, ri_##qt##_2, ri_##qt##_3, ri_##qt##_4, \
                                         ri_##qt##_5, ri_##qt##_6, ri_##qt##_7, ri_##qt##_8};
RI8(GT_Q8_0) RI8(GT_Q4_0) RI8(GT_Q4_1) RI8(GT_Q5_0) RI8(GT_Q5_1) RI8(GT_Q4_K) RI8(GT_Q5_K) RI8(GT_Q6_K)

static const row_i8_fn *row_i8_kernels(int qt) {
    switch (qt) {
    case GT_Q8_0: return ri_GT_Q8_0;
    case GT_Q4_0: return ri_GT_Q4_0;
    case GT_Q4_1: return ri_GT_Q4_1;
    case GT_Q5_0: return ri_GT_Q5_0;
    case GT_Q5_1: return ri_GT_Q5_1;
    case GT_Q4_K: return ri_GT_Q4_K;
    case GT_Q5_K: return ri_GT_Q5_K;
    case GT_Q6_K: return ri_GT_Q6_K;
    default: return 0;
    }
}
#endif

/* 1 where quant_qmatmul_int8 is built (vpdpbusd), else 0 */
int quant_int8_available(void) {
#if defined(QINT8)
    return 1;
#else
    return 0;
#endif
}

/* As quant_qmatmul, x quantized to Q8_0 on the fly. Returns also -1 for a float type (no int8 form) and -5 where
 * this build has no vpdpbusd. */
int quant_qmatmul_int8(int qt, const uint8_t *w, int64_t row_bytes, int64_t N, int64_t K, const void *x,
                       int x_bf16, int64_t xs, int64_t B, void *y, int y_bf16, int64_t ys, const float *bias,
                       int nt) {
    if (qt >= R16_OFF && r16f_format(qt - R16_OFF))   /* float weights: no integer activations to take */
        return r16f_matmul(qt - R16_OFF, w, N, K, x, x_bf16, xs, B, y, y_bf16, ys, bias, nt);
    if (qt >= R16_OFF) return r16_qmatmul(qt - R16_OFF, w, row_bytes, N, K, x, x_bf16, xs, B, y, y_bf16, ys, bias, nt, 0);
#if defined(QINT8)
    const int err = check_shape(qt, K);
    if (err) return err;
    const row_i8_fn *tab = row_i8_kernels(qt);
    if (!tab) return -1;
    const int64_t G = K / 32;
    uint8_t *xb = (uint8_t *)malloc((size_t)(B * G * 34 + 64));
    float *dx = (float *)malloc((size_t)(2 * B * G + 1) * sizeof(float)), *sx = dx + B * G;
    if (!xb || !dx) { free(xb); free(dx); return -3; }
    for (int64_t b = 0; b < B; b++)
        for (int64_t g = 0; g < G; g++) {
            float v[32];
            quantize_x_q8_0(x_group(x, x_bf16, xs, b, g, v), xb + (b * G + g) * 34, dx + b * G + g, sx + b * G + g);
        }
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
                tab[bt - 1](w + n * row_bytes, G, xb + b0 * G * 34, dx + b0 * G, sx + b0 * G, o);
                for (int b = 0; b < bt; b++) {
                    const float v = o[b] + bn;
                    if (y_bf16) ((uint16_t *)y)[(b0 + b) * ys + n] = f2bf(v);
                    else ((float *)y)[(b0 + b) * ys + n] = v;
                }
            }
        }
    }
    free(xb);
    free(dx);
    return 0;
#else
    (void)qt; (void)w; (void)row_bytes; (void)N; (void)K; (void)x; (void)x_bf16; (void)xs; (void)B; (void)y;
    (void)y_bf16; (void)ys; (void)bias; (void)nt;
    return -5;
#endif
}
