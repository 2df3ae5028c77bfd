/* SPDX-License-Identifier: MIT */
/* coordinator/convert/calib.h: calibration for `shardlm convert --calib` - the model runs its own
 * forward (worker/model.c, in this process, over a bf16 image of the source) on calibration text
 * and collects, for the input of every linear layer, the per-channel mean square (llama.cpp's
 * "imatrix") and, for GPTQ and AWQ, the mean of x x^T (the layer's Hessian up to a factor 2). */
#ifndef SHARDLM_COORD_CALIB_H
#define SHARDLM_COORD_CALIB_H

#include "source.h"
#include "util.h"

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Calibration text: a file of at most this many bytes, and tokens used by default / at most. */
#define COORD_CALIB_MAX_BYTES (64u << 20)
#define COORD_CALIB_TOKENS 4096
#define COORD_CALIB_MAX_TOKENS (1 << 20)
/* Bytes of Hessians held at once: a third of MemAvailable, within these bounds. A model
 * whose Hessians exceed it takes several forward passes over the calibration tokens, each
 * collecting a range of layers (the statistics are the same). */
#define COORD_CALIB_HESSIAN_MIN ((size_t)1 << 30)
#define COORD_CALIB_HESSIAN_MAX ((size_t)16 << 30)
#define COORD_CALIB_SAMPLES 128
/* The held-out slice (coord_calib_opts.holdout): 1/COORD_CALIB_HELDOUT_PART of the tokens, the
 * last ones, and at least COORD_CALIB_HELDOUT_MIN of them. */
#define COORD_CALIB_HELDOUT_PART 8
#define COORD_CALIB_HELDOUT_MIN 16

struct coord_calib_opts {
    const char *text; /* a UTF-8 text file, or NULL: the model writes its own text (--calib self) */
    int tokens;       /* calibration tokens (0: COORD_CALIB_TOKENS) */
    bool hessians;    /* collect x x^T too */
    bool head;        /* collect the LM head's input too (its logits cost a product per token) */
    bool samples;     /* keep COORD_CALIB_SAMPLES input rows per product, spread over the text */
    /* keep the last eighth of the tokens out of every statistic (--method auto's held-out
     * slice, coord_calib_heldout); at least COORD_CALIB_HELDOUT_MIN tokens or -EINVAL */
    bool holdout;
    int threads;      /* forward threads (0: the online CPUs) */
    /* When set and nonzero (a signal's number): stop with -ECANCELED, seen between forward
     * steps. NULL: never. */
    volatile sig_atomic_t *cancel;
    /* Progress, when set: @stage ("tokens", "statistics") and its count so far of @total. */
    void (*progress)(void *ctx, const char *stage, long done, long total);
    void *progress_ctx;
};

struct coord_calib;

/* Tokenizes (or generates) the calibration tokens of @src's model and runs the first pass.
 * @src stays open while the calibration lives. Returns 0 or -errno with @e set: an empty text,
 * one that is not UTF-8 or past COORD_CALIB_MAX_BYTES, too few tokens, out of memory,
 * -ECANCELED when @o->cancel was set (coord_calib_stats's later passes too). Release
 * with coord_calib_free(). */
int coord_calib_open(struct coord_calib **out, struct coord_source *src,
                     const struct coord_calib_opts *o, struct shardlm_err *e);
void coord_calib_free(struct coord_calib *c);

/* The statistics of the input of the tensor of @kind (enum shlm_kind) of @layer, of @cols
 * columns: *@imatrix the per-column mean square (cols floats), *@hessian (when the calibration
 * collects them, else NULL) the mean of x x^T (cols x cols, symmetric). Both NULL when the tensor
 * is no quantized linear layer's weight (its kind's site in the tensor table). The pointers hold
 * until the next call. Returns 0 or -errno with @e set (a pass that ran out of memory). */
int coord_calib_stats(struct coord_calib *c, int kind, uint32_t layer, int cols,
                      const float **imatrix, const float **hessian, struct shardlm_err *e);
/* Which product input the tensor of @kind of @layer reads (tensors that read the same input, as
 * q, k and v do, have the same key), or -1 when it is no quantized linear layer's weight. */
long coord_calib_site(const struct coord_calib *c, int kind, uint32_t layer);

/* The input rows kept of layer @layer's product input @site (enum wrk_site): *@n rows of @cols
 * floats at *@x (NULL, 0 when no samples were kept). */
void coord_calib_samples(const struct coord_calib *c, uint32_t layer, int site, int cols,
                         const float **x, int *n);
/* The per-column mean square of layer @layer's product input @site; NULL when not collected.
 * Valid while @c is. */
const double *coord_calib_sumsq(const struct coord_calib *c, uint32_t layer, int site, long *rows);

/* The lower triangle of @h (cols x cols) += x^T x for the @n rows of @x, @ld floats apart (the
 * upper triangle is scratch), by @ops' gram_tile, split over @pool's threads (NULL: the
 * caller's). */
struct wrk_pool;
struct kn_ops;
void coord_calib_hessian_add(float *h, const float *x, int n, int ld, int cols,
                             const struct kn_ops *ops, struct wrk_pool *pool);

/* The tokens the statistics came from (for the closing line). */
long coord_calib_tokens(const struct coord_calib *c);

/* The held-out slice of a calibration opened with opts.holdout: *@n sequences, the i-th of
 * @len[i] tokens (BOS first), one after another at *@tok; (NULL, NULL, 0) without. The tokens
 * are the last of the calibration's (a sequence the cut falls in gives its tail, after a BOS of
 * its own); no statistic has seen them. Valid while @c is. */
void coord_calib_heldout(const struct coord_calib *c, const int32_t **tok, const int **len, int *n);
/* Whether coord_calib_stats returns Hessians (when the calibration collected them): a method
 * that reads none turns them off so as not to copy them, or to run passes for them. */
void coord_calib_want_hessians(struct coord_calib *c, bool want);

/* Reads @path as calibration text: refuses a missing, empty or non-UTF-8 file or one past
 * COORD_CALIB_MAX_BYTES with a line naming it. On success *@text is malloc'd and NUL-terminated. */
int coord_calib_read_text(const char *path, char **text, size_t *len, struct shardlm_err *e);

#endif
