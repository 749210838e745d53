/* The AVX-512 mask of the first `count` of 16 float lanes (all for 16 or more, none for 0 or fewer): the tails of
 * rows and panels in panel_linear_cpu.c, int8_linear_cpu.c and paged_attention_avx512.h. Where AVX2 is there,
 * `lanes8` is the same for 8 lanes of a ymm register, as the vector mask that vmaskmov and vpmaskmov take. */
#ifndef LANE_MASK_H
#define LANE_MASK_H

#include <immintrin.h>
#include <stdint.h>

static inline __mmask16 lanes(int64_t count) {
    return count >= 16 ? (__mmask16)0xffff : count <= 0 ? (__mmask16)0 : (__mmask16)((1u << count) - 1);
}

#if defined(__AVX2__)
static inline __m256i lanes8(int64_t count) {
    static const int32_t ones_then_zeros[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
    const int64_t on = count >= 8 ? 8 : count <= 0 ? 0 : count;
    return _mm256_loadu_si256((const __m256i *)(ones_then_zeros + 8 - on));
}
#endif

#endif
