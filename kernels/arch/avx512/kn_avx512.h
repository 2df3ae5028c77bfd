/* SPDX-License-Identifier: MIT */
/* kernels/arch/avx512/kn_avx512.h: lane masks shared by the tables built on AVX-512 (avx512,
 * amx). */
#ifndef SHARDLM_KN_AVX512_H
#define SHARDLM_KN_AVX512_H

#include <immintrin.h>

/* Lane masks for the first @n lanes (n <= 0 gives none, n >= width gives all). */
static inline __mmask16 mask16(int n)
{
    return n >= 16 ? (__mmask16)0xffff : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1);
}

static inline __mmask64 mask64(int n)
{
    return n >= 64 ? ~(__mmask64)0 : n <= 0 ? (__mmask64)0 : (((__mmask64)1 << n) - 1);
}

/* The lanes of the 16 rows from @r that fall in [n0, n1). */
static inline __mmask16 rows_in(int r, int n0, int n1)
{
    return (__mmask16)(mask16(n1 - r) & ~mask16(n0 - r));
}

#endif
