/* The decode entry of the attention kernel in C: `write_kv` (the step's new K/V rows into their cache slots, in the
 * cache's dtype) and `paged_attention` (n query tokens over their paged contexts), with `decode_row_bf16`, the row
 * kernel for bf16 queries over a bf16 (or fp8) cache that walks the keys by blocks of 16, one pass over K and one over
 * V, with the next block prefetched into L2. Queries
 * are read in place from the packed QKV rows and the output is written in the model's dtype; with more threads than
 * rows to keep them busy, a row's keys can be split across threads and merged by log-sum-exp (cpu_kernel.MIN_SPLIT;
 * off by default: it did not pay on this shared machine). `decode_layer_attention` is one layer of a plain decode step
 * in one call (rope, K/V write, attention), for the lean stack's plain_decode.py. */

#include "kernel_common.h"

/* n values (fp32 or bf16) into a cache row of type dst_kvt (KV_*): a copy, a widening (exact) or a rounding */
static inline void copy_row(void *dst, int dst_kvt, const void *src, int src_bf16, int64_t n, float *tmp) {
    if (dst_kvt >= KV_E4M3) {
        const float *f = (const float *)src;
        if (src_bf16) { load_row(tmp, src, 0, n, 1); f = tmp; }
        store_row_fp8((uint8_t *)dst, f, n, dst_kvt);
        return;
    }
    if (dst_kvt == src_bf16) { memcpy(dst, src, (size_t)n * (src_bf16 ? 2 : 4)); return; }
    if (src_bf16) { load_row((float *)dst, src, 0, n, 1); return; }
    store_row(dst, 1, (const float *)src, n);
}

/* The step's new K and V rows (token t at kn/vn + t * ts, hkv * d = `width` values each) into their cache slots,
 * in the cache's type (KV_*): what kc.index_copy_(0, slots, k.to(kc.dtype)) does, without the copies around it. */
void write_kv(const void *kn, const void *vn, int64_t ts, int src_bf16, void *kc, void *vc, int dst_kvt,
              const int64_t *slots, int64_t n, int64_t width) {
    const int64_t es = src_bf16 ? 2 : 4, ed = kv_bytes(dst_kvt);
    float *tmp = dst_kvt >= KV_E4M3 && src_bf16 ? (float *)malloc(sizeof(float) * (size_t)width) : NULL;
    for (int64_t t = 0; t < n; t++) {
        copy_row((char *)kc + slots[t] * width * ed, dst_kvt, (const char *)kn + t * ts * es, src_bf16, width, tmp);
        copy_row((char *)vc + slots[t] * width * ed, dst_kvt, (const char *)vn + t * ts * es, src_bf16, width, tmp);
    }
    free(tmp);
}

#if defined(__AVX512BF16__)
/* One decode row, bf16 queries over a bf16 or fp8 cache (kvt; d = D, D % 32 == 0, <= 256; fp8 codes are read as the
 * bf16 values they are, load_pairs32): keys sl[0..len), by blocks of 16 keys, head by head within a block.
 * Scores: a head's 16 keys' partial dot products (bf16 pairs) stay in registers and are reduced once (hsum16); with
 * ql (an fp32 query split by split_query into qb = hi and ql = lo), each K pair feeds both halves' dot products.
 * Softmax: max, then e^(s - max) and its sum in one pass (exp16); the 1/sum is applied to the output at the end.
 * V pass: a head's output stays in registers over the block (a piece of 32 bf16 values is one load that gives two
 * fp32 vectors without a shuffle: its even values (x << 16) and its odd ones (x & 0xffff0000); ot holds them in
 * that order per piece until the end). Writes each head's normalized output (fp32, in order) to dst and, with lse,
 * its log-sum-exp. NOTE: against the key-by-key kernel this replaced (every head of a key row, partial sums and
 * outputs through memory), 1.5x from L2 on a Zen 4; from memory the prefetch (PF_DECODE) is what counts. */
