/* SPDX-License-Identifier: MIT */
/* kernels/kn_types.c: the type traits of every weight format (name, block shape, bytes, to-float
 * and from-float of rows), as ggml's type_traits[]. No intrinsics here. */
#include "kn.h"

#include <string.h>

/* ---- to-float: one row ---- */

static void row_f32(const struct kn_mat *m, int r, float *out)
{
    size_t c = (size_t)m->cols;
    memcpy(out, (const float *)m->codes + (size_t)r * c, c * sizeof(float));
}

static void row_bf16(const struct kn_mat *m, int r, float *out)
{
    size_t c = (size_t)m->cols;
    const uint16_t *p = (const uint16_t *)m->codes + (size_t)r * c;
    for (size_t i = 0; i < c; i++)
        out[i] = kn_bf16_to_f32(p[i]);
}

static void row_q8(const struct kn_mat *m, int r, float *out)
{
    size_t c = (size_t)m->cols;
    const int8_t *p = (const int8_t *)m->codes + (size_t)r * c;
    float s = ((const float *)m->scales)[r];
    for (size_t i = 0; i < c; i++)
        out[i] = s * (float)p[i];
}

/* Any int4 layout, canonical or tiled, through the element accessors. */
static void row_w4(const struct kn_mat *m, int r, float *out)
{
    for (int i = 0; i < m->cols; i++) {
        int g = i / m->group;
        out[i] = kn_f16_to_f32(kn_w4_scale(m, r, g)) *
                 (float)(kn_w4_code(m, r, i) - kn_w4_zero(m, r, g));
    }
}

/* ---- from-float: the quantizers of kn_quant.c under one signature ---- */

static void from_f32(const float *w, int rows, int cols, int group, void *out,
                     const struct kn_par *par)
{
    memcpy(out, w, (size_t)rows * (size_t)cols * sizeof(float));
}

static void from_bf16(const float *w, int rows, int cols, int group, void *out,
                      const struct kn_par *par)
{
    kn_quant_bf16(w, (size_t)rows * (size_t)cols, out);
}

static void from_q8(const float *w, int rows, int cols, int group, void *out,
                    const struct kn_par *par)
{
    kn_quant_q8(w, rows, cols, out);
}

static void from_q6(const float *w, int rows, int cols, int group, void *out,
                    const struct kn_par *par)
{
    kn_quant_q6(w, rows, cols, out, par);
}

static void from_w4a16(const float *w, int rows, int cols, int group, void *out,
                       const struct kn_par *par)
{
    kn_quant_w4(w, rows, cols, group, true, NULL, out, par);
}

static void from_w4a8(const float *w, int rows, int cols, int group, void *out,
                      const struct kn_par *par)
{
    kn_quant_w4(w, rows, cols, group, false, NULL, out, par);
}

const struct kn_type_traits kn_type_traits[KN_DT_COUNT] = {
    [KN_DT_F32] = {.name = "f32",
                   .bits = 32,
                   .canon = KN_DT_F32,
                   .act_parts = KN_ACT_F32,
                   .to_float = row_f32,
                   .from_float = from_f32},
    [KN_DT_BF16] = {.name = "bf16",
                    .bits = 16,
                    .canon = KN_DT_BF16,
                    .act_parts = KN_ACT_F32,
                    .to_float = row_bf16,
                    .from_float = from_bf16},
    [KN_DT_Q8] = {.name = "q8",
                  .bits = 8,
                  .scale_bytes = 4,
                  .canon = KN_DT_Q8,
                  .act_parts = KN_ACT_Q16,
                  .to_float = row_q8,
                  .from_float = from_q8},
    [KN_DT_W4A16] = {.name = "w4a16",
                     .bits = 4,
                     .scale_bytes = 2,
                     .grouped = true,
                     .zeros = true,
                     .canon = KN_DT_W4A16,
                     .act_parts = KN_ACT_F32 | KN_ACT_EO,
                     .to_float = row_w4,
                     .from_float = from_w4a16},
    [KN_DT_W4A8] = {.name = "w4a8",
                    .bits = 4,
                    .scale_bytes = 2,
                    .grouped = true,
                    .canon = KN_DT_W4A8,
                    .act_parts = KN_ACT_Q | KN_ACT_QEO,
                    .to_float = row_w4,
                    .from_float = from_w4a8},
    /* "t": the tile layouts of a weights segment (kn.h), made by kn_repack_tiles() */
    [KN_DT_W4A8_T] = {.name = "w4a8t",
                      .bits = 4,
                      .scale_bytes = 2,
                      .grouped = true,
                      .tile_rows = KN_TILE_ROWS,
                      .canon = KN_DT_W4A8,
                      .act_parts = KN_ACT_Q,
                      .to_float = row_w4},
    [KN_DT_W4A16_T] = {.name = "w4a16t",
                       .bits = 4,
                       .scale_bytes = 2,
                       .grouped = true,
                       .zeros = true,
                       .tile_rows = KN_TILE_ROWS,
                       .canon = KN_DT_W4A16,
                       .act_parts = KN_ACT_F32,
                       .to_float = row_w4},
    [KN_DT_Q6] = {.name = "q6",
                  .bits = 6,
                  .scale_bytes = 2,
                  .row_block = KN_Q6_BLOCK,
                  .block_scales = KN_Q6_BLOCK / KN_Q6_GROUP,
                  .canon = KN_DT_Q6,
                  .act_parts = KN_ACT_Q6,
                  .to_float = kn_q6_row,
                  .from_float = from_q6},
};
