/* The tiles of paged_attention_cpu.c's two passes written for AVX-512 (included by it when the CPU has
 * AVX-512F/BW/VL; the passes that walk a run over them are paged_attention_passes.h).
 *
 * scores pass: one dot product per (query row, cached position), bfloat16 rows widened in registers.
 * values pass: tiles of up to 4 query rows x 64 output floats accumulate in 16 registers over every cached
 * position, then are divided by their softmax sums and stored once. (The portable loop adds each position's
 * weighted row into the output in memory: every add waits for the previous store of the same row.)
 * Many query rows over one long kv head (T5's cross-attention over the encoder states: 12 rows x 768 floats) take
 * shared tiles instead: scores of 4 rows x 4 positions and values of 6 rows, each K/V load feeding every row.
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

/* Rows of a grouped-query run that share a kv head take the shared tiles below when a head is at least this long;
 * with short heads the per-row loops already keep enough independent sums in flight. */
#define SHARED_MIN_HEAD_SIZE 256

/* The scaled score (before any position bias) of query row `r` (at `q_row`) against the run's position `t`. */
ALWAYS_INLINE float row_score(const Job *job, const Scratch *scratch, const float *q_row, int64_t r, int64_t t,
                              const int bf16) {
    const int64_t d = job->head_size;
    const int64_t k_start = scratch->slots[t] * job->num_kv_heads * d + scratch->kv_offsets[r];
    __m512 sum = _mm512_setzero_ps();
    for (int64_t i = 0; i < d; i += 16) {
        const __mmask16 mask = lanes(d - i);
        const __m512 key = load_lanes(job->key_cache, k_start + i, mask, bf16);
        sum = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, q_row + i), key, sum);
    }
    return _mm512_reduce_add_ps(sum) * job->scale;
}

/* The lane sums of four registers, in order: pairs interleaved and added, then the 128-bit quarters added. */
ALWAYS_INLINE __m128 sum_of_four(__m512 a, __m512 b, __m512 c, __m512 d) {
    const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b)); /* a0 b0 a1 b1 per quarter */
    const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
    const __m512 abcd = _mm512_add_ps(_mm512_shuffle_ps(ab, cd, 0x44), _mm512_shuffle_ps(ab, cd, 0xEE));
    const __m256 halves = _mm256_add_ps(_mm512_castps512_ps256(abcd), _mm512_extractf32x8_ps(abcd, 1));
    return _mm_add_ps(_mm256_castps256_ps128(halves), _mm256_extractf128_ps(halves, 1));
}

/* Scores of SCORE_ROWS rows reading one kv head against SCORE_POSITIONS positions from `t`: 16 independent sums,
 * so a long row (a head of hundreds of floats) is not one chain of dependent adds, and each K or query load feeds
 * four products. (Six rows spilled the sums to the stack every step.) The next tile's K rows are prefetched beside
 * this tile's loads: no hardware prefetcher follows rows a block's stride apart. */
