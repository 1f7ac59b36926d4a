/* A plain decode step of the lean stack over quantized weights, every layer in one call (runner/decode_stack.py).
 *
 * At batch 1 a SmolLM2-sized layer is ~60 us of kernels, and each of the 8 calls from Python that lean.py makes per
 * layer (4 quantized matmuls, attention, 2 norms, silu * up) costs 5-15 us of interpreter between two kernels. Here
 * the loop over layers is C and calls the same functions, through pointers into the libraries that hold them
 * (quant_qmatmul, decode_layer_attention, add_rmsnorm, silu_mul), in the same order on the same buffers: the same
 * bits as lean.LeanStack.forward (tests/test_decode_stack.py).
 *
 *   per layer:  qkv = [q | k | v](x)   (one to three quantized weights, each writing its columns of qkv)
 *               a   = attention(qkv)   (rope, K/V write, paged attention: decode_layer_attention)
 *               h  += o(a);  x = rmsnorm2(h)
 *               gu  = [gate | up](x);  act = silu(gate) * up
 *               h  += down(act); x = next layer's rmsnorm1(h), or the final norm after the last
 *
 * Gemma 3 (lean_gemma.py) norms the attention's and the MLP's outputs before each residual add (o and down each
 * followed by a norm in place: post_attn, post_ff) and multiplies by gelu_tanh(gate) instead of silu(gate).
 */
#include <stdint.h>
#include <time.h>

#include "bf16.h"
#if defined(__AVX512F__)
#include <immintrin.h>
/* 16 values from row[j..j + 16) as fp32 (bf16: widened exactly) */
static inline __m512 load16(const void *row, int64_t j, int bf16) {
    if (!bf16) return _mm512_loadu_ps((const float *)row + j);
    const __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + j));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
#endif

typedef int (*qmatmul_fn)(int, const uint8_t *, int64_t, int64_t, int64_t, const void *, int, int64_t, int64_t,
                          void *, int, int64_t, const float *, int);
typedef void (*attention_fn)(const void *, const void *, void *, void *);
typedef void (*add_rmsnorm_fn)(const void *, int64_t, void *, int64_t, void *, int64_t, const void *, int64_t,
                               int64_t, float, int, int);
typedef void (*act_mul_fn)(const void *, int64_t, const void *, int64_t, void *, int64_t, int64_t, int64_t, int,
                           int);

/* one quantized weight writing columns [col, col + n) of its projection's output */
typedef struct {
    const uint8_t *w;
    const float *bias;
    int64_t row_bytes, n, k, col;
    int qt, int8;   /* int8: quant_qmatmul_int8 (llama.cpp's activations), else quant_qmatmul */
} qpart_t;

typedef struct {
    qpart_t qkv[3], gate_up[2], o, down;
    int n_qkv, n_gate_up;
    const void *norm2, *next_norm;   /* the norm after the attention's residual add (Llama's post-attention norm,
                                        Gemma's pre-feedforward one); the next layer's input norm (the final norm last) */
    const void *post_attn, *post_ff; /* Gemma's norms of o's and down's outputs before their residual adds; else NULL */
    const void *attention;           /* this layer's decode_layer_t */
} stack_layer_t;

typedef struct {
    qmatmul_fn qmatmul, qmatmul_int8;
    attention_fn attention;
    add_rmsnorm_fn add_rmsnorm;
    act_mul_fn act_mul;              /* fused_ops' silu_mul, or gelu_tanh_mul (Gemma) */
    const void *attention_step;      /* the step's decode_step_t */
    const stack_layer_t *layers;
    int64_t n_layers, tokens, hidden, inter, qkv_width, attn_width;
    void *h, *x, *qkv, *attn, *tmp, *gu, *act;   /* [tokens][...] rows, contiguous, in the activations' dtype */
    float eps;
    int bf16, nthreads;
} stack_t;

static int project(const stack_t *s, const qpart_t *p, int parts, const void *in, int64_t in_width, void *out,
                   int64_t out_width) {
    const int64_t es = s->bf16 ? 2 : 4;
    for (int i = 0; i < parts; i++) {
        const qmatmul_fn mm = p[i].int8 ? s->qmatmul_int8 : s->qmatmul;
        const int rc = mm(p[i].qt, p[i].w, p[i].row_bytes, p[i].n, p[i].k, in, s->bf16, in_width, s->tokens,
                          (char *)out + p[i].col * es, s->bf16, out_width, p[i].bias, s->nthreads);
        if (rc) return rc;
    }
    return 0;
}

