/* SPDX-License-Identifier: MIT */
/* coordinator/convert/auto.c: `shardlm convert --method auto` - every method fitted on the
 * calibration's statistics, each one's result run on the slice of the calibration text that no
 * statistic saw (calib.h, coord_calib_opts.holdout), and the one closest to the f32 model kept.
 *
 * The candidates share one calibration (one forward over the text, Hessians and sample rows
 * collected once); each is encoded into an image in memory as coord_convert would write it and
 * run by worker/model.c in this process, as the calibration runs its bf16 image. The measure is
 * `shardlm eval`'s: the mean over positions of KL(f32 || candidate), here over the held-out
 * positions, all of them unless the f32 model's log-probabilities there pass the bound
 * (coord_convert_opts.heldout_bytes, COORD_AUTO_REF_BYTES): then the first that fit. A
 * candidate's logits are taken one forward step at a time (at most COORD_AUTO_STEP_BYTES), so
 * the evaluation holds at most those two. rtn is the first candidate and another replaces the best
 * only when strictly lower, so the choice is never worse than rtn on that slice. */
#include "convert.h"

#include "calib.h"
#include "kn.h"
#include "model.h"
#include "pool.h"
#include "seg.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define AUTO_CHUNK 128 /* tokens per forward call */

/* The held-out sequences and what each candidate is compared with. */
struct auto_ctx {
    const int32_t *tok;
    const int *len;
    int n_seqs;
    long n_tok; /* the positions scored: the first of the held-out sequences' */
    int vocab;
    int step;    /* tokens per forward call */
    int max_len; /* the longest sequence, as far as it is scored */
    struct wrk_pool *pool;
    const struct kn_ops *ops;
    volatile sig_atomic_t *cancel;
    float *ref;    /* (n_tok, vocab) log-softmax of the f32 model's logits */
    float *logits; /* (step, vocab) a forward step's logits */
};

/* In place: the log-softmax of a row of @n logits (in double, stored as float). */
static void log_softmax(float *x, int n)
{
    float mx = x[0];
    for (int i = 1; i < n; i++)
        mx = fmaxf(mx, x[i]);
    double sum = 0.0;
    for (int i = 0; i < n; i++)
        sum += exp((double)x[i] - mx);
    double lse = mx + log(sum);
    for (int i = 0; i < n; i++)
        x[i] = (float)((double)x[i] - lse);
}

/* KL(p || q) of two rows of log-probabilities. */
static double kld_row(const float *lp, const float *lq, int n)
{
    double k = 0.0;
    for (int i = 0; i < n; i++)
        k += exp((double)lp[i]) * ((double)lp[i] - lq[i]);
    return k;
}

/* Runs the model image @image over the held-out sequences: with @ref NULL their log-softmaxed
 * logits go into a->ref, else *@kld is the mean KL(a->ref || model) over every position.
 * Returns 0 or -errno with @e set. */
static int heldout_run(struct auto_ctx *a, void *image, size_t size, double *kld,
                       struct shardlm_err *e)
{
    struct shlm_model img;
    struct wrk_model m;
    int rc = shlm_parse(&img, image, size, "model image", e);
    if (rc)
        return rc;
    if ((rc = wrk_model_init(&m, &img, a->ops, a->step, a->pool, NULL)))
        return shardlm_fail(e, rc, "out of memory for the held-out forward");
    const struct shlm_config *c = &img.hdr->cfg;
    uint32_t kvd = (uint32_t)m.plan.kv_dim;
    uint32_t blocks = (uint32_t)((a->max_len + SEG_KV_BLOCK - 1) / SEG_KV_BLOCK);
    void *kv = calloc(1, seg_kv_bytes(blocks, c->n_layers, kvd, m.plan.kv_keys_only));
    uint32_t *table = malloc((size_t)blocks * sizeof(*table));
    if (!kv || !table) {
        rc = shardlm_fail(e, -ENOMEM, "out of memory for the held-out KV cache");
        goto out;
    }
    seg_kv_init(kv, blocks, c->n_layers, kvd, m.plan.kv_keys_only);
    for (uint32_t b = 0; b < blocks; b++)
        table[b] = b;
    double sum = 0.0;
    long at = 0; /* scored positions before sequence q */
    for (int q = 0; q < a->n_seqs && at < a->n_tok; at += a->len[q++]) {
        int len = a->n_tok - at < a->len[q] ? (int)(a->n_tok - at) : a->len[q];
        for (int p = 0; p < len; p += a->step) {
            int n = len - p < a->step ? len - p : a->step;
            float *dst = kld ? a->logits : a->ref + (size_t)(at + p) * a->vocab;
            if (a->cancel && *a->cancel) {
                rc = shardlm_fail(e, -ECANCELED, "conversion stopped");
                goto out;
            }
            if ((rc = wrk_forward(&m, kv, table, a->tok + at + p, n, p, dst, true))) {
                rc = shardlm_fail(e, rc, "held-out forward failed");
                goto out;
            }
            for (int i = 0; i < n; i++) {
                float *row = dst + (size_t)i * a->vocab;
                log_softmax(row, a->vocab);
                if (kld)
                    sum += kld_row(a->ref + (size_t)(at + p + i) * a->vocab, row, a->vocab);
            }
        }
    }
    if (kld)
        *kld = sum / (double)a->n_tok;
out:
    free(kv);
    free(table);
    wrk_model_free(&m);
    return rc;
}

