/* `block_attention` in C (AVX-512): many query rows over one run of keys as two register-tiled GEMMs per KV head,
 * queries along the vector lanes (32 per tile): long prefill chunks and the shared part of cascade attention. */

#include "kernel_common.h"

#if defined(__AVX512F__)
#include <time.h>
#define FOR8(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7)

/* Row k (< nk) of a tile's 8 x 32 results as it leaves the registers: times vs into dst[k][0..32). With lv (the
 * scores of keys j0..j0+nk), the causal mask fused in: lane l keeps key j0 + k only when j0 + k <= lv's lim[l] (else
 * -inf; checked only past lo, the least lim), and top[0..2) take the max of each half's kept scores */
static inline void put_row(float *dst, int k, int64_t nk, __m512 x0, __m512 x1, __m512 vs, const __m512i *lv,
                           int32_t lo, int64_t j0, __m512 *top) {
    if (k >= nk) return;
    x0 = _mm512_mul_ps(x0, vs);
    x1 = _mm512_mul_ps(x1, vs);
    if (lv) {
        if (j0 + k > lo) {
            const __m512i j = _mm512_set1_epi32((int32_t)(j0 + k));
            const __m512 ninf = _mm512_set1_ps(-INFINITY);
            x0 = _mm512_mask_blend_ps(_mm512_cmpge_epi32_mask(lv[0], j), ninf, x0);
            x1 = _mm512_mask_blend_ps(_mm512_cmpge_epi32_mask(lv[1], j), ninf, x1);
        }
        top[0] = _mm512_max_ps(top[0], x0);
        top[1] = _mm512_max_ps(top[1], x1);
    }
    _mm512_store_ps(dst + k * 32, x0);
    _mm512_store_ps(dst + k * 32 + 16, x1);
}

/* dst[k][0..32) = scale * sum over t < n of b[k * ks + t * ts] * v[t][0..32) (acc: added to dst), for k < nk <= 8
 * (put_row: with lv, masked, and the max taken): one row of v loaded per t, each b value broadcast into its FMAs
 * (block_attention's two fp32 GEMMs). NOTE: sixteen named accumulators. The a[8][2] array they replace did stay in
 * zmm registers through the loop (gcc 12, -O3 -march=native: no stack traffic per step; 32 zmm registers, where the
 * AVX2 tile's array spilled), but went through the stack once per call on the way out, and `k < nk ? k : 0` left
 * three compares in the loop; named, the tile alone at n = 32-64 ran ~1.07x (median of 16 alternating rounds). */
static inline void tile8x32(const float *b, int64_t ks, int64_t ts, int64_t nk, const float *v, int64_t n,
                            float *dst, float scale, const __m512i *lv, int32_t lo, int64_t j0, __m512 *top, int acc) {
#define T8_PTR(k) const float *b##k = b + (k < nk ? k : 0) * ks;
#define T8_ZERO(k) __m512 a##k##0 = acc && k < nk ? _mm512_load_ps(dst + k * 32) : _mm512_setzero_ps(), \
                          a##k##1 = acc && k < nk ? _mm512_load_ps(dst + k * 32 + 16) : _mm512_setzero_ps();
#define T8_STEP(k) { const __m512 x = _mm512_set1_ps(b##k[o]); \
                     a##k##0 = _mm512_fmadd_ps(x, v0, a##k##0); a##k##1 = _mm512_fmadd_ps(x, v1, a##k##1); }
#define T8_PUT(k) put_row(dst, k, nk, a##k##0, a##k##1, vs, lv, lo, j0, top);
    FOR8(T8_PTR) FOR8(T8_ZERO)
    for (int64_t t = 0; t < n; t++) {
        const __m512 v0 = _mm512_load_ps(v + t * 32), v1 = _mm512_load_ps(v + t * 32 + 16);
        const int64_t o = t * ts;
        FOR8(T8_STEP)
    }
    const __m512 vs = _mm512_set1_ps(scale);
    FOR8(T8_PUT)
#undef T8_PTR
#undef T8_STEP
}

