/* SPDX-License-Identifier: MIT */
/* coordinator/cli/eval.c: fidelity against reference logits (KL divergence, top-1, perplexity,
 * relative L2 distance of the logits). */
#include "generate.h"

#include "cli.h"
#include "kn.h"
#include "sampler.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define REF_MAX_BYTES (1u << 30)

struct eval_acc {
    double kld, nll;
    double ref_p1; /* sum of the reference's top-1 probabilities (how peaked its outputs are) */
    long positions, top1, predicted;
    double *kl; /* (positions) each position's KL divergence, for the 99th percentile */
    double *l2; /* (positions) each position's ||model - ref||_2 / ||ref||_2 */
    long cap;   /* entries kl and l2 have room for */
};

/* Makes room in @a for @n positions. Returns 0 or -ENOMEM. */
static int acc_reserve(struct eval_acc *a, long n)
{
    if (n <= a->cap)
        return 0;
    double *kl = realloc(a->kl, (size_t)n * sizeof(double));
    if (!kl)
        return -ENOMEM;
    a->kl = kl;
    double *l2 = realloc(a->l2, (size_t)n * sizeof(double));
    if (!l2)
        return -ENOMEM;
    a->l2 = l2;
    a->cap = n;
    return 0;
}

static void acc_free(struct eval_acc *a)
{
    free(a->kl);
    free(a->l2);
}

/* log-softmax of @x (n) into @out, in double for the divergence sums */
static void log_softmax(const float *x, int n, double *out)
{
    double mx = x[0], sum = 0.0;
    for (int i = 1; i < n; i++)
        mx = x[i] > mx ? x[i] : mx;
    for (int i = 0; i < n; i++)
        sum += exp((double)x[i] - mx);
    double lse = mx + log(sum);
    for (int i = 0; i < n; i++)
        out[i] = (double)x[i] - lse;
}

/* Adds one position: KL(ref || model), top-1 agreement, the relative L2 distance of the logits
 * themselves (softmax forgives a shift of every logit, this does not: a check on the forward's
 * arithmetic, not only on its ranking), the reference's top-1 probability and, when @next >= 0,
 * its NLL. @a has room for it (acc_reserve). */