static inline __attribute__((always_inline)) void row_blocked(const uint16_t *qb, const uint16_t *ql, float *dst,
        float *lse, const char *kc, const char *vc, int kvt, const int64_t *sl, int64_t len, int64_t hq, int64_t hkv,
        const int64_t D, float scale, float *scores, float *ot, const int64_t *next_sl, int64_t next_len) {
    const int64_t g = hq / hkv, es = kv_bytes(kvt), rowb = hkv * D * es, hb = D * es, P = D / 32;
    const __m512 vs = _mm512_set1_ps(scale);
    for (int64_t j0 = 0; j0 < len; j0 += 16) {
        const int64_t nk = len - j0 < 16 ? len - j0 : 16;
        const char *kr[16], *pr[16];   /* this block's rows, the rows PF_DECODE blocks ahead */
        const int64_t nn = block_rows(kr, pr, kc, sl, j0, len, rowb, vc, sl, len);
        for (int64_t hh = 0; hh < hq; hh++) {
            const int64_t off = (hh / g) * hb;
            if (hh % g == 0) prefetch_head(pr, nn, off, hb);
            __m512i qv[8];
            for (int64_t p = 0; p < P; p++) qv[p] = _mm512_loadu_si512((const void *)(qb + hh * D + 32 * p));
            __m512 v[16];
            if (ql) {   /* an fp32 query as hi + lo bf16 halves: each K pair loaded once for both */
                __m512i lv[8];
                for (int64_t p = 0; p < P; p++) lv[p] = _mm512_loadu_si512((const void *)(ql + hh * D + 32 * p));
                for (int64_t k = 0; k < 16; k++) {
                    __m512 a = _mm512_setzero_ps(), b = _mm512_setzero_ps();
                    for (int64_t p = 0; p < P; p++) {
                        const __m512bh kp = (__m512bh)load_pairs32(kr[k] + off + 32 * p * es, kvt);
                        a = _mm512_dpbf16_ps(a, (__m512bh)qv[p], kp);
                        b = _mm512_dpbf16_ps(b, (__m512bh)lv[p], kp);
                    }
                    v[k] = _mm512_add_ps(a, b);
                }
            } else {
                for (int64_t k = 0; k < 16; k++) {
                    __m512 a = _mm512_setzero_ps();
                    for (int64_t p = 0; p < P; p++)
                        a = _mm512_dpbf16_ps(a, (__m512bh)qv[p], (__m512bh)load_pairs32(kr[k] + off + 32 * p * es, kvt));
                    v[k] = a;
                }
            }
            const __m512 s = _mm512_mul_ps(hsum16(v), vs);
            store_scores16(scores + hh * len + j0, s, nk);
        }
    }
    float inv[256 + 1];   /* hq <= 256 (checked by the caller) */
    softmax_exp_rows(scores, hq, len, lse, inv);
    const __m512i hi_mask = _mm512_set1_epi32((int)0xffff0000u);
    for (int64_t j0 = 0; j0 < len; j0 += 16) {
        const int64_t nk = len - j0 < 16 ? len - j0 : 16;
        const char *vr[16], *pr[16];
        const int64_t nn = block_rows(vr, pr, vc, sl, j0, len, rowb, next_sl ? kc : NULL, next_sl, next_len);
        for (int64_t hh = 0; hh < hq; hh++) {
            const int64_t off = (hh / g) * hb;
            if (hh % g == 0) prefetch_head(pr, nn, off, hb);
            __m512 acc[16];
            float *o = ot + hh * D;
            for (int64_t p = 0; p < 2 * P; p++) acc[p] = j0 ? _mm512_loadu_ps(o + 16 * p) : _mm512_setzero_ps();
            const float *pp = scores + hh * len + j0;
            for (int64_t k = 0; k < nk; k++) {
                const __m512 pj = _mm512_set1_ps(pp[k]);
                for (int64_t p = 0; p < P; p++) {
                    const __m512i x = load_pairs32(vr[k] + off + 32 * p * es, kvt);
                    acc[2 * p] = _mm512_fmadd_ps(pj, _mm512_castsi512_ps(_mm512_slli_epi32(x, 16)), acc[2 * p]);
                    acc[2 * p + 1] = _mm512_fmadd_ps(pj, _mm512_castsi512_ps(_mm512_and_si512(x, hi_mask)), acc[2 * p + 1]);
                }
            }
            for (int64_t p = 0; p < 2 * P; p++) _mm512_storeu_ps(o + 16 * p, acc[p]);
        }
    }
    const __m512i lo_idx = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i hi_idx = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
    for (int64_t hh = 0; hh < hq; hh++) {
        const __m512 s = _mm512_set1_ps(inv[hh]);
        for (int64_t e = 0; e < D; e += 32) {
            const __m512 ev = _mm512_loadu_ps(ot + hh * D + e), od = _mm512_loadu_ps(ot + hh * D + e + 16);
            _mm512_storeu_ps(dst + hh * D + e, _mm512_mul_ps(_mm512_permutex2var_ps(ev, lo_idx, od), s));
            _mm512_storeu_ps(dst + hh * D + e + 16, _mm512_mul_ps(_mm512_permutex2var_ps(ev, hi_idx, od), s));
        }
    }
}
/* row_blocked with the head size a constant where it is a common one, so the loops over pieces unroll and the
 * partial sums and outputs are registers */
