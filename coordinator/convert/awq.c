/* SPDX-License-Identifier: MIT */
/* coordinator/convert/awq.c: activation-aware scaling (see quant.h).
 *
 * A layer's scales are searched when its first tensor is written (the file holds a layer's
 * tensors together, norms first): the weights of each product are read from the source, and for
 * each grid point a the scaled matrices are rounded (the imatrix-weighted search, the importance
 * of column c divided by s_c^2 as its input is) and scored by sum over the sample rows x of
 * |(W - Q(W diag(s)) diag(s)^-1) x|^2. a = 0 is no scaling, so the search never does worse on
 * that score than imatrix alone. */
#include "quant.h"

#include "calib.h"
#include "kn.h"
#include "model.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define AWQ_GRID 10 /* a = 0, 0.1, ..., 1 */

/* The foldable inputs: the products that read each are the quantized kinds of the tensor table
 * whose site it is; the scale folds into the kinds that feed it (shlm_kinds[].feeds). */
static const struct awq_site {
    enum wrk_site site;
} awq_sites[] = {{WRK_SITE_QKV}, {WRK_SITE_O}, {WRK_SITE_GATE_UP}, {WRK_SITE_DOWN}};
#define AWQ_SITES 4
#define AWQ_MATS 3 /* products per site at most (q, k, v) */

struct coord_awq {
    struct coord_calib *calib;
    struct coord_source *src;
    struct shlm_config cfg;
    int group;
    bool asym;
    long layer;          /* whose scales s[] hold; -1 none */
    float *s[AWQ_SITES]; /* per input column of each site (O: qd columns) */
    float *kv_s;         /* O's scale per KV channel (kvd): the rows of v divide by it */
    const struct kn_par *par; /* the quantizer's threads */
};

int coord_awq_open(struct coord_awq **out, struct coord_calib *c, struct coord_source *src,
                   int group, bool asym, const struct kn_par *par, struct shardlm_err *e)
{
    struct coord_awq *a = calloc(1, sizeof(*a));
    *out = NULL;
    if (!a)
        return shardlm_fail(e, -ENOMEM, "out of memory");
    *a = (struct coord_awq){c, src, src->cfg, group, asym, -1, {0}, NULL, par};
    const struct shlm_config *g = &a->cfg;
    int cols[AWQ_SITES] = {(int)g->dim, (int)(g->n_heads * shlm_v_dim(g, &src->cfgx)), (int)g->dim,
                           (int)g->hidden_dim};
    bool ok = (a->kv_s = malloc((size_t)g->n_kv_heads * g->head_dim * sizeof(float))) != NULL;
    for (int k = 0; k < AWQ_SITES; k++)
        ok = ok && (a->s[k] = malloc((size_t)cols[k] * sizeof(float)));
    if (!ok) {
        coord_awq_free(a);
        return shardlm_fail(e, -ENOMEM, "out of memory");
    }
    *out = a;
    return 0;
}

void coord_awq_free(struct coord_awq *a)
{
    if (!a)
        return;
    for (int k = 0; k < AWQ_SITES; k++)
        free(a->s[k]);
    free(a->kv_s);
    free(a);
}

/* The rms of each input column of @site; O's is averaged over the query heads that share a KV
 * head (they share its scale). */
static void site_rms(const struct coord_awq *a, uint32_t l, const struct awq_site *st, int cols,
                     float *rms)
{
    long rows;
    const double *sq = coord_calib_sumsq(a->calib, l, st->site, &rows);
    for (int c = 0; c < cols; c++)
        rms[c] = (float)sqrt(sq[c] / (double)(rows > 0 ? rows : 1));
    if (st->site != WRK_SITE_O || a->src->cfgx.kv_lora_rank) /* latent attention: no sharing */
        return;
    int hd = (int)a->cfg.head_dim, mul = (int)(a->cfg.n_heads / a->cfg.n_kv_heads);
    for (int kv = 0; kv < (int)a->cfg.n_kv_heads; kv++)
        for (int j = 0; j < hd; j++) {
            float m = 0.0f;
            for (int h = kv * mul; h < (kv + 1) * mul; h++)
                m += rms[h * hd + j];
            for (int h = kv * mul; h < (kv + 1) * mul; h++)
                rms[h * hd + j] = m / (float)mul;
        }
}

