/* The two passes of paged_attention_cpu.c over the tiles of one instruction set (included by
 * paged_attention_avx512.h and paged_attention_avx2.h after their tiles), so both sets walk a run the same way.
 *
 * Each tile header defines: row_score (one scaled dot product), shared_scores_tile (SCORE_ROWS rows reading one kv
 * head x SCORE_POSITIONS positions), values_tile (TILE_ROWS rows x TILE_WIDTH output floats, rows a constant in
 * each copy) and values_tail_tile (fewer rows), shared_values_tile (SHARED_VALUE_ROWS rows reading one kv head x
 * SHARED_VALUE_WIDTH floats), and SHARED_MIN_HEAD_SIZE.
 */
#ifndef PAGED_ATTENTION_PASSES_H
#define PAGED_ATTENTION_PASSES_H

ALWAYS_INLINE void scores_of(const Job *job, const Run *run, Scratch *scratch, const int bf16) {
    const int64_t d = job->head_size, width = job->num_kv_heads * d;
    const float *q = job->query + run->first * job->num_heads * d;
    /* the run's rows are (sequence, head) sequence-major from `first`, like the bias rows */
    const float *bias = job->position_bias ? job->position_bias + run->first * job->num_heads * job->bias_len : NULL;
    const int64_t row_bytes = width * (bf16 ? 2 : 4);
    /* The values pass reads the V rows next: fetching each with its K row overlaps the two streams. float32 rows
     * only while the run's K and V rows fit in half the L2: past that the K stream evicts V rows before the
     * values pass reads them and they come from memory twice; bfloat16 rows, widened as they are read, gain from
     * the overlap at every length measured (decisions §31). */
    const int64_t prefetch_end = bf16 || run->context * row_bytes <= job->v_prefetch_bytes ? row_bytes : 0;
    for (int64_t t = 0; t < run->context; t++) {
        const int64_t row_start = scratch->slots[t] * width;
        const char *v_row = (const char *)job->value_cache + row_start * (bf16 ? 2 : 4);
        for (int64_t byte = 0; byte < prefetch_end; byte += 64) _mm_prefetch(v_row + byte, _MM_HINT_T1);
        for (int64_t r = 0; r < run->rows; r++)
            scratch->scores[r * run->context + t] =
                row_score(job, scratch, q + r * d, r, t, bf16) + (bias ? bias[r * job->bias_len + t] : 0.0f);
    }
}

/* Whether the `count` rows from `first_row` read the same kv head (grouped-query rows of one sequence). */
ALWAYS_INLINE int share_kv_head(const Scratch *scratch, int64_t first_row, int64_t count, int64_t rows) {
    if (first_row + count > rows) return 0;
    for (int64_t k = 1; k < count; k++)
        if (scratch->kv_offsets[first_row + k] != scratch->kv_offsets[first_row]) return 0;
    return 1;
}

/* The scores of grouped rows without a position bias: shared tiles where SCORE_ROWS rows read one kv head, every
 * other score (row and position tails, rows of two kv heads) one at a time. */
ALWAYS_INLINE int shared_scores_of(const Job *job, const Run *run, Scratch *scratch, const int bf16) {
    if (job->position_bias || job->head_size < SHARED_MIN_HEAD_SIZE ||
        !share_kv_head(scratch, 0, SCORE_ROWS, run->rows))
        return 0;
    const float *q = job->query + run->first * job->num_heads * job->head_size;
    const int64_t full_t = run->context - run->context % SCORE_POSITIONS;
    for (int64_t first_row = 0; first_row < run->rows; first_row += SCORE_ROWS) {
        const int shared = share_kv_head(scratch, first_row, SCORE_ROWS, run->rows);
        const int64_t rows = run->rows - first_row < SCORE_ROWS ? run->rows - first_row : SCORE_ROWS;
        for (int64_t t = shared ? full_t : 0; t < run->context; t++)
            for (int64_t r = first_row; r < first_row + rows; r++)
                scratch->scores[r * run->context + t] =
                    row_score(job, scratch, q + r * job->head_size, r, t, bf16);
        for (int64_t t = 0; shared && t < full_t; t += SCORE_POSITIONS)
            shared_scores_tile(job, run, scratch, q, first_row, t, bf16);
    }
    return 1;
}

static void scores_pass(const Job *job, const Run *run, Scratch *scratch) {
    if (job->cache_is_bf16) {
        if (!shared_scores_of(job, run, scratch, 1)) scores_of(job, run, scratch, 1);
    } else if (!shared_scores_of(job, run, scratch, 0)) {
        scores_of(job, run, scratch, 0);
    }
}

ALWAYS_INLINE void values_of(const Job *job, const Run *run, const Scratch *scratch, const int bf16) {
    int64_t first_row = 0;
    while (job->head_size >= SHARED_MIN_HEAD_SIZE &&
           share_kv_head(scratch, first_row, SHARED_VALUE_ROWS, run->rows)) {
        for (int64_t column = 0; column < job->head_size; column += SHARED_VALUE_WIDTH)
            shared_values_tile(job, run, scratch, first_row, column, bf16);
        first_row += SHARED_VALUE_ROWS;
    }
    for (; first_row < run->rows; first_row += TILE_ROWS) {
        const int64_t rows = run->rows - first_row < TILE_ROWS ? run->rows - first_row : TILE_ROWS;
        for (int64_t column = 0; column < job->head_size; column += TILE_WIDTH) {
            if (rows == TILE_ROWS)
                values_tile(job, run, scratch, first_row, column, TILE_ROWS, bf16);
            else
                values_tail_tile(job, run, scratch, first_row, column, (int)rows, bf16);
        }
    }
}

static void values_pass(const Job *job, const Run *run, Scratch *scratch) {
    if (job->cache_is_bf16)
        values_of(job, run, scratch, 1);
    else
        values_of(job, run, scratch, 0);
}

#endif
