/* The AVX2 + FMA tiles of panel_linear_cpu.c (included by it where the compiler targets AVX2 and FMA but not
 * AVX-512F). With 16 ymm registers a tile is TILE_ROWS rows x one panel (TILE_VECTORS ymm of 8 columns); every row
 * tile walks the panel in turn while it is in L1/L2, and the accumulators stay in registers over the whole K as in
 * the AVX-512 tiles. The prefetch of the next panel is spread over the panel's row tiles, as there. */
#ifndef PANEL_LINEAR_AVX2_H
#define PANEL_LINEAR_AVX2_H

#include <immintrin.h>

#include "lane_mask.h"
#include "tile_activation.h"

/* 3 x 4: 12 accumulators, 4 panel vectors (one of them is read from L1 by the FMAs) and the broadcast. Measured on
 * an AMD EPYC Zen 5 (AVX2 build, one thread), 3 x 4 / 2 x 4 / 4 x 2 / 6 x 2: 32 rows x 512 -> 2048 in 485 / 611 /
 * 537 / 533 us, 512 rows x 768 -> 768 in 4.42 / 5.62 / 4.81 / 4.45 ms, one row 512 -> 512 in 16 / 16 / 20 / 23 us. */
#define TILE_ROWS 3
#define TILE_VECTORS 4
#define PANEL_LINEAR_ISA "avx2"

/* The 8 weights from element `index` of a panel as floats: float32, or bfloat16 widened (its bits shifted left by 16
 * are the float32 of the same value) where `bf16`. */
ALWAYS_INLINE __m256 load_weights(const char *panel, int64_t index, const int bf16) {
    if (bf16) {
        const __m128i half = _mm_loadu_si128((const __m128i *)(panel + 2 * index));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16));
    }
    return _mm256_loadu_ps((const float *)panel + index);
}

/* Adds the bias to the [rows x cols] accumulators and stores them (masked past cols). */
ALWAYS_INLINE void store_tile(__m256 acc[TILE_ROWS][TILE_VECTORS], const int rows, const float *bias, float *out,
                              int64_t out_stride, int64_t cols) {
    for (int v = 0; v < TILE_VECTORS; v++) {
        const int64_t left = cols - 8 * v;
        if (left <= 0) break;
        const __m256i mask = lanes8(left);
        const __m256 bias_v = !bias ? _mm256_setzero_ps()
                              : left >= 8 ? _mm256_loadu_ps(bias + 8 * v) : _mm256_maskload_ps(bias + 8 * v, mask);
        for (int r = 0; r < rows; r++) {
            const __m256 y = _mm256_add_ps(acc[r][v], bias_v);
            if (left >= 8)
                _mm256_storeu_ps(out + r * out_stride + 8 * v, y);
            else
                _mm256_maskstore_ps(out + r * out_stride + 8 * v, mask, y);
        }
    }
}

/* Outputs [rows x cols] (cols <= PANEL) of one panel for the rows of x starting at `x`; meanwhile `prefetch_lines`
 * cache lines from `prefetch` go to L2, spread evenly over the k steps. */
ALWAYS_INLINE void panel_tile(const float *x, int64_t x_stride, const int rows, int64_t k_size, const char *panel,
                              const float *bias, float *out, int64_t out_stride, int64_t cols, int activation,
                              const char *prefetch, int64_t prefetch_lines, const int bf16) {
    __m256 acc[TILE_ROWS][TILE_VECTORS];
    for (int r = 0; r < rows; r++)
        for (int v = 0; v < TILE_VECTORS; v++) acc[r][v] = _mm256_setzero_ps();
    int64_t credit = 0, issued = 0;
    for (int64_t k = 0; k < k_size; k++) {
        for (credit += prefetch_lines; credit >= k_size; credit -= k_size)
            _mm_prefetch(prefetch + issued++ * LINE_BYTES, _MM_HINT_T1);
        __m256 w[TILE_VECTORS];
        for (int v = 0; v < TILE_VECTORS; v++) w[v] = load_weights(panel, k * PANEL + 8 * v, bf16);
        for (int r = 0; r < rows; r++) {
            const __m256 value = _mm256_broadcast_ss(x + r * x_stride + k);
            for (int v = 0; v < TILE_VECTORS; v++) acc[r][v] = _mm256_fmadd_ps(value, w[v], acc[r][v]);
        }
    }
    store_tile(acc, rows, bias, out, out_stride, cols);
    if (activation != ACTIVATION_NONE) activate_tile(out, out_stride, rows, cols, activation);
}

/* Every row of x against one panel, TILE_ROWS rows at a time (the row count is a constant in each copy), each tile
 * prefetching its share of the `next_lines` lines at `next`. */
ALWAYS_INLINE void panel_group(const float *x, int64_t x_stride, int64_t num_rows, int64_t k_size, const char *panel,
                               int panels, const float *bias, float *out, int64_t out_stride, int64_t cols,
                               int activation, const char *next, int64_t next_lines, const int bf16) {
    (void)panels;
    const int64_t num_tiles = (num_rows + TILE_ROWS - 1) / TILE_ROWS;
    const int64_t lines_per_tile = (next_lines + num_tiles - 1) / num_tiles;
    for (int64_t first = 0; first < num_rows; first += TILE_ROWS) {
        const float *x_rows = x + first * x_stride;
        float *out_rows = out + first * out_stride;
        const int64_t first_line = first / TILE_ROWS * lines_per_tile;
        const int64_t lines = first_line >= next_lines ? 0 : min64(next_lines - first_line, lines_per_tile);
        const char *prefetch = next + first_line * LINE_BYTES;
#define TILE_CASE(n) \
    case n: \
        panel_tile(x_rows, x_stride, n, k_size, panel, bias, out_rows, out_stride, cols, activation, prefetch, \
                   lines, bf16); \
        break;
        switch (min64(num_rows - first, TILE_ROWS)) {
            TILE_CASE(1) TILE_CASE(2)
            default:
                panel_tile(x_rows, x_stride, TILE_ROWS, k_size, panel, bias, out_rows, out_stride, cols, activation,
                           prefetch, lines, bf16);
        }
#undef TILE_CASE
    }
}

/* One panel per group: the next group's prefetch is then one panel, spread over this panel's tiles. */
static inline int64_t group_panels(int64_t num_rows) { (void)num_rows; return 1; }

#endif
