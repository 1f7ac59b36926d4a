"""`block_attention` in C (AVX-512): many query rows over one run of keys as two register-tiled GEMMs per KV head,
queries along the vector lanes (32 per tile): long prefill chunks and the shared part of cascade attention."""

SOURCE = r"""
#if defined(__AVX512F__)
/* dst[k][0..32) = sum over t < n of b[k * ks + t * ts] * v[t][0..32), for k < nk <= 8: 8 x 32 accumulators in
 * registers, one row of v loaded per t, each b value broadcast into its FMA (block_attention's two GEMMs) */
static inline void tile8x32(const float *b, int64_t ks, int64_t ts, int64_t nk, const float *v, int64_t n,
                            float *dst) {
    __m512 a[8][2];
    for (int k = 0; k < 8; k++) a[k][0] = a[k][1] = _mm512_setzero_ps();
    for (int64_t t = 0; t < n; t++) {
        const __m512 v0 = _mm512_load_ps(v + t * 32), v1 = _mm512_load_ps(v + t * 32 + 16);
        for (int k = 0; k < 8; k++) {
            const __m512 x = _mm512_set1_ps(b[(k < nk ? k : 0) * ks + t * ts]);
            a[k][0] = _mm512_fmadd_ps(x, v0, a[k][0]);
            a[k][1] = _mm512_fmadd_ps(x, v1, a[k][1]);
        }
    }
    for (int k = 0; k < nk; k++) {
        _mm512_store_ps(dst + k * 32, a[k][0]);
        _mm512_store_ps(dst + k * 32 + 16, a[k][1]);
    }
}

/* r[c][k] = r[k][c] for 16 rows of 16 32-bit values: four rounds that swap the off-diagonal halves of ever smaller
 * blocks (8, 4, 2, 1), two permutations per pair of rows each */
static inline void transpose16(__m512i *r) {
    for (int b = 8; b >= 1; b >>= 1) {
        int32_t lo[16], hi[16];
        for (int c = 0; c < 16; c++) {
            lo[c] = (c & b) ? 16 + c - b : c;
            hi[c] = (c & b) ? 16 + c : c + b;
        }
        const __m512i il = _mm512_loadu_si512((const void *)lo), ih = _mm512_loadu_si512((const void *)hi);
        for (int i = 0; i < 16; i++)
            if (!(i & b)) {
                const __m512i x = r[i], y = r[i + b];
                r[i] = _mm512_permutex2var_epi32(x, il, y);
                r[i + b] = _mm512_permutex2var_epi32(x, ih, y);
            }
    }
}

#if defined(__AVX512BF16__)
/* tile8x32 on bf16 pairs: a[k][0..32) = sum over t < n of pair rows[k][t * ts] . pair v[t][0..32) (each 32-bit
 * value two bf16), AVX512-BF16 dot products: S = K Q^T (keys straight from a bf16 cache, query pairs along the head
 * dim; bf16 x bf16 products are exact in fp32) and O^T = V^T P (V and P paired along the keys) */
static inline void acc8x32_bf16(const uint32_t *const *rows, int64_t ts, int64_t nk, const uint32_t *v, int64_t n,
                                __m512 a[8][2]) {
    for (int k = 0; k < 8; k++) a[k][0] = a[k][1] = _mm512_setzero_ps();
    for (int64_t p = 0; p < n; p++) {
        const __m512bh q0 = (__m512bh)_mm512_load_si512((const void *)(v + p * 32));
        const __m512bh q1 = (__m512bh)_mm512_load_si512((const void *)(v + p * 32 + 16));
        for (int k = 0; k < 8; k++) {
            const __m512bh x = (__m512bh)_mm512_set1_epi32((int)rows[k < nk ? k : 0][p * ts]);
            a[k][0] = _mm512_dpbf16_ps(a[k][0], x, q0);
            a[k][1] = _mm512_dpbf16_ps(a[k][1], x, q1);
        }
    }
}

/* dst[k][0..32) = scale * a[k] of acc8x32_bf16 */
static inline void tile8x32_bf16(const uint32_t *const *rows, int64_t ts, int64_t nk, const uint32_t *v, int64_t n,
                                 float scale, float *dst) {
    __m512 a[8][2];
    acc8x32_bf16(rows, ts, nk, v, n, a);
    const __m512 vs = _mm512_set1_ps(scale);
    for (int k = 0; k < nk; k++) {
        _mm512_store_ps(dst + k * 32, _mm512_mul_ps(a[k][0], vs));
        _mm512_store_ps(dst + k * 32 + 16, _mm512_mul_ps(a[k][1], vs));
    }
}

/* tile8x32_bf16 for S = K Q^T of keys j0..j0+nk, with the causal mask and the running max fused in: lane l keeps
 * key j only when j <= lim[l] (else -inf; lanes past every lim are only blended where j0 + k > lo, the least lim),
 * and top[0..2) take the max of each half's kept scores: no second pass over S before the softmax */
static inline void scores8x32_bf16(const uint32_t *const *rows, int64_t nk, const uint32_t *v, int64_t n, float scale,
                                   float *dst, int64_t j0, const __m512i *lv, int32_t lo, __m512 *top) {
    __m512 a[8][2];
    acc8x32_bf16(rows, 1, nk, v, n, a);
    const __m512 vs = _mm512_set1_ps(scale), ninf = _mm512_set1_ps(-INFINITY);
    for (int k = 0; k < nk; k++)
        for (int h = 0; h < 2; h++) {
            __m512 x = _mm512_mul_ps(a[k][h], vs);
            if (j0 + k > lo)
                x = _mm512_mask_blend_ps(_mm512_cmpge_epi32_mask(lv[h], _mm512_set1_epi32((int32_t)(j0 + k))), ninf, x);
            _mm512_store_ps(dst + k * 32 + h * 16, x);
            top[h] = _mm512_max_ps(top[h], x);
        }
}
#endif

/* Attention of a block of query rows over one run of keys (slots sl[0..len)), as two small GEMMs per KV head with
 * the queries along the vector lanes, so each K/V value is converted once and used by every query of its head from
 * registers. Row r sees keys 0..lim[r] (lim NULL: all): the shared prefix of cascade.py (every row, every key) and
 * long prefill chunks (row r at position start + r of its request, causal).
 *   Kf, Vf [len][d] fp32: the head's keys and values
 *   for each tile of 32 lanes (lane = row r, group head gi: i = r * g + gi; keys up to the tile's last lim):
 *     S[j][lane] = Kf[j] . Qt[.][lane] * scale, masked past lim; P = e^(S - max), sum; lse = max + log(sum)
 *     Ot[e][lane] = sum_j Vf[j][e] P[j][lane];  out[r][h*g+gi] = Ot[.][lane] / sum
 * fp32 math throughout (the products of bf16 values are exact in fp32), like the row-by-row paths. With bf16 queries
 * (qb) over a bf16 cache, S comes from AVX512-BF16 pair dot products of the cache's own bits (no Kf), the mask and the
 * max are taken as S leaves the registers, and e^(S - max) goes straight into the bf16 pairs of P V: one pass over
 * S after the GEMM instead of three (W3's 1,920-token causal prefill, one thread: 1.12-1.22x the three passes).
 * Queries in, and the output out (fp32 or bf16 rows, `out_bf16`), move through 16 x 16 register transposes. */
void block_attention(const float *q, const uint16_t *qb, void *out, int out_bf16, float *lse, const void *kc,
                     const void *vc, int bf16,
                     const int64_t *sl, int64_t len, const int64_t *lim, int64_t m, int64_t hq, int64_t hkv, int64_t d,
                     float scale, int nthreads) {
    const int64_t g = hq / hkv, mq = m * g, kp = (len + 1) / 2;
#if defined(__AVX512BF16__)
    /* bf16 queries over a bf16 cache: both GEMMs on bf16 pairs; P is rounded to bf16 for O = P V, as torch's flash
     * attention does for bf16 (the sums and the softmax stay fp32). First, in one pass over the cache rows in order
     * (each slot's K and V rows read whole, front to back), every head's keys next to each other, kall[h][j][d], and
     * its values paired along the keys, vall[h][j/2][e] = V[j][e] | V[j+1][e] << 16 (a zero row past the end):
     * reading them head by head from the cache took one 2*d-byte piece of each row per head, about half the time
     * of a shared-prefix call when the rows came from memory. */
    const int pairs = qb && bf16 && d % 2 == 0;
    uint16_t *kall = pairs ? (uint16_t *)malloc(sizeof(uint16_t) * (size_t)(hkv * len * d)) : NULL;
    uint32_t *vall = pairs ? (uint32_t *)malloc(sizeof(uint32_t) * (size_t)(hkv * kp * d)) : NULL;
    if (pairs) {
        #pragma omp parallel for num_threads(nthreads) schedule(static)
        for (int64_t jp = 0; jp < kp; jp++) {
            const int64_t j0 = 2 * jp, j1 = 2 * jp + 1;
            const uint16_t *k0 = (const uint16_t *)kc + sl[j0] * hkv * d, *v0 = (const uint16_t *)vc + sl[j0] * hkv * d;
            const uint16_t *k1 = j1 < len ? (const uint16_t *)kc + sl[j1] * hkv * d : NULL;
            const uint16_t *v1 = j1 < len ? (const uint16_t *)vc + sl[j1] * hkv * d : NULL;
            for (int64_t h = 0; h < hkv; h++) {
                memcpy(kall + (h * len + j0) * d, k0 + h * d, sizeof(uint16_t) * (size_t)d);
                if (k1) memcpy(kall + (h * len + j1) * d, k1 + h * d, sizeof(uint16_t) * (size_t)d);
                uint32_t *vp = vall + (h * kp + jp) * d;
                int64_t e = 0;
                for (; e + 16 <= d; e += 16) {
                    const __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(v0 + h * d + e)));
                    const __m512i hi = v1 ? _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(v1 + h * d + e)))
                                          : _mm512_setzero_si512();
                    _mm512_storeu_si512((void *)(vp + e), _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
                }
                for (; e < d; e++) vp[e] = (uint32_t)v0[h * d + e] | (v1 ? (uint32_t)v1[h * d + e] << 16 : 0u);
            }
        }
    }
#else
    const int pairs = 0;
#endif
    #pragma omp parallel for num_threads(nthreads) schedule(static, 1)
    for (int64_t h = 0; h < hkv; h++) {
        /* lenp: every buffer below starts 64-byte aligned (the tiles' aligned loads) */
        const int64_t lenp = (len + 15) & ~(int64_t)15;
        const int64_t kv = pairs ? 0 : lenp * d;   /* the fp32 K and V copies: not with bf16 pairs */
        float *kf = (float *)aligned_alloc(64, sizeof(float) * (size_t)(2 * kv + 2 * d * 32 + lenp * 32 + lenp * 16 + 64));
        float *vf = kf + kv, *qt = vf + kv, *ot = qt + d * 32, *s = ot + d * 32, *mx = s + lenp * 32;
        float *sum = mx + 32;   /* then pp: P paired along the keys, [kp][32] */
#if defined(__AVX512BF16__)
        uint32_t *qp = (uint32_t *)qt, *pp = (uint32_t *)(mx + 64);
        const uint16_t *kh = pairs ? kall + h * len * d : NULL;
        const uint32_t *vp = pairs ? vall + h * kp * d : NULL;
#endif
        for (int64_t j = 0; j < len && !pairs; j++) {
            load_row(kf + j * d, kc, sl[j] * hkv + h, d, bf16);
            load_row(vf + j * d, vc, sl[j] * hkv + h, d, bf16);
        }
        for (int64_t i0 = 0; i0 < mq; i0 += 32) {
            const int64_t nl = mq - i0 < 32 ? mq - i0 : 32;
            int64_t at[32];   /* lane l's (query row, head) as a row of q and out */
            for (int64_t l = 0; l < nl; l++) at[l] = ((i0 + l) / g) * hq + h * g + (i0 + l) % g;
            int32_t lane_lim[32];
            int64_t keys = 0;
            for (int64_t l = 0; l < 32; l++) {
                /* padding lanes (zero queries) see every key of the tile: finite, and dropped */
                const int64_t lv = l < nl ? (lim ? lim[(i0 + l) / g] : len - 1) : -2;
                lane_lim[l] = (int32_t)lv;
                keys = lv + 1 > keys ? lv + 1 : keys;
            }
            for (int64_t l = nl; l < 32; l++) lane_lim[l] = (int32_t)(keys - 1);
            if (!pairs) {
                memset(qt, 0, sizeof(float) * (size_t)(d * 32));
                for (int64_t l = 0; l < nl; l++)   /* q NULL: the bf16 queries, widened (exact) */
                    for (int64_t e = 0; e < d; e++) {
                        float x;
                        if (q) x = q[at[l] * d + e];
                        else { const uint32_t u = (uint32_t)qb[at[l] * d + e] << 16; memcpy(&x, &u, 4); }
                        qt[e * 32 + l] = x * scale;
                    }
            }
            /* S = K Q^T, 8 keys at a time */
#if defined(__AVX512BF16__)
            if (pairs) {
                /* qp[p][l] = lane l's pair p: 16 x 16 transposes (zero lanes past nl), the rest one value at a time */
                const int64_t dp = d / 2, dp16 = dp & ~(int64_t)15;
                for (int64_t lb = 0; lb < 32; lb += 16)
                    for (int64_t pb = 0; pb < dp16; pb += 16) {
                        __m512i r[16];
                        for (int k = 0; k < 16; k++)
                            r[k] = lb + k < nl ? _mm512_loadu_si512((const void *)((const uint32_t *)(qb + at[lb + k] * d) + pb))
                                               : _mm512_setzero_si512();
                        transpose16(r);
                        for (int c = 0; c < 16; c++) _mm512_store_si512((void *)(qp + (pb + c) * 32 + lb), r[c]);
                    }
                for (int64_t p = dp16; p < dp; p++)
                    for (int64_t l = 0; l < 32; l++) qp[p * 32 + l] = l < nl ? ((const uint32_t *)(qb + at[l] * d))[p] : 0u;
                __m512i lv[2];
                __m512 top[2] = {_mm512_set1_ps(-INFINITY), _mm512_set1_ps(-INFINITY)};
                int32_t lo = lane_lim[0];
                for (int l = 1; l < 32; l++) lo = lane_lim[l] < lo ? lane_lim[l] : lo;
                lv[0] = _mm512_loadu_si512((const void *)lane_lim);
                lv[1] = _mm512_loadu_si512((const void *)(lane_lim + 16));
                for (int64_t j0 = 0; j0 < keys; j0 += 8) {
                    const uint32_t *kr[8];
                    const int64_t nk = keys - j0 < 8 ? keys - j0 : 8;
                    for (int64_t k = 0; k < nk; k++)
                        kr[k] = (const uint32_t *)(kh + (j0 + k) * d);
                    scores8x32_bf16(kr, nk, qp, d / 2, scale, s + j0 * 32, j0, lv, lo, top);
                }
                /* P = e^(S - max) straight into bf16 pairs along the keys (pp), the sums from the fp32 values */
                const int64_t tp = (keys + 1) / 2;
                const __m512i inter = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                                       23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
                for (int half = 0; half < 2; half++) {
                    __m512 tot = _mm512_setzero_ps();
                    const __m512 t = top[half];
                    for (int64_t jp = 0; jp < tp; jp++) {
                        const __m512 p0 = exp16(_mm512_sub_ps(_mm512_load_ps(s + 2 * jp * 32 + half * 16), t));
                        const __m512 p1 = 2 * jp + 1 < keys
                            ? exp16(_mm512_sub_ps(_mm512_load_ps(s + (2 * jp + 1) * 32 + half * 16), t))
                            : _mm512_setzero_ps();
                        tot = _mm512_add_ps(tot, _mm512_add_ps(p0, p1));
                        /* lanes' (p0, p1) side by side: one 32-bit pair per lane */
                        const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(p1, p0);
                        _mm512_store_si512((void *)(pp + jp * 32 + half * 16), _mm512_permutexvar_epi16(inter, both));
                    }
                    _mm512_store_ps(mx + half * 16, t);
                    _mm512_store_ps(sum + half * 16, tot);
                }
                for (int64_t e0 = 0; e0 < d; e0 += 8) {
                    const uint32_t *vr[8];
                    for (int k = 0; k < 8; k++) vr[k] = vp + e0 + (e0 + k < d ? k : 0);
                    tile8x32_bf16(vr, d, d - e0 < 8 ? d - e0 : 8, pp, tp, 1.f, ot + e0 * 32);
                }
            } else
#endif
            {   /* fp32: S = K Q^T, the masked softmax in place, O^T = V^T P (8 output dims at a time) */
                for (int64_t j0 = 0; j0 < keys; j0 += 8)
                    tile8x32(kf + j0 * d, d, 1, keys - j0 < 8 ? keys - j0 : 8, qt, d, s + j0 * 32);
                for (int64_t half = 0; half < 32; half += 16) {
                    const __m512i lv = _mm512_loadu_si512((const void *)(lane_lim + half));
                    int32_t lo = lane_lim[half];
                    for (int l = 1; l < 16; l++) lo = lane_lim[half + l] < lo ? lane_lim[half + l] : lo;
                    __m512 top = _mm512_set1_ps(-INFINITY), tot = _mm512_setzero_ps();
                    for (int64_t j = 0; j < keys; j++) {   /* keys past a lane's lim: -inf, e^-inf = 0 */
                        __m512 x = _mm512_load_ps(s + j * 32 + half);
                        if (j > lo)
                            x = _mm512_mask_blend_ps(_mm512_cmpge_epi32_mask(lv, _mm512_set1_epi32((int32_t)j)),
                                                     _mm512_set1_ps(-INFINITY), x);
                        _mm512_store_ps(s + j * 32 + half, x);
                        top = _mm512_max_ps(top, x);
                    }
                    for (int64_t j = 0; j < keys; j++) {
                        const __m512 p = exp16(_mm512_sub_ps(_mm512_load_ps(s + j * 32 + half), top));
                        _mm512_store_ps(s + j * 32 + half, p);
                        tot = _mm512_add_ps(tot, p);
                    }
                    _mm512_store_ps(mx + half, top);
                    _mm512_store_ps(sum + half, tot);
                }
                for (int64_t e0 = 0; e0 < d; e0 += 8)
                    tile8x32(vf + e0, 1, d, d - e0 < 8 ? d - e0 : 8, s, keys, ot + e0 * 32);
            }
            /* out[at[l]] = Ot[.][l] / sum[l]: 16 x 16 transposes of Ot, the rest one value at a time */
            const int64_t es = out_bf16 ? 2 : 4, d16 = d & ~(int64_t)15;
            float inv[32];
            for (int64_t l = 0; l < nl; l++) inv[l] = 1.f / sum[l];
            for (int64_t lb = 0; lb < nl; lb += 16)
                for (int64_t eb = 0; eb < d16; eb += 16) {
                    __m512i r[16];
                    for (int k = 0; k < 16; k++) r[k] = _mm512_load_si512((const void *)(ot + (eb + k) * 32 + lb));
                    transpose16(r);
                    for (int c = 0; c < 16 && lb + c < nl; c++)
                        store16((char *)out + (at[lb + c] * d + eb) * es, out_bf16,
                                _mm512_mul_ps(_mm512_castsi512_ps(r[c]), _mm512_set1_ps(inv[lb + c])));
                }
            for (int64_t l = 0; l < nl; l++) {
                for (int64_t e = d16; e < d; e++) {
                    const float x = ot[e * 32 + l] * inv[l];
                    if (out_bf16) ((uint16_t *)out)[at[l] * d + e] = f32_to_bf16(x);
                    else ((float *)out)[at[l] * d + e] = x;
                }
                if (lse) lse[at[l]] = mx[l] + logf(sum[l]);
            }
        }
        free(kf);
    }
    free(kall);
    free(vall);
}
#endif
"""