/* s = rms^@alpha, normalised so that max * min = 1 (as AWQ does), kept away from 0. */
static void scales_for(const float *rms, int cols, float alpha, float *s)
{
    float lo = INFINITY, hi = 0.0f;
    for (int c = 0; c < cols; c++) {
        s[c] = alpha == 0.0f ? 1.0f : powf(fmaxf(rms[c], 1e-8f), alpha);
        lo = fminf(lo, s[c]);
        hi = fmaxf(hi, s[c]);
    }
    float norm = sqrtf(lo * hi);
    for (int c = 0; c < cols; c++)
        s[c] = fmaxf(s[c] / norm, 1e-4f);
}

/* The output error on the samples of rounding @w (rows x cols) scaled by @s. */
static double scaled_error(const struct coord_awq *a, const float *w, int rows, int cols,
                           const float *s, const float *imp0, const float *x, int nx, float *ws,
                           float *imp, void *q, float *row)
{
    enum kn_dtype dt = a->asym ? KN_DT_W4A16 : KN_DT_W4A8;
    for (int c = 0; c < cols; c++)
        imp[c] = imp0[c] / (s[c] * s[c]);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            ws[(size_t)r * cols + c] = w[(size_t)r * cols + c] * s[c];
    kn_quant_w4(ws, rows, cols, a->group, a->asym, imp, q, a->par);
    struct kn_mat m;
    kn_mat_view(&m, dt, rows, cols, a->group, q);
    double err = 0.0;
    for (int r = 0; r < rows; r++) {
        kn_mat_row(&m, r, row);
        for (int c = 0; c < cols; c++) /* the error of W's row, back in unscaled columns */
            row[c] = w[(size_t)r * cols + c] - row[c] / s[c];
        for (int i = 0; i < nx; i++) {
            const float *xi = x + (size_t)i * cols;
            float d = 0.0f;
            for (int c = 0; c < cols; c++)
                d += row[c] * xi[c];
            err += (double)d * d;
        }
    }
    return err;
}

/* Searches site @st of layer @l: reads its matrices, scores the grid, keeps the best scale. */
static int search_site(struct coord_awq *a, uint32_t l, const struct awq_site *st, int k,
                       struct shardlm_err *e)
{
    const struct shlm_config *g = &a->cfg;
    /* the site's products: kind, rows; their columns are the site's width */
    enum shlm_kind kinds[AWQ_MATS];
    int nk = 0, cols = 0;
    for (int t = SHLM_KIND_FIRST_LAYER; t < SHLM_KIND_COUNT; t++)
        if (shlm_kinds[t].site == (enum shlm_site)st->site && shlm_kinds[t].dtc == SHLM_DTC_MAT &&
            shlm_kind_present(g, &a->src->cfgx, (enum shlm_kind)t, l)) {
            KN_ASSERT(nk < AWQ_MATS);
            kinds[nk++] = (enum shlm_kind)t;
            cols = shlm_dim_size(g, &a->src->cfgx, shlm_kinds[t].cols);
        }
    if (!nk) { /* a MoE layer's FFN: its experts do not scale their columns (calibration does
                * not see them), so nothing before them divides: scales of 1 */
        int width = st->site == WRK_SITE_DOWN ? (int)g->hidden_dim : (int)g->dim;
        for (int c = 0; c < width; c++)
            a->s[k][c] = 1.0f;
        return 0;
    }
    const float *x;
    int nx, nm = 0, rows[AWQ_MATS] = {0}, rc = 0;
    coord_calib_samples(a->calib, l, st->site, cols, &x, &nx);
    float *w[AWQ_MATS] = {0}, *rms = malloc((size_t)cols * sizeof(float)),
          *imp0 = malloc((size_t)cols * sizeof(float)), *s = malloc((size_t)cols * sizeof(float)),
          *imp = malloc((size_t)cols * sizeof(float)), *row = malloc((size_t)cols * sizeof(float));
    float *ws = NULL;
    void *q = NULL;
    size_t most = 0;
    if (!rms || !imp0 || !s || !imp || !row)
        goto oom;
    for (; nm < nk; nm++) {
        rows[nm] = shlm_dim_size(g, &a->src->cfgx, shlm_kinds[kinds[nm]].rows);
        size_t n = (size_t)rows[nm] * cols;
        most = n > most ? n : most;
        if (!(w[nm] = malloc(n * sizeof(float))))
            goto oom;
        if ((rc = a->src->read(a->src, kinds[nm], l, 0, rows[nm], cols, w[nm], e)))
            goto out;
    }
    if (!(ws = malloc(most * sizeof(float))) ||
        !(q = malloc(kn_mat_bytes(a->asym ? KN_DT_W4A16 : KN_DT_W4A8, (int)(most / cols), cols,
                                  a->group))))
        goto oom;
    site_rms(a, l, st, cols, rms);
    for (int c = 0; c < cols; c++)
        imp0[c] = rms[c] * rms[c];
    double best = INFINITY;
    for (int i = 0; i <= AWQ_GRID; i++) {
        float alpha = (float)i / AWQ_GRID;
        scales_for(rms, cols, alpha, s);
        double err = 0.0;
        for (int m = 0; m < nm; m++)
            err += scaled_error(a, w[m], rows[m], cols, s, imp0, x, nx, ws, imp, q, row);
        if (err < best) {
            best = err;
            memcpy(a->s[k], s, (size_t)cols * sizeof(float));
        }
    }
    goto out;
oom:
    rc = shardlm_fail(e, -ENOMEM, "out of memory for AWQ of layer %u", l);
out:
    for (int m = 0; m < AWQ_MATS; m++)
        free(w[m]);
    free(rms);
    free(imp0);
    free(s);
    free(imp);
    free(row);
    free(ws);
    free(q);
    return rc;
}

