/* int8 linear layer y = (x_q W_q^T) * row_scale * column_scale (+ bias) on column panels: AVX-512 VNNI, AVX-VNNI or
 * AVX2.
 *
 * Built on first use by kernels/native.py and called through ctypes (front end: kernels/native_int8.py).
 * Weights: symmetric per-output-channel int8 in [-127, 127], stored as panels [ceil(N / 32)][ceil(K / 4)][32][4]:
 * for each group of 4 input channels, the 4 weights of each of 32 output columns side by side (zero-padded past N
 * and K), which is the operand layout of vpdpbusd. Activations: each row of x is quantized in this call to
 * q = round(x * 127 / max|x_row|) in [-127, 127]; for vpdpbusd (which multiplies unsigned by signed bytes) it is
 * stored as the unsigned byte q + 128, and the column offsets 128 * sum_k W_q[n, k], computed once at packing, take
 * the +128 back out of the int32 sums exactly. One scale per row keeps a row with outliers from coarsening the other
 * rows. As in panel_linear_cpu.c, each thread streams a contiguous range of panels once, and a tile of int32 sums
 * accumulates in registers over the whole K; the scales, bias and activation are applied to the tile in L1.
 * The tiles are per instruction set: int8_linear_avx512.h (AVX-512 VNNI/BW, 8 x 32 tiles) and int8_linear_avx2.h
 * (AVX-VNNI, or plain AVX2 with exact vpmaddubsw products); every path computes the same integer sums and floats.
 * `int8_linear_isa` names the path built; without AVX2 at build time it is "none", `int8_linear_supported`
 * returns 0 and the front end keeps fbgemm's path.
 */
#include <stdint.h>
#include <string.h>

#define PANEL 32
#define GROUP 4
#define ALWAYS_INLINE static inline __attribute__((always_inline))

typedef struct {
    const int32_t *offsets;     /* 128 * sum_k W_q[n, k] for the panel's columns */
    const float *column_scale;  /* the weight's per-column scales */
    const float *bias;          /* NULL for none */
    int64_t cols;               /* valid columns of the panel (<= PANEL) */
    int activation;
} PanelEpilogue;

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include "int8_linear_avx512.h"
#elif defined(__AVX2__)
#include "int8_linear_avx2.h"
#endif

#if defined(INT8_LINEAR_ISA)

int int8_linear_supported(void) { return 1; }

const char *int8_linear_isa(void) { return INT8_LINEAR_ISA; }

/* out [num_rows, n_size] (row stride out_stride) = activation(quantized(x) W_q^T * scales + bias). x is
 * [num_rows, k_size] float32 (row stride x_stride); xq [num_rows, k_groups * 4] and row_scale [num_rows] are scratch
 * the caller allocates; offsets and column_scale have ceil(n_size / 32) * 32 entries (column_scale zero-padded). */
void int8_linear(const float *x, int64_t x_stride, int64_t num_rows, int64_t k_size, const int8_t *panels,
                 const int32_t *offsets, const float *column_scale, int64_t n_size, const float *bias,
                 int activation, uint8_t *xq, float *row_scale, float *out, int64_t out_stride, int num_threads) {
    const int64_t k_groups = (k_size + GROUP - 1) / GROUP, k_padded = k_groups * GROUP;
    const int64_t num_panels = (n_size + PANEL - 1) / PANEL;
#pragma omp parallel num_threads(num_threads)
    {
#pragma omp for schedule(static)
        for (int64_t row = 0; row < num_rows; row++)
            quantize_row(x + row * x_stride, k_size, k_padded, xq + row * k_padded, row_scale + row);
#pragma omp for schedule(static)
        for (int64_t p = 0; p < num_panels; p++) {
            const int64_t first_col = p * PANEL, cols = n_size - first_col < PANEL ? n_size - first_col : PANEL;
            const PanelEpilogue epilogue = {offsets + first_col, column_scale + first_col,
                                            bias ? bias + first_col : 0, cols, activation};
            panel_all_rows(xq, k_padded, num_rows, k_groups, panels + p * k_groups * PANEL * GROUP, row_scale,
                           &epilogue, out + first_col, out_stride);
        }
    }
}

#else

int int8_linear_supported(void) { return 0; }

const char *int8_linear_isa(void) { return "none"; }

void int8_linear(const float *x, int64_t x_stride, int64_t num_rows, int64_t k_size, const int8_t *panels,
                 const int32_t *offsets, const float *column_scale, int64_t n_size, const float *bias,
                 int activation, uint8_t *xq, float *row_scale, float *out, int64_t out_stride, int num_threads) {
    (void)x, (void)x_stride, (void)num_rows, (void)k_size, (void)panels, (void)offsets, (void)column_scale,
        (void)n_size, (void)bias, (void)activation, (void)xq, (void)row_scale, (void)out, (void)out_stride,
        (void)num_threads;
}

#endif
