/* The tiles of lora_cpu.c (included by it after the vectors of lora_avx512.h, lora_avx2.h or lora_portable.h and
 * its Lora job and Tile): the register blocks shrink_block (rows x SHRINK_RANKS dot products along `in`),
 * expand_block (rows x VL dot products along the rank) and expand_outer_block (rows x OUTER_VECTORS vectors of
 * outputs from B's transpose: rank outer products), each with its row count a constant in every copy, and the
 * walks of a tile over them, shrink_tile and expand_tile. */
#ifndef LORA_TILES_H
#define LORA_TILES_H

/* t_i[r] = x_i . a_r for `rows` rows (a constant in each copy) and ranks r0 .. r0 + SHRINK_RANKS - 1 (those below
 * the rank: ranks past it repeat the last one, computed but not stored, so the loops have constant counts). */
ALWAYS_INLINE void shrink_block(const Lora *job, const float *const *x, const float *a, int64_t r0,
                                float *const *t, const int rows) {
    const int64_t in = job->in_features;
    const float *ar[SHRINK_RANKS];
    for (int j = 0; j < SHRINK_RANKS; j++) ar[j] = a + min64(r0 + j, job->rank - 1) * in;
    vec acc[BLOCK_ROWS][SHRINK_RANKS];
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < SHRINK_RANKS; j++) acc[i][j] = vzero();
    int64_t k = 0;
    for (; k + VL <= in; k += VL) {
        vec av[SHRINK_RANKS];
        for (int j = 0; j < SHRINK_RANKS; j++) av[j] = vload(ar[j] + k);
        for (int i = 0; i < rows; i++) {
            const vec xv = vload(x[i] + k);
            for (int j = 0; j < SHRINK_RANKS; j++) acc[i][j] = vfma(xv, av[j], acc[i][j]);
        }
    }
    if (k < in) {
        vec av[SHRINK_RANKS];
        for (int j = 0; j < SHRINK_RANKS; j++) av[j] = vload_part(ar[j] + k, in - k);
        for (int i = 0; i < rows; i++) {
            const vec xv = vload_part(x[i] + k, in - k);
            for (int j = 0; j < SHRINK_RANKS; j++) acc[i][j] = vfma(xv, av[j], acc[i][j]);
        }
    }
    for (int i = 0; i < rows; i++) store_sums(acc[i], t[i] + r0, min64(SHRINK_RANKS, job->rank - r0));
}

/* y_i[0 .. VL) += t_i . b_n for `rows` rows (a constant in each copy; row i's t and y at t[i] and y[i]) and
 * the VL outputs whose B rows start at `b` (those below `count`; rows past it repeat the last one, computed but not
 * stored). Four outputs at a time, each load of B serving every row; their dot products along the rank are reduced
 * to a quad, the quads of a row to its VL sums, added to y with one vector. */
