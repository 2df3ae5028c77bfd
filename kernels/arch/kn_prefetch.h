/* SPDX-License-Identifier: MIT */
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

#endif
