/* SPDX-License-Identifier: MIT */
/* coordinator/format/rows.c: stored row types (F32, F16, BF16, Q8_0, Q4_0, MXFP4) to float32. */
#include "rows.h"

#include "kn.h"

#include <math.h>
#include <string.h>

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "rows.c reads the little-endian fields of the stored blocks in place"
#endif

#define ROWS_QK 32 /* elements per Q8_0 / Q4_0 block */

/* ggml block layouts (ggml-common.h block_q8_0, block_q4_0) */
struct rows_blk_q8_0 {
    uint16_t d; /* fp16 scale */
    int8_t qs[ROWS_QK];
};
struct rows_blk_q4_0 {
    uint16_t d;              /* fp16 scale */
    uint8_t qs[ROWS_QK / 2]; /* byte j: element j in the low nibble, j + 16 in the high one */
};
_Static_assert(sizeof(struct rows_blk_q8_0) == 34, "Q8_0 block is 34 bytes");
struct rows_blk_mxfp4 {
    uint8_t e;               /* E8M0: the scale 2^(e - 128) of the doubled E2M1 values */
    uint8_t qs[ROWS_QK / 2]; /* as Q4_0's */
};
_Static_assert(sizeof(struct rows_blk_q4_0) == 18, "Q4_0 block is 18 bytes");
_Static_assert(sizeof(struct rows_blk_mxfp4) == 17, "MXFP4 block is 17 bytes");

/* E2M1 values doubled (0, 0.5, 1, 1.5, 2, 3, 4, 6 times 2), a sign in bit 3 */
static const int8_t mxfp4_values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

const struct coord_rows_traits coord_rows_traits[COORD_ROWS_COUNT] = {
    [COORD_ROWS_F32] = {"F32", 1, 4},
    [COORD_ROWS_F16] = {"F16", 1, 2},
    [COORD_ROWS_BF16] = {"BF16", 1, 2},
    [COORD_ROWS_Q8_0] = {"Q8_0", ROWS_QK, sizeof(struct rows_blk_q8_0)},
    [COORD_ROWS_Q4_0] = {"Q4_0", ROWS_QK, sizeof(struct rows_blk_q4_0)},
    [COORD_ROWS_MXFP4] = {"MXFP4", ROWS_QK, sizeof(struct rows_blk_mxfp4)},
};

void coord_rows_to_f32(enum coord_rows_type type, const uint8_t *src, uint64_t n, float *out)
{
    switch (type) {
    case COORD_ROWS_F32:
        memcpy(out, src, n * 4);
        return;
    case COORD_ROWS_F16:
        for (uint64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            out[i] = kn_f16_to_f32(h);
        }
        return;
    case COORD_ROWS_BF16:
        for (uint64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            out[i] = kn_bf16_to_f32(h);
        }
        return;
    case COORD_ROWS_Q8_0:
        for (uint64_t b = 0; b < n / ROWS_QK; b++) {
            struct rows_blk_q8_0 q;
            memcpy(&q, src + b * sizeof(q), sizeof(q));
            float d = kn_f16_to_f32(q.d);
            for (int j = 0; j < ROWS_QK; j++)
                out[b * ROWS_QK + j] = d * (float)q.qs[j];
        }
        return;
    case COORD_ROWS_Q4_0:
        for (uint64_t b = 0; b < n / ROWS_QK; b++) {
            struct rows_blk_q4_0 q;
            memcpy(&q, src + b * sizeof(q), sizeof(q));
            float d = kn_f16_to_f32(q.d);
            for (int j = 0; j < ROWS_QK / 2; j++) {
                out[b * ROWS_QK + j] = d * (float)((q.qs[j] & 0x0f) - 8);
                out[b * ROWS_QK + j + ROWS_QK / 2] = d * (float)((q.qs[j] >> 4) - 8);
            }
        }
        return;
    case COORD_ROWS_MXFP4:
        for (uint64_t b = 0; b < n / ROWS_QK; b++) {
            struct rows_blk_mxfp4 q;
            memcpy(&q, src + b * sizeof(q), sizeof(q));
            float d = ldexpf(1.0f, (int)q.e - 128); /* exact: 2^-128 .. 2^127 */
            for (int j = 0; j < ROWS_QK / 2; j++) {
                out[b * ROWS_QK + j] = d * (float)mxfp4_values[q.qs[j] & 0x0f];
                out[b * ROWS_QK + j + ROWS_QK / 2] = d * (float)mxfp4_values[q.qs[j] >> 4];
            }
        }
        return;
    case COORD_ROWS_COUNT:
        break;
    }
    KN_ASSERT(!"unknown row type");
}

/* The nibble nearest to @v (a multiple of the block's scale), ties away from zero. */
static uint8_t mxfp4_nibble(float v)
{
    float a = fabsf(v);
    int best = 0;
    for (int i = 1; i < 8; i++)
        if (fabsf(a - (float)mxfp4_values[i]) <= fabsf(a - (float)mxfp4_values[best]))
            best = i;
    return (uint8_t)(best | (v < 0.0f && best ? 8 : 0));
}

void coord_rows_mxfp4_block(const float *x, uint8_t *blk)
{
    struct rows_blk_mxfp4 q;
    float amax = 0.0f;
    for (int j = 0; j < ROWS_QK; j++)
        amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
    int e = 1; /* the smallest e with amax <= 12 * 2^(e - 128) */
    while (e < 254 && amax > ldexpf(12.0f, e - 128))
        e++;
    q.e = (uint8_t)e;
    float inv = ldexpf(1.0f, 128 - e);
    for (int j = 0; j < ROWS_QK / 2; j++)
        q.qs[j] = (uint8_t)(mxfp4_nibble(x[j] * inv) | mxfp4_nibble(x[j + ROWS_QK / 2] * inv) << 4);
    memcpy(blk, &q, sizeof(q));
}