static void decode_row_bf16(const uint16_t *qb, const uint16_t *ql, float *dst, float *lse, const char *kc,
                            const char *vc, int kvt, const int64_t *sl, int64_t len, int64_t hq, int64_t hkv, int64_t d,
                            float scale, float *scores, float *ot, const int64_t *next_sl, int64_t next_len) {
    if (d == 64) row_blocked(qb, ql, dst, lse, kc, vc, kvt, sl, len, hq, hkv, 64, scale, scores, ot, next_sl, next_len);
    else if (d == 128) row_blocked(qb, ql, dst, lse, kc, vc, kvt, sl, len, hq, hkv, 128, scale, scores, ot, next_sl, next_len);
    else row_blocked(qb, ql, dst, lse, kc, vc, kvt, sl, len, hq, hkv, d, scale, scores, ot, next_sl, next_len);
}

/* An fp32 query row (n values) as two bf16 rows, hi = bf16(x) and lo = bf16(x - hi): hi + lo holds x to ~2^-17 of
 * its size, so the scores of decode_row_bf16 over a bf16 cache stay within fp32 rounding of the fp32 kernel's (the
 * cache's own rounding, 2^-9, is 100x larger) while each K pair is one load and two bf16 dot products, where
 * attend_vec widened every K value to fp32 once per query head */
static void split_query(const float *x, uint16_t *hi, uint16_t *lo, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        hi[i] = f32_to_bf16(x[i]);
        lo[i] = f32_to_bf16(x[i] - bf16_to_f32(hi[i]));
    }
}
#endif

/* Paged attention of n query tokens (decodes and short chunks), each over its request's context by slot.
 *   q: token t's heads at q + t * q_ts (elements; fp32 or bf16, heads contiguous: a view into the packed QKV rows)
 *   out: [n][hq][d] contiguous, fp32 or bf16 (rounded as torch rounds): the model's dtype, no copy after
 *   token t attends to slots[tok_seq[t]][first..tok_pos[t]] (first: the window's start, else 0)
 * bf16 queries over a bf16 (or fp8) cache with plain attention take decode_row_bf16, and so do fp32 queries over a
 * bf16 cache, each split into bf16 halves first (split_query); with more threads than a few
 * tokens per thread (min_split > 0), each token's keys are cut into parts of at least min_split keys, the parts
 * run on any thread and are merged by their log-sum-exp, so a few long rows use every thread. An fp8 cache (kvt
 * KV_E4M3 or KV_E5M2) takes decode_row_fp8 for plain attention with AVX-512; else each token's context is widened
 * to fp32 rows first and `attend` runs over them (every variant, any CPU). Everything else
 * (fp32, windows' variants, soft-capping, sinks) runs the row kernels as before, token by token, in fp32. */
