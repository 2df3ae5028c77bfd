/* SPDX-License-Identifier: MIT */
/* coordinator/convert/convert.c: `shardlm convert` below the CLI - a model source (GGUF file,
 * Hugging Face folder, llama2.c checkpoint + tokenizer.bin) laid out, encoded in a scheme and
 * written as a .shlm file, whole or not at all. */
#include "convert.h"

#include "calib.h"
#include "source.h"

#include "fault.h"
#include "pool.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static int pwrite_all(int fd, const void *buf, size_t n, uint64_t off)
{
    const uint8_t *p = buf;
    while (n) {
        ssize_t w = pwrite(fd, p, n, (off_t)off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return w < 0 ? -errno : -EIO;
        p += w;
        n -= (size_t)w;
        off += (uint64_t)w;
    }
    return 0;
}

/* Encodes f32 rows into the tensor's format, split over @par (NULL: this thread). */
static void encode(const struct shlm_tensor_spec *s, const float *src, void *dst,
                   const struct kn_par *par)
{
    const struct kn_type_traits *tt = &kn_type_traits[s->dtype];
    KN_ASSERT(tt->from_float); /* NULL for the device layouts: never in a file */
    tt->from_float(src, s->rows, s->cols, s->group, dst, par);
}

/* The W4 group of @o's scheme (the scheme's default for 0), checked with the head bits; 0 for
 * the schemes without groups. A group is a multiple of 32 up to KN_MAX_GROUP, as the .shlm
 * format takes it (shlm_expected_tensors). Returns 0 or -EINVAL with @e naming the option. */
static int convert_group(const struct coord_convert_opts *o, int *group, struct shardlm_err *e)
{
    *group = 0;
    if (o->scheme != SHLM_SCHEME_W4A16 && o->scheme != SHLM_SCHEME_W4A8)
        return 0;
    int g = o->group ? o->group : o->scheme == SHLM_SCHEME_W4A16 ? 64 : 128;
    if (g < 32 || g > KN_MAX_GROUP || g % 32)
        return shardlm_fail(e, -EINVAL, "--group %d: expected a multiple of 32 from 32 to %d", g,
                            KN_MAX_GROUP);
    if (o->head_bits != 8 && o->head_bits != 6 && o->head_bits != 4)
        return shardlm_fail(e, -EINVAL, "--head-bits %d: expected 8, 6 or 4", o->head_bits);
    *group = g;
    return 0;
}

/* The .shlm being written: its tensors (specs and table entries) and its header. */
struct convert_plan {
    struct shlm_tensor_spec *specs; /* (SHLM_MAX_TENSORS), n used */
    struct shlm_tensor *table;      /* (SHLM_MAX_TENSORS), n used */
    struct shlm_header *h;
    int n;
};

static void plan_free(struct convert_plan *p)
{
    free(p->specs);
    free(p->table);
    free(p->h);
}

/* Lays out the file for @src's config in @o's scheme: the tensors it needs, their offsets and
 * sizes, and the header fields (checksums excepted). Returns 0 or -errno with @e set; release
 * with plan_free() either way. */
static int plan_layout(struct convert_plan *p, const struct coord_source *src,
                       enum shlm_scheme scheme, int group, int head_bits, struct shardlm_err *e)
{
    p->specs = calloc(SHLM_MAX_TENSORS, sizeof(*p->specs));
    p->table = calloc(SHLM_MAX_TENSORS, sizeof(*p->table));
    p->h = calloc(1, sizeof(*p->h));
    if (!p->specs || !p->table || !p->h)
        return shardlm_fail(e, -ENOMEM, "out of memory");
    p->n = shlm_expected_tensors(&src->cfg, &src->cfgx, scheme, group, head_bits, NULL, p->specs,
                                 SHLM_MAX_TENSORS);
    if (p->n < 0)
        return shardlm_fail(e, -EINVAL,
                            "%s: the model needs more than %d tensors (layers x experts)",
                            src->path, SHLM_MAX_TENSORS);
    struct shlm_header *h = p->h;
    shlm_layout(h, p->table, p->specs, p->n, src->tok_len);
    h->cfg = src->cfg;
    h->cfgx = src->cfgx;
    h->scheme = scheme;
    h->group = (uint32_t)group;
    h->head_bits = group ? (uint32_t)head_bits : 0;
    h->tok_kind = src->tok_kind;
    h->bos_id = src->bos_id;
    h->eos_id = src->eos_id;
    return 0;
}

/* What the tensors are encoded with: the options, and the calibration's statistics when a
 * method needs them (NULL: plain encoding). */
struct convert_enc {
    const struct coord_convert_opts *o;
    enum coord_quant_method method; /* o->method, or the candidate --method auto fits */
    struct coord_calib *calib;
    struct coord_awq *awq; /* --method awq */
    /* GPTQ: the factorisation of the last input's Hessian (q, k and v share one) */
    struct coord_gptq_factor *factor;
    long factor_site;
    struct wrk_pool *pool; /* the quantizer's and GPTQ's threads (NULL: this one) */
    struct kn_par par;     /* the same for the kernels' quantizers */
};

/* The threads @c's tensors are quantized on: its pool, or NULL for this thread alone. */
static const struct kn_par *enc_par(const struct convert_enc *c)
{
    return c->pool ? &c->par : NULL;
}

static bool is_w4(enum kn_dtype dt) { return dt == KN_DT_W4A8 || dt == KN_DT_W4A16; }

/* Encodes W4 tensor @s from @w (rows x cols floats) by a calibrated method into @dst; a tensor
 * that is no linear layer's weight (no statistics) is encoded plainly. Returns 0 or -errno. */
static int encode_calibrated(struct convert_enc *c, const struct shlm_tensor_spec *s,
                             const float *w, const float *col_scale, void *dst,
                             struct shardlm_err *e)
{
    const float *imat, *h;
    long site = coord_calib_site(c->calib, s->kind, s->layer);
    bool asym = s->dtype == KN_DT_W4A16, factored = c->factor && site == c->factor_site;
    int rc = 0;
    if (!factored && (rc = coord_calib_stats(c->calib, s->kind, s->layer, s->cols, &imat, &h, e)))
        return rc;
    if (factored) /* GPTQ's factorisation of this input is at hand: no Hessian to copy */
        return coord_gptq_apply(c->factor, w, s->rows, s->group, asym, c->pool, dst)
                   ? shardlm_fail(e, -ENOMEM, "out of memory for GPTQ of tensor %s", s->name)
                   : 0;
    if (!imat) {
        encode(s, w, dst, enc_par(c));
        return 0;
    }
    switch (c->method) {
    case COORD_QUANT_GPTQ: {
        struct coord_gptq_opts g = {
            c->o->damp > 0.0f ? c->o->damp : coord_gptq_damp(s->cols, coord_calib_tokens(c->calib)),
            !c->o->no_act_order};
        coord_gptq_factor_free(c->factor);
        c->factor = NULL;
        if (!(rc = coord_gptq_factor(h, s->cols, &g, c->pool, &c->factor))) {
            c->factor_site = site;
            rc = coord_gptq_apply(c->factor, w, s->rows, s->group, asym, c->pool, dst);
        }
        if (rc == -EDOM)
            return shardlm_fail(e, rc,
                                "tensor %s: its Hessian stays singular after dampening "
                                "(try a larger --damp, or more calibration text)",
                                s->name);
        return rc ? shardlm_fail(e, rc, "out of memory for GPTQ of tensor %s", s->name) : 0;
    }
    case COORD_QUANT_AWQ: { /* the columns were scaled by AWQ: their inputs divide by it */
        float *imp = malloc((size_t)s->cols * sizeof(float));
        if (!imp)
            return shardlm_fail(e, -ENOMEM, "out of memory");
        for (int i = 0; i < s->cols; i++)
            imp[i] = col_scale ? imat[i] / (col_scale[i] * col_scale[i]) : imat[i];
        kn_quant_w4(w, s->rows, s->cols, s->group, asym, imp, dst, enc_par(c));
        free(imp);
        return 0;
    }
    default: /* imatrix */
        kn_quant_w4(w, s->rows, s->cols, s->group, asym, imat, dst, enc_par(c));
        return 0;
    }
}

/* Reads tensor @t of @src as float32, encodes it as @spec and @enc say, checksums it and writes
 * it at its offset in @fd. Returns 0 or -errno with @e naming the tensor or the output. */
static int write_tensor(int fd, struct coord_source *src, const struct shlm_tensor_spec *spec,
                        struct shlm_tensor *t, struct convert_enc *enc, const char *out,
                        struct shardlm_err *e)
{
    float *f32 = malloc((size_t)t->rows * t->cols * sizeof(float));
    void *buf = malloc(t->bytes);
    int rc;
    if (!f32 || !buf) {
        rc = shardlm_fail(e, -ENOMEM, "out of memory for tensor %s", t->name);
        goto out_free;
    }
    rc = src->read(src, (enum shlm_kind)spec->kind, spec->layer, spec->expert, (int)t->rows,
                   (int)t->cols, f32, e);
    if (rc == -ENOENT)
        shardlm_fail(e, rc, "%s: tensor %s is missing", src->path, t->name);
    if (rc)
        goto out_free;
    const float *col_scale = NULL;
    if (enc->awq && (rc = coord_awq_apply(enc->awq, spec->kind, spec->layer, f32, (int)t->rows,
                                          (int)t->cols, &col_scale, e)))
        goto out_free;
    if (enc->calib && is_w4(spec->dtype))
        rc = encode_calibrated(enc, spec, f32, col_scale, buf, e);
    else
        encode(spec, f32, buf, enc_par(enc));
    if (rc)
        goto out_free;
    t->checksum = shlm_hash(buf, t->bytes);
    if ((rc = pwrite_all(fd, buf, t->bytes, t->offset)))
        shardlm_fail(e, rc, "%s: write failed: %s", out, strerror(-rc));
out_free:
    free(f32);
    free(buf);
    return rc;
}

static int close_synced(int *fd, const char *out, struct shardlm_err *e);

/* Seals the header and writes it, the tensor table and the tokenizer, then syncs and closes @fd
 * (*@fd = -1 once it is closed, whether the sync or the close failed; a failed write leaves it
 * open for the caller). Returns 0 or -errno with @e naming @out. */
static int write_tail(int *fd, struct convert_plan *p, const struct coord_source *src,
                      const char *out, struct shardlm_err *e)
{
    struct shlm_header *h = p->h;
    int rc;
    h->tok_checksum = shlm_hash(src->tok, src->tok_len);
    shlm_seal(h, p->table);
    if ((rc = pwrite_all(*fd, h, sizeof(*h), 0)) ||
        (rc = pwrite_all(*fd, p->table, (size_t)p->n * sizeof(*p->table), h->table_offset)) ||
        (rc = pwrite_all(*fd, src->tok, src->tok_len, h->tok_offset)))
        return shardlm_fail(e, rc, "%s: write failed: %s", out, strerror(-rc));
    return close_synced(fd, out, e);
}

/* Syncs and closes *@fd (*@fd = -1 whether the sync or the close failed). Returns 0 or -errno
 * with @e naming @out. */
static int close_synced(int *fd, const char *out, struct shardlm_err *e)
{
    /* closed whatever fsync says: the caller removes the temporary, the descriptor is ours */
    int rc = 0;
    if (shardlm_fault(SHARDLM_FAULT_FSYNC))
        rc = -EIO; /* as a failed write-back reports it */
    else if (fsync(*fd) < 0)
        rc = -errno;
    if (close(*fd) < 0 && !rc)
        rc = -errno;
    *fd = -1;
    if (rc)
        return shardlm_fail(e, rc, "%s: %s", out, strerror(-rc));
    return 0;
}

/* Checks @o's method against its scheme: a calibrated method rounds int4 matrices only, and a
 * calibration text is for a calibrated method. Returns 0 or -EINVAL with @e naming the options. */
static int check_method(const struct coord_convert_opts *o, struct shardlm_err *e)
{
    bool w4 = o->scheme == SHLM_SCHEME_W4A16 || o->scheme == SHLM_SCHEME_W4A8;
    if (o->method != COORD_QUANT_RTN && !w4)
        return shardlm_fail(e, -EINVAL,
                            "--method %s: %s has no int4 matrices to round "
                            "(methods apply to w4a16 and w4a8)",
                            coord_quant_method_name(o->method), shlm_scheme_name(o->scheme));
    if (o->calib && o->method == COORD_QUANT_RTN)
        return shardlm_fail(e, -EINVAL,
                            "--calib %s: %s uses no calibration (pick --method "
                            "imatrix, gptq, awq or auto)",
                            o->calib, w4 ? "--method rtn" : shlm_scheme_name(o->scheme));
    if (o->damp < 0.0f || o->damp > 1.0f || o->damp != o->damp)
        return shardlm_fail(e, -EINVAL, "--damp %g: expected 0 to 1", (double)o->damp);
    return 0;
}

/* The quantizer's and GPTQ's threads: --threads, or the online CPUs. */
static int quant_pool(const struct coord_convert_opts *o, struct convert_enc *c,
                      struct shardlm_err *e)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int n = o->threads > 0 ? o->threads : cpus > 0 ? (int)cpus : 1;
    int rc = wrk_pool_init(&c->pool, n, NULL);
    if (rc)
        return shardlm_fail(e, rc, "%s threads: %s",
                            o->method == COORD_QUANT_GPTQ ? "GPTQ" : "quantizer", strerror(-rc));
    c->par = wrk_pool_par(c->pool);
    return 0;
}

