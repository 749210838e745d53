/* The AVX2 + FMA vectors of lora_cpu.c's tiles (included by it where the compiler targets AVX2 and FMA but not
 * AVX-512F): 8 floats a register, 16 registers. A shrink block is 4 rows x 2 ranks (8 sums, 2 A and 4 x loads per
 * 8 FMAs), an expand block 2 rows x 4 outputs (8 dot products along the rank), or from B^T 4 rows x 2 vectors (16
 * outputs), so no accumulator spills. Row tails take masked loads and stores. */
#ifndef LORA_AVX2_H
#define LORA_AVX2_H

#include <immintrin.h>

#include "lane_mask.h"

#define LORA_ISA "avx2"
#define VL 8
#define SHRINK_RANKS 2

#define EXPAND_ROWS 2
#define OUTER_VECTORS 2

typedef __m256 vec;

ALWAYS_INLINE vec vset1(float v) { return _mm256_set1_ps(v); }

ALWAYS_INLINE vec vzero(void) { return _mm256_setzero_ps(); }

ALWAYS_INLINE vec vload(const float *p) { return _mm256_loadu_ps(p); }

/* The first `count` (all for 8 or more, none for 0 or fewer) floats at p, zeros after. */
ALWAYS_INLINE vec vload_part(const float *p, int64_t count) { return _mm256_maskload_ps(p, lanes8(count)); }

ALWAYS_INLINE vec vfma(vec a, vec b, vec acc) { return _mm256_fmadd_ps(a, b, acc); }

/* Per 128-bit lane, the partial lane sums of four registers, in order. */
ALWAYS_INLINE vec reduce_quad(vec a, vec b, vec c, vec d) {
    return _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
}

/* Lane j of the result: output j, from the 2 quads of reduce_quad (summed across the 128-bit lanes here). */
ALWAYS_INLINE vec reduce_quads(const vec *quads) {
    return _mm256_add_ps(_mm256_permute2f128_ps(quads[0], quads[1], 0x20),
                         _mm256_permute2f128_ps(quads[0], quads[1], 0x31));
}

/* t[0 .. count) = the lane sums of the SHRINK_RANKS = 2 registers acc (count <= 2). */
ALWAYS_INLINE void store_sums(const vec *acc, float *t, int64_t count) {
    const __m256 pairs = _mm256_hadd_ps(acc[0], acc[1]); /* per 128-bit lane: a01 a23 b01 b23 */
    __m128 sums = _mm_add_ps(_mm256_castps256_ps128(pairs), _mm256_extractf128_ps(pairs, 1));
    sums = _mm_hadd_ps(sums, sums); /* a b a b */
    t[0] = _mm_cvtss_f32(sums);
    if (count >= 2) t[1] = _mm_cvtss_f32(_mm_movehdup_ps(sums));
}

/* y[0 .. count) += the first `count` (all for 8 or more) lanes of v. */
ALWAYS_INLINE void vadd_to(float *y, vec v, int64_t count) {
    if (count >= 8) {
        _mm256_storeu_ps(y, _mm256_add_ps(_mm256_loadu_ps(y), v));
    } else {
        const __m256i mask = lanes8(count);
        _mm256_maskstore_ps(y, mask, _mm256_add_ps(_mm256_maskload_ps(y, mask), v));
    }
}

#endif