#define SCORE_ROWS 4
ALWAYS_INLINE void shared_scores_tile(const Job *job, const Run *run, Scratch *scratch, const float *q,
                                      int64_t first_row, int64_t t, const int bf16) {
    const int64_t d = job->head_size, element_bytes = bf16 ? 2 : 4;
    int64_t k_start[SCORE_POSITIONS];
    const char *next[SCORE_POSITIONS];
    const int prefetch = score_tile_rows(job, run, scratch, first_row, t, bf16, k_start, next);
    __m512 sum[SCORE_ROWS][SCORE_POSITIONS];
    for (int r = 0; r < SCORE_ROWS; r++)
        for (int j = 0; j < SCORE_POSITIONS; j++) sum[r][j] = _mm512_setzero_ps();
    const float *rows = q + first_row * d;
    for (int64_t i = 0; i < d; i += 16) {
        const __mmask16 mask = lanes(d - i);
        if (prefetch)
#pragma GCC unroll 8
            for (int j = 0; j < SCORE_POSITIONS; j++) _mm_prefetch(next[j] + i * element_bytes, _MM_HINT_T0);
        __m512 k[SCORE_POSITIONS];
#pragma GCC unroll 8
        for (int j = 0; j < SCORE_POSITIONS; j++) k[j] = load_lanes(job->key_cache, k_start[j] + i, mask, bf16);
#pragma GCC unroll 8
        for (int r = 0; r < SCORE_ROWS; r++) {
            const __m512 query = _mm512_maskz_loadu_ps(mask, rows + r * d + i);
#pragma GCC unroll 8
            for (int j = 0; j < SCORE_POSITIONS; j++) sum[r][j] = _mm512_fmadd_ps(query, k[j], sum[r][j]);
        }
    }
    const __m128 scale = _mm_set1_ps(job->scale);
    for (int r = 0; r < SCORE_ROWS; r++)
        _mm_storeu_ps(scratch->scores + (first_row + r) * run->context + t,
                      _mm_mul_ps(sum_of_four(sum[r][0], sum[r][1], sum[r][2], sum[r][3]), scale));
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

/* out[SHARED_VALUE_ROWS rows reading one kv head x 64 floats from `column`]: each V load feeds six rows, whose
 * 24 sums stay in registers over every position. */
#define SHARED_VALUE_ROWS 6
#define SHARED_VALUE_WIDTH TILE_WIDTH
#define VALUE_PREFETCH_ROWS 16
ALWAYS_INLINE void shared_values_tile(const Job *job, const Run *run, const Scratch *scratch, int64_t first_row,
                                      int64_t column, const int bf16) {
    const int64_t d = job->head_size, width = job->num_kv_heads * d, context = run->context;
    const int64_t offset = scratch->kv_offsets[first_row] + column;
    __mmask16 mask[4];
    for (int j = 0; j < 4; j++) mask[j] = lanes(d - column - 16 * j);
    __m512 sum[SHARED_VALUE_ROWS][4];
    for (int k = 0; k < SHARED_VALUE_ROWS; k++)
        for (int j = 0; j < 4; j++) sum[k][j] = _mm512_setzero_ps();
    const float *probs = scratch->scores + first_row * context;
    const int64_t element_bytes = bf16 ? 2 : 4;
    for (int64_t t = 0; t < context; t++) {
        const int64_t row_start = scratch->slots[t] * width + offset;
        /* the rows are a block's stride apart: no hardware prefetcher follows them */
        if (t + VALUE_PREFETCH_ROWS < context) {
            const char *ahead = (const char *)job->value_cache +
                                (scratch->slots[t + VALUE_PREFETCH_ROWS] * width + offset) * element_bytes;
            for (int j = 0; j < 4; j++) _mm_prefetch(ahead + 16 * j * element_bytes, _MM_HINT_T0);
        }
        __m512 v[4];
        for (int j = 0; j < 4; j++) v[j] = load_lanes(job->value_cache, row_start + 16 * j, mask[j], bf16);
        for (int k = 0; k < SHARED_VALUE_ROWS; k++) {
            const __m512 p = _mm512_set1_ps(probs[k * context + t]);
            for (int j = 0; j < 4; j++) sum[k][j] = _mm512_fmadd_ps(p, v[j], sum[k][j]);
        }
    }
    float *out = job->out + (run->first * job->num_heads + first_row) * d + column;
    for (int k = 0; k < SHARED_VALUE_ROWS; k++) {
        const __m512 inverse = _mm512_set1_ps(1.0f / scratch->sums[first_row + k]);
        for (int j = 0; j < 4; j++)
            _mm512_mask_storeu_ps(out + k * d + 16 * j, mask[j], _mm512_mul_ps(sum[k][j], inverse));
    }
}


/* values_tile for the 1 to TILE_ROWS - 1 rows left at the end of a run (a constant in each copy). */
ALWAYS_INLINE void values_tail_tile(const Job *job, const Run *run, const Scratch *scratch, int64_t first_row,
                                    int64_t column, const int rows, const int bf16) {
    switch (rows) {
        case 1: values_tile(job, run, scratch, first_row, column, 1, bf16); break;
        case 2: values_tile(job, run, scratch, first_row, column, 2, bf16); break;
        default: values_tile(job, run, scratch, first_row, column, 3, bf16);
    }
}

#include "paged_attention_passes.h"
