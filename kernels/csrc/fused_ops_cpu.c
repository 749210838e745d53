/* Fused elementwise CPU kernels for the decoder layers: (residual add +) RMSNorm, neox rotary, SiLU-and-mul,
 * GELU(tanh)-and-mul (float32).
 *
 * Built on first use by kernels/native.py and called through ctypes (front end: kernels/native_fused.py).
 * Each one replaces 4-10 small torch kernels with one pass over the rows, rounding where HF's module rounds:
 * float32 math throughout, results stored in the tensor dtype (float32, or bfloat16 rounded to nearest even
 * after each step HF performs in bfloat16). Rows are spread over the caller's OpenMP threads (torch's pool)
 * once a call has enough work to pay for waking them. All tensors are row-major with the given row strides.
 */
#include <math.h>
#include <stdint.h>

enum { DTYPE_F32 = 0, DTYPE_BF16 = 1 };
#define PARALLEL_MIN_ELEMENTS 65536

static inline float load(const void *base, int dtype, int64_t index) {
    if (dtype == DTYPE_F32) return ((const float *)base)[index];
    union { uint32_t u; float f; } bits = {(uint32_t)((const uint16_t *)base)[index] << 16};
    return bits.f;
}

static inline uint16_t to_bf16(float value) {
    union { float f; uint32_t u; } bits = {value};
    if ((bits.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits.u >> 16) | 0x40u); /* quiet NaN */
    return (uint16_t)((bits.u + 0x7fffu + ((bits.u >> 16) & 1u)) >> 16);
}

/* `value` as the tensor dtype would hold it (identity for float32). */
static inline float round_to(int dtype, float value) {
    if (dtype == DTYPE_F32) return value;
    union { uint32_t u; float f; } bits = {(uint32_t)to_bf16(value) << 16};
    return bits.f;
}

static inline void store(void *base, int dtype, int64_t index, float value) {
    if (dtype == DTYPE_F32) ((float *)base)[index] = value;
    else ((uint16_t *)base)[index] = to_bf16(value);
}

#define INLINE static inline __attribute__((always_inline))

/* One row of rms_norm; `dtype` is a constant at each call site, so each dtype gets its own vectorised copy. */
INLINE void rms_norm_row(const void *input, int64_t in_base, const void *residual, void *residual_out,
                         const void *weight, void *out, int64_t base, int64_t width, float eps, int dtype) {
    /* summed in double: the mean is then (nearly) exact, as torch's pairwise float sum nearly is */
    double sum_squares = 0.0;
    if (residual) {
        for (int64_t i = 0; i < width; i++) {
            const float x = round_to(dtype, load(input, dtype, in_base + i) + load(residual, dtype, base + i));
            store(residual_out, dtype, base + i, x);
            sum_squares += (double)x * x;
        }
        input = residual_out;
        in_base = base;
    } else {
        for (int64_t i = 0; i < width; i++) {
            const float x = load(input, dtype, in_base + i);
            sum_squares += (double)x * x;
        }
    }
    /* float ops as torch does them, in double so -ffast-math cannot swap in an approximate rsqrt */
    const float variance = (float)(sum_squares / (double)width);
    const float root = (float)sqrt((double)(variance + eps));
    const float inverse_rms = (float)(1.0 / (double)root);
    for (int64_t i = 0; i < width; i++) {
        const float normed = round_to(dtype, load(input, dtype, in_base + i) * inverse_rms);
        store(out, dtype, base + i, load(weight, dtype, i) * normed);
    }
}

/* out = weight * dtype(x * rsqrt(mean(x^2) + eps)) per row, where x = input (+ residual when given; the sum is
 * then also written to residual_out, contiguous like out). Strides are in elements. */
void rms_norm(const void *input, int64_t input_stride, const void *residual, void *residual_out, const void *weight,
              void *out, int64_t rows, int64_t width, float eps, int dtype, int num_threads) {
#pragma omp parallel for num_threads(num_threads) if (rows * width >= PARALLEL_MIN_ELEMENTS) schedule(static)
    for (int64_t row = 0; row < rows; row++) {
        if (dtype == DTYPE_F32)
            rms_norm_row(input, row * input_stride, residual, residual_out, weight, out, row * width, width, eps,
                         DTYPE_F32);
        else
            rms_norm_row(input, row * input_stride, residual, residual_out, weight, out, row * width, width, eps,
                         DTYPE_BF16);
    }
}