/* r[c][k] = r[k][c] for 16 rows of 16 32-bit values: four rounds that swap the off-diagonal halves of ever smaller
 * blocks (8, 4, 2, 1), two permutations per pair of rows each. The rounds' indices are constants: built in arrays on
 * each call (lo[c] = (c & b) ? 16 + c - b : c, hi[c] = (c & b) ? 16 + c : c + b), their vector loads waited on the
 * stores (~3% of W3's bf16 prefill layer) */
static const int32_t T16_IDX[4][2][16] __attribute__((aligned(64))) = {
    {{0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23},
     {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31}},
    {{0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27},
     {4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31}},
    {{0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29},
     {2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31}},
    {{0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30},
     {1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31}}};
static inline void transpose16(__m512i *r) {
    for (int round = 0; round < 4; round++) {
        const int b = 8 >> round;
        const __m512i il = _mm512_load_si512((const void *)T16_IDX[round][0]);
        const __m512i ih = _mm512_load_si512((const void *)T16_IDX[round][1]);
        for (int i = 0; i < 16; i++)
            if (!(i & b)) {
                const __m512i x = r[i], y = r[i + b];
                r[i] = _mm512_permutex2var_epi32(x, il, y);
                r[i + b] = _mm512_permutex2var_epi32(x, ih, y);
            }
    }
}

#if defined(__AVX512BF16__)
/* tile8x32 on bf16 pairs: dst[k][0..32) = scale * sum over t < n of pair rows[k][t * ts] . pair v[t][0..32) (each
 * 32-bit value two bf16; acc: added to dst), AVX512-BF16 dot products: S = K Q^T (keys straight from a bf16 cache,
 * query pairs along the head dim; bf16 x bf16 products are exact in fp32) and O^T = V^T P (V and P paired along the
 * keys); put_row as in tile8x32 (with lv: the scores, masked, and the max). Named accumulators as there (the same
 * speed as the array: this tile runs at vdpbf16ps's limit) */
static inline void tile8x32_bf16(const uint32_t *const *rows, int64_t ts, int64_t nk, const uint32_t *v, int64_t n,
                                 float *dst, float scale, const __m512i *lv, int32_t lo, int64_t j0, __m512 *top,
                                 int acc) {
#define T8_PTR(k) const uint32_t *b##k = rows[k < nk ? k : 0];
#define T8_STEP(k) { const __m512bh x = (__m512bh)_mm512_set1_epi32((int)b##k[o]); \
                     a##k##0 = _mm512_dpbf16_ps(a##k##0, x, q0); a##k##1 = _mm512_dpbf16_ps(a##k##1, x, q1); }
    FOR8(T8_PTR) FOR8(T8_ZERO)
    for (int64_t p = 0; p < n; p++) {
        const __m512bh q0 = (__m512bh)_mm512_load_si512((const void *)(v + p * 32));
        const __m512bh q1 = (__m512bh)_mm512_load_si512((const void *)(v + p * 32 + 16));
        const int64_t o = p * ts;
        FOR8(T8_STEP)
    }
    const __m512 vs = _mm512_set1_ps(scale);
    FOR8(T8_PUT)
#undef T8_PTR
#undef T8_STEP
}

/* Whether the bf16 pair dot products are worth their rounding here: an AVX512-BF16 vdpbf16ps does twice an fp32
 * FMA's work, but it is not twice as fast everywhere. Measured once per process (12 independent chains of each, the
 * best of five alternating rounds of 5-20 us), the pairs when a dot product takes at most two FMAs' time; else bf16
 * inputs are widened to fp32 (exact) and take the fp32 GEMMs. MODELCALL_BLOCK_PAIRS=1 / 0 decides instead.
 * NOTE (measured, one core): an Intel Xeon (model 207, AVX512-BF16 and -FP16, no AMX) ran vdpbf16ps at half the
 * fp32 FMA's FLOP rate (~75-85 against ~165-175 GFLOP/s in the same runs; here a dot product takes 4.05-4.17 FMAs'
 * time), the pair tiles at that limit: W3's bf16 prefill layer (1,920 causal queries, 8 x 64, one thread) took 54 ms
 * on the pairs, 30 ms widened to the fp32 GEMMs (benchmarks/block_attention.py). On the Zen 4 of docs/runner.md the
 * pairs ran ~200 GFLOP/s, about twice what its fp32 FMAs allow: the pairs stay there (not measured since). */
