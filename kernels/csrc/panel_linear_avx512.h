/* The AVX-512 tiles of panel_linear_cpu.c (included by it where the compiler targets AVX-512F): 8 rows x one
 * panel below WIDE_TILE_MIN_ROWS rows, 6 rows x two panels from there, as that file's header describes. */
#ifndef PANEL_LINEAR_AVX512_H
#define PANEL_LINEAR_AVX512_H

#include <immintrin.h>

#include "lane_mask.h"
#include "tile_activation.h"

#define NARROW_TILE_ROWS 8
#define WIDE_TILE_ROWS 6
#define WIDE_TILE_PANELS 2
#define WIDE_TILE_MIN_ROWS 64
#define PANEL_LINEAR_ISA "avx512"

/* The 16 weights from element `index` of a panel as floats: float32, or bfloat16 widened (its bits shifted left by
 * 16 are the float32 of the same value) where `bf16`. */
ALWAYS_INLINE __m512 load_weights(const char *panel, int64_t index, const int bf16) {
    if (bf16) {
        const __m256i half = _mm256_loadu_si256((const __m256i *)(panel + 2 * index));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
    }
    return _mm512_loadu_ps((const float *)panel + index);
}

/* Outputs [rows x cols] (cols <= PANEL * panels, the panels `panel_stride` elements apart) for the rows of x
 * starting at `x`; meanwhile `prefetch_lines` cache lines from `prefetch` go to L2, spread evenly over the k steps. */
ALWAYS_INLINE void panel_tile(const float *x, int64_t x_stride, const int rows, int64_t k_size, const char *panel,
                              const int panels, int64_t panel_stride, const float *bias, float *out,
                              int64_t out_stride, int64_t cols, int activation, const char *prefetch,
                              int64_t prefetch_lines, const int bf16) {
    const int vectors = 2 * panels;
    __m512 acc[NARROW_TILE_ROWS][2 * WIDE_TILE_PANELS];
    for (int r = 0; r < rows; r++)
        for (int v = 0; v < vectors; v++) acc[r][v] = _mm512_setzero_ps();
    /* Evenly spread, not all at once: a burst of prefetches waiting on DRAM holds the L1 miss buffers that the
     * tile's own panel loads from L2 need, and the FMAs stall behind the memory stream instead of overlapping it
     * (a T5 decode step's linears at 32 rows: 43.7 -> 32.8 ms on an Intel Xeon). */
    int64_t credit = 0, issued = 0;
    for (int64_t k = 0; k < k_size; k++) {
        for (credit += prefetch_lines; credit >= k_size; credit -= k_size)
            _mm_prefetch(prefetch + issued++ * LINE_BYTES, _MM_HINT_T1);
        __m512 w[2 * WIDE_TILE_PANELS];
        for (int v = 0; v < vectors; v++)
            w[v] = load_weights(panel, v / 2 * panel_stride + k * PANEL + v % 2 * 16, bf16);
        for (int r = 0; r < rows; r++) {
            const __m512 value = _mm512_set1_ps(x[r * x_stride + k]);
            for (int v = 0; v < vectors; v++) acc[r][v] = _mm512_fmadd_ps(value, w[v], acc[r][v]);
        }
    }
    for (int v = 0; v < vectors; v++) {
        const __mmask16 mask = lanes(cols - 16 * v);
        const __m512 bias_v = bias ? _mm512_maskz_loadu_ps(mask, bias + 16 * v) : _mm512_setzero_ps();
        for (int r = 0; r < rows; r++)
            _mm512_mask_storeu_ps(out + r * out_stride + 16 * v, mask, _mm512_add_ps(acc[r][v], bias_v));
    }
    if (activation != ACTIVATION_NONE) activate_tile(out, out_stride, rows, cols, activation);
}

/* Every row of x against `panels` adjacent panels, `tile_rows` rows at a time (the row and panel counts are
 * constants in each copy), each tile prefetching its share of the `next_lines` lines at `next` (none for 0). */
ALWAYS_INLINE void group_all_rows(const float *x, int64_t x_stride, int64_t num_rows, int64_t k_size,
                                  const char *panel, const int panels, const int tile_rows, const float *bias,
                                  float *out, int64_t out_stride, int64_t cols, int activation, const char *next,
                                  int64_t next_lines, const int bf16) {
    const int64_t num_tiles = (num_rows + tile_rows - 1) / tile_rows;
    const int64_t lines_per_tile = (next_lines + num_tiles - 1) / num_tiles;
    const int64_t panel_stride = k_size * PANEL;
    for (int64_t first = 0; first < num_rows; first += tile_rows) {
        const int64_t rows = min64(num_rows - first, tile_rows);
        const float *x_rows = x + first * x_stride;
        float *out_rows = out + first * out_stride;
        const int64_t first_line = first / tile_rows * lines_per_tile;
        const int64_t lines = first_line >= next_lines ? 0 : min64(next_lines - first_line, lines_per_tile);
        const char *prefetch = next + first_line * LINE_BYTES;
#define TILE_CASE(n) \
    case n: \
        panel_tile(x_rows, x_stride, n, k_size, panel, panels, panel_stride, bias, out_rows, out_stride, cols, \
                   activation, prefetch, lines, bf16); \
        break;
        switch (rows) {
            TILE_CASE(1) TILE_CASE(2) TILE_CASE(3) TILE_CASE(4) TILE_CASE(5) TILE_CASE(6) TILE_CASE(7)
            default:
                panel_tile(x_rows, x_stride, tile_rows, k_size, panel, panels, panel_stride, bias, out_rows,
                           out_stride, cols, activation, prefetch, lines, bf16);
        }
#undef TILE_CASE
    }
}

/* One group of adjacent panels: a pair in 6 x 64 tiles, or one panel in 8 x 32 tiles. */
ALWAYS_INLINE void panel_group(const float *x, int64_t x_stride, int64_t num_rows, int64_t k_size, const char *panel,
                               int panels, const float *bias, float *out, int64_t out_stride, int64_t cols,
                               int activation, const char *next, int64_t next_lines, const int bf16) {
    if (panels == WIDE_TILE_PANELS)
        group_all_rows(x, x_stride, num_rows, k_size, panel, WIDE_TILE_PANELS, WIDE_TILE_ROWS, bias, out, out_stride,
                       cols, activation, next, next_lines, bf16);
    else
        group_all_rows(x, x_stride, num_rows, k_size, panel, 1, NARROW_TILE_ROWS, bias, out, out_stride, cols,
                       activation, next, next_lines, bf16);
}

/* Panels per group (and per prefetch of the next group) for a call of `num_rows` rows. */
static inline int64_t group_panels(int64_t num_rows) { return num_rows >= WIDE_TILE_MIN_ROWS ? WIDE_TILE_PANELS : 1; }

#endif