void paged_attention(const void *q, int q_bf16, int64_t q_ts, void *out, int out_bf16, const void *kc,
                     const void *vc, int kvt, const int64_t *tok_seq, const int64_t *tok_pos, const int64_t *slots,
                     int64_t max_ctx, int64_t n, int64_t hq, int64_t hkv, int64_t d, float scale, int64_t window,
                     float softcap, const float *sinks, float *lse, int nthreads, int64_t min_split) {
#if defined(__AVX512BF16__)
    /* fp32 queries too over a bf16 cache, split into bf16 halves (split_query); over fp8 they keep decode_row_fp8 */
    const int fast = (q_bf16 ? kvt != KV_F32 : kvt == KV_BF16) && d % 32 == 0 && d <= 256 && hq <= 256
                     && softcap == 0.f && !sinks;
#else
    const int fast = 0;
#endif
    int64_t parts = 1;
    if (fast && nthreads > 1 && min_split > 0 && n < 4 * (int64_t)nthreads) {
        int64_t longest = 0;
        for (int64_t t = 0; t < n; t++) longest = tok_pos[t] + 1 > longest ? tok_pos[t] + 1 : longest;
        parts = (4 * (int64_t)nthreads + n - 1) / n;
        if (parts > longest / min_split) parts = longest / min_split;
        if (parts < 1) parts = 1;
    }
    const int64_t chunk = parts > 1 ? (max_ctx + parts - 1) / parts : max_ctx;
    /* parts' outputs and log-sum-exps: [n][parts][hq][d] and [n][parts][hq] */
    float *po = parts > 1 ? (float *)malloc(sizeof(float) * (size_t)(n * parts * hq * (d + 1))) : NULL;
    float *pl = po ? po + n * parts * hq * d : NULL;
    /* no more threads than work items: a lone row (one long prompt decoding) wakes no one to wait for */
    const int team = (int64_t)nthreads < n * parts ? nthreads : (int)(n * parts > 0 ? n * parts : 1);
    const int fp8 = kvt >= KV_E4M3;
#if defined(__AVX512F__)
    const int fp8_fast = fp8 && d % 16 == 0 && d <= 256 && hq <= 256 && softcap == 0.f && !sinks;
#else
    const int fp8_fast = 0;
#endif
#if defined(HAVE_DECODE_ROW8)
    const int row8_fast = (kvt == KV_BF16 || (fp8 && ROW8_FP8)) && d % 16 == 0 && d <= 256 && softcap == 0.f && !sinks;
#else
    const int row8_fast = 0;
#endif
    #pragma omp parallel num_threads(team)
    {
        /* per-thread scratch: scores [hq][keys], 16 keys' partial dots per head (AVX2: a q row and an output row
         * in decode_row8's order), one output row, one q row, one K/V row, with an fp8 cache 16 K or V rows
         * widened to fp32, and an fp32 query's two bf16 halves (split_query) */
        float *scores = (float *)malloc(sizeof(float) * (size_t)(hq * chunk + hq * 512 + 3 * hq * d + d + 64
                                                                 + (fp8_fast ? 16 * hkv * d : 0)));
        float *part = scores + hq * chunk, *ot = part + hq * 512, *qf = ot + hq * d, *row = qf + hq * d;
        /* the portable path over an fp8 cache: a token's K and V widened to fp32 rows (keys 0..), then `attend` */
        float *wctx = fp8 && !fp8_fast && !row8_fast ? (float *)malloc(sizeof(float) * (size_t)(2 * max_ctx * hkv * d))
                                                       : NULL;
        int64_t *ids = wctx ? (int64_t *)malloc(sizeof(int64_t) * (size_t)max_ctx) : NULL;
        for (int64_t j = 0; ids && j < max_ctx; j++) ids[j] = j;
        float *wide = row + d + 64;   /* decode_row_fp8's 16 widened rows (AVX-512) */
        uint16_t *qhi = (uint16_t *)(wide + (fp8_fast ? 16 * hkv * d : 0)), *qlo = qhi + hq * d;   /* split_query's */
        (void)wide; (void)qhi; (void)qlo;
        #pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < n * parts; it++) {
            const int64_t t = it / parts, pi = it % parts;
            (void)pi;   /* a part's index: only the AVX512-BF16 rows are split */
            const int64_t len = tok_pos[t] + 1, first = window > 0 && len > window ? len - window : 0;
            const int64_t *sl = slots + tok_seq[t] * max_ctx + first;
            float *lt = lse ? lse + t * hq : NULL;
            void *dst_t = (char *)out + t * hq * d * (out_bf16 ? 2 : 4);
#if defined(__AVX512BF16__)
            if (fast) {
                const uint16_t *qt = (const uint16_t *)q + t * q_ts, *ql = NULL;
                if (!q_bf16) {
                    split_query((const float *)q + t * q_ts, qhi, qlo, hq * d);
                    qt = qhi;
                    ql = qlo;
                }
                if (parts > 1) {   /* this part's keys: the pi-th of `parts` near-equal runs of the token's keys */
                    const int64_t keys = len - first, per = (keys + parts - 1) / parts;
                    const int64_t a = pi * per, b = a + per < keys ? a + per : keys;
                    float *o = po + it * hq * d, *l = pl + it * hq;
                    /* NOTE: a finite 'no keys' log-sum-exp (its weight e^(l - max) is 0): -ffast-math assumes no inf */
                    if (a >= b) { for (int64_t hh = 0; hh < hq; hh++) l[hh] = -1e30f; continue; }
                    decode_row_bf16(qt, ql, o, l, (const char *)kc, (const char *)vc, kvt, sl + a, b - a, hq, hkv, d,
                                    scale, scores, ot, NULL, 0);
                    continue;
                }
                /* the row this thread likely takes next (it + team: exact with one thread; with more, under the
                 * dynamic schedule a guess): its first K block is prefetched during this row's last V block */
                const int64_t nt = t + team;
                const int64_t nlen = nt < n ? tok_pos[nt] + 1 : 0, nfirst = window > 0 && nlen > window ? nlen - window : 0;
                float *o = out_bf16 ? qf : (float *)dst_t;
                decode_row_bf16(qt, ql, o, lt, (const char *)kc, (const char *)vc, kvt, sl, len - first, hq, hkv, d,
                                scale, scores, ot, nt < n ? slots + tok_seq[nt] * max_ctx + nfirst : NULL,
                                nlen - nfirst);
                if (out_bf16) store_row(dst_t, 1, o, hq * d);
                continue;
            }
#endif
            const float *qt;
            if (q_bf16) { load_row(qf, (const uint16_t *)q + t * q_ts, 0, hq * d, 1); qt = qf; }
            else qt = (const float *)q + t * q_ts;
            float *o = out_bf16 ? ot : (float *)dst_t;
            if (wctx) {   /* keys 0.. of the widened rows: the identity slots */
                const int64_t rl = hkv * d, keys = len - first;
                for (int64_t j = 0; j < keys; j++) {
                    load_row_fp8(wctx + j * rl, (const uint8_t *)kc + sl[j] * rl, rl, kvt);
                    load_row_fp8(wctx + (max_ctx + j) * rl, (const uint8_t *)vc + sl[j] * rl, rl, kvt);
                }
                attend(qt, o, wctx, wctx + max_ctx * rl, KV_F32, ids, keys, hq, hkv, d, scale, softcap, sinks, scores,
                       row, lt);
            }
#if defined(__AVX512F__)
            else if (fp8_fast)
                decode_row_fp8(qt, o, lt, (const uint8_t *)kc, (const uint8_t *)vc, sl, len - first, hq, hkv, d, scale,
                               kvt, scores, wide);
            else if (d % 16 == 0 && d <= 256 && softcap == 0.f && !sinks)
                attend_vec(qt, NULL, o, kc, vc, kvt, sl, len - first, hq, hkv, d, scale, scores, lt);
#elif defined(__AVX2__) && defined(__FMA__)
#if defined(HAVE_DECODE_ROW8)
            else if (row8_fast) {   /* part: hq * 512 floats >= 2 * hq * d; the next row as decode_row_bf16's */
                const int64_t nt = t + team;
                const int64_t nlen = nt < n ? tok_pos[nt] + 1 : 0, nfirst = window > 0 && nlen > window ? nlen - window : 0;
                decode_row8(qt, o, lt, (const char *)kc, (const char *)vc, kvt, sl, len - first, hq, hkv, d, scale,
                            scores, part, part + hq * d, nt < n ? slots + tok_seq[nt] * max_ctx + nfirst : NULL,
                            nlen - nfirst);
            }
#endif
            else if (d % 8 == 0 && d <= 256 && softcap == 0.f && !sinks)
                attend_vec8(qt, o, kc, vc, kvt, sl, len - first, hq, hkv, d, scale, scores, lt);
#endif
            else
                attend(qt, o, kc, vc, kvt, sl, len - first, hq, hkv, d, scale, softcap, sinks, scores, row, lt);
            if (out_bf16) store_row(dst_t, 1, o, hq * d);
        }
        if (parts > 1) {   /* merge each token's parts: weights e^(lse_p - max) */
            #pragma omp for schedule(static)
            for (int64_t t = 0; t < n; t++) {
                float *acc = ot;
                for (int64_t hh = 0; hh < hq; hh++) {
                    float m = -1e30f, w = 0.f;
                    for (int64_t p = 0; p < parts; p++) {
                        const float l = pl[(t * parts + p) * hq + hh];
                        m = l > m ? l : m;
                    }
                    for (int64_t e = 0; e < d; e++) acc[hh * d + e] = 0.f;
                    for (int64_t p = 0; p < parts; p++) {
                        const float l = pl[(t * parts + p) * hq + hh];
                        if (l < -1e29f) continue;   /* a part with no keys: its output was never written */
                        const float wp = expf(l - m);
                        const float *op = po + ((t * parts + p) * hq + hh) * d;
                        for (int64_t e = 0; e < d; e++) acc[hh * d + e] += wp * op[e];
                        w += wp;
                    }
                    const float iw = 1.f / w;
                    for (int64_t e = 0; e < d; e++) acc[hh * d + e] *= iw;
                    if (lse) lse[t * hq + hh] = m + logf(w);
                }
                store_row((char *)out + t * hq * d * (out_bf16 ? 2 : 4), out_bf16, acc, hq * d);
            }
        }
        free(scores);
        free(wctx);
        free(ids);
    }
    free(po);
}

