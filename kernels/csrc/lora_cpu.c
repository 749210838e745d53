/* Grouped LoRA for a batch of rows with mixed adapters: punica's shrink (t = x A_s^T) and expand (y += t B_s^T).
 *
 * Built on first use by kernels/native.py and called through ctypes (front end: kernels/native_lora.py).
 * float32 throughout. x [rows, in] (row stride x_stride), A stacked [slots, rank, in] and B [slots, out, rank]
 * (contiguous; B's scaling folded in), t [rows, rank] (row stride t_stride), y [rows, out] (row stride y_stride: a
 * column slice of a wider output is fine). The rows with an adapter come as groups of one slot: group g is the rows
 * rows[starts[g]] .. rows[ends[g] - 1] (the runs of slot slots[g], their rows in order); rows in no group are never
 * read nor written. Rows are read and written in place, never gathered: a group is cut into tiles of up to
 * TILE_ROWS rows (decode rows of requests that share an adapter fall in one tile), and each load of A or B from L2
 * serves all the rows of a tile (register blocks of BLOCK_ROWS rows, the rest from L1).
 * shrink: a block of rows x SHRINK_RANKS ranks accumulates its dot products along `in` in vector registers.
 * expand: where a slot has OUTER_MIN_ROWS rows or more (a prefill), B_s is transposed once per call and a block of
 * rows x OUTER_VECTORS vectors of outputs accumulates rank outer products (no sums across lanes); for the other
 * slots (decode rows) a block of EXPAND_ROWS rows x 4 outputs accumulates dot products along the rank (B's rows
 * are contiguous along it), reduced to quads, then to a vector of VL outputs added to y at once. Every block has
 * a copy per row count (constant loops, nothing computed for missing rows): lora_tiles.h.
 * `lora_apply_f32` runs both per tile, its t on the stack, when there are at least as many tiles as threads; with
 * fewer (a decode step of one or two requests) it shares the ranks, then the output columns, among the threads
 * through a scratch t. The vectors are lora_avx512.h (AVX-512F), lora_avx2.h (AVX2 + FMA) or lora_portable.h (GNU C
 * vectors) by the build's target; `lora_isa` names the one built. The functions return 0, or 1 when a scratch
 * allocation failed (nothing written then).
 */
#include <stdint.h>
#include <stdlib.h>

#define ALWAYS_INLINE static inline __attribute__((always_inline))
#define TILE_ROWS 8  /* rows of a tile: every load of A or B (from L2) serves them all */
#define BLOCK_ROWS 4 /* rows of a register block: TILE_ROWS / BLOCK_ROWS blocks reuse its A or B from L1 */
#define PARALLEL_MIN_MACS (1 << 18) /* below this many multiply-adds a call runs on the calling thread */
#define OUTER_MIN_ROWS 32           /* a slot with this many rows expands from B's transpose */

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

static inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

#if defined(__AVX512F__)
#include "lora_avx512.h"
#elif defined(__AVX2__) && defined(__FMA__)
#include "lora_avx2.h"
#else
#include "lora_portable.h"
#endif

const char *lora_isa(void) { return LORA_ISA; }

/* One call's operands. The tiles of group g are tile_offsets[g] .. tile_offsets[g + 1] - 1. */
typedef struct {
    const float *x, *a, *b;
    float *t, *y;
    int64_t x_stride, t_stride, y_stride, in_features, out_features, rank;
    const int64_t *rows, *starts, *ends, *slots;
    int64_t num_groups, num_tiles;
    int64_t *tile_offsets;
    float *transposed;  /* B^T [rank, out] of each group with OUTER_MIN_ROWS rows or more, in group order */
    int64_t *bt_offset; /* per group: where its B^T starts in `transposed`, or -1 (expand by dot products) */
} Lora;

/* A tile: its rows (count of them, 1..TILE_ROWS, from `rows`), their adapter slot and its B^T (or NULL). */
typedef struct {
    const int64_t *rows;
    int64_t count, slot;
    const float *bt;
} Tile;

static void release(Lora *job) {
    free(job->tile_offsets), free(job->transposed), free(job->bt_offset);
}

