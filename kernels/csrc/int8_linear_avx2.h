/* The AVX2 tiles of int8_linear_cpu.c (included by it where the compiler targets AVX2 but not AVX-512 VNNI). A tile
 * is TILE_ROWS rows x one panel: 4 ymm registers of int32 sums (8 columns each) per row over the whole K, and
 * computes the same integer sums as the AVX-512 VNNI tile:
 * - with AVX-VNNI (__AVXVNNI__), rows are stored as q + 128 and the ymm vpdpbusd adds 4 unsigned x signed byte
 *   products per lane as the AVX-512 tile does; the column offsets take the +128 back out;
 * - otherwise rows are stored as signed q and each lane gets |q| x (w with q's sign) from vpmaddubsw, then vpmaddwd
 *   by ones: |q|, |w| <= 127, so a pair of products is at most 2 * 127 * 127 = 32258 and the int16 sums of
 *   vpmaddubsw never saturate (with u8 q + 128 they would); no offsets are needed.
 * Same rounding, scales and epilogue as the AVX-512 tile, so the outputs are the same floats. */
#ifndef INT8_LINEAR_AVX2_H
#define INT8_LINEAR_AVX2_H

#include <immintrin.h>

#include "lane_mask.h"
#include "tile_activation.h"

/* 2 rows: 8 accumulators, 4 panel vectors and the row's bytes (and for plain AVX2 the ones and temporaries) fit
 * the 16 ymm registers. Measured on an AMD EPYC Zen 5 (one thread, 32 rows x 512 -> 2048), 2 x 32 / 3 x 32 /
 * 4 x 16 tiles: AVX-VNNI 138 / 243 / 139 us (3 rows spill), AVX2 306 / 305 / 329 us. */
#define TILE_ROWS 2
#define TILE_VECTORS 4

#if defined(__AVXVNNI__)
#define INT8_LINEAR_ISA "avx_vnni"
#define STORED_OFFSET 128

/* acc += the int32 sums of 4 unsigned x signed byte products per lane. In asm for the reason given in
 * int8_linear_avx512.h; {vex} asks for the AVX-VNNI encoding, not the EVEX one of AVX-512 VNNI. */
ALWAYS_INLINE void dot_accumulate(__m256i *acc, __m256i unsigned_bytes, __m256i signed_bytes, __m256i ones) {
    (void)ones;
    __asm__("%{vex%} vpdpbusd %2, %1, %0" : "+x"(*acc) : "x"(unsigned_bytes), "x"(signed_bytes));
}
#else
#define INT8_LINEAR_ISA "avx2"
#define STORED_OFFSET 0

/* acc += the int32 sums of 4 signed byte products per lane, exactly (see above); `ones` holds int16 ones. */
ALWAYS_INLINE void dot_accumulate(__m256i *acc, __m256i q, __m256i w, __m256i ones) {
    const __m256i pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(q), _mm256_sign_epi8(w, q));
    *acc = _mm256_add_epi32(*acc, _mm256_madd_epi16(pairs, ones));
}
#endif

ALWAYS_INLINE __m256 load_floats(const float *x, int64_t count) {
    return count >= 8 ? _mm256_loadu_ps(x) : _mm256_maskload_ps(x, lanes8(count));
}

/* 32 rounded values q (+ STORED_OFFSET) of x * inverse (zeros past `count`) as bytes. */
ALWAYS_INLINE __m256i quantize_32(const float *x, int64_t count, __m256 inverse) {
    const __m256i low = _mm256_set1_epi32(-127), high = _mm256_set1_epi32(127);
    const __m256i shift = _mm256_set1_epi32(STORED_OFFSET);
    __m256i q[4];
    for (int i = 0; i < 4; i++) {
        /* round to nearest even, as torch.round */
        q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(load_floats(x + 8 * i, count - 8 * i), inverse));
        q[i] = _mm256_add_epi32(_mm256_min_epi32(_mm256_max_epi32(q[i], low), high), shift);
    }
    const __m256i words = _mm256_packs_epi32(q[0], q[1]), words_high = _mm256_packs_epi32(q[2], q[3]);
    const __m256i bytes = STORED_OFFSET ? _mm256_packus_epi16(words, words_high)
                                        : _mm256_packs_epi16(words, words_high);
    /* the packs work within 128-bit lanes: put the 4-byte groups back in order */
    return _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* One row of x as bytes q + STORED_OFFSET ([k_padded], padding a zero q) and its scale max|x| / 127. */