/* fused_ops.py's rope (the lean stack hands its address in: the two libraries are built apart) */
typedef void (*rope_fn_t)(void *, int64_t, int64_t, int64_t, int64_t, int64_t, const int64_t *, const void *,
                          const void *, const void *, const void *, float, int, int);

/* A plain decode step as decode_layer_attention reads it: filled once per step (plain_decode.StepArgs) */
typedef struct {
    rope_fn_t rope;
    const int64_t *pos;            /* [n] each token's position: its cos/sin row */
    const int64_t *tok_seq, *tok_pos;   /* paged_attention's */
    int64_t n, row_stride, nq, nkv, d, min_split;
    float eps;
    int bf16, kvt, nthreads;
} decode_step_t;

/* One layer's part of it (plain_decode.LayerArgs): its cache, norms and scale, and what differs between KV groups
 * (sliding and full layers: their own slot mapping and slot tables) and layer types (Gemma's rotary tables) */
typedef struct {
    void *kc, *vc;
    const void *q_norm, *k_norm;   /* Qwen3's and Gemma's per-head norms, else NULL */
    const int64_t *slot_mapping, *slots;   /* the layer's KV group's */
    const void *cos, *sin;                 /* the layer's rotary table */
    int64_t max_ctx, window;               /* slots' row length; the sliding window (0: none) */
    float scale;
} decode_layer_t;

