/* Paged KV-cache writes (kernels/cache_ops.py, reshape_and_cache): each new token's K row and V row copied into
 * its cache slot, in one pass and without the index tensors and row copies torch's index_copy_ path builds.
 * A row is the token's heads x head_size elements, contiguous in the source (rows themselves may be strided, as
 * in a view of a fused qkv projection) and in the cache; the caller passes sizes and strides in bytes, so every
 * dtype is the same copy. Tokens with a negative slot are padding and are skipped. */
#include <stdint.h>
#include <string.h>

#define PARALLEL_MIN_BYTES (1 << 20)

/* Returns 1 if a slot is at or past num_slots (and writes nothing), else 0. */
int write_kv_slots(const char *key, int64_t key_stride, const char *value, int64_t value_stride,
                   char *key_cache, char *value_cache, const int64_t *slots, int64_t tokens, int64_t row_bytes,
                   int64_t num_slots, int num_threads) {
    for (int64_t token = 0; token < tokens; token++)
        if (slots[token] >= num_slots) return 1;
#pragma omp parallel for num_threads(num_threads) if (tokens * row_bytes >= PARALLEL_MIN_BYTES) schedule(static)
    for (int64_t token = 0; token < tokens; token++) {
        const int64_t slot = slots[token];
        if (slot < 0) continue;
        memcpy(key_cache + slot * row_bytes, key + token * key_stride, (size_t)row_bytes);
        memcpy(value_cache + slot * row_bytes, value + token * value_stride, (size_t)row_bytes);
    }
    return 0;
}
