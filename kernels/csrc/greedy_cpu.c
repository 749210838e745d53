/* Greedy token and log-sum-exp of float32 logits rows in one read of each row (the sampler's all-greedy step).
 *
 * Built on first use by kernels/native.py and called through ctypes (front end: kernels/native_greedy.py).
 * A row is read in blocks that stay in L1: the block's max (vectorised), then, only when it beats the running
 * max, the block's first index of it and a rescale of the running sum, then the block's sum of exp(x - max).
 * So the token is the first index of the row's maximum (torch.max's choice) and
 * lse = max + log(sum(exp(x - max))). Entries of -inf (banned tokens) add nothing.
 * Rows are spread over the caller's OpenMP threads once there is enough work.
 */
#include <math.h>
#include <stdint.h>

#define BLOCK 1024
#define PARALLEL_MIN_ELEMENTS 65536

static float block_max(const float *x, int64_t n) {
    float best = x[0];
    for (int64_t i = 1; i < n; i++) best = x[i] > best ? x[i] : best;
    return best;
}

/* exp(x - max) of -inf (a banned token) is taken as exp(-80), nothing next to exp(0) = 1 of the maximum,
 * so the vectorised expf never sees an infinity */
static float block_sum_exp(const float *x, int64_t n, float max) {
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) sum += expf(fmaxf(x[i] - max, -80.0f));
    return sum;
}

static void greedy_row(const float *row, int64_t width, int64_t *token, float *lse) {
    /* no comparisons with infinities, which -ffast-math may fold away: blocks whose max is at or below
     * FLOOR (only banned tokens) add nothing to the sum */
    const float FLOOR = -3.0e38f;
    float best = row[0], sum = 0.0f;
    int64_t best_index = 0;
    for (int64_t start = 0; start < width; start += BLOCK) {
        const int64_t n = width - start < BLOCK ? width - start : BLOCK;
        const float local = block_max(row + start, n);
        if (start == 0 || local > best) {
            int64_t i = 0;
            while (row[start + i] != local) i++;
            best_index = start + i;
            if (sum > 0.0f) sum *= expf(best - local);
            best = local;
        }
        if (best > FLOOR) sum += block_sum_exp(row + start, n, best);
    }
    *token = best_index;
    *lse = best + logf(sum);
}

/* tokens[r] = first argmax of row r, lse[r] = logsumexp of row r, for logits [rows, width] with row stride
 * `stride` (elements). */
void greedy_logsumexp(const float *logits, int64_t stride, int64_t rows, int64_t width, int64_t *tokens,
                      float *lse, int num_threads) {
#pragma omp parallel for num_threads(num_threads) if (rows * width >= PARALLEL_MIN_ELEMENTS) schedule(static)
    for (int64_t row = 0; row < rows; row++)
        greedy_row(logits + row * stride, width, tokens + row, lse + row);
}
