/* paged_attention alone, from C: the decode step's attention over L layers' caches (blocks of 16 tokens, scattered
 * over each layer's pool or in order), timed without Python around it. Built by benchmarks/decode_kernel.sh with the
 * kernel's source (cpu_kernel.SOURCE) included first:
 *     decode_kernel ROWS CTX LAYERS IN_ORDER SECONDS LABEL
 * Environment: QF32=1 (fp32 queries instead of bf16), KVT=2 (an fp8 E4M3 cache instead of bf16; 3: E5M2), NT=N (the
 * kernel's threads), HUGE=0 (4 KB pages; by default the caches are madvised onto huge pages, as torch's
 * THP_MEM_ALLOC_ENABLE=1 does for the engine). Prints the mean and best ms per step, the K/V bytes per step
 * over the best time, and a checksum of the output (equal checksums: the same results). W1's heads: 8 x 64, MHA. */
#include <stdio.h>
#include <time.h>
#include <sys/mman.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}
static uint64_t rs = 88172645463325252ull;   /* xorshift: the same caches and queries every run */
static uint64_t rnd(void) { rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return rs; }
static uint16_t rnd_bf16(void) { return 0x3f80 ^ (rnd() & 0x80ff); }   /* +-[1, 2) with random low mantissa bits */

int main(int argc, char **argv) {
    if (argc < 7) { fprintf(stderr, "usage: %s ROWS CTX LAYERS IN_ORDER SECONDS LABEL\n", argv[0]); return 2; }
    const int64_t rows = atoi(argv[1]), ctx = atoi(argv[2]), L = atoi(argv[3]);
    const int inorder = atoi(argv[4]), nt = getenv("NT") ? atoi(getenv("NT")) : 1, qf32 = getenv("QF32") != NULL;
    const int kvt = getenv("KVT") ? atoi(getenv("KVT")) : 1, es = kvt == 1 ? 2 : 1;
    const double secs = atof(argv[5]);
    if (rows < 1 || rows > 4096 || ctx < 1 || ctx > 1 << 20 || L < 1 || L > 256 || nt < 1 || kvt < 1 || kvt > 3) {
        fprintf(stderr, "rows, context, layers and threads must be positive (and not huge)\n");
        return 2;
    }
    const int64_t hq = 8, hkv = 8, d = 64, bs = 16, nb = (ctx + bs - 1) / bs, pool = rows * nb + 1, w = hkv * d;
    const size_t bytes = (((size_t)(pool * bs * w * es)) | ((2u << 20) - 1)) + 1;
    uint16_t **kc = malloc(sizeof(void *) * L), **vc = malloc(sizeof(void *) * L);
    for (int l = 0; l < L; l++) {   /* one pool per layer, so a step's K/V come from memory as in a real step */
        kc[l] = aligned_alloc(2u << 20, bytes);
        vc[l] = aligned_alloc(2u << 20, bytes);
        if (!getenv("HUGE") || atoi(getenv("HUGE"))) {   /* as the engine's THP_MEM_ALLOC_ENABLE=1 */
            madvise(kc[l], bytes, MADV_HUGEPAGE);
            madvise(vc[l], bytes, MADV_HUGEPAGE);
        }
        if (es == 2)
            for (int64_t i = 0; i < pool * bs * w; i++) { kc[l][i] = rnd_bf16(); vc[l][i] = rnd_bf16(); }
        else   /* fp8 codes of +-[0.25, 4) or so: exponent bits never all ones, so never NaN */
            for (int64_t i = 0; i < pool * bs * w; i++) {
                ((uint8_t *)kc[l])[i] = (uint8_t)((rnd() & 0x9f) | 0x20);
                ((uint8_t *)vc[l])[i] = (uint8_t)((rnd() & 0x9f) | 0x20);
            }
    }
    int64_t *perm = malloc(sizeof(int64_t) * pool);
    for (int64_t i = 0; i < pool; i++) perm[i] = i;
    if (!inorder)
        for (int64_t i = pool - 1; i > 0; i--) { const int64_t j = rnd() % (i + 1), t = perm[i]; perm[i] = perm[j]; perm[j] = t; }
    int64_t *slots = malloc(sizeof(int64_t) * rows * ctx), *seq = malloc(8 * rows), *pos = malloc(8 * rows);
    for (int64_t r = 0; r < rows; r++) {
        seq[r] = r, pos[r] = ctx - 1;
        for (int64_t j = 0; j < ctx; j++) slots[r * ctx + j] = perm[r * nb + j / bs] * bs + j % bs;
    }
    const int64_t qn = rows * (hq + 2 * hkv) * d;   /* packed QKV rows: q read in place, as the lean stack calls it */
    uint16_t *q = malloc(2 * (size_t)qn), *out = malloc(4 * (size_t)(rows * hq * d));
    float *qf = malloc(4 * (size_t)qn);
    for (int64_t i = 0; i < qn; i++) { q[i] = rnd_bf16(); const uint32_t u = (uint32_t)q[i] << 16; memcpy(qf + i, &u, 4); }
    double best = 1e9, tot = 0;
    int n = 0;
    const double t0 = now();
    while (now() - t0 < secs) {
        const double a = now();
        for (int l = 0; l < L; l++)
            paged_attention(qf32 ? (void *)qf : (void *)q, !qf32, (hq + 2 * hkv) * d, out, 1, kc[l], vc[l], kvt, seq,
                            pos, slots, ctx, rows, hq, hkv, d, 0.125f, 0, 0.f, NULL, NULL, nt, 0);
        const double b = now() - a;
        tot += b, n++;
        best = b < best ? b : best;
    }
    float cs = 0;
    for (int64_t i = 0; i < rows * hq * d; i++) { const uint32_t u = (uint32_t)out[i] << 16; float f; memcpy(&f, &u, 4); cs += f; }
    printf("%s %ldx%ld L%ld %s kvt %d threads %d: mean %.3f ms, best %.3f ms per step, %.1f GB/s (best), checksum %.6f\n",
           argv[6], (long)rows, (long)ctx, (long)L, inorder ? "in order" : "scattered", kvt, nt, tot / n * 1e3,
           best * 1e3, (double)rows * ctx * L * 2 * w * es / best / 1e9, cs);
    return 0;
}
