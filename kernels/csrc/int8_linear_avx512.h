/* The AVX-512 VNNI tile of int8_linear_cpu.c (included by it where the compiler targets AVX-512F/BW/VNNI): rows
 * quantized to q + 128 with 16-lane masks, then an 8 x 32 tile of int32 sums in 16 zmm registers over the whole K,
 * 4 products per lane per vpdpbusd. */
#ifndef INT8_LINEAR_AVX512_H
#define INT8_LINEAR_AVX512_H

#include <immintrin.h>

#include "lane_mask.h"
#include "tile_activation.h"

#define TILE_ROWS 8
#define INT8_LINEAR_ISA "avx512_vnni"

/* acc += the int32 sums of 4 unsigned x signed byte products per lane. Written as asm so that the accumulator
 * stays in its register: GCC copies each accumulator out and back around _mm512_dpbusd_epi32 (measured: 16
 * extra register moves per 16 products in the 8-row tile). */
ALWAYS_INLINE void dot_accumulate(__m512i *acc, __m512i unsigned_bytes, __m512i signed_bytes) {
    __asm__("vpdpbusd %2, %1, %0" : "+v"(*acc) : "v"(unsigned_bytes), "v"(signed_bytes));
}

/* One row of x as unsigned bytes q + 128 ([k_padded], padding 128 = a zero q) and its scale max|x| / 127. */
static void quantize_row(const float *x, int64_t k_size, int64_t k_padded, uint8_t *out, float *scale) {
    __m512 amax = _mm512_setzero_ps();
    for (int64_t k = 0; k < k_size; k += 16) {
        const __mmask16 mask = lanes(k_size - k);
        amax = _mm512_max_ps(amax, _mm512_abs_ps(_mm512_maskz_loadu_ps(mask, x + k)));
    }
    const float row_max = _mm512_reduce_max_ps(amax);
    *scale = row_max / 127.0f;
    const __m512 inverse = _mm512_set1_ps(row_max > 0.0f ? 127.0f / row_max : 0.0f);
    const __m512i low = _mm512_set1_epi32(-127), high = _mm512_set1_epi32(127), shift = _mm512_set1_epi32(128);
    for (int64_t k = 0; k < k_size; k += 16) {
        const __mmask16 mask = lanes(k_size - k);
        /* round to nearest even, as torch.round */
        __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(mask, x + k), inverse));
        q = _mm512_add_epi32(_mm512_min_epi32(_mm512_max_epi32(q, low), high), shift);
        _mm_mask_storeu_epi8(out + k, mask, _mm512_cvtepi32_epi8(q));
    }
    memset(out + k_size, 128, (size_t)(k_padded - k_size));
}

/* Outputs [rows x cols] of one panel for the quantized rows starting at `xq`. */
ALWAYS_INLINE void int8_tile(const uint8_t *xq, int64_t xq_stride, const int rows, int64_t k_groups,
                             const int8_t *panel, const float *row_scale, const PanelEpilogue *epilogue,
                             float *out, int64_t out_stride) {
    __m512i low[TILE_ROWS], high[TILE_ROWS];
    for (int r = 0; r < rows; r++) {
        low[r] = _mm512_setzero_si512();
        high[r] = _mm512_setzero_si512();
    }
    for (int64_t g = 0; g < k_groups; g++) {
        const __m512i w_low = _mm512_loadu_si512(panel + g * PANEL * GROUP);
        const __m512i w_high = _mm512_loadu_si512(panel + g * PANEL * GROUP + 64);
        for (int r = 0; r < rows; r++) {
            int32_t four;
            memcpy(&four, xq + r * xq_stride + g * GROUP, sizeof(four));
            const __m512i value = _mm512_set1_epi32(four);
            dot_accumulate(&low[r], value, w_low);
            dot_accumulate(&high[r], value, w_high);
        }
    }
    const int64_t cols = epilogue->cols;
    const __mmask16 mask_low = lanes(cols), mask_high = lanes(cols - 16);
    const __m512i offset_low = _mm512_loadu_si512(epilogue->offsets);
    const __m512i offset_high = _mm512_loadu_si512(epilogue->offsets + 16);
    const __m512 scale_low = _mm512_maskz_loadu_ps(mask_low, epilogue->column_scale);
    const __m512 scale_high = _mm512_maskz_loadu_ps(mask_high, epilogue->column_scale + 16);
    const float *bias = epilogue->bias;
    const __m512 bias_low = bias ? _mm512_maskz_loadu_ps(mask_low, bias) : _mm512_setzero_ps();
    const __m512 bias_high = bias ? _mm512_maskz_loadu_ps(mask_high, bias + 16) : _mm512_setzero_ps();
    for (int r = 0; r < rows; r++) {
        const __m512 rs = _mm512_set1_ps(row_scale[r]);
        const __m512 y_low = _mm512_cvtepi32_ps(_mm512_sub_epi32(low[r], offset_low));
        const __m512 y_high = _mm512_cvtepi32_ps(_mm512_sub_epi32(high[r], offset_high));
        _mm512_mask_storeu_ps(out + r * out_stride, mask_low,
                              _mm512_fmadd_ps(y_low, _mm512_mul_ps(rs, scale_low), bias_low));
        _mm512_mask_storeu_ps(out + r * out_stride + 16, mask_high,
                              _mm512_fmadd_ps(y_high, _mm512_mul_ps(rs, scale_high), bias_high));
    }
    if (epilogue->activation != ACTIVATION_NONE) activate_tile(out, out_stride, rows, cols, epilogue->activation);
}

/* Every quantized row against one panel, TILE_ROWS rows at a time (the row count is a constant in each copy). */
static void panel_all_rows(const uint8_t *xq, int64_t xq_stride, int64_t num_rows, int64_t k_groups,
                           const int8_t *panel, const float *row_scale, const PanelEpilogue *epilogue, float *out,
                           int64_t out_stride) {
    for (int64_t first = 0; first < num_rows; first += TILE_ROWS) {
        const int64_t rows = num_rows - first < TILE_ROWS ? num_rows - first : TILE_ROWS;
        const uint8_t *x_rows = xq + first * xq_stride;
        const float *scales = row_scale + first;
        float *out_rows = out + first * out_stride;
#define TILE_CASE(n) \
    case n: int8_tile(x_rows, xq_stride, n, k_groups, panel, scales, epilogue, out_rows, out_stride); break;
        switch (rows) {
            TILE_CASE(1) TILE_CASE(2) TILE_CASE(3) TILE_CASE(4) TILE_CASE(5) TILE_CASE(6) TILE_CASE(7)
            default: int8_tile(x_rows, xq_stride, TILE_ROWS, k_groups, panel, scales, epilogue, out_rows, out_stride);
        }
#undef TILE_CASE
    }
}

#endif
