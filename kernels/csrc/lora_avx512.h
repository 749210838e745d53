/* The AVX-512F vectors of lora_cpu.c's tiles (included by it where the compiler targets AVX-512F): 16 floats a
 * register, 32 registers. A shrink block is 4 rows x 4 ranks (16 sums, 4 A and 4 x loads per 16 FMAs); an expand
 * block 4 rows x 4 outputs (16 dot products along the rank), or from B^T 4 rows x 4 vectors (64 outputs: 4 loads
 * and 4 broadcasts per 16 FMAs). Row tails take masked loads and stores. */
#ifndef LORA_AVX512_H
#define LORA_AVX512_H

#include <immintrin.h>

#include "lane_mask.h"

#define LORA_ISA "avx512"
#define VL 16
#define SHRINK_RANKS 4

#define EXPAND_ROWS 4
#define OUTER_VECTORS 4

typedef __m512 vec;

ALWAYS_INLINE vec vset1(float v) { return _mm512_set1_ps(v); }

ALWAYS_INLINE vec vzero(void) { return _mm512_setzero_ps(); }

ALWAYS_INLINE vec vload(const float *p) { return _mm512_loadu_ps(p); }

/* The first `count` (all for 16 or more, none for 0 or fewer) floats at p, zeros after. */
ALWAYS_INLINE vec vload_part(const float *p, int64_t count) { return _mm512_maskz_loadu_ps(lanes(count), p); }

ALWAYS_INLINE vec vfma(vec a, vec b, vec acc) { return _mm512_fmadd_ps(a, b, acc); }

/* Per 128-bit lane, the partial lane sums of four registers, in order. */
ALWAYS_INLINE vec reduce_quad(vec a, vec b, vec c, vec d) {
    const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
    return _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(ab), _mm512_castps_pd(cd))),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(ab), _mm512_castps_pd(cd))));
}

/* Lane j of the result: output j, from the 4 quads of reduce_quad (quad g: outputs 4g .. 4g + 3, summed across the
 * 128-bit lanes here). */
ALWAYS_INLINE vec reduce_quads(const vec *quads) {
    const __m512 q01 = _mm512_add_ps(_mm512_shuffle_f32x4(quads[0], quads[1], 0x44),
                                     _mm512_shuffle_f32x4(quads[0], quads[1], 0xee));
    const __m512 q23 = _mm512_add_ps(_mm512_shuffle_f32x4(quads[2], quads[3], 0x44),
                                     _mm512_shuffle_f32x4(quads[2], quads[3], 0xee));
    return _mm512_add_ps(_mm512_shuffle_f32x4(q01, q23, 0x88), _mm512_shuffle_f32x4(q01, q23, 0xdd));
}

/* t[0 .. count) = the lane sums of the SHRINK_RANKS = 4 registers acc (count <= 4). */
ALWAYS_INLINE void store_sums(const vec *acc, float *t, int64_t count) {
    const __m512 quad = reduce_quad(acc[0], acc[1], acc[2], acc[3]);
    const __m256 half = _mm256_add_ps(_mm512_castps512_ps256(quad),
                                      _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(quad), 1)));
    const __m128 sums = _mm_add_ps(_mm256_castps256_ps128(half), _mm256_extractf128_ps(half, 1));
    if (count >= 4) {
        _mm_storeu_ps(t, sums);
    } else {
        float lanes4[4];
        _mm_storeu_ps(lanes4, sums);
        for (int64_t j = 0; j < count; j++) t[j] = lanes4[j];
    }
}

/* y[0 .. count) += the first `count` (all for 16 or more) lanes of v. */
ALWAYS_INLINE void vadd_to(float *y, vec v, int64_t count) {
    if (count >= 16) {
        _mm512_storeu_ps(y, _mm512_add_ps(_mm512_loadu_ps(y), v));
    } else {
        const __mmask16 mask = lanes(count);
        _mm512_mask_storeu_ps(y, mask, _mm512_add_ps(_mm512_maskz_loadu_ps(mask, y), v));
    }
}

#endif
