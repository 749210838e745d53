/* The AVX-512 mask of the first `count` of 16 float lanes (all for 16 or more, none for 0 or fewer): the tails of
 * rows and panels in panel_linear_cpu.c, int8_linear_cpu.c and paged_attention_avx512.h. */
#ifndef LANE_MASK_H
#define LANE_MASK_H

#include <immintrin.h>
#include <stdint.h>

static inline __mmask16 lanes(int64_t count) {
    return count >= 16 ? (__mmask16)0xffff : count <= 0 ? (__mmask16)0 : (__mmask16)((1u << count) - 1);
}

#endif
