/* The two passes of paged_attention_cpu.c written for AVX-512 (included by it when the CPU has AVX-512F/BW/VL).
 *
 * scores_pass: one dot product per (query row, cached position), bfloat16 rows widened in registers.
 * values_pass: tiles of up to 4 query rows x 64 output floats accumulate in 16 registers over every cached
 * position, then are divided by their softmax sums and stored once. (The portable loop adds each position's
 * weighted row into the output in memory: every add waits for the previous store of the same row.)
 */
#include <immintrin.h>

#include "lane_mask.h"

#define ALWAYS_INLINE static inline __attribute__((always_inline))
#define TILE_ROWS 4
#define TILE_WIDTH 64 /* floats of a head's row in one tile: 4 registers */

/* 16 (masked) floats of a cache from element `index`, widened from bfloat16 when `bf16`. */
ALWAYS_INLINE __m512 load_lanes(const void *cache, int64_t index, __mmask16 mask, const int bf16) {
    if (bf16) {
        const __m256i half = _mm256_maskz_loadu_epi16(mask, (const uint16_t *)cache + index);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
    }
    return _mm512_maskz_loadu_ps(mask, (const float *)cache + index);
}

ALWAYS_INLINE void scores_of(const Job *job, const Run *run, Scratch *scratch, const int bf16) {
    const int64_t d = job->head_size, width = job->num_kv_heads * d;
    const float *q = job->query + run->first * job->num_heads * d;
    /* the run's rows are (sequence, head) sequence-major from `first`, like the bias rows */
    const float *bias = job->position_bias ? job->position_bias + run->first * job->num_heads * job->bias_len : NULL;
    const int64_t row_bytes = width * (bf16 ? 2 : 4);
    /* The values pass reads the V rows next: fetching each with its K row overlaps the two streams. float32 rows
     * only while the run's K and V rows fit in half the L2: past that the K stream evicts V rows before the
     * values pass reads them and they come from memory twice; bfloat16 rows, widened as they are read, gain from
     * the overlap at every length measured (decisions §71). */
    const int64_t prefetch_end = bf16 || run->context * row_bytes <= job->v_prefetch_bytes ? row_bytes : 0;
    for (int64_t t = 0; t < run->context; t++) {
        const int64_t row_start = scratch->slots[t] * width;
        const char *v_row = (const char *)job->value_cache + row_start * (bf16 ? 2 : 4);
        for (int64_t byte = 0; byte < prefetch_end; byte += 64) _mm_prefetch(v_row + byte, _MM_HINT_T1);
        for (int64_t r = 0; r < run->rows; r++) {
            const int64_t k_start = row_start + scratch->kv_offsets[r];
            __m512 sum = _mm512_setzero_ps();
            for (int64_t i = 0; i < d; i += 16) {
                const __mmask16 mask = lanes(d - i);
                sum = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, q + r * d + i),
                                      load_lanes(job->key_cache, k_start + i, mask, bf16), sum);
            }
            const float dot = _mm512_reduce_add_ps(sum);
            scratch->scores[r * run->context + t] = dot * job->scale + (bias ? bias[r * job->bias_len + t] : 0.0f);
        }
    }
}

static void scores_pass(const Job *job, const Run *run, Scratch *scratch) {
    if (job->cache_is_bf16)
        scores_of(job, run, scratch, 1);
    else
        scores_of(job, run, scratch, 0);
}

/* out[rows x 64 floats from `column`] of `rows` query rows from `first_row`, normalised by their sums. */
ALWAYS_INLINE void values_tile(const Job *job, const Run *run, const Scratch *scratch, int64_t first_row,
                               int64_t column, const int rows, const int bf16) {
    const int64_t d = job->head_size, width = job->num_kv_heads * d, context = run->context;
    __mmask16 mask[4];
    for (int j = 0; j < 4; j++) mask[j] = lanes(d - column - 16 * j);
    __m512 sum[TILE_ROWS][4];
    for (int k = 0; k < rows; k++)
        for (int j = 0; j < 4; j++) sum[k][j] = _mm512_setzero_ps();
    const float *probs = scratch->scores + first_row * context;
    const int64_t *offsets = scratch->kv_offsets + first_row;
    for (int64_t t = 0; t < context; t++) {
        const int64_t row_start = scratch->slots[t] * width + column;
        for (int k = 0; k < rows; k++) {
            const __m512 p = _mm512_set1_ps(probs[k * context + t]);
            for (int j = 0; j < 4; j++)
                sum[k][j] = _mm512_fmadd_ps(
                    p, load_lanes(job->value_cache, row_start + offsets[k] + 16 * j, mask[j], bf16), sum[k][j]);
        }
    }
    float *out = job->out + (run->first * job->num_heads + first_row) * d + column;
    for (int k = 0; k < rows; k++) {
        const __m512 inverse = _mm512_set1_ps(1.0f / scratch->sums[first_row + k]);
        for (int j = 0; j < 4; j++)
            _mm512_mask_storeu_ps(out + k * d + 16 * j, mask[j], _mm512_mul_ps(sum[k][j], inverse));
    }
}

ALWAYS_INLINE void values_of(const Job *job, const Run *run, const Scratch *scratch, const int bf16) {
    for (int64_t first_row = 0; first_row < run->rows; first_row += TILE_ROWS) {
        const int64_t rows = run->rows - first_row < TILE_ROWS ? run->rows - first_row : TILE_ROWS;
        for (int64_t column = 0; column < job->head_size; column += TILE_WIDTH) {
            switch (rows) {
                case 1: values_tile(job, run, scratch, first_row, column, 1, bf16); break;
                case 2: values_tile(job, run, scratch, first_row, column, 2, bf16); break;
                case 3: values_tile(job, run, scratch, first_row, column, 3, bf16); break;
                default: values_tile(job, run, scratch, first_row, column, TILE_ROWS, bf16);
            }
        }
    }
}

static void values_pass(const Job *job, const Run *run, Scratch *scratch) {
    if (job->cache_is_bf16)
        values_of(job, run, scratch, 1);
    else
        values_of(job, run, scratch, 0);
}