static void quantize_row(const float *x, int64_t k_size, int64_t k_padded, uint8_t *out, float *scale) {
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 amax = _mm256_setzero_ps();
    for (int64_t k = 0; k < k_size; k += 8)
        amax = _mm256_max_ps(amax, _mm256_and_ps(magnitude, load_floats(x + k, k_size - k)));
    __m128 half = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    half = _mm_max_ps(half, _mm_movehl_ps(half, half));
    const float row_max = _mm_cvtss_f32(_mm_max_ss(half, _mm_movehdup_ps(half)));
    *scale = row_max / 127.0f;
    const __m256 inverse = _mm256_set1_ps(row_max > 0.0f ? 127.0f / row_max : 0.0f);
    for (int64_t k = 0; k < k_padded; k += 32) {
        const __m256i bytes = quantize_32(x + k, k_size - k, inverse);
        if (k + 32 <= k_padded) {
            _mm256_storeu_si256((__m256i *)(out + k), bytes);
        } else {
            uint8_t last[32];
            _mm256_storeu_si256((__m256i *)last, bytes);
            memcpy(out + k, last, (size_t)(k_padded - k));
        }
    }
}

/* The [rows x cols] outputs of the int32 sums: (sum - offset) * row scale * column scale + bias. */
ALWAYS_INLINE void store_tile(__m256i acc[TILE_ROWS][TILE_VECTORS], const int rows, const float *row_scale,
                              const PanelEpilogue *epilogue, float *out, int64_t out_stride) {
    for (int v = 0; v < TILE_VECTORS; v++) {
        const int64_t col = 8 * v, left = epilogue->cols - col;
        if (left <= 0) break;
        const __m256i mask = lanes8(left);
        const __m256i offset = STORED_OFFSET ? _mm256_loadu_si256((const __m256i *)(epilogue->offsets + col))
                                             : _mm256_setzero_si256();
        const __m256 scale = _mm256_loadu_ps(epilogue->column_scale + col);   /* zero-padded to the panel */
        const __m256 bias = epilogue->bias ? load_floats(epilogue->bias + col, left) : _mm256_setzero_ps();
        for (int r = 0; r < rows; r++) {
            const __m256 y = _mm256_cvtepi32_ps(_mm256_sub_epi32(acc[r][v], offset));
            const __m256 result = _mm256_fmadd_ps(y, _mm256_mul_ps(_mm256_set1_ps(row_scale[r]), scale), bias);
            if (left >= 8)
                _mm256_storeu_ps(out + r * out_stride + col, result);
            else
                _mm256_maskstore_ps(out + r * out_stride + col, mask, result);
        }
    }
}

/* Outputs [rows x cols] of one panel for the quantized rows starting at `xq`. */
ALWAYS_INLINE void int8_tile(const uint8_t *xq, int64_t xq_stride, const int rows, int64_t k_groups,
                             const int8_t *panel, const float *row_scale, const PanelEpilogue *epilogue,
                             float *out, int64_t out_stride) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc[TILE_ROWS][TILE_VECTORS];
    for (int r = 0; r < rows; r++)
        for (int v = 0; v < TILE_VECTORS; v++) acc[r][v] = _mm256_setzero_si256();
    for (int64_t g = 0; g < k_groups; g++) {
        __m256i w[TILE_VECTORS];
        for (int v = 0; v < TILE_VECTORS; v++)
            w[v] = _mm256_loadu_si256((const __m256i *)(panel + (g * PANEL + 8 * v) * GROUP));
        for (int r = 0; r < rows; r++) {
            int32_t four;
            memcpy(&four, xq + r * xq_stride + g * GROUP, sizeof(four));
            const __m256i value = _mm256_set1_epi32(four);
            for (int v = 0; v < TILE_VECTORS; v++) dot_accumulate(&acc[r][v], value, w[v], ones);
        }
    }
    store_tile(acc, rows, row_scale, epilogue, out, out_stride);
    if (epilogue->activation != ACTIVATION_NONE)
        activate_tile(out, out_stride, rows, epilogue->cols, epilogue->activation);
}

/* Every quantized row against one panel, TILE_ROWS rows at a time (the row count is a constant in each copy). */
static void panel_all_rows(const uint8_t *xq, int64_t xq_stride, int64_t num_rows, int64_t k_groups,
                           const int8_t *panel, const float *row_scale, const PanelEpilogue *epilogue, float *out,
                           int64_t out_stride) {
    for (int64_t first = 0; first < num_rows; first += TILE_ROWS) {
        const uint8_t *x_rows = xq + first * xq_stride;
        float *out_rows = out + first * out_stride;
        if (num_rows - first < TILE_ROWS)
            int8_tile(x_rows, xq_stride, 1, k_groups, panel, row_scale + first, epilogue, out_rows, out_stride);
        else
            int8_tile(x_rows, xq_stride, TILE_ROWS, k_groups, panel, row_scale + first, epilogue, out_rows,
                      out_stride);
    }
}

#endif
