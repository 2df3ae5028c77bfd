/* coordinator/cli/eval.c: fidelity against reference logits (KL divergence, top-1, perplexity). */
#include "generate.h"

#include "cli.h"
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
    long positions, top1, predicted;
};

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

/* Adds one position: KL(ref || model), top-1 agreement and, when @next >= 0, its NLL. */
static void score(struct eval_acc *a, const float *ref, const float *model, int n, int next,
                  double *lp, double *lq)
{
    log_softmax(ref, n, lp);
    log_softmax(model, n, lq);
    double kl = 0.0;
    for (int i = 0; i < n; i++)
        kl += exp(lp[i]) * (lp[i] - lq[i]);
    a->kld += kl;
    a->positions++;
    a->top1 += coord_argmax(ref, n) == coord_argmax(model, n);
    if (next >= 0) {
        a->nll -= lq[next];
        a->predicted++;
    }
}

static void report(const char *label, const struct eval_acc *a)
{
    printf("%s kld=%.6g top1=%.4f ppl=%.4f\n", label, a->kld / (double)a->positions,
           (double)a->top1 / (double)a->positions,
           a->predicted ? exp(a->nll / (double)a->predicted) : NAN);
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

/* Evaluates line @no of greedy.tsv; with --save, writes its logits file and appends the line to
 * @saved (a malloc'd text of *@saved_len bytes). */
static int eval_line(struct coord_engine *g, const struct coord_eval_opts *o, char *line, int no,
                     struct eval_acc *total, double *lp, double *lq, char **saved,
                     size_t *saved_len, struct shardlm_err *e)
{
    const struct shlm_config *c = &coord_engine_model(g)->hdr->cfg;
    int vocab = (int)c->vocab_size, ctx = (int)c->seq_len;
    char *f[5], *orig = strdup(line);
    int nf = orig ? split_tabs(line, f, 5) : -1;
    if (nf != 5)
        free(orig);
    if (nf != 5)
        return shardlm_fail(e, -EINVAL, "%s/greedy.tsv line %d: expected 5 tab-separated fields",
                            o->ref_dir, no);
    int32_t *ids = malloc((size_t)(ctx + 1) * sizeof(int32_t));
    float *save = NULL; /* this model's logits, rows x vocab */
    if (!ids) {
        free(orig);
        return shardlm_fail(e, -ENOMEM, "out of memory");
    }
    int rc, n = parse_ids(f[1], ids, 0, ctx + 1, vocab);
    if (n > 0)
        n = parse_ids(f[2], ids, n, ctx + 1, vocab);
    if (n <= 0) {
        free(ids);
        free(orig);
        return shardlm_fail(e, -EINVAL,
                            "%s/greedy.tsv line %d: token ids missing, outside the "
                            "vocabulary of %d or beyond the context of %d",
                            o->ref_dir, no, vocab, ctx);
    }
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", o->ref_dir, f[4]);
    uint8_t *buf;
    size_t len;
    if ((rc = coord_read_file(path, REF_MAX_BYTES, &buf, &len, e))) {
        free(ids);
        free(orig);
        return rc;
    }
    /* a row per position fed: every id, or all but the last (whose logits predict past the
     * line); finite, and not constant (a uniform distribution no model gives: padding) */
    size_t row_bytes = (size_t)vocab * sizeof(float);
    int rows = (int)(len / row_bytes);
    if (len % row_bytes || rows < n - 1 || rows > n) {
        rc = shardlm_fail(e, -EINVAL,
                          "%s: %zu bytes; expected %d or %d rows of %d float32 logits, "
                          "one per position fed (the %d token ids of greedy.tsv line %d, or all "
                          "but the last)",
                          path, len, n, n - 1, vocab, n, no);
        goto out;
    }
    const float *ref = (const float *)buf;
    for (int row = 0; row < rows; row++) {
        const float *x = ref + (size_t)row * vocab;
        bool constant = true;
        for (int i = 0; i < vocab; i++) {
            if (!isfinite(x[i])) {
                rc = shardlm_fail(e, -EINVAL, "%s: row %d, logit %d is %f", path, row, i, x[i]);
                goto out;
            }
            constant &= x[i] == x[0];
        }
        if (constant && vocab > 1) {
            rc = shardlm_fail(e, -EINVAL,
                              "%s: row %d holds one value, %g, in every logit (padding?)", path,
                              row, x[0]);
            goto out;
        }
    }
    struct eval_acc acc = {0};
    if (o->save_dir && !(save = malloc(len))) {
        rc = shardlm_fail(e, -ENOMEM, "out of memory for %s", f[4]);
        goto out;
    }
    uint32_t chunk = coord_engine_logit_rows(g);
    for (int pos = 0; pos < rows;) {
        uint32_t m = (uint32_t)(rows - pos) < chunk ? (uint32_t)(rows - pos) : chunk;
        struct coord_seq_step s = {.seq_id = 0, .pos = (uint32_t)pos, .n_tokens = m,
                                   .tokens = ids + pos, .all_logits = true};
        if ((rc = coord_engine_step(g, &s, 1, e)))
            goto out;
        if (save)
            memcpy(save + (size_t)pos * vocab, s.logits, m * row_bytes);
        for (uint32_t i = 0; i < m; i++) {
            int p = pos + (int)i;
            score(&acc, ref + (size_t)p * vocab, s.logits + (size_t)i * vocab, vocab,
                  p + 1 < n ? ids[p + 1] : -1, lp, lq);
        }
        pos += (int)m;
    }
    char label[160];
    snprintf(label, sizeof(label), "prompt %d \"%.60s\" positions=%d", no, f[0], rows);
    report(label, &acc);
    total->kld += acc.kld;
    total->nll += acc.nll;
    total->positions += acc.positions;
    total->top1 += acc.top1;
    total->predicted += acc.predicted;
    if (save) {
        save_path(o, f[4], path, sizeof(path));
        size_t ol = strlen(orig);
        char *grown = realloc(*saved, *saved_len + ol + 2);
        if (!grown) {
            rc = shardlm_fail(e, -ENOMEM, "out of memory");
            goto out;
        }
        *saved = grown;
        memcpy(grown + *saved_len, orig, ol);
        *saved_len += ol;
        if (ol == 0 || orig[ol - 1] != '\n')
            grown[(*saved_len)++] = '\n';
        rc = write_whole(path, save, len, e);
    }
out:
    free(save);
    free(buf);
    free(ids);
    free(orig);
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

int coord_eval(const struct coord_eval_opts *o, struct shardlm_err *e)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/greedy.tsv", o->ref_dir);
    uint8_t *tsv;
    size_t tsv_len;
    int rc = coord_read_file(path, 64u << 20, &tsv, &tsv_len, e);
    if (rc)
        return rc;
    char *text = realloc(tsv, tsv_len + 1);
    if (!text) {
        free(tsv);
        return shardlm_fail(e, -ENOMEM, "out of memory");
    }
    char **lines = malloc(MAX_LINES * sizeof(char *)), *names = NULL, *saved = NULL;
    char **files = NULL;
    double *lp = NULL, *lq = NULL;
    size_t saved_len = 0;
    bool made_save = false;
    if (!lines) {
        free(text);
        return shardlm_fail(e, -ENOMEM, "out of memory");
    }
    text[tsv_len] = 0;
    int n_lines = split_lines(text, lines, MAX_LINES), n_files = 0;
    if (n_lines < 0) {
        rc = shardlm_fail(e, -EFBIG, "%s: more than %d lines", path, MAX_LINES);
        goto out_free;
    }
    if (o->save_dir) {
        /* what --save will write: greedy.tsv and each line's logits file (the 5th field) */
        names = malloc(tsv_len + 1); /* a copy of the split lines, cut again into fields */
        files = malloc((MAX_LINES + 1) * sizeof(char *));
        if (!names || !files) {
            rc = shardlm_fail(e, -ENOMEM, "out of memory");
            goto out_free;
        }
        memcpy(names, text, tsv_len + 1);
        files[n_files++] = "greedy.tsv";
        for (int i = 0; i < n_lines; i++) {
            char *f[5], *copy = names + (lines[i] - text);
            if (lines[i][0] && lines[i][0] != '#' && split_tabs(copy, f, 5) == 5) {
                if (strchr(f[4], '/') || strcmp(f[4], "greedy.tsv") == 0) {
                    rc = shardlm_fail(e, -EINVAL,
                                      "%s line %d: logits file name '%s' is not a plain "
                                      "file name",
                                      path, i + 1, f[4]);
                    goto out_free;
                }
                files[n_files++] = f[4];
            }
        }
        if ((rc = save_check(o, files, n_files, &made_save, e)))
            goto out_free;
    }
    struct coord_engine *g;
    struct coord_engine_opts eo = o->engine;
    if ((rc = coord_engine_start(&g, &eo, e)))
        goto out_free;
    int vocab = (int)coord_engine_model(g)->hdr->cfg.vocab_size;
    lp = malloc((size_t)vocab * sizeof(double));
    lq = malloc((size_t)vocab * sizeof(double));
    struct eval_acc total = {0};
    if (!lp || !lq) {
        rc = shardlm_fail(e, -ENOMEM, "out of memory");
        goto out;
    }
    for (int i = 0; i < n_lines; i++) {
        if (lines[i][0] == 0 || lines[i][0] == '#' || lines[i][0] == '\r')
            continue;
        if ((rc = eval_line(g, o, lines[i], i + 1, &total, lp, lq, &saved, &saved_len, e)))
            goto out;
    }
    if (total.positions == 0) {
        rc = shardlm_fail(e, -EINVAL, "%s: no reference sequences", path);
        goto out;
    }
    report("overall", &total);
    if (o->save_dir) {
        char out_tsv[4096];
        save_path(o, "greedy.tsv", out_tsv, sizeof(out_tsv));
        rc = write_whole(out_tsv, saved, saved_len, e);
    }
out:
    if (o->engine.load.stats)
        coord_cli_print_stats(g, 0, stderr);
    coord_engine_stop(g);
out_free:
    if (rc && made_save)
        rmdir(o->save_dir);
    free(lp);
    free(lq);
    free(saved);
    free(files);
    free(names);
    free(lines);
    free(text);
    return rc;
}
