/* The core's bf16 dot-product peak for benchmarks/embeddings_ceiling.py, built by core.native's OnceLibrary. */
#include <immintrin.h>
#include <stdint.h>
/* n rounds of 12 independent vdpbf16ps on registers (12 chains cover the instruction's latency); returns a sum
 * so the loop is not removed. 12 * 32 multiply-adds a round. */
float bf16_peak_loop(int64_t n) {
#if defined(__AVX512BF16__)
    /* distinct starting values, or the compiler merges the identical chains into one */
    __m512 a0 = _mm512_set1_ps(0.f), a1 = _mm512_set1_ps(1.f), a2 = _mm512_set1_ps(2.f), a3 = _mm512_set1_ps(3.f),
           a4 = _mm512_set1_ps(4.f), a5 = _mm512_set1_ps(5.f), a6 = _mm512_set1_ps(6.f), a7 = _mm512_set1_ps(7.f),
           a8 = _mm512_set1_ps(8.f), a9 = _mm512_set1_ps(9.f), a10 = _mm512_set1_ps(10.f), a11 = _mm512_set1_ps(11.f);
    const __m512bh x = (__m512bh)_mm512_set1_epi32(0x3c003c00 + (int)(n & 1)), y = (__m512bh)_mm512_set1_epi32(0x3c003c00);
    for (int64_t i = 0; i < n; i++) {
        a0 = _mm512_dpbf16_ps(a0, x, y); a1 = _mm512_dpbf16_ps(a1, x, y); a2 = _mm512_dpbf16_ps(a2, x, y);
        a3 = _mm512_dpbf16_ps(a3, x, y); a4 = _mm512_dpbf16_ps(a4, x, y); a5 = _mm512_dpbf16_ps(a5, x, y);
        a6 = _mm512_dpbf16_ps(a6, x, y); a7 = _mm512_dpbf16_ps(a7, x, y); a8 = _mm512_dpbf16_ps(a8, x, y);
        a9 = _mm512_dpbf16_ps(a9, x, y); a10 = _mm512_dpbf16_ps(a10, x, y); a11 = _mm512_dpbf16_ps(a11, x, y);
    }
    a0 = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                       _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
    a0 = _mm512_add_ps(a0, _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)));
    return _mm512_reduce_add_ps(a0);
#else
    (void)n;
    return -1.f;   /* no AVX512_BF16 */
#endif
}
