/* float32 linear layer y = x W^T (+ bias) on a weight stored as column panels, for any number of rows.
 *
 * Built on first use by kernels/native.py and called through ctypes (front end: kernels/native_linear.py).
 * The weight [N, K] is stored as panels [ceil(N / 32)][K][32]: panel p holds output columns 32p..32p+31 with its K
 * rows contiguous, zero-padded past N. Each thread takes a contiguous range of panels and streams each panel once
 * from memory; a tile of outputs accumulates in vector registers over the whole K (x broadcast, panel loads and
 * FMAs per k), so a panel is read from memory once and from cache for the other row tiles. Decode steps (a few rows)
 * are then bound by memory bandwidth, not by a blocking made for large matrices; large prefill matrices run at the
 * FMA rate as well. The tiles are per instruction set: panel_linear_avx512.h (AVX-512F) and panel_linear_avx2.h
 * (AVX2 + FMA, 16 ymm registers). With AVX-512, below WIDE_TILE_MIN_ROWS rows a tile is 8 rows x one panel (16
 * accumulators, two panel loads and 16 FMAs per k); from there it is 6 rows x two adjacent panels (24 accumulators,
 * four loads and 24 FMAs per k: fewer loads per FMA, which an Intel Xeon needed to keep pace with oneDNN at 128+
 * rows, while 8 rows x one panel streams better at decode sizes). While it works on one group of panels, a thread
 * prefetches the next group into L2 (shared among the row tiles, spread evenly over each tile's k steps; at the end
 * of a thread's range that is the other thread's first group, one wasted group a call), so the memory stream of a
 * decode step keeps many requests in flight instead of waiting on each group's first tile.
 * An activation (relu, silu, gelu in its erf form) is applied to each tile while it is in L1, after the bias.
 * Every output sums its K products in k order in one accumulator, so a row's result does not depend on the tile.
 * `panel_linear_bf16w` reads the same panels with bfloat16 elements (half the bytes streamed per decode step, for
 * CPUs without bfloat16 matmul instructions): each weight vector is widened to float32 in registers as it is loaded
 * (exact: a bfloat16 is the top half of a float32), x, bias and output stay float32, and the sums run in the same
 * order, so its result is the float32 kernel's on the widened weight, bit for bit.
 * `panel_linear_isa` names the code path built; without AVX-512F or AVX2 + FMA at build time it is "none",
 * `panel_linear_supported` returns 0 and the front end keeps oneDNN's path.
 */
#include <stdint.h>

#define PANEL 32
#define LINE_BYTES 64
#define ALWAYS_INLINE static inline __attribute__((always_inline))

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

#if defined(__AVX512F__)
#include "panel_linear_avx512.h"
#elif defined(__AVX2__) && defined(__FMA__)
#include "panel_linear_avx2.h"
#endif

#if defined(PANEL_LINEAR_ISA)

int panel_linear_supported(void) { return 1; }

const char *panel_linear_isa(void) { return PANEL_LINEAR_ISA; }

/* out [num_rows, n_size] (row stride out_stride) = activation(x [num_rows, k_size] (row stride x_stride) W^T + bias)
 * (bias may be NULL; activation one of the enum in tile_activation.h); panels as described above, of float32
 * elements, or of bfloat16 ones where `bf16` (a constant in each copy). */
ALWAYS_INLINE void panel_linear(const float *x, int64_t x_stride, int64_t num_rows, int64_t k_size, const char *panels,
                                int64_t n_size, const float *bias, int activation, float *out, int64_t out_stride,
                                int num_threads, const int bf16) {
    const int64_t num_panels = (n_size + PANEL - 1) / PANEL;
    const int64_t panel_bytes = k_size * PANEL * (bf16 ? 2 : 4);
    const int64_t panels_per_group = group_panels(num_rows);
    const int64_t num_groups = (num_panels + panels_per_group - 1) / panels_per_group;
#pragma omp parallel for num_threads(num_threads) schedule(static)
    for (int64_t g = 0; g < num_groups; g++) {
        const int64_t first_panel = g * panels_per_group, first_col = first_panel * PANEL;
        const int64_t panels_here = min64(panels_per_group, num_panels - first_panel);
        const int64_t next_panel = first_panel + panels_here;
        const int64_t next_panels = min64(panels_per_group, num_panels - next_panel);
        const int64_t cols = min64(n_size - first_col, panels_here * PANEL);
        const char *group = panels + first_panel * panel_bytes, *next = panels + next_panel * panel_bytes;
        const float *group_bias = bias ? bias + first_col : 0;
        const int64_t next_lines = next_panels * panel_bytes / LINE_BYTES;
        /* bf16 is a shared variable inside the OpenMP body: branch once here so each copy has it as a constant
         * (a runtime test in the k loop costs registers and a branch per step) */
        if (bf16)
            panel_group(x, x_stride, num_rows, k_size, group, (int)panels_here, group_bias, out + first_col,
                        out_stride, cols, activation, next, next_lines, 1);
        else
            panel_group(x, x_stride, num_rows, k_size, group, (int)panels_here, group_bias, out + first_col,
                        out_stride, cols, activation, next, next_lines, 0);
    }
}

#else

int panel_linear_supported(void) { return 0; }

const char *panel_linear_isa(void) { return "none"; }

static inline void panel_linear(const float *x, int64_t x_stride, int64_t num_rows, int64_t k_size,
                                const char *panels, int64_t n_size, const float *bias, int activation, float *out,
                                int64_t out_stride, int num_threads, const int bf16) {
    (void)x, (void)x_stride, (void)num_rows, (void)k_size, (void)panels, (void)n_size, (void)bias, (void)activation,
        (void)out, (void)out_stride, (void)num_threads, (void)bf16;
}

#endif

void panel_linear_f32(const float *x, int64_t x_stride, int64_t num_rows, int64_t k_size, const float *panels,
                      int64_t n_size, const float *bias, int activation, float *out, int64_t out_stride,
                      int num_threads) {
    panel_linear(x, x_stride, num_rows, k_size, (const char *)panels, n_size, bias, activation, out, out_stride,
                 num_threads, 0);
}

/* The same on panels of bfloat16 weights (uint16 bit patterns), widened to float32 as they are loaded. */
void panel_linear_bf16w(const float *x, int64_t x_stride, int64_t num_rows, int64_t k_size, const uint16_t *panels,
                        int64_t n_size, const float *bias, int activation, float *out, int64_t out_stride,
                        int num_threads) {
    panel_linear(x, x_stride, num_rows, k_size, (const char *)panels, n_size, bias, activation, out, out_stride,
                 num_threads, 1);
}
