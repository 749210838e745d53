/* The tiles of paged_attention_cpu.c's two passes written for AVX2 + FMA (included by it where the compiler targets
 * AVX2 and FMA but not AVX-512; the passes that walk a run over them are paged_attention_passes.h). The same tiles
 * as paged_attention_avx512.h, sized for 16 ymm registers of 8 floats:
 * scores: tiles of up to 2 rows reading one kv head x 4 positions (8 sums); row_score (two independent sums) for the
 * last positions of a context.
 * values: tiles of up to 6 rows reading one kv head x 32 output floats (up to 3 rows x 4 registers, or 6 rows x 2
 * registers twice: 12 sums in registers over a chunk of positions), each V load feeding every row.
 * Row tails shorter than 8 floats take masked loads (float32) or a zero-padded copy (bfloat16: AVX2 has no masked
 * 16-bit load).
 */
#include <immintrin.h>
#include <string.h>

#include "lane_mask.h"

#define ALWAYS_INLINE static inline __attribute__((always_inline))

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

/* Adds `count` (8 but at a row's end) floats from `i` of each row's query times the K rows of a scores tile to the
 * rows' sums: a constant count in the loop over a row leaves it no branches. */
ALWAYS_INLINE void group_score_step(const Job *job, const float **query, const int64_t *k_start, int64_t i,
                                    int64_t count, const int rows, const int bf16, __m256 (*sum)[SCORE_POSITIONS]) {
    __m256 k[SCORE_POSITIONS];
    for (int j = 0; j < SCORE_POSITIONS; j++) k[j] = load_lanes(job->key_cache, k_start[j] + i, count, bf16);
    for (int r = 0; r < rows; r++) {
        const __m256 q = load_floats(query[r] + i, count);
        for (int j = 0; j < SCORE_POSITIONS; j++) sum[r][j] = _mm256_fmadd_ps(q, k[j], sum[r][j]);
    }
}

/* Scores of `rows` (1 or 2) rows of kv head `head`'s group (from its row `first`) x positions t0 to t1 (a multiple
 * of SCORE_POSITIONS), with their position bias: tiles of rows x SCORE_POSITIONS sums, so each K load feeds both
 * rows and each query load four positions (8 sums, 4 K and a query register). */
#define GROUP_SCORE_ROWS 2
ALWAYS_INLINE void group_scores_tile(const Job *job, const Run *run, Scratch *scratch, int64_t head, int64_t first,
                                     int64_t t0, int64_t t1, const int rows, const int bf16) {
    const int64_t d = job->head_size, row_bytes = d * (bf16 ? 2 : 4);
    const float *query[GROUP_SCORE_ROWS], *bias[GROUP_SCORE_ROWS];
    float *scores[GROUP_SCORE_ROWS];
    group_tile_rows(job, run, scratch, head, first, rows, query, bias, scores);
    const __m128 scale = _mm_set1_ps(job->scale);
    for (int64_t t = t0; t < t1; t += SCORE_POSITIONS) {
        int64_t k_start[SCORE_POSITIONS];
        const char *next[SCORE_POSITIONS];
        if (score_tile_rows(job, run, scratch, head * d, t, bf16, k_start, next))
            for (int j = 0; j < SCORE_POSITIONS; j++)
                for (int64_t byte = 0; byte < row_bytes; byte += 64) _mm_prefetch(next[j] + byte, _MM_HINT_T1);
        __m256 sum[GROUP_SCORE_ROWS][SCORE_POSITIONS];
        for (int r = 0; r < rows; r++)
            for (int j = 0; j < SCORE_POSITIONS; j++) sum[r][j] = _mm256_setzero_ps();
        int64_t i = 0;
        for (; i + 8 <= d; i += 8) group_score_step(job, query, k_start, i, 8, rows, bf16, sum);
        if (i < d) group_score_step(job, query, k_start, i, d - i, rows, bf16, sum);
        for (int r = 0; r < rows; r++) {
            const __m128 score = _mm_mul_ps(sum_of_four(sum[r][0], sum[r][1], sum[r][2], sum[r][3]), scale);
            _mm_storeu_ps(scores[r] + t, bias[r] ? _mm_add_ps(score, _mm_loadu_ps(bias[r] + t)) : score);
        }
    }
}

#define GROUP_VALUE_ROWS 6
#define GROUP_VALUE_WIDTH 32

/* Adds position `t`'s V row (8 * regs floats from `offset`: all of them when `full`, else the `left` the head has)
 * times each row's probability to the rows' sums, fetching the row GROUP_CHUNK positions on. */
