/* The activations the linear kernels apply to an output tile while it is in L1 (panel_linear_cpu.c,
 * int8_linear_cpu.c): codes shared with their Python front ends, computed as torch computes them (F.relu, F.silu,
 * F.gelu in its erf form) within float32 rounding. */
#ifndef TILE_ACTIVATION_H
#define TILE_ACTIVATION_H

#include <math.h>
#include <stdint.h>

enum { ACTIVATION_NONE = 0, ACTIVATION_RELU = 1, ACTIVATION_SILU = 2, ACTIVATION_GELU = 3 };

static void activate_tile(float *out, int64_t out_stride, int rows, int64_t cols, int activation) {
    for (int r = 0; r < rows; r++) {
        float *o = out + r * out_stride;
        if (activation == ACTIVATION_RELU)
            for (int64_t j = 0; j < cols; j++) o[j] = o[j] > 0.0f ? o[j] : 0.0f;
        else if (activation == ACTIVATION_SILU)
            for (int64_t j = 0; j < cols; j++) o[j] = o[j] / (1.0f + expf(-o[j]));
        else if (activation == ACTIVATION_GELU)
            for (int64_t j = 0; j < cols; j++) o[j] = 0.5f * o[j] * (1.0f + erff(o[j] * (float)M_SQRT1_2));
    }
}

#endif