/* The calibration @o's method needs, or none (*@calib NULL). */
static int calibrate(const struct coord_convert_opts *o, struct coord_source *src,
                     struct coord_calib **calib, struct coord_calib_opts *co, struct shardlm_err *e)
{
    *calib = NULL;
    if (o->method == COORD_QUANT_RTN)
        return 0;
    *co = (struct coord_calib_opts){
        .text = o->calib && strcmp(o->calib, "self") ? o->calib : NULL,
        .tokens = o->calib_tokens,
        .hessians = o->method == COORD_QUANT_GPTQ || o->method == COORD_QUANT_AUTO,
        .samples = o->method == COORD_QUANT_AWQ || o->method == COORD_QUANT_AUTO,
        .holdout = o->method == COORD_QUANT_AUTO,
        .head = o->head_bits == 4,
        .threads = o->threads,
        .cancel = o->cancel,
        .progress = o->stage,
        .progress_ctx = o->progress_ctx};
    return coord_calib_open(calib, src, co, e);
}

int coord_convert(const struct coord_convert_opts *o, struct coord_convert_info *info,
                  struct shardlm_err *e)
{
    struct coord_source src;
    struct convert_plan p = {0};
    struct coord_calib *calib = NULL;
    struct coord_awq *awq = NULL;
    struct coord_calib_opts co;
    struct convert_enc enc = {.o = o, .method = o->method, .factor_site = -1};
    struct coord_convert_info scratch;
    int rc, group;
    const char *inputs[] = {o->checkpoint, o->tokenizer, o->calib};
    if (!info)
        info = &scratch;
    memset(info, 0, sizeof(*info));
    if ((rc = convert_group(o, &group, e)) || (rc = check_method(o, e)) ||
        (rc = coord_out_check(o->out, inputs, o->calib ? 3 : 2, e)))
        return rc;
    if ((rc = coord_source_open(&src, o->checkpoint, o->tokenizer, o->max_ctx, e)))
        return rc;
    struct shardlm_err cerr;
    if (shlm_config_check(&src.cfg, &cerr) || shlm_config_ext_check(&src.cfg, &src.cfgx, &cerr)) {
        rc = shardlm_fail(e, -EINVAL, "%s: %s", o->checkpoint, cerr.msg);
        goto out_src;
    }
    if ((rc = plan_layout(&p, &src, o->scheme, group, o->head_bits, e)))
        goto out_free;
    /* the output first: a folder that refuses it fails now, not after a calibration */
    char tmp[4200];
    int fd = coord_out_open(o->out, tmp, sizeof(tmp), e);
    if (fd < 0) {
        rc = fd;
        goto out_free;
    }
    if (ftruncate(fd, (off_t)p.h->file_bytes) < 0) {
        rc = shardlm_fail(e, -errno, "%s: %s", o->out, strerror(errno));
        goto out_unlink;
    }
    if ((rc = quant_pool(o, &enc, e)) || (rc = calibrate(o, &src, &calib, &co, e)))
        goto out_unlink;
    if (o->method == COORD_QUANT_AWQ &&
        (rc = coord_awq_open(&awq, calib, &src, group, o->scheme == SHLM_SCHEME_W4A16,
                             enc_par(&enc), e)))
        goto out_unlink;
    *info = (struct coord_convert_info){.group = group,
                                        .n_tensors = p.n,
                                        .file_bytes = p.h->file_bytes,
                                        .calib_tokens = calib ? coord_calib_tokens(calib) : 0,
                                        .method = o->method,
                                        .experts_rtn = src.cfgx.n_experts > 0 && group > 0};
    if (o->method == COORD_QUANT_AUTO) { /* the chosen candidate's image is the file */
        void *image;
        size_t size;
        if ((rc =
                 coord_auto(&src, o, group, calib, enc.pool, &image, &size, &info->auto_report, e)))
            goto out_unlink;
        KN_ASSERT(size == p.h->file_bytes);
        info->method = info->auto_report.chosen;
        if (o->progress)
            o->progress(o->progress_ctx, 0, p.n);
        if ((rc = pwrite_all(fd, image, size, 0)))
            shardlm_fail(e, rc, "%s: write failed: %s", o->out, strerror(-rc));
        munmap(image, size);
        if (rc)
            goto out_unlink;
        info->bytes_written = p.h->file_bytes;
        if (o->progress)
            o->progress(o->progress_ctx, p.n, p.n);
        rc = close_synced(&fd, o->out, e);
        goto out_commit;
    }
    if (o->progress)
        o->progress(o->progress_ctx, 0, p.n);
    enc.calib = calib;
    enc.awq = awq;
    for (int i = 0; i < p.n; i++) {
        if (o->cancel && *o->cancel) {
            rc = shardlm_fail(e, -ECANCELED, "%s: conversion stopped", o->out);
            goto out_unlink;
        }
        if ((rc = write_tensor(fd, &src, &p.specs[i], &p.table[i], &enc, o->out, e)))
            goto out_unlink;
        info->bytes_written += p.table[i].bytes;
        if (o->progress)
            o->progress(o->progress_ctx, i + 1, p.n);
    }
    rc = write_tail(&fd, &p, &src, o->out, e);
out_commit:
    if (rc)
        goto out_unlink;
    if (o->cancel && *o->cancel) { /* the last moment: OUT stays what it was */
        rc = shardlm_fail(e, -ECANCELED, "%s: conversion stopped", o->out);
        goto out_unlink;
    }
    if ((rc = coord_out_commit(tmp, o->out, e)))
        goto out_free;
    rc = 0;
    goto out_free;
out_unlink:
    if (fd >= 0)
        close(fd);
    unlink(tmp);
out_free:
    coord_gptq_factor_free(enc.factor);
    if (enc.pool)
        wrk_pool_free(enc.pool);
    coord_awq_free(awq);
    coord_calib_free(calib);
    plan_free(&p);
out_src:
    coord_source_close(&src);
    if (rc)
        memset(info, 0, sizeof(*info));
    return rc;
}