static int awq_layer(struct coord_awq *a, uint32_t l, struct shardlm_err *e)
{
    int rc;
    for (int k = 0; k < AWQ_SITES; k++)
        if ((rc = search_site(a, l, &awq_sites[k], k, e)))
            return rc;
    /* O's scale per KV channel: the query heads of a KV head share it (site_rms); latent
     * attention's O channels are attn_v_b's rows, one each */
    if (a->src->cfgx.kv_lora_rank) {
        a->layer = l;
        return 0;
    }
    int hd = (int)a->cfg.head_dim, mul = (int)(a->cfg.n_heads / a->cfg.n_kv_heads);
    for (int kv = 0; kv < (int)a->cfg.n_kv_heads; kv++)
        for (int j = 0; j < hd; j++)
            a->kv_s[kv * hd + j] = a->s[1][kv * mul * hd + j];
    a->layer = l;
    return 0;
}

static void scale_cols(float *w, int rows, int cols, const float *s)
{
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            w[(size_t)r * cols + c] *= s[c];
}

/* Row r (or element r of a vector) divided by s[r]. */
static void unscale_rows(float *w, int rows, int cols, const float *s)
{
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            w[(size_t)r * cols + c] /= s[r];
}

int coord_awq_apply(struct coord_awq *a, int kind, uint32_t l, float *w, int rows, int cols,
                    const float **col_scale, struct shardlm_err *e)
{
    *col_scale = NULL;
    int rc;
    if ((unsigned)kind >= SHLM_KIND_COUNT || !shlm_kinds[kind].layer || l >= a->cfg.n_layers)
        return 0;
    if ((long)l != a->layer && (rc = awq_layer(a, l, e)))
        return rc;
    /* a product's columns times its input's scale; the rows (a vector's elements) of what feeds
     * a scaled input divided by it: O's input per KV channel (through attention, from v) */
    const struct shlm_kind_traits *t = &shlm_kinds[kind];
    bool vector = t->rows == SHLM_DIM_ONE;
    if (t->site >= 0 && t->site < AWQ_SITES && !vector)
        scale_cols(w, rows, cols, *col_scale = a->s[t->site]);
    if (t->feeds >= 0 && t->feeds < AWQ_SITES) {
        const float *d =
            t->feeds == SHLM_SITE_O && !a->src->cfgx.kv_lora_rank ? a->kv_s : a->s[t->feeds];
        if (vector) /* a (1, n) vector: element c by d[c] */
            unscale_rows(w, cols, 1, d);
        else
            unscale_rows(w, rows, cols, d);
    }
    return 0;
}
