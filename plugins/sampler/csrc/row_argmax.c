/* Row-wise argmax of a step's logits, straight on bf16 (or fp32) values (row_argmax.py calls it through ctypes):
 * each row is read once: block maxima over BLOCK columns (vectorized), then the first block holding the row
 * maximum, then the first column there holding it: the first maximum, as torch's `x.max(-1).indices` picks it.
 * Rows split over the threads only above PAR_MIN values (not a decode step's). */

#include <stdint.h>
#include <string.h>
#include <omp.h>

#define BLOCK 256
/* elements: below this, rows run on the calling thread. NOTE: a decode step's logits (32 x 32,000) stay below it:
 * serial they take ~66 us, and a parallel region would hand half of that to a second thread that a loaded
 * machine may not have free just then (the wake-up costs more than the work) */
#define PAR_MIN (1 << 22)

static inline float bf2f(uint16_t b) { uint32_t u = (uint32_t)b << 16; float f; memcpy(&f, &u, 4); return f; }

/* The block maxima vectorize; the scan for the first index compares for equality with a value read from the
 * same row, so the result is exact whatever order the max reduction takes. */
/* NOTE: maxima start from a value of the row, never from an infinity constant: -ffast-math lets gcc assume
 * there are none (a row masked to -inf by a logits processor still holds -inf values, compared as values). */
#define ROW_ARGMAX(NAME, T, LOAD)                                                                    \
static int64_t NAME(const T *x, int64_t n) {                                                         \
    float best = LOAD(x[0]);                                                                          \
    int64_t best_block = 0;                                                                           \
    for (int64_t b = 0; b < n; b += BLOCK) {                                                          \
        const int64_t e = b + BLOCK < n ? b + BLOCK : n;                                              \
        float m = LOAD(x[b]);                                                                         \
        for (int64_t i = b; i < e; i++) { const float v = LOAD(x[i]); m = v > m ? v : m; }           \
        if (m > best) { best = m; best_block = b; }                                                   \
    }                                                                                                 \
    for (int64_t i = best_block; i < n; i++) if (LOAD(x[i]) == best) return i;                        \
    return best_block;                                                                                \
}
#define AS_FLOAT(v) (v)
ROW_ARGMAX(row_bf16, uint16_t, bf2f)
ROW_ARGMAX(row_f32, float, AS_FLOAT)

/* out[r] = index of the first maximum of row r of x ([rows, n], row stride rs elements) */
void row_argmax(const void *x, int64_t rows, int64_t n, int64_t rs, int bf, int64_t *out, int nt) {
    #pragma omp parallel for num_threads(nt) if (nt > 1 && rows > 1 && rows * n >= PAR_MIN)
    for (int64_t r = 0; r < rows; r++)
        out[r] = bf ? row_bf16((const uint16_t *)x + r * rs, n) : row_f32((const float *)x + r * rs, n);
}