/* Every layer of the step; x holds the first layer's normed input on entry and the final-normed rows on return.
 * Returns 0, or the first non-zero code of a quantized matmul (then x is undefined). */
int decode_stack(const stack_t *s) {
    const int64_t T = s->tokens, H = s->hidden, I = s->inter;
    for (int64_t i = 0; i < s->n_layers; i++) {
        const stack_layer_t *L = s->layers + i;
        int rc = project(s, L->qkv, L->n_qkv, s->x, H, s->qkv, s->qkv_width);
        if (rc) return rc;
        s->attention(s->attention_step, L->attention, s->qkv, s->attn);
        if ((rc = project(s, &L->o, 1, s->attn, s->attn_width, s->tmp, H))) return rc;
        if (L->post_attn) s->add_rmsnorm(0, 0, s->tmp, H, s->tmp, H, L->post_attn, T, H, s->eps, s->bf16, s->nthreads);
        s->add_rmsnorm(s->tmp, H, s->h, H, s->x, H, L->norm2, T, H, s->eps, s->bf16, s->nthreads);
        if ((rc = project(s, L->gate_up, L->n_gate_up, s->x, H, s->gu, 2 * I))) return rc;
        s->act_mul(s->gu, 2 * I, (const char *)s->gu + I * (s->bf16 ? 2 : 4), 2 * I, s->act, I, T, I, s->bf16,
                   s->nthreads);
        if ((rc = project(s, &L->down, 1, s->act, I, s->tmp, H))) return rc;
        if (L->post_ff) s->add_rmsnorm(0, 0, s->tmp, H, s->tmp, H, L->post_ff, T, H, s->eps, s->bf16, s->nthreads);
        s->add_rmsnorm(s->tmp, H, s->h, H, s->x, H, L->next_norm, T, H, s->eps, s->bf16, s->nthreads);
    }
    return 0;
}

/* ---- decode bursts: every step of a greedy burst, with no Python between them (runner/decode_burst.py) ----
 *
 * A step of rows that decode greedily: their ids' embedding rows (dequantized), the first layer's norm, every layer
 * (decode_stack), the lm_head, each row's first maximum; then positions and K/V slots one further. The same calls
 * on the same buffers as lean.LeanStack.forward, TorchModelRunner._head and the sampler's argmax: the same bits. */


typedef int (*dequant_fn)(int, const uint8_t *, int64_t, int64_t, int64_t, const int64_t *, int64_t, int64_t, void *,
                          int, int64_t, int);
/* quant_screen_argmax (csrc/quant_screen.c): the rows' first maxima of the head's logits, most of them not computed */
typedef int (*screen_fn)(const void *, const void *, int, int64_t, int64_t, int, int64_t *, int);

typedef struct {
    stack_t *stack;                /* every layer; its h and x are [rows][hidden] buffers of the burst's own */
    dequant_fn dequant;            /* quant_dequantize_rows */
    qpart_t embed, head;           /* the token table, looked up by id, and the lm_head (a tied one: the same bytes) */
    const void *norm1;             /* the first layer's input norm */
    void *logits;                  /* [rows][vocab], the activations' dtype */
    int64_t *ids, *pos, *slot;     /* [rows] each: a step's inputs, positions and K/V slots (the attention's step and
                                      layers point at pos and slot) */
    const int64_t *slots;          /* [rows][slots_stride]: the slot of every context position (DecodeState.slots) */
    int64_t rows, slots_stride, steps;
    int64_t *out;                  /* [steps][rows]: the tokens chosen */
    double *ends;                  /* [steps]: CLOCK_MONOTONIC seconds at each step's end (Python's time.monotonic) */
    const void *screen;            /* the head's screen_t (runner/head_screen.py), or NULL: every logit computed */
    screen_fn screen_argmax;
} burst_t;

/* row[i] as fp32 */
static inline float value_at(const void *row, int64_t i, int bf16) {
    return bf16 ? bf2f(((const uint16_t *)row)[i]) : ((const float *)row)[i];
}