ALWAYS_INLINE void expand_block(const float *b, int64_t rank, const float *const *t, int64_t count, float *const *y,
                                const int rows) {
    vec quads[EXPAND_ROWS][VL / 4];
    for (int q = 0; q < VL / 4; q++) {
        const float *br[4];
        for (int j = 0; j < 4; j++) br[j] = b + min64(4 * q + j, count - 1) * rank;
        vec acc[EXPAND_ROWS][4];
        for (int i = 0; i < rows; i++)
            for (int j = 0; j < 4; j++) acc[i][j] = vzero();
        int64_t k = 0;
        for (; k + VL <= rank; k += VL) {
            vec bv[4];
            for (int j = 0; j < 4; j++) bv[j] = vload(br[j] + k);
            for (int i = 0; i < rows; i++) {
                const vec tv = vload(t[i] + k);
                for (int j = 0; j < 4; j++) acc[i][j] = vfma(tv, bv[j], acc[i][j]);
            }
        }
        if (k < rank) {
            vec bv[4];
            for (int j = 0; j < 4; j++) bv[j] = vload_part(br[j] + k, rank - k);
            for (int i = 0; i < rows; i++) {
                const vec tv = vload_part(t[i] + k, rank - k);
                for (int j = 0; j < 4; j++) acc[i][j] = vfma(tv, bv[j], acc[i][j]);
            }
        }
        for (int i = 0; i < rows; i++) quads[i][q] = reduce_quad(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
    }
    for (int i = 0; i < rows; i++) vadd_to(y[i], reduce_quads(quads[i]), count);
}

/* y_i[0 .. OUTER_VECTORS * VL) += sum_r t_i[r] bt[r] for `rows` rows (a constant in each copy) from B^T's rows at
 * `bt` (row stride bt_stride: B's transpose from the block's first output), outputs below `count` (masked loads and
 * stores past it, where `full` is 0): the t of each row broadcast, each load of B^T serving every row, no sums
 * across lanes. */
ALWAYS_INLINE void expand_outer_block(const float *bt, int64_t bt_stride, int64_t rank, const float *const *t,
                                      int64_t count, float *const *y, const int rows, const int full) {
    vec acc[BLOCK_ROWS][OUTER_VECTORS];
    for (int i = 0; i < rows; i++)
        for (int v = 0; v < OUTER_VECTORS; v++) acc[i][v] = vzero();
    for (int64_t r = 0; r < rank; r++) {
        vec bv[OUTER_VECTORS];
        const float *row = bt + r * bt_stride;
        for (int v = 0; v < OUTER_VECTORS; v++)
            bv[v] = full ? vload(row + v * VL) : vload_part(row + v * VL, count - v * VL);
        for (int i = 0; i < rows; i++) {
            const vec tv = vset1(t[i][r]);
            for (int v = 0; v < OUTER_VECTORS; v++) acc[i][v] = vfma(tv, bv[v], acc[i][v]);
        }
    }
    for (int i = 0; i < rows; i++)
        for (int v = 0; v < OUTER_VECTORS; v++) vadd_to(y[i] + v * VL, acc[i][v], count - v * VL);
}

#define SHRINK_ROWS(n)                                                                                                \
    case n:                                                                                                           \
        shrink_block(job, x + i0, a, r0, tr + i0, n);                                                                 \
        break;

/* The tile's t for ranks r_begin .. r_end - 1 (r_begin a multiple of SHRINK_RANKS), BLOCK_ROWS rows at a time: the
 * A rows of a block of ranks are read from L1 by all of them. */
static void shrink_tile(const Lora *job, const Tile *tile, int64_t r_begin, int64_t r_end, float *t,
                        int64_t t_stride, int local) {
    const float *x[TILE_ROWS], *a = job->a + tile->slot * job->rank * job->in_features;
    float *tr[TILE_ROWS];
    for (int i = 0; i < tile->count; i++) {
        x[i] = job->x + tile->rows[i] * job->x_stride;
        tr[i] = t_row(tile, t, t_stride, local, i);
    }
    for (int64_t r0 = r_begin; r0 < r_end; r0 += SHRINK_RANKS)
        for (int i0 = 0; i0 < tile->count; i0 += BLOCK_ROWS) {
            switch (min64(BLOCK_ROWS, tile->count - i0)) {
                SHRINK_ROWS(1)
                SHRINK_ROWS(2)
                SHRINK_ROWS(3)
                SHRINK_ROWS(4)
            }
        }
}

#define EXPAND_ROWS_CASE(n)                                                                                           \
    case n:                                                                                                           \
        expand_block(b + n0 * job->rank, job->rank, tr + i0, n_end - n0, yr + i0, n);                                 \
        break;

#define OUTER_ROWS_CASE(n)                                                                                            \
    case n:                                                                                                           \
        if (n_end - n0 >= OUTER_VECTORS * VL)                                                                         \
            expand_outer_block(tile->bt + n0, job->out_features, job->rank, tr + i0, n_end - n0, yr + i0, n, 1);      \
        else                                                                                                          \
            expand_outer_block(tile->bt + n0, job->out_features, job->rank, tr + i0, n_end - n0, yr + i0, n, 0);      \
        break;

/* The tile's y += t B^T for outputs n_begin .. n_end - 1: by outer products from its slot's B^T where the slot has
 * one, else by dot products, each block of VL rows of B (in L1) serving all the tile's rows, EXPAND_ROWS at a time. */
static void expand_tile(const Lora *job, const Tile *tile, float *t, int64_t t_stride, int local, int64_t n_begin,
                        int64_t n_end) {
    const float *b = job->b + tile->slot * job->out_features * job->rank;
    const float *tr[TILE_ROWS];
    float *yr[TILE_ROWS];
    const int64_t step = tile->bt ? OUTER_VECTORS * VL : VL;
    for (int64_t n0 = n_begin; n0 < n_end; n0 += step) {
        for (int i = 0; i < tile->count; i++) {
            tr[i] = t_row(tile, t, t_stride, local, i);
            yr[i] = job->y + tile->rows[i] * job->y_stride + n0;
        }
        for (int i0 = 0; tile->bt && i0 < tile->count; i0 += BLOCK_ROWS) {
            switch (min64(BLOCK_ROWS, tile->count - i0)) {
                OUTER_ROWS_CASE(1)
                OUTER_ROWS_CASE(2)
                OUTER_ROWS_CASE(3)
                OUTER_ROWS_CASE(4)
            }
        }
        if (tile->bt) continue;
        for (int i0 = 0; i0 < tile->count; i0 += EXPAND_ROWS) {
            switch (min64(EXPAND_ROWS, tile->count - i0)) {
                EXPAND_ROWS_CASE(1)
#if EXPAND_ROWS >= 2
                EXPAND_ROWS_CASE(2)
#endif
#if EXPAND_ROWS >= 4
                EXPAND_ROWS_CASE(3)
                EXPAND_ROWS_CASE(4)
#endif
            }
        }
    }
}

#endif
