/* SPDX-License-Identifier: MIT */
/* kernels/arch/kn_gram.h: the f32 Gram tile of the calibration's Hessians (kn_ops.gram_tile), one
 * body for each table to compile with its own flags. */
#ifndef SHARDLM_KN_GRAM_H
#define SHARDLM_KN_GRAM_H

#include "../kn.h"

#include <string.h>

/* 16 floats; unaligned: rows of x and H start anywhere */
typedef float kn_v16 __attribute__((vector_size(64), aligned(4)));

/* Defines @name, a kn_ops.gram_tile: eight rows of a 16-wide tile held in registers while the
 * rows of x go by (one vector load, eight broadcasts per row). Per lane every table does the
 * same multiply-adds in the same order: the tables with FMA (avx2, avx512, amx) give the same
 * bits, ref (mul, then add) may differ in the last place. */
#define KN_GRAM_TILE(name)                                                                         \
    static void name(float *h, int cols, const float *x, int n, int ld, int i0, int k0)            \
    {                                                                                              \
        kn_v16 acc[8];                                                                             \
        for (int a = 0; a < 8; a++)                                                                \
            memcpy(&acc[a], h + (size_t)(i0 + a) * cols + k0, sizeof(kn_v16));                     \
        for (int r = 0; r < n; r++) {                                                              \
            const float *xr = x + (size_t)r * ld;                                                  \
            kn_v16 v;                                                                              \
            memcpy(&v, xr + k0, sizeof(v));                                                        \
            for (int a = 0; a < 8; a++)                                                            \
                acc[a] += xr[i0 + a] * v;                                                          \
        }                                                                                          \
        for (int a = 0; a < 8; a++)                                                                \
            memcpy(h + (size_t)(i0 + a) * cols + k0, &acc[a], sizeof(kn_v16));                     \
    }

#endif
