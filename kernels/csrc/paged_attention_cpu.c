/* Paged decode attention on the CPU: one fused pass over each sequence's cached K/V rows (no gathered copy).
 *
 * Built on first use by kernels/native.py (cc -O3 -march=native -ffast-math -fopenmp) and called through
 * ctypes. Layouts match kernels/decode_attention.py: query [num_seqs, num_heads, head_size] float32 (the scores
 * are multiplied by `scale`); caches [num_blocks, block_size, num_kv_heads, head_size] float32 or bfloat16,
 * contiguous; block_tables int32 [num_seqs, max_blocks]; context_lens int32 [num_seqs] (the engine's metadata
 * dtypes, so no per-layer conversion); out float32 like query. position_bias (may be NULL) float32
 * [num_seqs, num_heads, bias_len]: entry [seq, head, t] is added to the scaled score of cached position t (T5's
 * relative position bias, computed by the caller for each step).
 * Consecutive sequences with the same length and the same blocks form a run (the beams of a request over its
 * cross-attention table): a run's K/V rows are read once for all its queries. Runs are shared among
 * `num_threads` OpenMP threads (torch's own pool: the library links the libgomp torch loaded) through an atomic
 * counter. The two passes over a run (scores, then softmax-weighted values) are paged_attention_passes.h over the
 * tiles of paged_attention_avx512.h or paged_attention_avx2.h where the build targets those instruction sets (a kv
 * head at a time, each K/V load feeding every row that reads it: paged_attention_groups.h), and the portable loops
 * below elsewhere.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DEFAULT_L2_BYTES (1 << 20) /* where sysconf does not know the L2 size */

enum { OK = 0, BAD_BLOCK = 1, NO_MEMORY = 2, OVER_CAPACITY = 3 };

typedef struct {
    const float *query;
    const void *key_cache;
    const void *value_cache;
    const int32_t *block_tables;
    const int32_t *context_lens;
    int64_t *group_starts; /* [num_groups + 1], found by find_runs */
    const float *position_bias; /* NULL, or [num_seqs * num_heads, bias_len] */
    int64_t bias_len;
    int64_t v_prefetch_bytes; /* a run's V rows are prefetched during its scores pass up to this size */
    float *out;
    float scale;
    int64_t num_groups, num_heads, num_kv_heads, head_size, block_size, max_blocks, num_blocks;
    int cache_is_bf16;
    int64_t next_group; /* work counter, taken with __atomic_fetch_add */
    int status;       /* first error seen by any thread */
} Job;

typedef struct {
    float *scores;       /* [rows, context]: one row per query head of every sequence in the run */
    float *row;          /* one token's [num_kv_heads * head_size], widened from bfloat16 */
    float *sums;         /* [rows] softmax denominators */
    int64_t *slots;      /* [context]: the cache slot of each position of the run */
    int64_t *kv_offsets; /* [rows]: where each query row's kv head starts in a token's row */
    int64_t capacity_rows, capacity_context;
} Scratch;

/* A run of sequences attending to the same cached tokens: `rows` query heads (sequence-major) from `first`. */
typedef struct {
    int64_t first, rows, context;
    const int32_t *table;
} Run;

/* The cache slot of each of a run's positions, one block-table entry at a time; BAD_BLOCK when an entry is out of
 * range. */
static int run_slots(const Job *job, const Run *run, int64_t *slots) {
    for (int64_t start = 0, b = 0; start < run->context; start += job->block_size, b++) {
        const int64_t block = run->table[b];
        if (block < 0 || block >= job->num_blocks) return BAD_BLOCK;
        const int64_t count = run->context - start < job->block_size ? run->context - start : job->block_size;
        for (int64_t j = 0; j < count; j++) slots[start + j] = block * job->block_size + j;
    }
    return OK;
}

/* Where each row of a run (sequence-major (sequence, query head) pairs) finds its kv head in a token's row. */
static void run_kv_offsets(const Job *job, int64_t rows, int64_t *offsets) {
    const int64_t group = job->num_heads / job->num_kv_heads;
    for (int64_t r = 0; r < rows; r++) offsets[r] = (r % job->num_heads) / group * job->head_size;
}

