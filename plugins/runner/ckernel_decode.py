"""The decode entry of the attention kernel in C: `write_kv` (the step's new K/V rows into their cache slots, in the
cache's dtype) and `paged_attention` (n query tokens over their paged contexts), with `decode_row_bf16`, the row
kernel for bf16 queries over a bf16 cache that reads whole K/V rows in slot order, one pass each. Queries
are read in place from the packed QKV rows and the output is written in the model's dtype; with more threads than
rows to keep them busy, a row's keys can be split across threads and merged by log-sum-exp (cpu_kernel.MIN_SPLIT;
off by default: it did not pay on this shared machine)."""

SOURCE = r"""
/* n values (fp32 or bf16) into dst (fp32 or bf16): a copy, a widening (exact) or a rounding */
static inline void copy_row(void *dst, int dst_bf16, const void *src, int src_bf16, int64_t n) {
    if (dst_bf16 == src_bf16) { memcpy(dst, src, (size_t)n * (src_bf16 ? 2 : 4)); return; }
    if (src_bf16) { load_row((float *)dst, src, 0, n, 1); return; }
    store_row(dst, 1, (const float *)src, n);
}

/* The step's new K and V rows (token t at kn/vn + t * ts, hkv * d = `width` values each) into their cache slots,
 * in the cache's dtype: what kc.index_copy_(0, slots, k.to(kc.dtype)) does, without the copies around it. */
void write_kv(const void *kn, const void *vn, int64_t ts, int src_bf16, void *kc, void *vc, int dst_bf16,
              const int64_t *slots, int64_t n, int64_t width) {
    const int64_t es = src_bf16 ? 2 : 4, ed = dst_bf16 ? 2 : 4;
    for (int64_t t = 0; t < n; t++) {
        copy_row((char *)kc + slots[t] * width * ed, dst_bf16, (const char *)kn + t * ts * es, src_bf16, width);
        copy_row((char *)vc + slots[t] * width * ed, dst_bf16, (const char *)vn + t * ts * es, src_bf16, width);
    }
}

#if defined(__AVX512BF16__)
/* ot[hh] += sum over keys j0..j1 of p[hh][j] V[j][hh / g], every head, key by key: each V row is read whole, front
 * to back, so rows in consecutive slots are one stream. NOTE: keeping a group of heads' accumulators in registers
 * over a block (heads 0-3 over 16 rows, then heads 4-7) walked each block twice at a 1 KB stride: equal when the
 * blocks were scattered, 0.74-0.86x of the row-order pass when a request's blocks were consecutive. A piece of 32
 * bf16 values is one load that gives two fp32 vectors without a shuffle: its even values (x << 16) and its odd
 * ones (x & 0xffff0000); ot holds them in that order (even 16, odd 16) per piece until the end of the row. */
static inline void v_pass(float *ot, const float *p, int64_t len, const uint16_t *vc, const int64_t *sl, int64_t hq,
                          int64_t g, int64_t rowlen, int64_t d) {
    const __m512i hi_mask = _mm512_set1_epi32((int)0xffff0000u);
    for (int64_t j = 0; j < len; j++) {
        const uint16_t *vr = vc + sl[j] * rowlen;
        for (int64_t hh = 0; hh < hq; hh++) {
            const __m512 pj = _mm512_set1_ps(p[hh * len + j]);
            const uint16_t *vh = vr + (hh / g) * d;
            float *o = ot + hh * d;
            for (int64_t e = 0; e < d; e += 32) {
                const __m512i x = _mm512_loadu_si512((const void *)(vh + e));
                _mm512_storeu_ps(o + e, _mm512_fmadd_ps(pj, _mm512_castsi512_ps(_mm512_slli_epi32(x, 16)),
                                                        _mm512_loadu_ps(o + e)));
                _mm512_storeu_ps(o + e + 16, _mm512_fmadd_ps(pj, _mm512_castsi512_ps(_mm512_and_si512(x, hi_mask)),
                                                             _mm512_loadu_ps(o + e + 16)));
            }
        }
    }
}

/* One decode row, bf16 queries over a bf16 cache (d % 32 == 0): keys sl[0..len). Two passes in slot order, each
 * reading whole K (then V) rows front to back. NOTE: no software prefetch: asking for the rows 2-48 keys ahead
 * (the next block of the pool sits anywhere) was 4-10% slower here, with or without huge pages. Scores: per key and head one bf16 pair dot product into `part`, reduced 16 keys at a time.
 * Softmax: max, then e^(s - max) and its sum in one pass (exp16); the 1/sum is applied to the output at the end.
 * Writes each head's normalized output (fp32, in order) to dst and, with lse, its log-sum-exp. */
static void decode_row_bf16(const uint16_t *qb, float *dst, float *lse, const uint16_t *kc, const uint16_t *vc,
                            const int64_t *sl, int64_t len, int64_t hq, int64_t hkv, int64_t d, float scale,
                            float *scores, float *part, float *ot) {
    const int64_t g = hq / hkv, rowlen = hkv * d, full = len & ~(int64_t)15;
    const __m512 vs = _mm512_set1_ps(scale);
    for (int64_t j0 = 0; j0 < full; j0 += 16) {
        for (int64_t k = 0; k < 16; k++) {
            const uint16_t *kr = kc + sl[j0 + k] * rowlen;
            for (int64_t hh = 0; hh < hq; hh++)
                _mm512_storeu_ps(part + (hh * 16 + k) * 16, dot_bf16(qb + hh * d, kr + (hh / g) * d, d));
        }
        for (int64_t hh = 0; hh < hq; hh++) {
            __m512 v[16];
            for (int k = 0; k < 16; k++) v[k] = _mm512_loadu_ps(part + (hh * 16 + k) * 16);
            _mm512_storeu_ps(scores + hh * len + j0, _mm512_mul_ps(hsum16(v), vs));
        }
    }
    for (int64_t j = full; j < len; j++) {
        const uint16_t *kr = kc + sl[j] * rowlen;
        for (int64_t hh = 0; hh < hq; hh++)
            scores[hh * len + j] = _mm512_reduce_add_ps(dot_bf16(qb + hh * d, kr + (hh / g) * d, d)) * scale;
    }
    float inv[256 + 1];   /* hq <= 256 (checked by the caller) */
    for (int64_t hh = 0; hh < hq; hh++) {
        float *sc = scores + hh * len;
        __m512 top = _mm512_set1_ps(-3.0e38f);
        int64_t j = 0;
        for (; j + 16 <= len; j += 16) top = _mm512_max_ps(top, _mm512_loadu_ps(sc + j));
        float m = _mm512_reduce_max_ps(top);
        for (; j < len; j++) m = sc[j] > m ? sc[j] : m;
        const __m512 mv = _mm512_set1_ps(m);
        __m512 tot = _mm512_setzero_ps();
        for (j = 0; j + 16 <= len; j += 16) {
            const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(sc + j), mv));
            _mm512_storeu_ps(sc + j, e);
            tot = _mm512_add_ps(tot, e);
        }
        float sum = _mm512_reduce_add_ps(tot);
        if (j < len) {
            const __mmask16 mk = (__mmask16)((1u << (len - j)) - 1);
            const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, sc + j), mv));
            _mm512_mask_storeu_ps(sc + j, mk, e);
            sum += _mm512_mask_reduce_add_ps(mk, e);
        }
        inv[hh] = 1.f / sum;
        if (lse) lse[hh] = m + logf(sum);
    }
    memset(ot, 0, sizeof(float) * (size_t)(hq * d));
    v_pass(ot, scores, len, vc, sl, hq, g, rowlen, d);
    /* even/odd halves of each piece back into order, times 1/sum */
    const __m512i lo_idx = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i hi_idx = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
    for (int64_t hh = 0; hh < hq; hh++) {
        const __m512 s = _mm512_set1_ps(inv[hh]);
        for (int64_t e = 0; e < d; e += 32) {
            const __m512 ev = _mm512_loadu_ps(ot + hh * d + e), od = _mm512_loadu_ps(ot + hh * d + e + 16);
            _mm512_storeu_ps(dst + hh * d + e, _mm512_mul_ps(_mm512_permutex2var_ps(ev, lo_idx, od), s));
            _mm512_storeu_ps(dst + hh * d + e + 16, _mm512_mul_ps(_mm512_permutex2var_ps(ev, hi_idx, od), s));
        }
    }
}
#endif

/* Paged attention of n query tokens (decodes and short chunks), each over its request's context by slot.
 *   q: token t's heads at q + t * q_ts (elements; fp32 or bf16, heads contiguous: a view into the packed QKV rows)
 *   out: [n][hq][d] contiguous, fp32 or bf16 (rounded as torch rounds): the model's dtype, no copy after
 *   token t attends to slots[tok_seq[t]][first..tok_pos[t]] (first: the window's start, else 0)
 * bf16 queries over a bf16 cache with plain attention take decode_row_bf16; with more threads than a few
 * tokens per thread (min_split > 0), each token's keys are cut into parts of at least min_split keys, the parts
 * run on any thread and are merged by their log-sum-exp, so a few long rows use every thread. Everything else
 * (fp32, windows' variants, soft-capping, sinks) runs the row kernels as before, token by token, in fp32. */
void paged_attention(const void *q, int q_bf16, int64_t q_ts, void *out, int out_bf16, const void *kc,
                     const void *vc, int bf16, const int64_t *tok_seq, const int64_t *tok_pos, const int64_t *slots,
                     int64_t max_ctx, int64_t n, int64_t hq, int64_t hkv, int64_t d, float scale, int64_t window,
                     float softcap, const float *sinks, float *lse, int nthreads, int64_t min_split) {
#if defined(__AVX512BF16__)
    const int fast = q_bf16 && bf16 && d % 32 == 0 && hq <= 256 && softcap == 0.f && !sinks;
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
    #pragma omp parallel num_threads(team)
    {
        /* per-thread scratch: scores [hq][keys], 16 keys' partial dots per head, one output row, one q row, one K/V row */
        float *scores = (float *)malloc(sizeof(float) * (size_t)(hq * chunk + hq * 256 + 2 * hq * d + d + 64));
        float *part = scores + hq * chunk, *ot = part + hq * 256, *qf = ot + hq * d, *row = qf + hq * d;
        #pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < n * parts; it++) {
            const int64_t t = it / parts, pi = it % parts;
            const int64_t len = tok_pos[t] + 1, first = window > 0 && len > window ? len - window : 0;
            const int64_t *sl = slots + tok_seq[t] * max_ctx + first;
            float *lt = lse ? lse + t * hq : NULL;
            void *dst_t = (char *)out + t * hq * d * (out_bf16 ? 2 : 4);
#if defined(__AVX512BF16__)
            if (fast) {
                const uint16_t *qt = (const uint16_t *)q + t * q_ts;
                if (parts > 1) {   /* this part's keys: the pi-th of `parts` near-equal runs of the token's keys */
                    const int64_t keys = len - first, per = (keys + parts - 1) / parts;
                    const int64_t a = pi * per, b = a + per < keys ? a + per : keys;
                    float *o = po + it * hq * d, *l = pl + it * hq;
                    /* NOTE: a finite 'no keys' log-sum-exp (its weight e^(l - max) is 0): -ffast-math assumes no inf */
                    if (a >= b) { for (int64_t hh = 0; hh < hq; hh++) l[hh] = -1e30f; continue; }
                    decode_row_bf16(qt, o, l, (const uint16_t *)kc, (const uint16_t *)vc, sl + a, b - a, hq, hkv, d,
                                    scale, scores, part, ot);
                    continue;
                }
                float *o = out_bf16 ? qf : (float *)dst_t;
                decode_row_bf16(qt, o, lt, (const uint16_t *)kc, (const uint16_t *)vc, sl, len - first, hq, hkv, d,
                                scale, scores, part, ot);
                if (out_bf16) store_row(dst_t, 1, o, hq * d);
                continue;
            }
#endif
            const float *qt;
            if (q_bf16) { load_row(qf, (const uint16_t *)q + t * q_ts, 0, hq * d, 1); qt = qf; }
            else qt = (const float *)q + t * q_ts;
            float *o = out_bf16 ? ot : (float *)dst_t;
#if defined(__AVX512F__)
            if (d % 16 == 0 && d <= 256 && softcap == 0.f && !sinks)
                attend_vec(qt, NULL, o, kc, vc, bf16, sl, len - first, hq, hkv, d, scale, scores, lt);
            else
#elif defined(__AVX2__) && defined(__FMA__)
            if (bf16 && d % 16 == 0 && d <= 128 && softcap == 0.f && !sinks)   /* part: hq * 256 floats >= 2 * hq * d */
                attend_pairs8(qt, o, (const uint16_t *)kc, (const uint16_t *)vc, sl, len - first, hq, hkv, d, scale,
                              scores, lt, part);
            else if (d % 8 == 0 && d <= 256 && softcap == 0.f && !sinks)
                attend_vec8(qt, o, kc, vc, bf16, sl, len - first, hq, hkv, d, scale, scores, lt);
            else
#endif
            attend(qt, o, kc, vc, bf16, sl, len - first, hq, hkv, d, scale, softcap, sinks, scores, row, lt);
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
    }
    free(po);
}
"""
