/* The tiles of paged_attention_cpu.c's two passes written for AVX-512 (included by it when the CPU has
 * AVX-512F/BW/VL; the passes that walk a run over them are paged_attention_passes.h), bfloat16 rows widened in
 * registers:
 * scores: tiles of up to 6 rows reading one kv head x 4 positions (24 sums), each K load feeding every row and the
 * four positions' sums reduced together (sum_of_four); row_score for the last positions of a context.
 * values: tiles of up to 6 rows reading one kv head x 64 output floats (24 sums in registers over a chunk of
 * positions), each V load feeding every row.
 */
#include <immintrin.h>

#include "lane_mask.h"

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* 16 (masked) floats of a cache from element `index`, widened from bfloat16 when `bf16`. */
ALWAYS_INLINE __m512 load_lanes(const void *cache, int64_t index, __mmask16 mask, const int bf16) {
    if (bf16) {
        const __m256i half = _mm256_maskz_loadu_epi16(mask, (const uint16_t *)cache + index);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
    }
    return _mm512_maskz_loadu_ps(mask, (const float *)cache + index);
}

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

/* Scores of `rows` rows of kv head `head`'s group (from its row `first`) x positions t0 to t1 (a multiple of
 * SCORE_POSITIONS), with their position bias: tiles of rows x SCORE_POSITIONS sums, so each K load feeds every row
 * and each query load four positions. Up to 6 rows: 24 sums, 4 K and a query register. */
#define GROUP_SCORE_ROWS 6
ALWAYS_INLINE void group_scores_tile(const Job *job, const Run *run, Scratch *scratch, int64_t head, int64_t first,
                                     int64_t t0, int64_t t1, const int rows, const int bf16) {
    const int64_t d = job->head_size, element_bytes = bf16 ? 2 : 4;
    const float *query[GROUP_SCORE_ROWS], *bias[GROUP_SCORE_ROWS];
    float *scores[GROUP_SCORE_ROWS];
    group_tile_rows(job, run, scratch, head, first, rows, query, bias, scores);
    const __m128 scale = _mm_set1_ps(job->scale);
    for (int64_t t = t0; t < t1; t += SCORE_POSITIONS) {
        int64_t k_start[SCORE_POSITIONS];
        const char *next[SCORE_POSITIONS];
        const int prefetch = score_tile_rows(job, run, scratch, head * d, t, bf16, k_start, next);
        __m512 sum[GROUP_SCORE_ROWS][SCORE_POSITIONS];
        for (int r = 0; r < rows; r++)
            for (int j = 0; j < SCORE_POSITIONS; j++) sum[r][j] = _mm512_setzero_ps();
        for (int64_t i = 0; i < d; i += 16) {
            const __mmask16 mask = lanes(d - i);
            if (prefetch && (i * element_bytes) % 64 == 0)   /* once a cache line */
                for (int j = 0; j < SCORE_POSITIONS; j++) _mm_prefetch(next[j] + i * element_bytes, _MM_HINT_T1);
            __m512 k[SCORE_POSITIONS];
            for (int j = 0; j < SCORE_POSITIONS; j++) k[j] = load_lanes(job->key_cache, k_start[j] + i, mask, bf16);
            for (int r = 0; r < rows; r++) {
                const __m512 q = _mm512_maskz_loadu_ps(mask, query[r] + i);
                for (int j = 0; j < SCORE_POSITIONS; j++) sum[r][j] = _mm512_fmadd_ps(q, k[j], sum[r][j]);
            }
        }
        for (int r = 0; r < rows; r++) {
            const __m128 score = _mm_mul_ps(sum_of_four(sum[r][0], sum[r][1], sum[r][2], sum[r][3]), scale);
            _mm_storeu_ps(scores[r] + t, bias[r] ? _mm_add_ps(score, _mm_loadu_ps(bias[r] + t)) : score);
        }
    }
}

/* out[rows x 64 floats from `column`] of `rows` rows of kv head `head`'s group (from its row `first`) over positions
 * t0 to t1: the sums start from the output the chunks before left (zero at the first), each V load feeds every row,
 * and the last chunk divides them by the softmax sums. Up to 6 rows: 24 sums, 4 V and a probability register. */
#define GROUP_VALUE_ROWS 6
#define GROUP_VALUE_WIDTH 64
ALWAYS_INLINE void group_values_tile(const Job *job, const Run *run, const Scratch *scratch, int64_t head,
                                     int64_t first, int64_t column, int64_t t0, int64_t t1, const int rows,
                                     const int bf16) {
    const int64_t d = job->head_size, width = job->num_kv_heads * d, context = run->context;
    const int64_t offset = head * d + column, element_bytes = bf16 ? 2 : 4;
    const float *probs[GROUP_VALUE_ROWS];
    float *out[GROUP_VALUE_ROWS], factor[GROUP_VALUE_ROWS];
    group_value_rows(job, run, scratch, head, first, rows, column, t1 == context, probs, out, factor);
    __mmask16 mask[4];
    for (int j = 0; j < 4; j++) mask[j] = lanes(d - column - 16 * j);
    __m512 sum[GROUP_VALUE_ROWS][4];
    for (int k = 0; k < rows; k++)
        for (int j = 0; j < 4; j++)
            sum[k][j] = t0 ? _mm512_maskz_loadu_ps(mask[j], out[k] + 16 * j) : _mm512_setzero_ps();
    for (int64_t t = t0; t < t1; t++) {
        const int64_t row_start = scratch->slots[t] * width + offset;
        if (t + GROUP_CHUNK < context) {
            const char *ahead = (const char *)job->value_cache +
                                (scratch->slots[t + GROUP_CHUNK] * width + offset) * element_bytes;
            for (int64_t byte = 0; byte < 64 * element_bytes; byte += 64) _mm_prefetch(ahead + byte, _MM_HINT_T1);
        }
        __m512 v[4];
        for (int j = 0; j < 4; j++) v[j] = load_lanes(job->value_cache, row_start + 16 * j, mask[j], bf16);
        for (int k = 0; k < rows; k++) {
            const __m512 p = _mm512_set1_ps(probs[k][t]);
            for (int j = 0; j < 4; j++) sum[k][j] = _mm512_fmadd_ps(p, v[j], sum[k][j]);
        }
    }
    for (int k = 0; k < rows; k++)
        for (int j = 0; j < 4; j++)
            _mm512_mask_storeu_ps(out[k] + 16 * j, mask[j], _mm512_mul_ps(sum[k][j], _mm512_set1_ps(factor[k])));
}

/* The group tiles with `rows` (1 to 6) a constant in each copy. */
ALWAYS_INLINE void group_scores_rows(const Job *job, const Run *run, Scratch *scratch, int64_t head, int64_t first,
                                     int64_t t0, int64_t t1, const int rows, const int bf16) {
    switch (rows) {
        case 1: group_scores_tile(job, run, scratch, head, first, t0, t1, 1, bf16); break;
        case 2: group_scores_tile(job, run, scratch, head, first, t0, t1, 2, bf16); break;
        case 3: group_scores_tile(job, run, scratch, head, first, t0, t1, 3, bf16); break;
        case 4: group_scores_tile(job, run, scratch, head, first, t0, t1, 4, bf16); break;
        case 5: group_scores_tile(job, run, scratch, head, first, t0, t1, 5, bf16); break;
        default: group_scores_tile(job, run, scratch, head, first, t0, t1, 6, bf16);
    }
}

#include "paged_attention_passes.h"