static double pair_clock(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}
#define R12(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) M(10) M(11)
static __attribute__((noinline)) double pair_chains(int bf, long it, float seed) {
#define C12_INIT(k) __m512 c##k = _mm512_set1_ps(seed * (float)(k + 1));
#define C12_DOT(k) c##k = _mm512_dpbf16_ps(c##k, x, y);
#define C12_FMA(k) c##k = _mm512_fmadd_ps(c##k, xf, yf);
#define C12_SUM(k) acc = _mm512_add_ps(acc, c##k);
    R12(C12_INIT)
    const __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f7f3f7e), y = (__m512bh)_mm512_set1_epi32(0x3a013a02);
    const __m512 xf = _mm512_set1_ps(0.999f), yf = _mm512_set1_ps(1e-4f);
    const double t0 = pair_clock();
    if (bf) for (long i = 0; i < it; i++) { R12(C12_DOT) }
    else for (long i = 0; i < it; i++) { R12(C12_FMA) }
    const double t1 = pair_clock();
    __m512 acc = _mm512_setzero_ps();
    R12(C12_SUM)
    volatile float sink = _mm512_reduce_add_ps(acc);
    (void)sink;
    return t1 - t0;
}
static int pairs_pay(void) {
    static int known = -1;
    int v = __atomic_load_n(&known, __ATOMIC_ACQUIRE);
    if (v >= 0) return v;
    const char *env = getenv("MODELCALL_BLOCK_PAIRS");
    if (env && (env[0] == '0' || env[0] == '1') && !env[1]) v = env[0] == '1';
    else {
        double dot = 1e30, fma = 1e30;
        pair_chains(1, 2000, 1e-3f);   /* warm: the core's wide-vector clock */
        pair_chains(0, 2000, 1e-3f);
        for (int r = 0; r < 5; r++) {
            const double a = pair_chains(1, 2000, 1e-3f), b = pair_chains(0, 2000, 1e-3f);
            dot = a < dot ? a : dot;
            fma = b < fma ? b : fma;
        }
        v = dot <= 2.0 * fma;
    }
    __atomic_store_n(&known, v, __ATOMIC_RELEASE);
    return v;
}

/* 1 when block_attention takes bf16 inputs on the pairs in this process, 0 when it widens them (pairs_pay) */
int block_pairs(void) { return pairs_pay(); }
#endif

/* Attention of a block of query rows over one run of keys (slots sl[0..len)), as two small GEMMs per KV head with
 * the queries along the vector lanes, so each K/V value is converted once and used by every query of its head from
 * registers. Row r sees keys 0..lim[r] (lim NULL: all): the shared prefix of cascade.py (every row, every key) and
 * long prefill chunks (row r at position start + r of its request, causal).
 *   Kf, Vf [len][d] fp32: the head's keys and values
 *   for each tile of 32 lanes (lane = row r, group head gi: i = r * g + gi; keys up to the tile's last lim):
 *     S[j][lane] = Kf[j] . Qt[.][lane] * scale, masked past lim; P = e^(S - max), sum; lse = max + log(sum)
 *     Ot[e][lane] = sum_j Vf[j][e] P[j][lane];  out[r][h*g+gi] = Ot[.][lane] / sum
 * fp32 math throughout (the products of bf16 values are exact in fp32), like the row-by-row paths. The mask and the
 * max are taken as S leaves the registers, then e^(S - max) and the sums in one pass: one pass over S after the
 * GEMM instead of three (W3's 1,920-token causal prefill, one thread: 1.12-1.22x the three passes, measured on the
 * pairs). With bf16 queries (qb) over a bf16 cache where the pair dot products pay (pairs_pay), S comes from
 * AVX512-BF16 pair dot products of the cache's own bits (no Kf), and e^(S - max) goes straight into the bf16 pairs
 * of P V; elsewhere bf16 queries and cache are widened (exact) and P stays fp32. Queries in, and the output out
 * (fp32 or bf16 rows, `out_bf16`), move through 16 x 16 register transposes. */