/* @src laid out in @scheme (@group, @head_bits) and encoded by @enc into a memfd image, mapped.
 * Returns 0 or -errno with @e set. */
static int image_write(struct coord_source *src, enum shlm_scheme scheme, int group, int head_bits,
                       struct convert_enc *enc, void **image, size_t *size, struct shardlm_err *e)
{
    struct convert_plan p = {0};
    void *map = MAP_FAILED;
    *image = NULL;
    int rc = plan_layout(&p, src, scheme, group, head_bits, e), fd = -1;
    if (rc)
        goto out;
    if ((fd = memfd_create("shardlm-image", MFD_CLOEXEC)) < 0 ||
        ftruncate(fd, (off_t)p.h->file_bytes) < 0) {
        rc = shardlm_fail(e, -errno, "model image (%llu bytes): %s",
                          (unsigned long long)p.h->file_bytes, strerror(errno));
        goto out;
    }
    map = mmap(NULL, p.h->file_bytes, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        rc = shardlm_fail(e, -errno, "model image: %s", strerror(errno));
        goto out;
    }
    for (int i = 0; i < p.n && !rc; i++) {
        if (enc->o->cancel && *enc->o->cancel)
            rc = shardlm_fail(e, -ECANCELED, "conversion stopped");
        else
            rc = write_tensor(fd, src, &p.specs[i], &p.table[i], enc, "model image", e);
    }
    if (!rc)
        rc = write_tail(&fd, &p, src, "model image", e);
out:
    if (fd >= 0)
        close(fd);
    if (rc && map != MAP_FAILED)
        munmap(map, p.h->file_bytes);
    if (!rc) {
        *image = map;
        *size = p.h->file_bytes;
    }
    plan_free(&p);
    return rc;
}

