/* SPDX-License-Identifier: MIT */
/* coordinator/convert/quant.h: how `shardlm convert` rounds a matrix to int4 - the methods, and
 * GPTQ. Every method writes the kernels' W4 layout (kernels/kn.h): only the codes and scales
 * differ, never the format. */
#ifndef SHARDLM_COORD_QUANT_H
#define SHARDLM_COORD_QUANT_H

#include <stdbool.h>
#include <stdint.h>

enum coord_quant_method {
    COORD_QUANT_RTN,     /* each group's scale searched, codes rounded to nearest */
    COORD_QUANT_IMATRIX, /* the search weighs each column by its input's mean square */
    COORD_QUANT_GPTQ,    /* static group scales, codes by GPTQ's error feedback */
    COORD_QUANT_AWQ,     /* per-channel input scaling folded into the norm before, then imatrix */
    COORD_QUANT_AUTO,    /* each of the above fitted, the lowest KLD on held-out text kept */
    COORD_QUANT_METHODS
};

/* "rtn", "imatrix", "gptq", "awq", "auto" -> 0 and *@m; -1 for anything else. */
int coord_quant_method_parse(const char *name, enum coord_quant_method *m);
const char *coord_quant_method_name(enum coord_quant_method m);

#define COORD_GPTQ_DAMP 0.01f /* least default dampening: this fraction of the mean diagonal */

/* The default dampening of a Hessian of @cols columns estimated from @tokens rows: @cols /
 * @tokens, within [COORD_GPTQ_DAMP, 1]. A mean of x x^T over few rows for its width is noisy
 * in its off-diagonal (the spread of its eigenvalues grows with cols / rows), and GPTQ's error
 * feedback fits that noise: on stories260K at w4a16 g64 with 256 calibration tokens, GPTQ at
 * 0.01 was worse than rounding to nearest (mean KLD 0.0773 against 0.0706, p99 0.441), at this
 * default 0.0507 (p99 0.329); at 4096 tokens the two are within noise (0.0464 / 0.0469). */
float coord_gptq_damp(int cols, long tokens);

struct coord_gptq_opts {
    float damp;     /* added to H's diagonal: damp * mean(diag(H)) */
    bool act_order; /* columns in decreasing diag(H) order (the group scales stay static) */
};

/* GPTQ (Frantar et al. 2022) of @w (@rows x @cols, row-major) whose input has second moments @h
 * (cols x cols, the mean of x x^T): each group's scale (and zero point when @asym) is fixed first
 * by the search over the original weights (static groups), then the columns are
 * rounded one at a time in @o's order, each column's rounding error spread over the columns not
 * yet rounded as the inverse Hessian says (lazy batches of 128 columns). Columns whose input is
 * always zero are zeroed. The result goes into @out in the W4 layout of @asym (kn_w4_pack). The
 * work is split over @pool's threads (NULL: the caller's alone); the result does not depend on it.
 * Returns 0, -ENOMEM, or -EDOM when H stays singular after ten-fold dampening three times. */
struct wrk_pool;
int coord_gptq(const float *w, int rows, int cols, int group, bool asym, const float *h,
               const struct coord_gptq_opts *o, struct wrk_pool *pool, void *out);

/* coord_gptq() in two steps, for matrices that share an input: the factorisation of @h (cols x
 * cols; -EDOM or -ENOMEM as coord_gptq), then the rounding of each matrix of @f->cols columns. */
struct coord_gptq_factor;
int coord_gptq_factor(const float *h, int cols, const struct coord_gptq_opts *o,
                      struct wrk_pool *pool, struct coord_gptq_factor **f);
int coord_gptq_apply(const struct coord_gptq_factor *f, const float *w, int rows, int group,
                     bool asym, struct wrk_pool *pool, void *out);
void coord_gptq_factor_free(struct coord_gptq_factor *f);

/* The proxy loss GPTQ minimises, sum over rows of (w - q)^T H (w - q), for a dequantized @q. */
double coord_gptq_loss(const float *w, const float *q, int rows, int cols, const float *h);

struct coord_calib;
struct coord_source;
struct shardlm_err;
struct coord_awq;
struct kn_par;

/* AWQ (Lin et al. 2023) over the calibration @c of @src: for each layer's product inputs whose
 * scaling folds into the tensor before them - q/k/v (into attn_norm), gate/up (ffn_norm), down
 * (the rows of up), O (the rows of v; one scale per KV channel, shared by the query heads that
 * read it) - a per-channel scale s = rms(x)^a, a searched on a grid from 0 (no scaling) to 1 by
 * the output error of the scaled, rounded matrices on the calibration's sample rows. The
 * weights become W diag(s) and the tensor before takes 1 / s, so the model computes the same
 * function before rounding. The rounding runs on @par (NULL: the caller's thread; it stays the
 * caller's and must outlive the result). Returns 0 or -ENOMEM with @e set. */
int coord_awq_open(struct coord_awq **out, struct coord_calib *c, struct coord_source *src,
                   int group, bool asym, const struct kn_par *par, struct shardlm_err *e);
void coord_awq_free(struct coord_awq *a);
/* Applies AWQ's scales to the tensor of @kind (enum shlm_kind) of @layer (@rows x @cols floats at
 * @w, in place), searching its layer's scales at the layer's first tensor; *@col_scale is the
 * scale of each column (NULL when the columns are not scaled), by which the tensor's importance
 * divides twice. Returns 0 or -errno with @e set. */
int coord_awq_apply(struct coord_awq *a, int kind, uint32_t layer, float *w, int rows, int cols,
                    const float **col_scale, struct shardlm_err *e);

#endif