/* One layer of a plain decode step between its QKV GEMM and its O GEMM, in one call: rope on the packed QKV rows
 * (in place), their K/V into the cache, then paged attention into `out` ([n][nq][d], the activations' dtype): the
 * same calls, in the same order, as attention.paged_attention makes for such a step, so the same bits. Why: every
 * call from Python between two GEMMs pays for an interpreter evicted by the weight stream (plain_decode.py). */
void decode_layer_attention(const decode_step_t *s, const decode_layer_t *l, void *qkv, void *out) {
    s->rope(qkv, s->n, s->row_stride, s->nq, s->nkv, s->d, s->pos, l->cos, l->sin, l->q_norm, l->k_norm, s->eps,
            s->bf16, s->nthreads);
    const int64_t es = s->bf16 ? 2 : 4;
    const char *k = (const char *)qkv + s->nq * s->d * es, *v = k + s->nkv * s->d * es;
    write_kv(k, v, s->row_stride, s->bf16, l->kc, l->vc, s->kvt, l->slot_mapping, s->n, s->nkv * s->d);
    paged_attention(qkv, s->bf16, s->row_stride, out, s->bf16, l->kc, l->vc, s->kvt, s->tok_seq, s->tok_pos,
                    l->slots, l->max_ctx, s->n, s->nq, s->nkv, s->d, l->scale, l->window, 0.f, NULL, NULL,
                    s->nthreads, s->min_split);
}

/* Pin the calling thread and the OpenMP team it leads (torch's too: one runtime) to cpus[0..n).
 * Returns how many threads were pinned. */
int bind_threads(const int *cpus, int n) {
    int ok = 0;
    #pragma omp parallel num_threads(n) reduction(+:ok)
    {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(cpus[omp_get_thread_num()], &set);
        ok += sched_setaffinity(0, sizeof(set), &set) == 0;
    }
    return ok;
}
