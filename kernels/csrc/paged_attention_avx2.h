/* The tiles of paged_attention_cpu.c's two passes written for AVX2 + FMA (included by it where the compiler targets
 * AVX2 and FMA but not AVX-512; the passes that walk a run over them are paged_attention_passes.h). The same tiles
 * as paged_attention_avx512.h, sized for 16 ymm registers of 8 floats:
 * scores pass: one dot product per (query row, cached position) in two independent sums; SCORE_ROWS 2 rows reading
 * one kv head x 4 positions share each K and query load (8 sums).
 * values pass: 3 query rows x 32 output floats accumulate in 12 registers over every cached position, then are
 * divided by their softmax sums and stored once; 6 rows reading one kv head x 16 floats (12 sums) share each V load.
 * Row tails shorter than 8 floats take masked loads (float32) or a zero-padded copy (bfloat16: AVX2 has no masked
 * 16-bit load).
 */
#include <immintrin.h>
#include <string.h>

#include "lane_mask.h"

#define ALWAYS_INLINE static inline __attribute__((always_inline))
#define TILE_ROWS 3
#define TILE_WIDTH 32 /* floats of a head's row in one values tile: 4 registers */
#define SHARED_MIN_HEAD_SIZE 256
#define SCORE_ROWS 2
#define SHARED_VALUE_ROWS 6
#define SHARED_VALUE_WIDTH 16
#define VALUE_PREFETCH_ROWS 16

/* `count` (>= 8: all 8) floats of a cache from element `index`, widened from bfloat16 when `bf16`; lanes past
 * `count` are zero. */
ALWAYS_INLINE __m256 load_lanes(const void *cache, int64_t index, int64_t count, const int bf16) {
    if (bf16) {
        __m128i half;
        if (count >= 8) {
            half = _mm_loadu_si128((const __m128i *)((const uint16_t *)cache + index));
        } else {
            uint16_t padded[8] = {0};
            if (count > 0) memcpy(padded, (const uint16_t *)cache + index, sizeof(uint16_t) * count);
            half = _mm_loadu_si128((const __m128i *)padded);
        }
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16));
    }
    if (count >= 8) return _mm256_loadu_ps((const float *)cache + index);
    return _mm256_maskload_ps((const float *)cache + index, lanes8(count));
}

ALWAYS_INLINE __m256 load_floats(const float *row, int64_t count) { return load_lanes(row, 0, count, 0); }

ALWAYS_INLINE void store_floats(float *row, int64_t count, __m256 value) {
    if (count >= 8)
        _mm256_storeu_ps(row, value);
    else if (count > 0)
        _mm256_maskstore_ps(row, lanes8(count), value);
}

ALWAYS_INLINE float sum_of_lanes(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* The lane sums of four registers, in order. */
ALWAYS_INLINE __m128 sum_of_four(__m256 a, __m256 b, __m256 c, __m256 d) {
    const __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d)); /* a b c d per 128-bit half */
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

/* The scaled score (before any position bias) of query row `r` (at `q_row`) against the run's position `t`. */
ALWAYS_INLINE float row_score(const Job *job, const Scratch *scratch, const float *q_row, int64_t r, int64_t t,
                              const int bf16) {
    const int64_t d = job->head_size;
    const int64_t k_start = scratch->slots[t] * job->num_kv_heads * d + scratch->kv_offsets[r];
    __m256 even = _mm256_setzero_ps(), odd = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= d; i += 16) {
        even = _mm256_fmadd_ps(_mm256_loadu_ps(q_row + i), load_lanes(job->key_cache, k_start + i, 8, bf16), even);
        odd = _mm256_fmadd_ps(_mm256_loadu_ps(q_row + i + 8), load_lanes(job->key_cache, k_start + i + 8, 8, bf16),
                              odd);
    }
    for (; i < d; i += 8)
        even = _mm256_fmadd_ps(load_floats(q_row + i, d - i), load_lanes(job->key_cache, k_start + i, d - i, bf16),
                               even);
    return sum_of_lanes(_mm256_add_ps(even, odd)) * job->scale;
}

/* Scores of SCORE_ROWS rows reading one kv head against SCORE_POSITIONS positions from `t`: 8 independent sums,
 * each K load feeding both rows and each query load four products; the next tile's K rows are prefetched. */
ALWAYS_INLINE void shared_scores_tile(const Job *job, const Run *run, Scratch *scratch, const float *q,
                                      int64_t first_row, int64_t t, const int bf16) {
    const int64_t d = job->head_size, element_bytes = bf16 ? 2 : 4;
    int64_t k_start[SCORE_POSITIONS];
    const char *next[SCORE_POSITIONS];
    const int prefetch = score_tile_rows(job, run, scratch, first_row, t, bf16, k_start, next);
    __m256 sum[SCORE_ROWS][SCORE_POSITIONS];
    for (int r = 0; r < SCORE_ROWS; r++)
        for (int j = 0; j < SCORE_POSITIONS; j++) sum[r][j] = _mm256_setzero_ps();
    const float *rows = q + first_row * d;
    for (int64_t i = 0; i < d; i += 8) {
        if (prefetch && (i * element_bytes) % 64 == 0)   /* once a cache line */
            for (int j = 0; j < SCORE_POSITIONS; j++) _mm_prefetch(next[j] + i * element_bytes, _MM_HINT_T0);
        __m256 k[SCORE_POSITIONS];
        for (int j = 0; j < SCORE_POSITIONS; j++) k[j] = load_lanes(job->key_cache, k_start[j] + i, d - i, bf16);
        for (int r = 0; r < SCORE_ROWS; r++) {
            const __m256 query = load_floats(rows + r * d + i, d - i);
            for (int j = 0; j < SCORE_POSITIONS; j++) sum[r][j] = _mm256_fmadd_ps(query, k[j], sum[r][j]);
        }
    }
    const __m128 scale = _mm_set1_ps(job->scale);
    for (int r = 0; r < SCORE_ROWS; r++)
        _mm_storeu_ps(scratch->scores + (first_row + r) * run->context + t,
                      _mm_mul_ps(sum_of_four(sum[r][0], sum[r][1], sum[r][2], sum[r][3]), scale));
}

