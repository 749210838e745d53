/* The rows and cached positions of the tiles of paged_attention_avx512.h and paged_attention_avx2.h (included by
 * paged_attention_cpu.c before them). The tiles take the rows reading one kv head together -- every sequence of a run
 * times the query heads of the kv head's group -- so each K/V load feeds all of them (paged_attention_passes.h).
 */
#ifndef PAGED_ATTENTION_GROUPS_H
#define PAGED_ATTENTION_GROUPS_H

#define SCORE_POSITIONS 4 /* positions of a scores tile, in both instruction sets' tiles */
/* The tiles walk positions in chunks of this many, every kv head over one chunk before the next, and fetch the rows
 * of their kv head a chunk ahead. */
#define GROUP_CHUNK 32

/* The run's row of row `k` of kv head `head`'s group, whose rows are (sequence, query head of the group) pairs,
 * sequence-major like the run's. */
static inline int64_t group_row(const Job *job, int64_t head, int64_t k) {
    const int64_t group = job->num_heads / job->num_kv_heads;
    return k / group * job->num_heads + head * group + k % group;
}

/* The query, position-bias (NULL without one) and score rows of rows `first` to `first + rows` of kv head `head`'s
 * group. */
static inline void group_tile_rows(const Job *job, const Run *run, Scratch *scratch, int64_t head, int64_t first,
                                   int rows, const float **query, const float **bias, float **scores) {
    for (int r = 0; r < rows; r++) {
        const int64_t row = group_row(job, head, first + r), seq_row = run->first * job->num_heads + row;
        query[r] = job->query + seq_row * job->head_size;
        bias[r] = job->position_bias ? job->position_bias + seq_row * job->bias_len : NULL;
        scores[r] = scratch->scores + row * run->context;
    }
}

/* The probability rows, output rows (from `column`) and output factors of rows `first` to `first + rows` of kv head
 * `head`'s group: after the `last` chunk of positions the sums are divided by the softmax sums. */
static inline void group_value_rows(const Job *job, const Run *run, const Scratch *scratch, int64_t head,
                                    int64_t first, int rows, int64_t column, int last, const float **probs,
                                    float **out, float *factor) {
    for (int k = 0; k < rows; k++) {
        const int64_t row = group_row(job, head, first + k);
        probs[k] = scratch->scores + row * run->context;
        out[k] = job->out + (run->first * job->num_heads + row) * job->head_size + column;
        factor[k] = last ? 1.0f / scratch->sums[row] : 1.0f;
    }
}

/* Where the K rows of a scores tile (SCORE_POSITIONS positions from `t`, `offset` elements into each token's row)
 * start, in elements, and where those GROUP_CHUNK positions on start, to prefetch; returns whether there are.
 * The values pass reads the tile's V rows next: a run whose V rows fit in a quarter of the L2 fetches them into the
 * L2 here, where the values pass finds them (a short context is all one chunk, ahead of which nothing was fetched);
 * a longer run's K stream would evict them before they are read, so they come from memory twice (decisions §31). */
static inline int score_tile_rows(const Job *job, const Run *run, const Scratch *scratch, int64_t offset, int64_t t,
                                  int bf16, int64_t *k_start, const char **next) {
    const int64_t width = job->num_kv_heads * job->head_size, element_bytes = bf16 ? 2 : 4;
    const int prefetch = t + GROUP_CHUNK + SCORE_POSITIONS <= run->context;
    const int64_t v_bytes =
        run->context * width * element_bytes <= job->v_prefetch_bytes ? job->head_size * element_bytes : 0;
    for (int j = 0; j < SCORE_POSITIONS; j++) {
        k_start[j] = scratch->slots[t + j] * width + offset;
        next[j] = (const char *)job->key_cache +
                  (prefetch ? scratch->slots[t + GROUP_CHUNK + j] * width + offset : 0) * element_bytes;
        for (int64_t byte = 0; byte < v_bytes; byte += 64)
            __builtin_prefetch((const char *)job->value_cache + k_start[j] * element_bytes + byte, 0, 2);
    }
    return prefetch;
}

#endif