#include "paged_attention_groups.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include "paged_attention_avx512.h"
const char *paged_attention_isa(void) { return "avx512"; }
#elif defined(__AVX2__) && defined(__FMA__)
#include "paged_attention_avx2.h"
const char *paged_attention_isa(void) { return "avx2"; }
#else
const char *paged_attention_isa(void) { return "portable"; }

static const float *token_row(const Job *job, const void *cache, int64_t slot, float *widened) {
    const int64_t width = job->num_kv_heads * job->head_size;
    if (!job->cache_is_bf16) return (const float *)cache + slot * width;
    const uint16_t *src = (const uint16_t *)cache + slot * width;
    uint32_t *dst = (uint32_t *)widened;
#pragma omp simd
    for (int64_t i = 0; i < width; i++) dst[i] = (uint32_t)src[i] << 16;
    return widened;
}

static void scores_pass(const Job *job, const Run *run, Scratch *scratch) {
    const int64_t d = job->head_size;
    const float *q = job->query + run->first * job->num_heads * d;
    /* the run's rows are (sequence, head) sequence-major from `first`, like the bias rows */
    const float *bias = job->position_bias ? job->position_bias + run->first * job->num_heads * job->bias_len : NULL;
    for (int64_t t = 0; t < run->context; t++) {
        const float *keys = token_row(job, job->key_cache, scratch->slots[t], scratch->row);
        for (int64_t r = 0; r < run->rows; r++) {
            const float *k = keys + scratch->kv_offsets[r], *qr = q + r * d;
            float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
            for (int64_t i = 0; i < d; i++) dot += qr[i] * k[i];
            scratch->scores[r * run->context + t] = dot * job->scale + (bias ? bias[r * job->bias_len + t] : 0.0f);
        }
    }
}

/* out = softmax(scores) V: the probabilities still unnormalised, divided by their sums at the end. */
static void values_pass(const Job *job, const Run *run, Scratch *scratch) {
    const int64_t d = job->head_size;
    float *out = job->out + run->first * job->num_heads * d;
    memset(out, 0, sizeof(float) * run->rows * d);
    for (int64_t t = 0; t < run->context; t++) {
        const float *values = token_row(job, job->value_cache, scratch->slots[t], scratch->row);
        for (int64_t r = 0; r < run->rows; r++) {
            const float p = scratch->scores[r * run->context + t], *v = values + scratch->kv_offsets[r];
            float *o = out + r * d;
#pragma omp simd
            for (int64_t i = 0; i < d; i++) o[i] += p * v[i];
        }
    }
    for (int64_t r = 0; r < run->rows; r++) {
        const float inverse = 1.0f / scratch->sums[r];
        float *o = out + r * d;
#pragma omp simd
        for (int64_t i = 0; i < d; i++) o[i] *= inverse;
    }
}
#endif

static void softmax_rows(float *scores, int64_t rows, int64_t context, float *sums) {
    for (int64_t r = 0; r < rows; r++) {
        float *s = scores + r * context;
        float top = s[0];
        for (int64_t t = 1; t < context; t++) top = s[t] > top ? s[t] : top;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int64_t t = 0; t < context; t++) {
            s[t] = expf(s[t] - top);
            sum += s[t];
        }
        sums[r] = sum;
    }
}

static int reserve(Scratch *scratch, int64_t rows, int64_t context) {
    if (rows <= scratch->capacity_rows && context <= scratch->capacity_context) return OK;
    const int64_t new_rows = rows > scratch->capacity_rows ? rows : scratch->capacity_rows;
    const int64_t new_context = context > scratch->capacity_context ? context : scratch->capacity_context;
    free(scratch->scores);
    free(scratch->sums);
    free(scratch->slots);
    free(scratch->kv_offsets);
    scratch->scores = malloc(sizeof(float) * new_rows * new_context);
    scratch->sums = malloc(sizeof(float) * new_rows);
    scratch->slots = malloc(sizeof(int64_t) * new_context);
    scratch->kv_offsets = malloc(sizeof(int64_t) * new_rows);
    scratch->capacity_rows = scratch->capacity_context = 0;
    if (!scratch->scores || !scratch->sums || !scratch->slots || !scratch->kv_offsets) return NO_MEMORY;
    scratch->capacity_rows = new_rows;
    scratch->capacity_context = new_context;
    return OK;
}