/* The index of the first maximum of row[0..n): the sampler's argmax (ties to the lowest index; the build assumes no
 * NaN, -ffast-math). With AVX-512 two passes: the maximum, 16 values a compare, then the first index holding it.
 * NOTE: the scalar scan (one compare and branch a value, 49,152 a SmolLM2 row) was ~0.3 ms of a 16-row step's ~19,
 * on one thread while the other waited. */
static int64_t first_max(const void *row, int64_t n, int bf16) {
#if defined(__AVX512F__)
    if (n >= 16) {   /* the maximum (a value of the row, exactly), then the first index holding it */
        __m512 acc = load16(row, 0, bf16);
        int64_t j = 16;
        for (; j + 16 <= n; j += 16) acc = _mm512_max_ps(load16(row, j, bf16), acc);
        float top = _mm512_reduce_max_ps(acc);
        for (; j < n; j++) { const float v = value_at(row, j, bf16); top = v > top ? v : top; }
        const __m512 t = _mm512_set1_ps(top);
        for (j = 0; j + 16 <= n; j += 16) {
            const __mmask16 hit = _mm512_cmp_ps_mask(load16(row, j, bf16), t, _CMP_EQ_OQ);
            if (hit) return j + __builtin_ctz((unsigned)hit);
        }
        for (; j < n; j++) if (value_at(row, j, bf16) == top) return j;
    }
#endif
    int64_t best = 0;
    float m = value_at(row, 0, bf16);
    for (int64_t i = 1; i < n; i++) {
        const float v = value_at(row, i, bf16);
        if (v > m) { m = v; best = i; }
    }
    return best;
}

/* first_max as the tests call it (tests/test_decode_burst_c.py: ties against torch.argmax) */
int64_t decode_first_max(const void *row, int64_t n, int bf16) { return first_max(row, n, bf16); }

/* The lm_head's logits of the step's rows, then each row's first maximum into b->ids; 0 or the matmul's code */
static int head_argmax(const burst_t *b, const stack_t *s) {
    const int64_t R = b->rows, H = s->hidden, V = b->head.n, es = s->bf16 ? 2 : 4;
    const qmatmul_fn mm = b->head.int8 ? s->qmatmul_int8 : s->qmatmul;
    const int rc = mm(b->head.qt, b->head.w, b->head.row_bytes, V, H, s->x, s->bf16, H, R, b->logits, s->bf16, V,
                      b->head.bias, s->nthreads);
    if (rc) return rc;
    /* rows' maxima on every thread: one row's scan is ~10 us */
    #pragma omp parallel for num_threads(s->nthreads) schedule(static) if (s->nthreads > 1 && R > 1)
    for (int64_t r = 0; r < R; r++)
        b->ids[r] = first_max((const char *)b->logits + r * V * es, V, s->bf16);
    return 0;
}

/* Runs b->steps steps; returns 0, or a quantized matmul's or lookup's non-zero code (the steps before it stand:
 * out and ends hold them, and *done counts them) */
int decode_burst(const burst_t *b, int64_t *done) {
    stack_t *s = b->stack;
    const int64_t R = b->rows, H = s->hidden;
    *done = 0;
    for (int64_t j = 0; j < b->steps; j++) {
        int rc = b->dequant(b->embed.qt, b->embed.w, b->embed.row_bytes, b->embed.n, H, b->ids, 0, R, s->h, s->bf16,
                            H, s->nthreads);
        if (rc) return rc;
        s->add_rmsnorm(0, 0, s->h, H, s->x, H, b->norm1, R, H, s->eps, s->bf16, s->nthreads);
        if ((rc = decode_stack(s))) return rc;
        if (b->screen)   /* the ids the head's logits and first_max give, without computing most of the logits */
            rc = b->screen_argmax(b->screen, s->x, s->bf16, H, R, s->bf16, b->ids, s->nthreads);
        else
            rc = head_argmax(b, s);
        if (rc) return rc;
        for (int64_t r = 0; r < R; r++) {
            b->out[j * R + r] = b->ids[r];
            b->pos[r] += 1;
            b->slot[r] = b->slots[r * b->slots_stride + b->pos[r]];
        }
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        b->ends[j] = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
        *done = j + 1;
    }
    return 0;
}
