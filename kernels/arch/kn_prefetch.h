/* kernels/arch/kn_prefetch.h: the software prefetch of each kn_pf mode (kernels/kn_prefetch.c),
 * for the GEMV loops of the SIMD tables to inline with the mode a constant: one call per cache
 * line of the weight stream. */
#ifndef SHARDLM_KN_PREFETCH_H
#define SHARDLM_KN_PREFETCH_H

#include "../kn.h"

#include <immintrin.h>

static inline __attribute__((always_inline)) void pf_line(const void *p, int mode)
{
    if (mode == KN_PF_L1)
        _mm_prefetch((const char *)p + 4096, _MM_HINT_T0);
    else if (mode == KN_PF_L2)
        _mm_prefetch((const char *)p + 8192, _MM_HINT_T1);
}

/* Calls @fn(..., mode) with the mode of a one-token call over @rows rows of @w from the tuner
 * (kernels/kn_prefetch.c), a constant in each of the three calls, and times it. */
#define KN_PF_RUN(w, rows, fn, ...)                                                                \
    do {                                                                                           \
        struct kn_pf_call pc_;                                                                     \
        int pf_ = kn_pf_begin(&pc_, (w), (rows));                                                  \
        if (pf_ == KN_PF_HW)                                                                       \
            fn(__VA_ARGS__, KN_PF_HW);                                                             \
        else if (pf_ == KN_PF_L1)                                                                  \
            fn(__VA_ARGS__, KN_PF_L1);                                                             \
        else                                                                                       \
            fn(__VA_ARGS__, KN_PF_L2);                                                             \
        kn_pf_end(&pc_);                                                                           \
    } while (0)

/* mm_q8 over the row dot @dot(w, x, k, pf): KN_MM_ROWS's loop with the prefetch mode of a
 * one-token call from the tuner; more tokens read each row from cache after the first and go to
 * @tokens(w, x, m, y, ldy, n0, n1), without software prefetch: mm_q8_pf_hw (one token's dot
 * after another), or a table's own product over several tokens at once. */
#define KN_MM_Q8_TUNED(dot, tokens)                                                                \
    static inline __attribute__((always_inline)) void mm_q8_pf(                                    \
        const struct kn_mat *w, const struct kn_act *x, int m, float *y, size_t ldy, int n0,       \
        int n1, int pf)                                                                            \
    {                                                                                              \
        for (int n = n0; n < n1; n++) {                                                            \
            const int8_t *row = (const int8_t *)w->codes + (size_t)n * (size_t)w->cols;            \
            float s = ((const float *)w->scales)[n];                                               \
            for (int i = 0; i < m; i++)                                                            \
                y[(size_t)i * ldy + (size_t)n] = s * dot(row, x[i].x, w->cols, pf);                \
        }                                                                                          \
    }                                                                                              \
    static __attribute__((unused)) void mm_q8_pf_hw(const struct kn_mat *w,                        \
                                                    const struct kn_act *x, int m, float *y,       \
                                                    size_t ldy, int n0, int n1)                    \
    {                                                                                              \
        mm_q8_pf(w, x, m, y, ldy, n0, n1, KN_PF_HW);                                               \
    }                                                                                              \
    static void mm_q8(const struct kn_mat *w, const struct kn_act *x, int m, float *y, size_t ldy, \
                      int n0, int n1)                                                              \
    {                                                                                              \
        if (m > 1)                                                                                 \
            tokens(w, x, m, y, ldy, n0, n1);                                                       \
        else                                                                                       \
            KN_PF_RUN(w, n1 - n0, mm_q8_pf, w, x, m, y, ldy, n0, n1);                              \
    }

#endif