static void score(struct eval_acc *a, const float *ref, const float *model, int n, int next,
                  double *lp, double *lq)
{
    log_softmax(ref, n, lp);
    log_softmax(model, n, lq);
    double kl = 0.0, d2 = 0.0, r2 = 0.0;
    for (int i = 0; i < n; i++) {
        kl += exp(lp[i]) * (lp[i] - lq[i]);
        double d = (double)model[i] - ref[i];
        d2 += d * d;
        r2 += (double)ref[i] * ref[i];
    }
    KN_ASSERT(a->positions < a->cap);
    a->kld += kl;
    a->kl[a->positions] = kl;
    /* r2 > 0: logits_check refused a reference row of one value, zero included */
    a->l2[a->positions++] = sqrt(d2 / r2);
    int best = coord_argmax(ref, n);
    a->ref_p1 += exp(lp[best]);
    a->top1 += best == coord_argmax(model, n);
    if (next >= 0) {
        a->nll -= lq[next];
        a->predicted++;
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The @p quantile (0..1) of the @n values @v (sorted here, in place): linear interpolation
 * between the closest ranks, at rank (n - 1) p from 0 (numpy.percentile's default), so that
 * a tool in Python finds the same figure. */
static double quantile(double *v, long n, double p)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    double h = (double)(n - 1) * p;
    long lo = (long)h;
    return lo + 1 < n ? v[lo] + (h - (double)lo) * (v[lo + 1] - v[lo]) : v[n - 1];
}

/* Prints @a's scores after @label; reorders @a->kl and @a->l2. The fields after kld_p99 came
 * later: tools read the line by its prefix, so new ones go at its end. */
static void report(const char *label, struct eval_acc *a)
{
    double n = (double)a->positions;
    printf("%s kld=%.6g top1=%.4f ppl=%.4f kld_p99=%.6g", label, a->kld / n, (double)a->top1 / n,
           a->predicted ? exp(a->nll / (double)a->predicted) : NAN,
           quantile(a->kl, a->positions, 0.99));
    double l2_p99 = quantile(a->l2, a->positions, 0.99), l2_max = a->l2[a->positions - 1];
    printf(" rel_l2_max=%.6g rel_l2_p99=%.6g ref_top1_prob=%.4f\n", l2_max, l2_p99, a->ref_p1 / n);
}

/* Splits @line at tabs into at most @max fields (in place). Returns the count. */
static int split_tabs(char *line, char **f, int max)
{
    int n = 0;
    char *save, *p = strtok_r(line, "\t\r\n", &save);
    while (p && n < max) {
        f[n++] = p;
        p = strtok_r(NULL, "\t\r\n", &save);
    }
    return n;
}

/* Parses space-separated ids into @ids (capacity @max) after @n existing ones. */
static int parse_ids(const char *s, int32_t *ids, int n, int max, int vocab)
{
    while (*s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s)
            break;
        if (v < 0 || v >= vocab || n >= max)
            return -EINVAL;
        ids[n++] = (int32_t)v;
        s = end;
    }
    return n;
}

/* --save DIR: the paths of this model's logits (DIR/<logits file>) and of its greedy.tsv. The
 * files are written under temporary names and renamed when whole; coord_eval has checked them. */
static void save_path(const struct coord_eval_opts *o, const char *name, char *path, size_t len)
{
    snprintf(path, len, "%s/%s", o->save_dir, name);
}

/* Checks --save before anything runs: a folder (made if absent) that is not the reference folder,
 * and none of the files it would get (greedy.tsv and each line's logits file, @n_files names in
 * @files) already there unless --overwrite, nor anything but a regular file. *@made: whether
 * this made the folder (a failed eval removes it again, if empty). */
static int save_check(const struct coord_eval_opts *o, char **files, int n_files, bool *made,
                      struct shardlm_err *e)
{
    struct stat ss, rs;
    *made = mkdir(o->save_dir, 0755) == 0;
    if (!*made && errno != EEXIST)
        return shardlm_fail(e, -errno, "--save %s: %s", o->save_dir, strerror(errno));
    if (stat(o->save_dir, &ss) < 0 || !S_ISDIR(ss.st_mode))
        return shardlm_fail(e, -ENOTDIR, "--save %s: not a folder", o->save_dir);
    if (stat(o->ref_dir, &rs) == 0 && rs.st_dev == ss.st_dev && rs.st_ino == ss.st_ino)
        return shardlm_fail(e, -EEXIST,
                            "--save %s is the reference folder %s: its logits would "
                            "be replaced by the model's own",
                            o->save_dir, o->ref_dir);
    for (int i = 0; i < n_files; i++) {
        char path[4096];
        struct stat st;
        save_path(o, files[i], path, sizeof(path));
        int rc = coord_out_check(path, NULL, 0, e);
        if (rc)
            return rc;
        if (!o->overwrite && lstat(path, &st) == 0)
            return shardlm_fail(e, -EEXIST, "--save %s: %s exists (--overwrite replaces it)",
                                o->save_dir, files[i]);
    }
    return 0;
}

/* Writes @len bytes to the new file @path (through its temporary name). Returns 0 or -errno. */
static int write_whole(const char *path, const void *buf, size_t len, struct shardlm_err *e)
{
    char tmp[4200];
    int fd = coord_out_open(path, tmp, sizeof(tmp), e);
    if (fd < 0)
        return fd;
    size_t done = 0;
    while (done < len) {
        ssize_t w = write(fd, (const char *)buf + done, len - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            int rc = shardlm_fail(e, w < 0 ? -errno : -EIO, "%s: write failed: %s", path,
                                  strerror(w < 0 ? errno : EIO));
            close(fd);
            unlink(tmp);
            return rc;
        }
        done += (size_t)w;
    }
    if (fsync(fd) < 0 || close(fd) < 0) {
        int rc = shardlm_fail(e, -errno, "%s: %s", path, strerror(errno));
        unlink(tmp);
        return rc;
    }
    return coord_out_commit(tmp, path, e);
}

/* One line of greedy.tsv: its fields, token ids and reference logits. */
struct ref_line {
    int no;          /* line number, from 1 */
    char *orig;      /* the line as read (malloc'd), for the saved greedy.tsv */
    char *f[5];      /* prompt, prompt ids, generated ids, text file, logits file */
    int32_t *ids;    /* (n): the prompt's ids, then the generated ones */
    int n;           /* ids */
    uint8_t *buf;    /* the logits (rows, vocab) float32, from the file's float32 or float16 */
    size_t len;      /* bytes of buf */
    bool f16;        /* the file (its name ends in .f16) holds float16 */
    int rows;        /* positions it has logits for: n or n - 1 */
    char path[4096]; /* its path */
};

static void ref_line_free(struct ref_line *r)
{
    free(r->buf);
    free(r->ids);
    free(r->orig);
}

/* Splits @line (cut in place) into @r's fields and parses its token ids (at most the context
 * plus one, each in the vocabulary). Returns 0 or -errno; release @r with ref_line_free(). */
static int ref_line_parse(struct ref_line *r, const struct coord_eval_opts *o, char *line,
                          int vocab, int ctx, struct shardlm_err *e)
{
    if (!(r->orig = strdup(line)))
        return shardlm_fail(e, -ENOMEM, "out of memory");
    if (split_tabs(line, r->f, 5) != 5)
        return shardlm_fail(e, -EINVAL, "%s/greedy.tsv line %d: expected 5 tab-separated fields",
                            o->ref_dir, r->no);
    if (!(r->ids = malloc((size_t)(ctx + 1) * sizeof(int32_t))))
        return shardlm_fail(e, -ENOMEM, "out of memory");
    r->n = parse_ids(r->f[1], r->ids, 0, ctx + 1, vocab);
    if (r->n > 0)
        r->n = parse_ids(r->f[2], r->ids, r->n, ctx + 1, vocab);
    if (r->n <= 0)
        return shardlm_fail(e, -EINVAL,
                            "%s/greedy.tsv line %d: token ids missing, outside the "
                            "vocabulary of %d or beyond the context of %d",
                            o->ref_dir, r->no, vocab, ctx);
    return 0;
}

/* Reads @r's logits file: a row per position fed, every id or all but the last (whose logits
 * predict past the line); finite, and not constant (a uniform distribution no model gives:
 * padding). Returns 0 or -errno. */
/* The logits row @row of @x (@vocab floats) of @what (a file, or "the model ..."): every value
 * finite, and with @refuse_constant not one value throughout (padding, not logits). The same
 * check for the reference files eval reads and for what --save writes, so eval never writes
 * what it would refuse. Returns 0 or -EINVAL. */
static int logits_check(const float *x, int vocab, bool refuse_constant, const char *what, int row,
                        struct shardlm_err *e)
{
    bool constant = true;
    for (int i = 0; i < vocab; i++) {
        if (!isfinite(x[i]))
            return shardlm_fail(e, -EINVAL, "%s: row %d, logit %d is %f", what, row, i, x[i]);
        constant &= x[i] == x[0];
    }
    if (refuse_constant && constant && vocab > 1)
        return shardlm_fail(e, -EINVAL, "%s: row %d holds one value, %g, in every logit (padding?)",
                            what, row, x[0]);
    return 0;
}

static int ref_line_logits(struct ref_line *r, const struct coord_eval_opts *o, int vocab,
                           struct shardlm_err *e)
{
    snprintf(r->path, sizeof(r->path), "%s/%s", o->ref_dir, r->f[4]);
    size_t name_len = strlen(r->f[4]);
    r->f16 = name_len > 4 && strcmp(r->f[4] + name_len - 4, ".f16") == 0;
    int rc = coord_read_file(r->path, REF_MAX_BYTES, &r->buf, &r->len, e);
    if (rc)
        return rc;
    size_t elem = r->f16 ? sizeof(uint16_t) : sizeof(float), row_bytes = (size_t)vocab * elem;
    int n = r->n;
    r->rows = (int)(r->len / row_bytes);
    if (r->len < row_bytes) /* no position to score */
        return shardlm_fail(e, -EINVAL, "%s: %zu bytes; expected at least one row of %d %s logits",
                            r->path, r->len, vocab, r->f16 ? "float16" : "float32");
    if (r->len % row_bytes || r->rows < n - 1 || r->rows > n)
        return shardlm_fail(e, -EINVAL,
                            "%s: %zu bytes; expected %d or %d rows of %d %s logits, "
                            "one per position fed (the %d token ids of greedy.tsv line %d, or "
                            "all but the last)",
                            r->path, r->len, n, n - 1, vocab, r->f16 ? "float16" : "float32", n,
                            r->no);
    if (r->f16) { /* widened once: the scoring reads float32 */
        size_t count = r->len / sizeof(uint16_t);
        float *x = malloc(count * sizeof(float));
        if (!x)
            return shardlm_fail(e, -ENOMEM, "out of memory");
        for (size_t i = 0; i < count; i++) {
            uint16_t h;
            memcpy(&h, r->buf + i * sizeof(h), sizeof(h));
            x[i] = kn_f16_to_f32(h);
        }
        free(r->buf);
        r->buf = (uint8_t *)x;
        r->len = count * sizeof(float);
    }
    for (int row = 0; row < r->rows; row++)
        if ((rc = logits_check((const float *)r->buf + (size_t)row * vocab, vocab, true, r->path,
                               row, e)))
            return rc;
    return 0;
}

/* Feeds @r's ids through the engine, as many logits rows a step as it returns, scoring every
 * position against the reference into @acc; with @save (rows, vocab), keeps the model's logits
 * there. Returns 0 or -errno. */
static int ref_line_run(struct coord_engine *g, const struct ref_line *r, int vocab,
                        struct eval_acc *acc, float *save, double *lp, double *lq,
                        struct shardlm_err *e)
{
    const float *ref = (const float *)r->buf;
    size_t row_bytes = (size_t)vocab * sizeof(float);
    uint32_t chunk = coord_engine_logit_rows(g);
    for (int pos = 0; pos < r->rows;) {
        uint32_t m = (uint32_t)(r->rows - pos) < chunk ? (uint32_t)(r->rows - pos) : chunk;
        struct coord_seq_step s = {.seq_id = 0,
                                   .pos = (uint32_t)pos,
                                   .n_tokens = m,
                                   .tokens = r->ids + pos,
                                   .all_logits = true};
        int rc = coord_engine_step(g, &s, 1, e);
        if (rc)
            return rc;
        /* a non-finite logit makes every score NaN: refused, and never saved */
        for (uint32_t i = 0; i < m && !rc; i++) {
            char what[160];
            snprintf(what, sizeof(what), "greedy.tsv line %d: the model's logits", r->no);
            rc = logits_check(s.logits + (size_t)i * vocab, vocab, save != NULL, what, pos + (int)i,
                              e);
        }
        if (rc)
            return rc;
        if (save)
            memcpy(save + (size_t)pos * vocab, s.logits, m * row_bytes);
        for (uint32_t i = 0; i < m; i++) {
            int p = pos + (int)i;
            score(acc, ref + (size_t)p * vocab, s.logits + (size_t)i * vocab, vocab,
                  p + 1 < r->n ? r->ids[p + 1] : -1, lp, lq);
        }
        pos += (int)m;
    }
    return 0;
}

/* --save: appends @r's line to @saved (a malloc'd text of *@saved_len bytes) and writes the
 * model's logits @save to its logits file in the --save folder. Returns 0 or -errno. */
static int ref_line_save(const struct ref_line *r, const struct coord_eval_opts *o,
                         const float *save, char **saved, size_t *saved_len, struct shardlm_err *e)
{
    char path[4096];
    save_path(o, r->f[4], path, sizeof(path));
    size_t ol = strlen(r->orig);
    char *grown = realloc(*saved, *saved_len + ol + 2);
    if (!grown)
        return shardlm_fail(e, -ENOMEM, "out of memory");
    *saved = grown;
    memcpy(grown + *saved_len, r->orig, ol);
    *saved_len += ol;
    if (ol == 0 || r->orig[ol - 1] != '\n')
        grown[(*saved_len)++] = '\n';
    if (!r->f16)
        return write_whole(path, save, r->len, e);
    /* a .f16 name: this model's logits in float16 too */
    size_t count = r->len / sizeof(float);
    uint16_t *h = malloc(count * sizeof(uint16_t));
    if (!h)
        return shardlm_fail(e, -ENOMEM, "out of memory");
    for (size_t i = 0; i < count; i++)
        h[i] = kn_f32_to_f16(save[i]);
    int rc = write_whole(path, h, count * sizeof(uint16_t), e);
    free(h);
    return rc;
}

/* Evaluates line @no of greedy.tsv, prints its scores and adds them to @total; with --save,
 * writes its logits file and appends the line to @saved (a malloc'd text of *@saved_len bytes).
 * @lp and @lq hold a vocabulary of doubles each. Returns 0 or -errno. */
static int eval_line(struct coord_engine *g, const struct coord_eval_opts *o, char *line, int no,
                     struct eval_acc *total, double *lp, double *lq, char **saved,
                     size_t *saved_len, struct shardlm_err *e)
{
    const struct shlm_config *c = &coord_engine_model(g)->hdr->cfg;
    int vocab = (int)c->vocab_size;
    struct ref_line r = {.no = no};
    struct eval_acc acc = {0};
    float *save = NULL; /* this model's logits, rows x vocab */
    int rc = ref_line_parse(&r, o, line, vocab, (int)c->seq_len, e);
    if (!rc)
        rc = ref_line_logits(&r, o, vocab, e);
    if (!rc && (acc_reserve(&acc, r.rows) || acc_reserve(total, total->positions + r.rows)))
        rc = shardlm_fail(e, -ENOMEM, "out of memory");
    if (!rc && o->save_dir && !(save = malloc(r.len)))
        rc = shardlm_fail(e, -ENOMEM, "out of memory for %s", r.f[4]);
    if (!rc)
        rc = ref_line_run(g, &r, vocab, &acc, save, lp, lq, e);
    if (!rc) {
        char label[400], shown[200];
        coord_escape(shown, sizeof(shown), r.f[0], strlen(r.f[0]) > 60 ? 60 : strlen(r.f[0]));
        snprintf(label, sizeof(label), "prompt %d \"%s\" positions=%d", no, shown, r.rows);
        report(label, &acc);
        memcpy(total->kl + total->positions, acc.kl, (size_t)acc.positions * sizeof(double));
        memcpy(total->l2 + total->positions, acc.l2, (size_t)acc.positions * sizeof(double));
        total->kld += acc.kld;
        total->ref_p1 += acc.ref_p1;
        total->nll += acc.nll;
        total->positions += acc.positions;
        total->top1 += acc.top1;
        total->predicted += acc.predicted;
    }
    if (!rc && save)
        rc = ref_line_save(&r, o, save, saved, saved_len, e);
    acc_free(&acc);
    free(save);
    ref_line_free(&r);
    return rc;
}

/* Splits @tsv into lines in place (at most @max into @lines). Returns the count, -1 past @max. */
static int split_lines(char *tsv, char **lines, int max)
{
    int n = 0;
    for (char *p = tsv, *nl; *p; p = nl + 1) {
        if (n == max)
            return -1;
        lines[n++] = p;
        if (!(nl = strchr(p, '\n')))
            break;
        *nl = 0;
    }
    return n;
}

#define MAX_LINES 4096

/* greedy.tsv of the reference folder, read whole: its text and its lines. */
struct ref_tsv {
    char path[4096];
    char *text;   /* NUL-terminated, cut into lines in place */
    size_t len;   /* bytes of text */
    char **lines; /* (n_lines) into text */
    int n_lines;
};

static void ref_tsv_free(struct ref_tsv *t)
{
    free(t->lines);
    free(t->text);
}

/* Reads @o's greedy.tsv into @t. Returns 0 or -errno; release @t with ref_tsv_free(). */
static int ref_tsv_read(struct ref_tsv *t, const struct coord_eval_opts *o, struct shardlm_err *e)
{
    uint8_t *tsv;
    snprintf(t->path, sizeof(t->path), "%s/greedy.tsv", o->ref_dir);
    int rc = coord_read_file(t->path, 64u << 20, &tsv, &t->len, e);
    if (rc)
        return rc;
    if (!(t->text = realloc(tsv, t->len + 1))) {
        free(tsv);
        return shardlm_fail(e, -ENOMEM, "out of memory");
    }
    t->text[t->len] = 0;
    if (!(t->lines = malloc(MAX_LINES * sizeof(char *))))
        return shardlm_fail(e, -ENOMEM, "out of memory");
    if ((t->n_lines = split_lines(t->text, t->lines, MAX_LINES)) < 0)
        return shardlm_fail(e, -EFBIG, "%s: more than %d lines", t->path, MAX_LINES);
    return 0;
}

/* --save: checks, before anything runs, every file it will write - greedy.tsv and each line's
 * logits file (the 5th field, a plain file name) - through save_check(). *@made: whether the
 * folder was made here. Returns 0 or -errno. */
static int save_plan(const struct coord_eval_opts *o, const struct ref_tsv *t, bool *made,
                     struct shardlm_err *e)
{
    char *names = malloc(t->len + 1); /* a copy of the split lines, cut again into fields */
    char **files = malloc((MAX_LINES + 1) * sizeof(char *));
    int n_files = 0, rc = 0;
    if (!names || !files) {
        rc = shardlm_fail(e, -ENOMEM, "out of memory");
        goto out;
    }
    memcpy(names, t->text, t->len + 1);
    files[n_files++] = "greedy.tsv";
    for (int i = 0; i < t->n_lines; i++) {
        char *f[5], *copy = names + (t->lines[i] - t->text);
        if (!t->lines[i][0] || t->lines[i][0] == '#' || split_tabs(copy, f, 5) != 5)
            continue;
        if (strchr(f[4], '/') || strcmp(f[4], "greedy.tsv") == 0) {
            rc = shardlm_fail(e, -EINVAL,
                              "%s line %d: logits file name '%s' is not a plain file name", t->path,
                              i + 1, f[4]);
            goto out;
        }
        files[n_files++] = f[4];
    }
    rc = save_check(o, files, n_files, made, e);
out:
    free(files);
    free(names);
    return rc;
}

/* Evaluates every line of @t on the started engine @g, prints each line's scores and the
 * overall ones; with --save, writes the model's logits and greedy.tsv. Returns 0 or -errno. */
static int eval_lines(struct coord_engine *g, const struct coord_eval_opts *o,
                      const struct ref_tsv *t, struct shardlm_err *e)
{
    int vocab = (int)coord_engine_model(g)->hdr->cfg.vocab_size, rc = 0;
    double *lp = malloc((size_t)vocab * sizeof(double));
    double *lq = malloc((size_t)vocab * sizeof(double));
    char *saved = NULL; /* --save's greedy.tsv */
    size_t saved_len = 0;
    struct eval_acc total = {0};
    if (!lp || !lq) {
        rc = shardlm_fail(e, -ENOMEM, "out of memory");
        goto out;
    }
    for (int i = 0; i < t->n_lines && !rc; i++) {
        char *line = t->lines[i];
        if (line[0] != 0 && line[0] != '#' && line[0] != '\r')
            rc = eval_line(g, o, line, i + 1, &total, lp, lq, &saved, &saved_len, e);
    }
    if (!rc && total.positions == 0)
        rc = shardlm_fail(e, -EINVAL, "%s: no reference sequences", t->path);
    if (rc)
        goto out;
    report("overall", &total);
    /* finite logits can still score past double's range (logits of 1e38): not a result */
    double kld = total.kld / (double)total.positions, nll = total.nll / (double)total.predicted;
    if (!isfinite(kld) || (total.predicted && !isfinite(exp(nll)))) {
        rc = shardlm_fail(e, -ERANGE,
                          "the overall score is not finite (kld %g, ppl %g): the "
                          "model's logits are out of range",
                          kld, exp(nll));
        goto out;
    }
    if (o->save_dir) {
        char out_tsv[4096];
        save_path(o, "greedy.tsv", out_tsv, sizeof(out_tsv));
        rc = write_whole(out_tsv, saved, saved_len, e);
    }
out:
    acc_free(&total);
    free(lp);
    free(lq);
    free(saved);
    return rc;
}

int coord_eval(const struct coord_eval_opts *o, struct shardlm_err *e)
{
    struct ref_tsv t = {0};
    bool made_save = false;
    int rc = ref_tsv_read(&t, o, e);
    if (!rc && o->save_dir)
        rc = save_plan(o, &t, &made_save, e);
    if (!rc) {
        struct coord_engine *g;
        struct coord_engine_opts eo = o->engine;
        if (!(rc = coord_engine_start(&g, &eo, e))) {
            rc = eval_lines(g, o, &t, e);
            if (o->engine.load.stats)
                coord_cli_print_stats(g, 0, stderr);
            coord_engine_stop(g);
        }
    }
    if (rc && made_save)
        rmdir(o->save_dir);
    ref_tsv_free(&t);
    return rc;
}
