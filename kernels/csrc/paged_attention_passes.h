/* The two passes of paged_attention_cpu.c over the tiles of one instruction set (included by
 * paged_attention_avx512.h and paged_attention_avx2.h after their tiles), so both sets walk a run the same way.
 *
 * A run walks head-major: the rows reading one kv head (every sequence of the run times the query heads of its
 * group; sequence-major rows put the beams of a request that read one kv head num_heads rows apart) share each K/V
 * load. Scores take tiles of up to GROUP_SCORE_ROWS rows x SCORE_POSITIONS positions and values tiles of up to
 * GROUP_VALUE_ROWS rows x GROUP_VALUE_WIDTH floats (the tile headers' group_scores_rows, group_values_rows below;
 * `rows` a constant in each copy); a larger group splits into even parts (7 rows into 4 and 3), each loading the
 * chunk's K/V again, from the L1. Positions go in chunks of GROUP_CHUNK, every kv head over one chunk before the
 * next, so the cached rows are read whole while they are in cache, in the order they lie in memory.
 */
#ifndef PAGED_ATTENTION_PASSES_H
#define PAGED_ATTENTION_PASSES_H

/* The size of part `part` of a group of `rows` rows split into `parts` parts as even as possible. */
ALWAYS_INLINE int part_rows(int64_t rows, int64_t parts, int64_t part) {
    return (int)(rows / parts + (part < rows % parts));
}

/* group_values_tile with `rows` a constant in each copy (1 to 6; each tile header sizes its own values tile). */
ALWAYS_INLINE void group_values_rows(const Job *job, const Run *run, const Scratch *scratch, int64_t head,
                                     int64_t first, int64_t column, int64_t t0, int64_t t1, const int rows,
                                     const int bf16) {
    switch (rows) {
        case 1: group_values_tile(job, run, scratch, head, first, column, t0, t1, 1, bf16); break;
        case 2: group_values_tile(job, run, scratch, head, first, column, t0, t1, 2, bf16); break;
        case 3: group_values_tile(job, run, scratch, head, first, column, t0, t1, 3, bf16); break;
        case 4: group_values_tile(job, run, scratch, head, first, column, t0, t1, 4, bf16); break;
        case 5: group_values_tile(job, run, scratch, head, first, column, t0, t1, 5, bf16); break;
        default: group_values_tile(job, run, scratch, head, first, column, t0, t1, 6, bf16);
    }
}

ALWAYS_INLINE void scores_of(const Job *job, const Run *run, Scratch *scratch, const int bf16) {
    const int64_t rows = run->rows / job->num_kv_heads, parts = (rows + GROUP_SCORE_ROWS - 1) / GROUP_SCORE_ROWS;
    const int64_t full_t = run->context - run->context % SCORE_POSITIONS, d = job->head_size;
    for (int64_t t0 = 0; t0 < full_t; t0 += GROUP_CHUNK) {
        const int64_t t1 = t0 + GROUP_CHUNK < full_t ? t0 + GROUP_CHUNK : full_t;
        for (int64_t head = 0; head < job->num_kv_heads; head++)
            for (int64_t part = 0, first = 0; part < parts; first += part_rows(rows, parts, part++))
                group_scores_rows(job, run, scratch, head, first, t0, t1, part_rows(rows, parts, part), bf16);
    }
    /* the run's rows are (sequence, head) sequence-major from `first`, like the bias rows */
    const float *q = job->query + run->first * job->num_heads * d;
    const float *bias = job->position_bias ? job->position_bias + run->first * job->num_heads * job->bias_len : NULL;
    for (int64_t t = full_t; t < run->context; t++)
        for (int64_t r = 0; r < run->rows; r++)
            scratch->scores[r * run->context + t] =
                row_score(job, scratch, q + r * d, r, t, bf16) + (bias ? bias[r * job->bias_len + t] : 0.0f);
}

static void scores_pass(const Job *job, const Run *run, Scratch *scratch) {
    if (job->cache_is_bf16)
        scores_of(job, run, scratch, 1);
    else
        scores_of(job, run, scratch, 0);
}

ALWAYS_INLINE void values_of(const Job *job, const Run *run, const Scratch *scratch, const int bf16) {
    const int64_t rows = run->rows / job->num_kv_heads, parts = (rows + GROUP_VALUE_ROWS - 1) / GROUP_VALUE_ROWS;
    for (int64_t t0 = 0; t0 < run->context; t0 += GROUP_CHUNK) {
        const int64_t t1 = t0 + GROUP_CHUNK < run->context ? t0 + GROUP_CHUNK : run->context;
        for (int64_t head = 0; head < job->num_kv_heads; head++)
            for (int64_t part = 0, first = 0; part < parts; first += part_rows(rows, parts, part++))
                for (int64_t column = 0; column < job->head_size; column += GROUP_VALUE_WIDTH)
                    group_values_rows(job, run, scratch, head, first, column, t0, t1,
                                      part_rows(rows, parts, part), bf16);
    }
}

static void values_pass(const Job *job, const Run *run, Scratch *scratch) {
    if (job->cache_is_bf16)
        values_of(job, run, scratch, 1);
    else
        values_of(job, run, scratch, 0);
}

#endif
