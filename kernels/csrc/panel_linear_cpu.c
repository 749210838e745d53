/* float32 linear layer y = x W^T (+ bias) on a weight stored as column panels, for any number of rows.
 *
 * Built on first use by kernels/native.py and called through ctypes (front end: kernels/native_linear.py).
 * The weight [N, K] is stored as panels [ceil(N / 32)][K][32]: panel p holds output columns 32p..32p+31 with its K
 * rows contiguous, zero-padded past N. Each thread takes a contiguous range of panels and streams each panel once
 * from memory; for every 8 input rows a tile of 8 x 32 outputs accumulates in 16 AVX-512 registers over the whole K
 * (x broadcast, two panel loads and 16 FMAs per k), so the panel is read from memory once and from cache for the
 * other row tiles. Decode steps (a few rows) are then bound by memory bandwidth, not by a blocking made for large
 * matrices; large prefill matrices run at the FMA rate as well. While it works on panel p, a thread prefetches panel
 * p + 1 into L2 (two lines per k step, spread over the row tiles; at the end of a thread's range that is the other
 * thread's first panel, one wasted panel a call), so the memory stream of a decode step keeps many requests in
 * flight instead of waiting on each panel's first tile.
 * An activation (relu, silu, gelu in its erf form) is applied to each tile while it is in L1, after the bias.
 * Without AVX-512F at build time `panel_linear_supported` returns 0 and the front end keeps oneDNN's path.
 */
#include <stdint.h>

#define PANEL 32
#define TILE_ROWS 8
#define LINE_BYTES 64
#define PANEL_ROW_LINES (PANEL * 4 / LINE_BYTES)

#if defined(__AVX512F__)
#include <immintrin.h>

#include "lane_mask.h"
#include "tile_activation.h"

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* Outputs [rows x cols] (rows <= TILE_ROWS, cols <= PANEL) of one panel for the rows of x starting at `x`; meanwhile
 * `prefetch_lines` cache lines from `prefetch` go to L2, PANEL_ROW_LINES per k step. */
ALWAYS_INLINE void panel_tile(const float *x, int64_t x_stride, const int rows, int64_t k_size, const float *panel,
                              const float *bias, float *out, int64_t out_stride, int64_t cols, int activation,
                              const char *prefetch, int64_t prefetch_lines) {
    __m512 low[TILE_ROWS], high[TILE_ROWS];
    for (int r = 0; r < rows; r++) {
        low[r] = _mm512_setzero_ps();
        high[r] = _mm512_setzero_ps();
    }
    for (int64_t k = 0; k < k_size; k++) {
        for (int line = 0; line < PANEL_ROW_LINES; line++)
            if (k * PANEL_ROW_LINES + line < prefetch_lines)
                _mm_prefetch(prefetch + (k * PANEL_ROW_LINES + line) * LINE_BYTES, _MM_HINT_T1);
        const __m512 w_low = _mm512_loadu_ps(panel + k * PANEL), w_high = _mm512_loadu_ps(panel + k * PANEL + 16);
        for (int r = 0; r < rows; r++) {
            const __m512 value = _mm512_set1_ps(x[r * x_stride + k]);
            low[r] = _mm512_fmadd_ps(value, w_low, low[r]);
            high[r] = _mm512_fmadd_ps(value, w_high, high[r]);
        }
    }
    const __mmask16 mask_low = lanes(cols), mask_high = lanes(cols - 16);
    const __m512 bias_low = bias ? _mm512_maskz_loadu_ps(mask_low, bias) : _mm512_setzero_ps();
    const __m512 bias_high = bias ? _mm512_maskz_loadu_ps(mask_high, bias + 16) : _mm512_setzero_ps();
    for (int r = 0; r < rows; r++) {
        _mm512_mask_storeu_ps(out + r * out_stride, mask_low, _mm512_add_ps(low[r], bias_low));
        _mm512_mask_storeu_ps(out + r * out_stride + 16, mask_high, _mm512_add_ps(high[r], bias_high));
    }
    if (activation != ACTIVATION_NONE) activate_tile(out, out_stride, rows, cols, activation);
}

/* Every row of x against one panel, TILE_ROWS rows at a time (the row count is a constant in each copy), each tile
 * prefetching its share of the panel `next` (NULL: none). */
static void panel_all_rows(const float *x, int64_t x_stride, int64_t num_rows, int64_t k_size, const float *panel,
                           const float *bias, float *out, int64_t out_stride, int64_t cols, int activation,
                           const float *next) {
    const int64_t panel_lines = next ? k_size * PANEL_ROW_LINES : 0;
    const int64_t num_tiles = (num_rows + TILE_ROWS - 1) / TILE_ROWS;
    const int64_t lines_per_tile = (panel_lines + num_tiles - 1) / num_tiles;
    for (int64_t first = 0; first < num_rows; first += TILE_ROWS) {
        const int64_t rows = num_rows - first < TILE_ROWS ? num_rows - first : TILE_ROWS;
        const float *x_rows = x + first * x_stride;
        float *out_rows = out + first * out_stride;
        const int64_t first_line = first / TILE_ROWS * lines_per_tile;
        const int64_t lines = first_line >= panel_lines ? 0
                              : (panel_lines - first_line < lines_per_tile ? panel_lines - first_line : lines_per_tile);
        const char *prefetch = (const char *)next + first_line * LINE_BYTES;
#define TILE_CASE(n) \
    case n: \
        panel_tile(x_rows, x_stride, n, k_size, panel, bias, out_rows, out_stride, cols, activation, prefetch, lines); \
        break;
        switch (rows) {
            TILE_CASE(1) TILE_CASE(2) TILE_CASE(3) TILE_CASE(4) TILE_CASE(5) TILE_CASE(6) TILE_CASE(7)
            default:
                panel_tile(x_rows, x_stride, TILE_ROWS, k_size, panel, bias, out_rows, out_stride, cols, activation,
                           prefetch, lines);
        }
#undef TILE_CASE
    }
}

int panel_linear_supported(void) { return 1; }

/* out [num_rows, n_size] (row stride out_stride) = activation(x [num_rows, k_size] (row stride x_stride) W^T + bias)
 * (bias may be NULL; activation one of the enum above); panels as described above. */
void panel_linear_f32(const float *x, int64_t x_stride, int64_t num_rows, int64_t k_size, const float *panels,
                      int64_t n_size, const float *bias, int activation, float *out, int64_t out_stride,
                      int num_threads) {
    const int64_t num_panels = (n_size + PANEL - 1) / PANEL;
#pragma omp parallel for num_threads(num_threads) schedule(static)
    for (int64_t p = 0; p < num_panels; p++) {
        const int64_t first_col = p * PANEL, cols = n_size - first_col < PANEL ? n_size - first_col : PANEL;
        const float *next = p + 1 < num_panels ? panels + (p + 1) * k_size * PANEL : 0;
        panel_all_rows(x, x_stride, num_rows, k_size, panels + p * k_size * PANEL, bias ? bias + first_col : 0,
                       out + first_col, out_stride, cols, activation, next);
    }
}

#else

int panel_linear_supported(void) { return 0; }

void panel_linear_f32(const float *x, int64_t x_stride, int64_t num_rows, int64_t k_size, const float *panels,
                      int64_t n_size, const float *bias, int activation, float *out, int64_t out_stride,
                      int num_threads) {
    (void)x, (void)x_stride, (void)num_rows, (void)k_size, (void)panels, (void)n_size, (void)bias, (void)activation,
        (void)out, (void)out_stride, (void)num_threads;
}

#endif