/* B^T of the groups with OUTER_MIN_ROWS rows or more, B's rows shared among the threads; 1 when out of memory. */
static int transpose_large_groups(Lora *job, int num_threads) {
    int64_t floats = 0, count = 0;
    const int64_t rank = job->rank, out = job->out_features, group_floats = rank * out;
    if (!(job->bt_offset = malloc(sizeof(int64_t) * job->num_groups))) return 1;
    for (int64_t g = 0; g < job->num_groups; g++) {
        job->bt_offset[g] = job->ends[g] - job->starts[g] >= OUTER_MIN_ROWS ? floats : -1;
        floats += job->bt_offset[g] >= 0 ? group_floats : 0;
        count += job->bt_offset[g] >= 0;
    }
    if (count == 0) return 0;
    if (!(job->transposed = malloc(sizeof(float) * floats))) return 1;
    const int64_t *offsets = job->bt_offset;
#pragma omp parallel for num_threads(num_threads) if (floats >= PARALLEL_MIN_MACS) schedule(static) collapse(2)
    for (int64_t g = 0; g < job->num_groups; g++)
        for (int64_t n = 0; n < out; n++) {
            if (offsets[g] < 0) continue;
            const float *b = job->b + (job->slots[g] * out + n) * rank;
            float *bt = job->transposed + offsets[g] + n;
            for (int64_t r = 0; r < rank; r++) bt[r * out] = b[r];
        }
    return 0;
}

/* tile_offsets of the groups and their total, and where `with_b`, the B^T of the large groups: 1 when out of
 * memory (all released then). */
static int prepare(Lora *job, int with_b, int num_threads) {
    int64_t *offsets = job->tile_offsets = malloc(sizeof(int64_t) * (job->num_groups + 1));
    if (!offsets) return 1;
    offsets[0] = 0;
    for (int64_t g = 0; g < job->num_groups; g++)
        offsets[g + 1] = offsets[g] + cdiv(job->ends[g] - job->starts[g], TILE_ROWS);
    job->num_tiles = offsets[job->num_groups];
    if (with_b && transpose_large_groups(job, num_threads)) {
        release(job);
        return 1;
    }
    return 0;
}

/* Tile `index` (binary search for its group). */
static Tile tile_at(const Lora *job, int64_t index) {
    int64_t low = 0, high = job->num_groups - 1;
    while (low < high) {
        const int64_t mid = (low + high + 1) / 2;
        if (job->tile_offsets[mid] <= index) low = mid; else high = mid - 1;
    }
    const int64_t first = job->starts[low] + (index - job->tile_offsets[low]) * TILE_ROWS;
    const float *bt = job->bt_offset && job->bt_offset[low] >= 0 ? job->transposed + job->bt_offset[low] : NULL;
    return (Tile){job->rows + first, min64(TILE_ROWS, job->ends[low] - first), job->slots[low], bt};
}

/* Row i of the tile's t: at t + i * t_stride where `local` (a tile's own buffer), else in the row's place. */
static inline float *t_row(const Tile *tile, float *t, int64_t t_stride, int local, int i) {
    return t + (local ? i : tile->rows[i]) * t_stride;
}

#include "lora_tiles.h"

/* How many shares of `units` (ranks or output columns, in steps of `step`) each tile is cut into so that every
 * thread has work: 1 when the tiles alone are enough. */
static int64_t shares(const Lora *job, int64_t units, int64_t step, int num_threads) {
    if (job->num_tiles >= num_threads || job->num_tiles == 0) return 1;
    return min64(cdiv(units, step), cdiv(num_threads, job->num_tiles));
}

/* The caller's threads, or 1 for a small call. */
static int threads_for(const Lora *job, int64_t macs_per_row, int num_threads) {
    const int64_t rows = job->num_tiles * TILE_ROWS;
    return rows * macs_per_row >= PARALLEL_MIN_MACS && num_threads > 1 ? num_threads : 1;
}

/* Share `item % per_tile` of the ranks of tile `item / per_tile` (t: see t_row). */
static void shrink_item(const Lora *job, int64_t item, int64_t per_tile, float *t, int64_t t_stride, int local) {
    const Tile tile = tile_at(job, item / per_tile);
    const int64_t span = cdiv(cdiv(job->rank, SHRINK_RANKS), per_tile) * SHRINK_RANKS;
    const int64_t r_begin = item % per_tile * span;
    shrink_tile(job, &tile, r_begin, min64(job->rank, r_begin + span), t, t_stride, local);
}

/* Share `item % per_tile` of the output columns of tile `item / per_tile`. */
static void expand_item(const Lora *job, int64_t item, int64_t per_tile, float *t, int64_t t_stride, int local) {
    const Tile tile = tile_at(job, item / per_tile);
    const int64_t step = OUTER_VECTORS * VL;
    const int64_t span = cdiv(cdiv(job->out_features, step), per_tile) * step;
    const int64_t n_begin = item % per_tile * span;
    expand_tile(job, &tile, t, t_stride, local, n_begin, min64(job->out_features, n_begin + span));
}