int coord_auto(struct coord_source *src, const struct coord_convert_opts *o, int group,
               struct coord_calib *calib, struct wrk_pool *pool, void **image, size_t *size,
               struct coord_auto_report *r, struct shardlm_err *e)
{
    struct auto_ctx a = {.vocab = (int)src->cfg.vocab_size, .pool = pool, .cancel = o->cancel};
    void *img = NULL;
    size_t img_size = 0;
    int rc;
    memset(r, 0, sizeof(*r));
    *image = NULL;
    coord_calib_heldout(calib, &a.tok, &a.len, &a.n_seqs);
    KN_ASSERT(a.n_seqs > 0); /* coord_calib_open refused a calibration without */
    size_t row = (size_t)a.vocab * sizeof(float);
    size_t bound = o->heldout_bytes ? o->heldout_bytes : COORD_AUTO_REF_BYTES;
    r->heldout_bound = bound;
    long fit = bound / row > 0 ? (long)(bound / row) : 1;
    for (int q = 0; q < a.n_seqs; q++)
        r->heldout_tokens += a.len[q];
    a.n_tok = r->heldout_tokens < fit ? r->heldout_tokens : fit;
    r->heldout_scored = a.n_tok;
    for (long q = 0, at = 0; q < a.n_seqs && at < a.n_tok; at += a.len[q++]) {
        int len = a.n_tok - at < a.len[q] ? (int)(a.n_tok - at) : a.len[q];
        a.max_len = len > a.max_len ? len : a.max_len;
    }
    a.step =
        COORD_AUTO_STEP_BYTES / row < AUTO_CHUNK ? (int)(COORD_AUTO_STEP_BYTES / row) : AUTO_CHUNK;
    a.step = a.step > 0 ? a.step : 1;
    a.ops = kn_ops_select(NULL, NULL, 0); /* as the calibration's forward: the fastest */
    a.ref = malloc((size_t)a.n_tok * row);
    a.logits = malloc((size_t)a.step * row);
    if (!a.ref || !a.logits) {
        rc =
            shardlm_fail(e, -ENOMEM, "out of memory for the held-out logits (%ld tokens)", a.n_tok);
        goto out;
    }
    /* the reference: the source in f32 */
    uint64_t t0 = shardlm_now_ns();
    if ((rc = coord_convert_image(src, SHLM_SCHEME_F32, o->cancel, &img, &img_size, e)))
        goto out;
    rc = heldout_run(&a, img, img_size, NULL, e);
    munmap(img, img_size);
    if (rc)
        goto out;
    r->ref_seconds = (double)(shardlm_now_ns() - t0) / 1e9;
    r->chosen = COORD_QUANT_RTN;
    for (int m = 0; m < COORD_QUANT_AUTO; m++) {
        r->kld[m] = NAN;
        if (o->cancel && *o->cancel) {
            rc = shardlm_fail(e, -ECANCELED, "conversion stopped");
            goto out;
        }
        if (o->stage)
            o->stage(o->progress_ctx, "methods", m, COORD_QUANT_AUTO);
        t0 = shardlm_now_ns();
        rc = coord_convert_image_by(src, o, group, (enum coord_quant_method)m, calib, pool, &img,
                                    &img_size, e);
        if (rc == -EDOM) /* GPTQ on a Hessian that stays singular: not a candidate */
            continue;
        if (rc)
            goto out;
        double kld;
        rc = heldout_run(&a, img, img_size, &kld, e);
        r->seconds[m] = (double)(shardlm_now_ns() - t0) / 1e9;
        if (rc) {
            munmap(img, img_size);
            goto out;
        }
        r->kld[m] = kld;
        if (!*image || kld < r->kld[r->chosen]) { /* rtn first; a tie keeps the earlier */
            if (*image)
                munmap(*image, *size);
            *image = img;
            *size = img_size;
            r->chosen = (enum coord_quant_method)m;
        } else {
            munmap(img, img_size);
        }
    }
    if (o->stage)
        o->stage(o->progress_ctx, "methods", COORD_QUANT_AUTO, COORD_QUANT_AUTO);
    rc = 0;
out:
    if (rc && *image) {
        munmap(*image, *size);
        *image = NULL;
    }
    free(a.ref);
    free(a.logits);
    return rc;
}