/* O^T = V^T P in blocks of PV_KEYS keys (every 8 output dims over one block, then the next block, adding): P's block
 * (32 KB) and V's stay in L1/L2 across the d / 8 passes, which over all the keys re-read P and V from L3 once they
 * outgrew L2 (bf16 in, fp32 GEMMs, one thread: 1.24x at 4,096 causal keys x d 128, 1.08x at d 64, 1.03-1.06x at
 * 1,920; the same within noise on the pairs, bound by vdpbf16ps here) */
#define PV_KEYS 256
void block_attention(const float *q, const uint16_t *qb, void *out, int out_bf16, float *lse, const void *kc,
                     const void *vc, int bf16,
                     const int64_t *sl, int64_t len, const int64_t *lim, int64_t m, int64_t hq, int64_t hkv, int64_t d,
                     float scale, int nthreads) {
    const int64_t g = hq / hkv, mq = m * g, kp = (len + 1) / 2;
    /* A bf16 cache, first, in one pass over the cache rows in order (each slot's K and V rows read whole, front to
     * back): every head's keys next to each other, kall[h][j][d], and its values, vall: reading them head by head
     * from the cache took one 2*d-byte piece of each row per head, about half the time of a shared-prefix call when
     * the rows came from memory. With the pairs, vall[h][j/2][e] = V[j][e] | V[j+1][e] << 16 (a zero row past the
     * end); else plain rows, vall[h][j][d] bf16, widened head by head into Kf, Vf. */
#if defined(__AVX512BF16__)
    /* bf16 queries over a bf16 cache on pairs: both GEMMs on bf16 pairs; P is rounded to bf16 for O = P V, as
     * torch's flash attention does for bf16 (the sums and the softmax stay fp32) */
    const int pairs = qb && bf16 && d % 2 == 0 && pairs_pay();
#else
    const int pairs = 0;
#endif
    const int gather = bf16 && (pairs || hkv > 1);
    uint16_t *kall = gather ? (uint16_t *)malloc(sizeof(uint16_t) * (size_t)(hkv * len * d)) : NULL;
    void *vall = !gather ? NULL : pairs ? malloc(sizeof(uint32_t) * (size_t)(hkv * kp * d))
                                        : malloc(sizeof(uint16_t) * (size_t)(hkv * len * d));
    if (gather && !pairs) {
        #pragma omp parallel for num_threads(nthreads) schedule(static)
        for (int64_t j = 0; j < len; j++) {
            const uint16_t *k0 = (const uint16_t *)kc + sl[j] * hkv * d, *v0 = (const uint16_t *)vc + sl[j] * hkv * d;
            for (int64_t h = 0; h < hkv; h++) {
                memcpy(kall + (h * len + j) * d, k0 + h * d, sizeof(uint16_t) * (size_t)d);
                memcpy((uint16_t *)vall + (h * len + j) * d, v0 + h * d, sizeof(uint16_t) * (size_t)d);
            }
        }
    }
#if defined(__AVX512BF16__)
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
                uint32_t *vp = (uint32_t *)vall + (h * kp + jp) * d;
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
        const uint32_t *vp = pairs ? (const uint32_t *)vall + h * kp * d : NULL;
#endif
        if (!pairs) {
            const uint16_t *kg = gather ? kall + h * len * d : NULL;
            const uint16_t *vg = gather ? (const uint16_t *)vall + h * len * d : NULL;
            for (int64_t j = 0; j < len; j++) {
                load_row(kf + j * d, kg ? (const void *)kg : kc, kg ? j : sl[j] * hkv + h, d, bf16);
                load_row(vf + j * d, vg ? (const void *)vg : vc, vg ? j : sl[j] * hkv + h, d, bf16);
            }
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
            __m512i lv[2];
            __m512 top[2] = {_mm512_set1_ps(-INFINITY), _mm512_set1_ps(-INFINITY)};
            int32_t lo = lane_lim[0];
            for (int l = 1; l < 32; l++) lo = lane_lim[l] < lo ? lane_lim[l] : lo;
            lv[0] = _mm512_loadu_si512((const void *)lane_lim);
            lv[1] = _mm512_loadu_si512((const void *)(lane_lim + 16));
            /* S = K Q^T, 8 keys at a time, masked, the max taken */
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
                for (int64_t j0 = 0; j0 < keys; j0 += 8) {
                    const uint32_t *kr[8];
                    const int64_t nk = keys - j0 < 8 ? keys - j0 : 8;
                    for (int64_t k = 0; k < nk; k++)
                        kr[k] = (const uint32_t *)(kh + (j0 + k) * d);
                    tile8x32_bf16(kr, 1, nk, qp, d / 2, s + j0 * 32, scale, lv, lo, j0, top, 0);
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
                for (int64_t b0 = 0; b0 < tp; b0 += PV_KEYS / 2) {   /* PV_KEYS keys: PV_KEYS / 2 pairs */
                    const int64_t nb = tp - b0 < PV_KEYS / 2 ? tp - b0 : PV_KEYS / 2;
                    for (int64_t e0 = 0; e0 < d; e0 += 8) {
                        const uint32_t *vr[8];
                        for (int k = 0; k < 8; k++) vr[k] = vp + b0 * d + e0 + (e0 + k < d ? k : 0);
                        tile8x32_bf16(vr, d, d - e0 < 8 ? d - e0 : 8, pp + b0 * 32, nb, ot + e0 * 32, 1.f, NULL, 0, 0,
                                      NULL, b0 > 0);
                    }
                }
            } else
#endif
            {   /* fp32: qt[e][l] = lane l's query (q, or NULL: qb widened, exact) by 16 x 16 transposes (zero lanes
                 * past nl), the rest one value at a time; S = K Q^T * scale, masked; P = e^(S - max) in place and
                 * the sums in one pass; O^T = V^T P (8 output dims at a time) */
                const int64_t d16 = d & ~(int64_t)15;
                for (int64_t lb = 0; lb < 32; lb += 16)
                    for (int64_t eb = 0; eb < d16; eb += 16) {
                        __m512i r[16];
                        for (int k = 0; k < 16; k++)
                            r[k] = lb + k >= nl ? _mm512_setzero_si512()
                                 : q ? _mm512_loadu_si512((const void *)(q + at[lb + k] * d + eb))
                                     : _mm512_slli_epi32(_mm512_cvtepu16_epi32(
                                           _mm256_loadu_si256((const __m256i *)(qb + at[lb + k] * d + eb))), 16);
                        transpose16(r);
                        for (int c = 0; c < 16; c++) _mm512_store_si512((void *)(qt + (eb + c) * 32 + lb), r[c]);
                    }
                for (int64_t e = d16; e < d; e++)
                    for (int64_t l = 0; l < 32; l++) {
                        float x = 0.f;
                        if (l < nl && q) x = q[at[l] * d + e];
                        else if (l < nl) x = bf16_to_f32(qb[at[l] * d + e]);
                        qt[e * 32 + l] = x;
                    }
                for (int64_t j0 = 0; j0 < keys; j0 += 8)
                    tile8x32(kf + j0 * d, d, 1, keys - j0 < 8 ? keys - j0 : 8, qt, d, s + j0 * 32, scale, lv, lo, j0,
                             top, 0);
                for (int half = 0; half < 2; half++) {   /* keys past a lane's lim: -inf, weight ~0 */
                    __m512 tot = _mm512_setzero_ps();
                    const __m512 t = top[half];
                    for (int64_t j = 0; j < keys; j++) {
                        const __m512 p = exp16(_mm512_sub_ps(_mm512_load_ps(s + j * 32 + half * 16), t));
                        _mm512_store_ps(s + j * 32 + half * 16, p);
                        tot = _mm512_add_ps(tot, p);
                    }
                    _mm512_store_ps(mx + half * 16, t);
                    _mm512_store_ps(sum + half * 16, tot);
                }
                for (int64_t b0 = 0; b0 < keys; b0 += PV_KEYS) {
                    const int64_t nb = keys - b0 < PV_KEYS ? keys - b0 : PV_KEYS;
                    for (int64_t e0 = 0; e0 < d; e0 += 8)
                        tile8x32(vf + b0 * d + e0, 1, d, d - e0 < 8 ? d - e0 : 8, s + b0 * 32, nb, ot + e0 * 32, 1.f,
                                 NULL, 0, 0, NULL, b0 > 0);
                }
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