/* t [rows, rank] = x A_s^T for the rows of each group (other rows of t untouched). */
int lora_shrink_f32(const float *x, int64_t x_stride, const float *a, int64_t in_features, int64_t rank,
                    const int64_t *rows, const int64_t *starts, const int64_t *ends, const int64_t *slots,
                    int64_t num_groups, float *t, int64_t t_stride, int num_threads) {
    Lora job = {.x = x, .a = a, .x_stride = x_stride, .in_features = in_features, .rank = rank, .rows = rows,
                .starts = starts, .ends = ends, .slots = slots, .num_groups = num_groups};
    if (prepare(&job, 0, num_threads)) return 1;
    const int64_t per_tile = shares(&job, rank, SHRINK_RANKS, num_threads);
    const int threads = threads_for(&job, in_features * rank, num_threads);
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t item = 0; item < job.num_tiles * per_tile; item++) shrink_item(&job, item, per_tile, t, t_stride, 0);
    release(&job);
    return 0;
}

/* y [rows, out] += t B_s^T for the rows of each group. */
int lora_expand_f32(const float *t, int64_t t_stride, const float *b, int64_t out_features, int64_t rank,
                    const int64_t *rows, const int64_t *starts, const int64_t *ends, const int64_t *slots,
                    int64_t num_groups, float *y, int64_t y_stride, int num_threads) {
    Lora job = {.b = b, .y = y, .y_stride = y_stride, .out_features = out_features, .rank = rank, .rows = rows,
                .starts = starts, .ends = ends, .slots = slots, .num_groups = num_groups};
    if (prepare(&job, 1, num_threads)) return 1;
    const int64_t per_tile = shares(&job, out_features, OUTER_VECTORS * VL, num_threads);
    const int threads = threads_for(&job, out_features * rank, num_threads);
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t item = 0; item < job.num_tiles * per_tile; item++)
        expand_item(&job, item, per_tile, (float *)t, t_stride, 0);
    release(&job);
    return 0;
}

/* Few tiles: the ranks of each tile shared among the threads into a scratch t [tiles * TILE_ROWS, rank] (a tile's
 * rows at TILE_ROWS * its index), then, after the barrier, the output columns. */
static int apply_shared(Lora *job, int threads) {
    float *scratch = malloc(sizeof(float) * job->num_tiles * TILE_ROWS * job->rank);
    if (!scratch) return 1;
    const int64_t rank_shares = shares(job, job->rank, SHRINK_RANKS, threads);
    const int64_t column_shares = shares(job, job->out_features, OUTER_VECTORS * VL, threads);
    const int64_t tile_floats = TILE_ROWS * job->rank;
#pragma omp parallel num_threads(threads)
    {
#pragma omp for schedule(static)
        for (int64_t item = 0; item < job->num_tiles * rank_shares; item++)
            shrink_item(job, item, rank_shares, scratch + item / rank_shares * tile_floats, job->rank, 1);
#pragma omp for schedule(static)
        for (int64_t item = 0; item < job->num_tiles * column_shares; item++)
            expand_item(job, item, column_shares, scratch + item / column_shares * tile_floats, job->rank, 1);
    }
    free(scratch);
    return 0;
}

/* y += (x A_s^T) B_s^T for the rows of each group: per tile, shrink then expand with t on the stack. */
int lora_apply_f32(const float *x, int64_t x_stride, const float *a, const float *b, int64_t in_features,
                   int64_t out_features, int64_t rank, const int64_t *rows, const int64_t *starts,
                   const int64_t *ends, const int64_t *slots, int64_t num_groups, float *y, int64_t y_stride,
                   int num_threads) {
    Lora job = {.x = x, .a = a, .b = b, .y = y, .x_stride = x_stride, .y_stride = y_stride,
                .in_features = in_features, .out_features = out_features, .rank = rank, .rows = rows,
                .starts = starts, .ends = ends, .slots = slots, .num_groups = num_groups};
    if (prepare(&job, 1, num_threads)) return 1;
    const int threads = threads_for(&job, (in_features + out_features) * rank, num_threads);
    int status = 0;
    if (job.num_tiles < threads) {
        status = apply_shared(&job, threads);
    } else {
#pragma omp parallel for num_threads(threads) schedule(static)
        for (int64_t index = 0; index < job.num_tiles; index++) {
            float t[TILE_ROWS * rank];
            const Tile tile = tile_at(&job, index);
            shrink_tile(&job, &tile, 0, rank, t, rank, 1);
            expand_tile(&job, &tile, t, rank, 1, 0, out_features);
        }
    }
    release(&job);
    return status;
}