ALWAYS_INLINE void group_value_step(const Job *job, const Run *run, const Scratch *scratch, int64_t t, int64_t offset,
                                    int64_t left, const float **probs, const int rows, const int regs, const int full,
                                    const int bf16, __m256 (*sum)[4]) {
    const int64_t width = job->num_kv_heads * job->head_size, element_bytes = bf16 ? 2 : 4;
    if (t + GROUP_CHUNK < run->context)
        _mm_prefetch((const char *)job->value_cache +
                         (scratch->slots[t + GROUP_CHUNK] * width + offset) * element_bytes,
                     _MM_HINT_T1);
    __m256 v[4];
    for (int j = 0; j < regs; j++)
        v[j] = load_lanes(job->value_cache, scratch->slots[t] * width + offset + 8 * j, full ? 8 : left - 8 * j, bf16);
    for (int k = 0; k < rows; k++) {
        const __m256 p = _mm256_set1_ps(probs[k][t]);
        for (int j = 0; j < regs; j++) sum[k][j] = _mm256_fmadd_ps(p, v[j], sum[k][j]);
    }
}

/* out[rows x 8 * regs floats from `column`] over positions t0 to t1: the sums start from the output the chunks before
 * left (zero at the first) and the last chunk divides them by the softmax sums. Fewer than 8 sums (one row) take
 * even and odd positions apart, so the FMA units do not wait on chains of dependent adds. */
ALWAYS_INLINE void group_values_span(const Job *job, const Run *run, const Scratch *scratch, int64_t head,
                                     int64_t first, int64_t column, int64_t t0, int64_t t1, const int rows,
                                     const int regs, const int full, const int bf16) {
    const int64_t left = job->head_size - column, offset = head * job->head_size + column;
    const int sets = rows * regs < 8 ? 2 : 1;
    const float *probs[GROUP_VALUE_ROWS];
    float *out[GROUP_VALUE_ROWS], factor[GROUP_VALUE_ROWS];
    group_value_rows(job, run, scratch, head, first, rows, column, t1 == run->context, probs, out, factor);
    __m256 sum[2][GROUP_VALUE_ROWS][4];
    for (int u = 0; u < sets; u++)
        for (int k = 0; k < rows; k++)
            for (int j = 0; j < regs; j++)
                sum[u][k][j] = t0 && !u ? load_floats(out[k] + 8 * j, left - 8 * j) : _mm256_setzero_ps();
    int64_t t = t0;
    for (; t + sets <= t1; t += sets)
        for (int u = 0; u < sets; u++)
            group_value_step(job, run, scratch, t + u, offset, left, probs, rows, regs, full, bf16, sum[u]);
    for (; t < t1; t++) group_value_step(job, run, scratch, t, offset, left, probs, rows, regs, full, bf16, sum[0]);
    for (int k = 0; k < rows; k++)
        for (int j = 0; j < regs; j++) {
            const __m256 total = sets == 2 ? _mm256_add_ps(sum[0][k][j], sum[1][k][j]) : sum[0][k][j];
            store_floats(out[k] + 8 * j, left - 8 * j, _mm256_mul_ps(total, _mm256_set1_ps(factor[k])));
        }
}

/* group_values_span with a constant count of floats in every load where the head has all 8 * regs from `column`. */
ALWAYS_INLINE void group_values_columns(const Job *job, const Run *run, const Scratch *scratch, int64_t head,
                                        int64_t first, int64_t column, int64_t t0, int64_t t1, const int rows,
                                        const int regs, const int bf16) {
    if (job->head_size - column >= 8 * regs)
        group_values_span(job, run, scratch, head, first, column, t0, t1, rows, regs, 1, bf16);
    else
        group_values_span(job, run, scratch, head, first, column, t0, t1, rows, regs, 0, bf16);
}

/* out[rows x 32 floats from `column`] of `rows` (1 to 6) rows of kv head `head`'s group (from its row `first`): each
 * V load feeds every row; up to 3 rows in one span of 4 registers a row (12 sums), more in two of 2 (12 sums). */
ALWAYS_INLINE void group_values_tile(const Job *job, const Run *run, const Scratch *scratch, int64_t head,
                                     int64_t first, int64_t column, int64_t t0, int64_t t1, const int rows,
                                     const int bf16) {
    if (rows <= 3) {
        group_values_columns(job, run, scratch, head, first, column, t0, t1, rows, 4, bf16);
        return;
    }
    group_values_columns(job, run, scratch, head, first, column, t0, t1, rows, 2, bf16);
    if (column + 16 < job->head_size)
        group_values_columns(job, run, scratch, head, first, column + 16, t0, t1, rows, 2, bf16);
}

/* The group tiles with `rows` a constant in each copy. */
ALWAYS_INLINE void group_scores_rows(const Job *job, const Run *run, Scratch *scratch, int64_t head, int64_t first,
                                     int64_t t0, int64_t t1, const int rows, const int bf16) {
    if (rows == 1)
        group_scores_tile(job, run, scratch, head, first, t0, t1, 1, bf16);
    else
        group_scores_tile(job, run, scratch, head, first, t0, t1, 2, bf16);
}

#include "paged_attention_passes.h"