static int attend_run(Job *job, int64_t group_index, Scratch *scratch) {
    const int64_t first = job->group_starts[group_index], count = job->group_starts[group_index + 1] - first;
    const Run run = {first, count * job->num_heads, job->context_lens[first], job->block_tables + first * job->max_blocks};
    if (run.context <= 0) {
        memset(job->out + first * job->num_heads * job->head_size, 0, sizeof(float) * run.rows * job->head_size);
        return OK;
    }
    if (reserve(scratch, run.rows, run.context) != OK) return NO_MEMORY;
    if (run_slots(job, &run, scratch->slots) != OK) return BAD_BLOCK;
    run_kv_offsets(job, run.rows, scratch->kv_offsets);
    scores_pass(job, &run, scratch);
    softmax_rows(scratch->scores, run.rows, run.context, scratch->sums);
    values_pass(job, &run, scratch);
    return OK;
}

static void *worker(void *arg) {
    Job *job = arg;
    Scratch scratch = {NULL, malloc(sizeof(float) * job->num_kv_heads * job->head_size), NULL, NULL, NULL, 0, 0};
    if (!scratch.row) __atomic_store_n(&job->status, NO_MEMORY, __ATOMIC_RELAXED);
    while (__atomic_load_n(&job->status, __ATOMIC_RELAXED) == OK) {
        const int64_t group_index = __atomic_fetch_add(&job->next_group, 1, __ATOMIC_RELAXED);
        if (group_index >= job->num_groups) break;
        const int status = attend_run(job, group_index, &scratch);
        if (status != OK) __atomic_store_n(&job->status, status, __ATOMIC_RELAXED);
    }
    free(scratch.scores);
    free(scratch.sums);
    free(scratch.slots);
    free(scratch.kv_offsets);
    free(scratch.row);
    return NULL;
}

/* Splits the sequences into runs of equal length and equal used blocks; returns the number of runs. */
static int64_t find_runs(const int32_t *tables, const int32_t *lens, int64_t num_seqs, int64_t max_blocks,
                         int64_t block_size, int64_t *starts) {
    int64_t runs = 0;
    for (int64_t seq = 0; seq < num_seqs; seq++) {
        const int64_t used = lens[seq] > 0 ? (lens[seq] + block_size - 1) / block_size : 0;
        const int same = seq > 0 && lens[seq] == lens[seq - 1] &&
                         memcmp(tables + seq * max_blocks, tables + (seq - 1) * max_blocks,
                                sizeof(int32_t) * (used < max_blocks ? used : max_blocks)) == 0;
        if (!same) starts[runs++] = seq;
    }
    starts[runs] = num_seqs;
    return runs;
}

/* Returns 0, or 1 for a block-table entry outside [0, num_blocks), 2 when memory ran out, or 3 when a context length
 * exceeds the block table's max_blocks * block_size tokens (nothing is computed then). */
int paged_attention_f32(const float *query, const void *key_cache, const void *value_cache, int cache_is_bf16,
                        const int32_t *block_tables, const int32_t *context_lens, float scale,
                        const float *position_bias, int64_t bias_len, float *out,
                        int64_t num_seqs, int64_t num_heads, int64_t num_kv_heads, int64_t head_size,
                        int64_t block_size, int64_t max_blocks, int64_t num_blocks, int num_threads) {
    for (int64_t seq = 0; seq < num_seqs; seq++)
        if (context_lens[seq] > max_blocks * block_size) return OVER_CAPACITY;
    int64_t *starts = malloc(sizeof(int64_t) * (num_seqs + 1));
    if (!starts) return NO_MEMORY;
    const int64_t num_groups = find_runs(block_tables, context_lens, num_seqs, max_blocks, block_size, starts);
    const long l2_bytes = sysconf(_SC_LEVEL2_CACHE_SIZE);
    const int64_t v_prefetch_bytes = (l2_bytes > 0 ? l2_bytes : DEFAULT_L2_BYTES) / 4;
    Job job = {query, key_cache, value_cache, block_tables, context_lens, starts, position_bias, bias_len,
               v_prefetch_bytes, out, scale, num_groups, num_heads, num_kv_heads, head_size, block_size,
               max_blocks, num_blocks, cache_is_bf16, 0, OK};
    if (num_threads > num_groups) num_threads = (int)num_groups;
    if (num_threads < 1) num_threads = 1;
#pragma omp parallel num_threads(num_threads)
    worker(&job);
    free(starts);
    return job.status;
}