/* One token's heads of rotary_neox (dtype constant per call site, as above). */
INLINE void rotary_token(const void *input, int64_t in_row, const void *cos_table, const void *sin_table,
                         int64_t table_base, void *out, int64_t out_row, int64_t heads, int64_t head_dim,
                         int dtype) {
    const int64_t half = head_dim / 2;
    for (int64_t head = 0; head < heads; head++) {
        const int64_t in_base = in_row + head * head_dim, out_base = out_row + head * head_dim;
        for (int64_t i = 0; i < half; i++) {
            const float first = load(input, dtype, in_base + i), second = load(input, dtype, in_base + half + i);
            const float cos_lo = load(cos_table, dtype, table_base + i);
            const float sin_lo = load(sin_table, dtype, table_base + i);
            const float cos_hi = load(cos_table, dtype, table_base + half + i);
            const float sin_hi = load(sin_table, dtype, table_base + half + i);
            store(out, dtype, out_base + i, round_to(dtype, first * cos_lo) + round_to(dtype, -second * sin_lo));
            store(out, dtype, out_base + half + i,
                  round_to(dtype, second * cos_hi) + round_to(dtype, first * sin_hi));
        }
    }
}

/* Neox (rotate-half) rotary of `heads` heads of head_dim starting at column `column` of each input row:
 * out = x * cos + rotate_half(x) * sin, with cos/sin [tokens, head_dim] already in the tensor dtype.
 * out is contiguous [tokens, heads * head_dim]. */
void rotary_neox(const void *input, int64_t input_stride, int64_t column, const void *cos_table,
                 const void *sin_table, void *out, int64_t tokens, int64_t heads, int64_t head_dim, int dtype,
                 int num_threads) {
    const int64_t width = heads * head_dim;
#pragma omp parallel for num_threads(num_threads) if (tokens * width >= PARALLEL_MIN_ELEMENTS) schedule(static)
    for (int64_t token = 0; token < tokens; token++) {
        const int64_t in_row = token * input_stride + column, out_row = token * width;
        if (dtype == DTYPE_F32)
            rotary_token(input, in_row, cos_table, sin_table, token * head_dim, out, out_row, heads, head_dim,
                         DTYPE_F32);
        else
            rotary_token(input, in_row, cos_table, sin_table, token * head_dim, out, out_row, heads, head_dim,
                         DTYPE_BF16);
    }
}

INLINE void silu_and_mul_row(const void *gate_up, int64_t in_base, void *out, int64_t out_base, int64_t width,
                             int dtype) {
    for (int64_t i = 0; i < width; i++) {
        const float gate = load(gate_up, dtype, in_base + i);
        const float activated = round_to(dtype, gate / (1.0f + expf(-gate)));
        store(out, dtype, out_base + i, activated * load(gate_up, dtype, in_base + width + i));
    }
}

/* out[t, i] = dtype(silu(gate)) * up for gate_up [tokens, 2 * width] (gate first, as the fused projection
 * stores it); out is contiguous [tokens, width]. */
void silu_and_mul(const void *gate_up, void *out, int64_t tokens, int64_t width, int dtype, int num_threads) {
#pragma omp parallel for num_threads(num_threads) if (tokens * width >= PARALLEL_MIN_ELEMENTS) schedule(static)
    for (int64_t token = 0; token < tokens; token++) {
        if (dtype == DTYPE_F32)
            silu_and_mul_row(gate_up, token * 2 * width, out, token * width, width, DTYPE_F32);
        else
            silu_and_mul_row(gate_up, token * 2 * width, out, token * width, width, DTYPE_BF16);
    }
}

/* out[t, i] = gelu_tanh(gate) * linear for float32 gate_linear [tokens, 2 * width] (gate first), with HF's gelu_new
 * formula 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) as written (its cancellation for negative x included,
 * so results stay within a few ulps of HF's; tanhf vectorises through libmvec). out is contiguous [tokens, width]. */
void gelu_tanh_and_mul_f32(const float *gate_linear, float *out, int64_t tokens, int64_t width, int num_threads) {
    const float c = 0.7978845608028654f;
#pragma omp parallel for num_threads(num_threads) if (tokens * width >= PARALLEL_MIN_ELEMENTS) schedule(static)
    for (int64_t token = 0; token < tokens; token++) {
        const float *gate = gate_linear + token * 2 * width, *linear = gate + width;
        float *row = out + token * width;
#pragma omp simd
        for (int64_t i = 0; i < width; i++) {
            const float x = gate[i];
            row[i] = 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * (x * x * x)))) * linear[i];
        }
    }
}
