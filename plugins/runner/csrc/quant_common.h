/* Quantized weights (GGML block formats): what every format file shares.
 *
 * A weight is N rows of K values; a row is K / 32 "groups" of 32 consecutive weights, and every format here is
 * decoded one group at a time into the same description:
 *
 *     32 small integers q[j] (int8)  +  a scale for the first 16 (dlo), one for the last 16 (dhi)  +  an offset m
 *     weight j = q[j] * (j < 16 ? dlo : dhi) + m
 *
 * (dlo == dhi except in Q6_K, whose scales cover 16 weights; m = -0.0 where a format has no offset, so a zero
 * product keeps its sign, as gguf's NumPy dequantizer gives it). The matmul and the dequantizer widen that to
 * fp32 in registers once per group, whatever the format.
 *
 * NOTE: every product q * d here is exact in fp32 (fp16 d: 11 significant bits; d * sub-block scale: 17 bits;
 * times a 4-6 bit q: at most 23 bits), so the one rounding is in "+ m": a fused multiply-add, or -ffast-math's
 * reordering, gives the same bits as gguf's separate multiply and add. That is why dequantize is bit-exact.
 *
 * Paths: QV512 (AVX-512F/BW/VL: a group is 2 zmm), QV256 (AVX2 + FMA + F16C: 4 ymm), else portable C (also
 * chosen by -DQUANT_SCALAR, which is how the tests build it on any machine).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <omp.h>

#if !defined(QUANT_SCALAR) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define QV512 1
#elif !defined(QUANT_SCALAR) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define QV256 1
#endif
#if defined(QV512) || defined(QV256)
#define QVEC 1
#include <immintrin.h>
#endif

#define INLINE static inline __attribute__((always_inline))

/* gguf.GGMLQuantizationType values */
enum { GT_F32 = 0, GT_F16 = 1, GT_Q4_0 = 2, GT_Q4_1 = 3, GT_Q5_0 = 6, GT_Q5_1 = 7, GT_Q8_0 = 8,
       GT_Q4_K = 12, GT_Q5_K = 13, GT_Q6_K = 14, GT_BF16 = 30 };

/* ---- fp16 / bf16 scalars (portable, exact / round to nearest even) ---- */

static inline float h2f(uint16_t h) {
    uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
    float f;
    if (e == 0) {                                   /* zero or subnormal: m * 2^-24, exact in fp32 */
        f = (float)m * 0x1p-24f;
        memcpy(&u, &f, 4);
        u |= s;
    } else if (e == 31) {
        u = s | 0x7f800000u | (m << 13);
    } else {
        u = s | ((e + 112u) << 23) | (m << 13);
    }
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f2h(float f) {   /* as NumPy's astype(float16): round to nearest even, subnormals kept */
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint16_t s = (uint16_t)((x >> 16) & 0x8000u);
    const uint32_t a = x & 0x7fffffffu;
    if (a > 0x7f800000u) return s | 0x7e00u;                          /* NaN */
    if (a >= 0x47800000u) return s | 0x7c00u;                         /* >= 65536 (and inf): inf */
    if (a >= 0x38800000u) {                                           /* normal half */
        uint32_t r = a - (112u << 23);
        r = (r + 0xfffu + ((r >> 13) & 1u)) >> 13;                    /* a carry may reach inf: right */
        return s | (uint16_t)r;
    }
    const uint32_t e = a >> 23;                                       /* subnormal half: round(f * 2^24) */
    const int shift = 126 - (int)e;
    if (shift > 24) return s;
    const uint32_t m = (a & 0x7fffffu) | 0x800000u;
    uint32_t q = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return s | (uint16_t)q;
}

static inline float bf2f(uint16_t b) { uint32_t u = (uint32_t)b << 16; float f; memcpy(&f, &u, 4); return f; }
static inline uint16_t f2bf(float f) {   /* round to nearest even, NaN kept quiet, as torch and gguf convert */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline uint16_t rd16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline uint32_t rd32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }

#if defined(QVEC)
static inline float h2f_fast(const uint8_t *p) { return _cvtsh_ss(rd16(p)); }
#else
static inline float h2f_fast(const uint8_t *p) { return h2f(rd16(p)); }
#endif

/* the 32 activations of row b, group g as fp32: in place, or widened from bf16 into v */
static inline const float *x_group(const void *x, int x_bf16, int64_t xs, int64_t b, int64_t g, float *v) {
    if (!x_bf16) return (const float *)x + b * xs + 32 * g;
    for (int j = 0; j < 32; j++) v[j] = bf2f(((const uint16_t *)x)[b * xs + 32 * g + j]);
    return v;
}

/* x's B rows (stride *xs) as fp32: x itself, or (x_bf16) a copy widened once, not once per weight row or tile, at
 * *tmp (the caller frees it; *xs becomes K). NULL when that copy cannot be allocated. */
static inline const float *x_fp32(const void *x, int x_bf16, int64_t *xs, int64_t B, int64_t K, float **tmp) {
    *tmp = 0;
    if (!x_bf16) return (const float *)x;
    *tmp = (float *)malloc((size_t)(B * K + 1) * sizeof(float));
    if (!*tmp) return 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t k = 0; k < K; k++) (*tmp)[b * K + k] = bf2f(((const uint16_t *)x)[b * *xs + k]);
    *xs = K;
    return *tmp;
}

/* r16 weights (quant_r16.c): type = the plain format's + R16_OFF; the exported entries hand them over to these
 * (quant_qmatmul with int16 x, quant_qmatmul_int8 with int8 x) */
#define R16_OFF 100
static int r16_qmatmul(int base, const uint8_t *w, int64_t row_bytes, int64_t N, int64_t K, const void *x,
                       int x_bf16, int64_t xs, int64_t B, void *y, int y_bf16, int64_t ys, const float *bias, int nt,
                       int x16);
static void r16_dequantize_row(int base, const uint8_t *w, int64_t row_bytes, int64_t r, int64_t K, void *out,
                               int bf16);
/* r16 weights of 16-bit floats (quant_r16f.c): their own kernel, repacking and rows */
static inline int r16f_format(int base) { return base == GT_F16 || base == GT_BF16; }
static int r16f_matmul(int base, const uint8_t *w, int64_t N, int64_t K, const void *x, int x_bf16, int64_t xs,
                       int64_t B, void *y, int y_bf16, int64_t ys, const float *bias, int nt);
static void r16f_repack(const uint8_t *src, int64_t N, int64_t K, uint8_t *dst, int nt);
static void r16f_dequantize_row(int base, const uint8_t *w, int64_t r, int64_t K, void *out, int bf16);
static void r16f_dequantize_tile(int base, const uint8_t *w, int64_t t, int64_t K, void *out, int bf16, int64_t os);

/* One decoded group (see the top of this file). */
typedef struct { float dlo, dhi, m; } qscale;

#if defined(QVEC)
/* the low nibbles of 16 bytes as weights 0..15, the high ones as 16..31 (Q4_0, Q4_1, Q5_0, Q5_1) */
INLINE __m256i nibbles_split16(const uint8_t *qs) {
    const __m128i v = _mm_loadu_si128((const __m128i *)qs), m4 = _mm_set1_epi8(0x0f);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m4), _mm_and_si128(v, m4));
}
/* bit j of a 32-bit word as 0x10 in byte j (the fifth bit of Q5_0 / Q5_1) */
INLINE __m256i bits_to_0x10(uint32_t bits) {
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL,
                                           0x0101010101010101LL, 0x0000000000000000LL);
    const __m256i sel = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), shuf);
    v = _mm256_cmpeq_epi8(_mm256_and_si256(v, sel), sel);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}
#endif
