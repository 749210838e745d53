/* The portable vectors of lora_cpu.c's tiles (included by it where the build targets neither AVX-512F nor AVX2 +
 * FMA): GNU C vectors of 4 floats, which the compiler maps to the target's SIMD registers (SSE on x86-64) or to
 * scalars. A shrink block is 4 rows x 4 ranks, an expand block 4 rows x 4 outputs. */
#ifndef LORA_PORTABLE_H
#define LORA_PORTABLE_H

#include <string.h>

#define LORA_ISA "portable"
#define VL 4
#define SHRINK_RANKS 4
#define EXPAND_ROWS 4
#define OUTER_VECTORS 2

typedef float vec __attribute__((vector_size(16)));

ALWAYS_INLINE vec vset1(float v) { return (vec){v, v, v, v}; }

ALWAYS_INLINE vec vzero(void) { return (vec){0.0f, 0.0f, 0.0f, 0.0f}; }

ALWAYS_INLINE vec vload(const float *p) {
    vec v;
    memcpy(&v, p, sizeof(v));
    return v;
}

/* The first `count` (all for 4 or more, none for 0 or fewer) floats at p, zeros after. */
ALWAYS_INLINE vec vload_part(const float *p, int64_t count) {
    vec v = vzero();
    for (int64_t i = 0; i < count && i < 4; i++) v[i] = p[i];
    return v;
}

ALWAYS_INLINE vec vfma(vec a, vec b, vec acc) { return acc + a * b; }

ALWAYS_INLINE float vsum(vec v) { return (v[0] + v[1]) + (v[2] + v[3]); }

/* The lane sums of four registers, in order. */
ALWAYS_INLINE vec reduce_quad(vec a, vec b, vec c, vec d) { return (vec){vsum(a), vsum(b), vsum(c), vsum(d)}; }

/* Lane j: output j of the VL / 4 = 1 quad. */
ALWAYS_INLINE vec reduce_quads(const vec *quads) { return quads[0]; }

/* t[0 .. count) = the lane sums of the SHRINK_RANKS registers acc (count <= SHRINK_RANKS). */
ALWAYS_INLINE void store_sums(const vec *acc, float *t, int64_t count) {
    for (int64_t j = 0; j < count; j++) t[j] = vsum(acc[j]);
}

/* y[0 .. count) += the first `count` (all for 4 or more) lanes of v. */
ALWAYS_INLINE void vadd_to(float *y, vec v, int64_t count) {
    for (int64_t i = 0; i < count && i < 4; i++) y[i] += v[i];
}

#endif
