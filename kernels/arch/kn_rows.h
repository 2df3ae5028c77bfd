/* SPDX-License-Identifier: MIT */
/* kernels/arch/kn_rows.h: the one loop of the row formats' matrix products (f32, bf16), for
 * each SIMD table to instantiate over its own row dots. */
#ifndef SHARDLM_KN_ROWS_H
#define SHARDLM_KN_ROWS_H

#include "../kn.h"

/* Defines the kn_mm_fn @name over a row-major @w of elements of type @T: y[i][n] = s_n *
 * @dot(row n, x[i].x, cols) for n in [n0, n1), i < m, where s_n is row n's float scale (q8) when
 * @scaled and 1 otherwise. Row by row, so a weight row is read from memory once and from L1 for
 * the other m - 1 activations. A macro so that every format's loop has its dot inlined, as the
 * three hand-written copies it replaces had. */
#define KN_MM_ROWS(name, T, dot, scaled)                                                           \
    static void name(const struct kn_mat *w, const struct kn_act *x, int m, float *y, size_t ldy,  \
                     int n0, int n1)                                                               \
    {                                                                                              \
        size_t k = (size_t)w->cols;                                                                \
        for (int n = n0; n < n1; n++) {                                                            \
            const T *row = (const T *)w->codes + (size_t)n * k;                                    \
            float s = (scaled) ? ((const float *)w->scales)[n] : 1.0f;                             \
            for (int i = 0; i < m; i++)                                                            \
                y[(size_t)i * ldy + (size_t)n] = s * dot(row, x[i].x, w->cols);                    \
        }                                                                                          \
    }

#endif
