/* bf16 <-> fp32 for the plugins' C kernels (include "bf16.h" with include_dirs=(core.native.INCLUDE,)): the
 * conversion torch makes (round to nearest even), and loads/stores of a row that is fp32 or bf16 by a flag. */
#ifndef MODELCALL_BF16_H
#define MODELCALL_BF16_H

#include <stdint.h>
#include <string.h>

static inline float bf2f(uint16_t b) { uint32_t u = (uint32_t)b << 16; float f; memcpy(&f, &u, 4); return f; }
static inline uint16_t f2bf(float f) {   /* round to nearest even, as torch converts */
    uint32_t u; memcpy(&u, &f, 4); u += 0x7fffu + ((u >> 16) & 1u); return (uint16_t)(u >> 16);
}
static inline float ld(const void *p, int64_t i, const int bf) {
    return bf ? bf2f(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}
static inline void st(void *p, int64_t i, float v, const int bf) {
    if (bf) ((uint16_t *)p)[i] = f2bf(v); else ((float *)p)[i] = v;
}

#endif