int coord_convert_image(struct coord_source *src, enum shlm_scheme scheme,
                        volatile sig_atomic_t *cancel, void **image, size_t *size,
                        struct shardlm_err *e)
{
    struct coord_convert_opts plain = {.scheme = scheme, .cancel = cancel};
    struct convert_enc enc = {.o = &plain, .factor_site = -1};
    return image_write(src, scheme, 0, 8, &enc, image, size, e);
}

int coord_convert_image_by(struct coord_source *src, const struct coord_convert_opts *o, int group,
                           enum coord_quant_method method, struct coord_calib *calib,
                           struct wrk_pool *pool, void **image, size_t *size, struct shardlm_err *e)
{
    struct convert_enc enc = {.o = o, .method = method, .factor_site = -1, .pool = pool};
    int rc = 0;
    if (pool)
        enc.par = wrk_pool_par(pool);
    if (method != COORD_QUANT_RTN) {
        enc.calib = calib;
        coord_calib_want_hessians(calib, method == COORD_QUANT_GPTQ);
    }
    if (method == COORD_QUANT_AWQ)
        rc = coord_awq_open(&enc.awq, calib, src, group, o->scheme == SHLM_SCHEME_W4A16,
                            enc_par(&enc), e);
    if (!rc)
        rc = image_write(src, o->scheme, group, o->head_bits, &enc, image, size, e);
    coord_gptq_factor_free(enc.factor);
    coord_awq_free(enc.awq);
    return rc;
}
