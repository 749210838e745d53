/* The AVX2 + FMA tiles of panel_linear_cpu.c (included by it where the compiler targets AVX2 and FMA but not
 * AVX-512F). With 16 ymm registers a tile is TILE_ROWS rows x half a panel (TILE_VECTORS ymm of 8 columns); every
 * row tile walks both halves of the panel in turn while it is in L1/L2, and the accumulators stay in registers over
 * the whole K as in the AVX-512 tiles. The prefetch of the next panel is spread over the panel's tiles, as there. */
#ifndef PANEL_LINEAR_AVX2_H
#define PANEL_LINEAR_AVX2_H

#include <immintrin.h>

#include "lane_mask.h"
#include "tile_activation.h"

/* 6 x 2: 12 accumulators, 2 panel vectors and the broadcast, 15 of the 16 ymm registers, so nothing spills; a
 * panel of 32 columns is walked as two 16-column halves, both while the row tile's x is in L1. A tile of 1 or 2 rows
 * takes the whole panel (4 vectors) instead: 2 accumulators a row would leave the FMAs waiting on their latency. A 3 x 4 tile needs 17
 * registers: gcc spilled one accumulator to the stack, and the store-to-load round trip on every k step halved the
 * FMA rate. Measured on an AMD EPYC Zen 5 (AVX2 build, one thread): 32 rows x 512 -> 2048 in 1020 us (3 x 4,
 * spilled) against 560 us (6 x 2). */
#define TILE_ROWS 6
#define TILE_VECTORS 2
#define TILE_COLS (8 * TILE_VECTORS)
#define MAX_VECTORS (PANEL / 8)
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
ALWAYS_INLINE void store_tile(__m256 acc[TILE_ROWS][MAX_VECTORS], const int rows, const int vectors,
                              const float *bias, float *out, int64_t out_stride, int64_t cols) {
    for (int v = 0; v < vectors; v++) {
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

/* Outputs [rows x cols] (cols <= 8 * vectors; rows and vectors constants in each copy) of the panel columns that
 * start at `panel` (a panel plus a column offset) for the rows of x starting at `x`; meanwhile `prefetch_lines`
 * cache lines from `prefetch` go to L2, spread evenly over the k steps. */
ALWAYS_INLINE void panel_tile(const float *x, int64_t x_stride, const int rows, const int vectors, int64_t k_size,
                              const char *panel, const float *bias, float *out, int64_t out_stride, int64_t cols,
                              int activation, const char *prefetch, int64_t prefetch_lines, const int bf16) {
    __m256 acc[TILE_ROWS][MAX_VECTORS];
    for (int r = 0; r < rows; r++)
        for (int v = 0; v < vectors; v++) acc[r][v] = _mm256_setzero_ps();
    int64_t credit = 0, issued = 0;
    for (int64_t k = 0; k < k_size; k++) {
        for (credit += prefetch_lines; credit >= k_size; credit -= k_size)
            _mm_prefetch(prefetch + issued++ * LINE_BYTES, _MM_HINT_T1);
        __m256 w[MAX_VECTORS];
        for (int v = 0; v < vectors; v++) w[v] = load_weights(panel, k * PANEL + 8 * v, bf16);
        for (int r = 0; r < rows; r++) {
            const __m256 value = _mm256_broadcast_ss(x + r * x_stride + k);
            for (int v = 0; v < vectors; v++) acc[r][v] = _mm256_fmadd_ps(value, w[v], acc[r][v]);
        }
    }
    store_tile(acc, rows, vectors, bias, out, out_stride, cols);
    if (activation != ACTIVATION_NONE) activate_tile(out, out_stride, rows, cols, activation);
}

/* Every row of x against one panel, TILE_ROWS rows at a time (the row count is a constant in each copy), each row
 * tile taking the panel's column halves in turn and prefetching its share of the `next_lines` lines at `next`. */
ALWAYS_INLINE void panel_group(const float *x, int64_t x_stride, int64_t num_rows, int64_t k_size, const char *panel,
                               int panels, const float *bias, float *out, int64_t out_stride, int64_t cols,
                               int activation, const char *next, int64_t next_lines, const int bf16) {
    (void)panels;
    const int64_t num_tiles = (num_rows + TILE_ROWS - 1) / TILE_ROWS * (PANEL / TILE_COLS);
    const int64_t lines_per_tile = (next_lines + num_tiles - 1) / num_tiles;
    const int64_t element_bytes = bf16 ? 2 : 4;
    int64_t tile = 0;
    for (int64_t first = 0; first < num_rows; first += TILE_ROWS) {
        const float *x_rows = x + first * x_stride;
        const int64_t rows = min64(num_rows - first, TILE_ROWS);
        /* 1 or 2 rows take the whole panel at once, more rows one half at a time */
        const int64_t step = rows <= 2 ? PANEL : TILE_COLS;
        for (int64_t col = 0; col < cols; col += step, tile += step / TILE_COLS) {
            const int64_t first_line = tile * lines_per_tile;
            const int64_t lines = first_line >= next_lines ? 0
                                  : min64(next_lines - first_line, lines_per_tile * (step / TILE_COLS));
            const char *prefetch = next + first_line * LINE_BYTES;
            const char *columns = panel + col * element_bytes;
            const float *bias_here = bias ? bias + col : 0;
            float *out_rows = out + first * out_stride + col;
            const int64_t cols_here = min64(cols - col, step);
#define TILE_CASE(n, vectors) \
    case n: \
        panel_tile(x_rows, x_stride, n, vectors, k_size, columns, bias_here, out_rows, out_stride, cols_here, \
                   activation, prefetch, lines, bf16); \
        break;
            switch (rows) {
                TILE_CASE(1, MAX_VECTORS) TILE_CASE(2, MAX_VECTORS) TILE_CASE(3, TILE_VECTORS)
                TILE_CASE(4, TILE_VECTORS) TILE_CASE(5, TILE_VECTORS)
                default:
                    panel_tile(x_rows, x_stride, TILE_ROWS, TILE_VECTORS, k_size, columns, bias_here, out_rows,
                               out_stride, cols_here, activation, prefetch, lines, bf16);
            }
#undef TILE_CASE
        }
    }
}

/* One panel per group: the next group's prefetch is then one panel, spread over this panel's tiles. */
static inline int64_t group_panels(int64_t num_rows) { (void)num_rows; return 1; }

#endif