/* out[rows x TILE_WIDTH floats from `column`] of `rows` query rows from `first_row`, normalised by their sums. */
ALWAYS_INLINE void values_tile(const Job *job, const Run *run, const Scratch *scratch, int64_t first_row,
                               int64_t column, const int rows, const int bf16) {
    const int64_t d = job->head_size, width = job->num_kv_heads * d, context = run->context;
    __m256 sum[TILE_ROWS][4];
    for (int k = 0; k < rows; k++)
        for (int j = 0; j < 4; j++) sum[k][j] = _mm256_setzero_ps();
    const float *probs = scratch->scores + first_row * context;
    const int64_t *offsets = scratch->kv_offsets + first_row;
    for (int64_t t = 0; t < context; t++) {
        const int64_t row_start = scratch->slots[t] * width + column;
        for (int k = 0; k < rows; k++) {
            const __m256 p = _mm256_set1_ps(probs[k * context + t]);
            for (int j = 0; j < 4; j++)
                sum[k][j] = _mm256_fmadd_ps(
                    p, load_lanes(job->value_cache, row_start + offsets[k] + 8 * j, d - column - 8 * j, bf16),
                    sum[k][j]);
        }
    }
    float *out = job->out + (run->first * job->num_heads + first_row) * d + column;
    for (int k = 0; k < rows; k++) {
        const __m256 inverse = _mm256_set1_ps(1.0f / scratch->sums[first_row + k]);
        for (int j = 0; j < 4; j++)
            store_floats(out + k * d + 8 * j, d - column - 8 * j, _mm256_mul_ps(sum[k][j], inverse));
    }
}

/* values_tile for the 1 or 2 rows left at the end of a run. */
ALWAYS_INLINE void values_tail_tile(const Job *job, const Run *run, const Scratch *scratch, int64_t first_row,
                                    int64_t column, const int rows, const int bf16) {
    if (rows == 1)
        values_tile(job, run, scratch, first_row, column, 1, bf16);
    else
        values_tile(job, run, scratch, first_row, column, 2, bf16);
}

/* out[SHARED_VALUE_ROWS rows reading one kv head x 16 floats from `column`]: each V load feeds six rows, whose 12
 * sums stay in registers over every position. */
ALWAYS_INLINE void shared_values_tile(const Job *job, const Run *run, const Scratch *scratch, int64_t first_row,
                                      int64_t column, const int bf16) {
    const int64_t d = job->head_size, width = job->num_kv_heads * d, context = run->context;
    const int64_t offset = scratch->kv_offsets[first_row] + column;
    __m256 sum[SHARED_VALUE_ROWS][2];
    for (int k = 0; k < SHARED_VALUE_ROWS; k++)
        for (int j = 0; j < 2; j++) sum[k][j] = _mm256_setzero_ps();
    const float *probs = scratch->scores + first_row * context;
    const int64_t element_bytes = bf16 ? 2 : 4;
    for (int64_t t = 0; t < context; t++) {
        const int64_t row_start = scratch->slots[t] * width + offset;
        /* the rows are a block's stride apart: no hardware prefetcher follows them */
        if (t + VALUE_PREFETCH_ROWS < context)
            _mm_prefetch((const char *)job->value_cache +
                             (scratch->slots[t + VALUE_PREFETCH_ROWS] * width + offset) * element_bytes,
                         _MM_HINT_T0);
        __m256 v[2];
        for (int j = 0; j < 2; j++) v[j] = load_lanes(job->value_cache, row_start + 8 * j, d - column - 8 * j, bf16);
        for (int k = 0; k < SHARED_VALUE_ROWS; k++) {
            const __m256 p = _mm256_set1_ps(probs[k * context + t]);
            for (int j = 0; j < 2; j++) sum[k][j] = _mm256_fmadd_ps(p, v[j], sum[k][j]);
        }
    }
    float *out = job->out + (run->first * job->num_heads + first_row) * d + column;
    for (int k = 0; k < SHARED_VALUE_ROWS; k++) {
        const __m256 inverse = _mm256_set1_ps(1.0f / scratch->sums[first_row + k]);
        for (int j = 0; j < 2; j++)
            store_floats(out + k * d + 8 * j, d - column - 8 * j, _mm256_mul_ps(sum[k][j], inverse));
    }
}

#include "paged_attention_passes.h"
