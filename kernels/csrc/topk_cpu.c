/* The k largest entries of float32 logits rows, largest first (beam search's candidates of each beam row).
 *
 * Built on first use by kernels/native.py and called through ctypes (front end: kernels/native_topk.py).
 * A row is read in blocks of BLOCK floats: a block whose (vectorised) max does not beat the k-th best so far is
 * skipped, so almost all of a long row costs one read; the few entries that do beat it are inserted into a
 * sorted list of k. An entry equal to one already kept goes after it (the lower index first). Entries at or
 * below FLOOR (banned tokens of -inf) are never kept: `found` says how many entries a row had above it.
 * Rows are spread over the caller's OpenMP threads once there is enough work.
 */
#include <stdint.h>

#define BLOCK 64
#define PARALLEL_MIN_ELEMENTS 65536

/* No comparisons with infinities, which -ffast-math may fold away: -inf sits below FLOOR. */
static const float FLOOR = -3.0e38f;

static float block_max(const float *x, int64_t n) {
    float best = x[0];
    for (int64_t i = 1; i < n; i++) best = x[i] > best ? x[i] : best;
    return best;
}

/* Inserts x (at `index`) into the `*count` sorted entries, keeping at most k. */
static void insert(float x, int64_t index, int64_t k, float *values, int64_t *indices, int64_t *count) {
    int64_t at = *count < k ? (*count)++ : k - 1;
    while (at > 0 && values[at - 1] < x) {
        values[at] = values[at - 1];
        indices[at] = indices[at - 1];
        at--;
    }
    values[at] = x;
    indices[at] = index;
}

static int64_t topk_row(const float *row, int64_t width, int64_t k, float *values, int64_t *indices) {
    int64_t count = 0;
    float threshold = FLOOR;
    for (int64_t start = 0; start < width; start += BLOCK) {
        const int64_t n = width - start < BLOCK ? width - start : BLOCK;
        if (block_max(row + start, n) <= threshold) continue;
        for (int64_t i = 0; i < n; i++) {
            if (row[start + i] <= threshold) continue;
            insert(row[start + i], start + i, k, values, indices, &count);
            if (count == k) threshold = values[k - 1];
        }
    }
    return count;
}

/* values/indices [rows, k] of logits [rows, width] (row stride `stride` elements); found[r]: the entries kept in
 * row r (fewer than k when the row has fewer than k entries above FLOOR; the rest of its outputs are undefined). */
void topk_rows(const float *logits, int64_t stride, int64_t rows, int64_t width, int64_t k, float *values,
               int64_t *indices, int64_t *found, int num_threads) {
#pragma omp parallel for num_threads(num_threads) if (rows * width >= PARALLEL_MIN_ELEMENTS) schedule(static)
    for (int64_t row = 0; row < rows; row++)
        found[row] = topk_row(logits + row * stride, width, k, values + row * k, indices + row * k);
}
