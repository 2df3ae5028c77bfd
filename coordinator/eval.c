/* coordinator/: fidelity against reference logits (KL divergence, top-1, perplexity). */
#include "generate.h"

#include "engine.h"
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

/* --save: this model's logits go to DIR/<logits file>, its line to DIR/greedy.tsv. */
static int save_open(const struct coord_eval_opts *o, const char *name, FILE **f,
                     struct coord_err *e)
{
    char path[4096];
    if (strchr(name, '/'))
        return coord_fail(e, -EINVAL, "logits file name '%s' has a '/'", name);
    snprintf(path, sizeof(path), "%s/%s", o->save_dir, name);
    *f = fopen(path, "wb");
    return *f ? 0 : coord_fail(e, -errno, "%s: %s", path, strerror(errno));
}

static int save_line(const struct coord_eval_opts *o, const char *line, struct coord_err *e)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/greedy.tsv", o->save_dir);
    FILE *f = fopen(path, "a");
    if (!f)
        return coord_fail(e, -errno, "%s: %s", path, strerror(errno));
    bool ok = fputs(line, f) >= 0 && (strchr(line, '\n') || fputc('\n', f) != EOF);
    ok &= fclose(f) == 0;
    return ok ? 0 : coord_fail(e, -EIO, "%s: write failed", path);
}

static int eval_line(struct coord_engine *g, const struct coord_eval_opts *o, char *line, int no,
                     struct eval_acc *total, double *lp, double *lq, struct coord_err *e)
{
    const struct shlm_config *c = &g->img.hdr->cfg;
    int vocab = (int)c->vocab_size, ctx = (int)c->seq_len;
    char *f[5], *orig = strdup(line);
    int nf = orig ? split_tabs(line, f, 5) : -1;
    if (nf != 5)
        free(orig);
    if (nf != 5)
        return coord_fail(e, -EINVAL, "%s/greedy.tsv line %d: expected 5 tab-separated fields",
                          o->ref_dir, no);
    int32_t *ids = malloc((size_t)(ctx + 1) * sizeof(int32_t));
    FILE *save = NULL;
    if (!ids) {
        free(orig);
        return coord_fail(e, -ENOMEM, "out of memory");
    }
    int rc, n = parse_ids(f[1], ids, 0, ctx + 1, vocab);
    if (n > 0)
        n = parse_ids(f[2], ids, n, ctx + 1, vocab);
    if (n <= 0) {
        free(ids);
        free(orig);
        return coord_fail(e, -EINVAL, "%s/greedy.tsv line %d: token ids missing, outside the "
                          "vocabulary of %d or beyond the context of %d", o->ref_dir, no, vocab,
                          ctx);
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
    size_t row_bytes = (size_t)vocab * sizeof(float);
    int rows = (int)(len / row_bytes);
    if (len % row_bytes || rows == 0 || rows > n) {
        rc = coord_fail(e, -EINVAL, "%s: %zu bytes is not 1..%d rows of %d float32 logits", path,
                        len, n, vocab);
        goto out;
    }
    const float *ref = (const float *)buf;
    struct eval_acc acc = {0};
    if (o->save_dir && (rc = save_open(o, f[4], &save, e)))
        goto out;
    uint32_t chunk = coord_engine_logit_rows(g);
    for (int pos = 0; pos < rows;) {
        uint32_t m = (uint32_t)(rows - pos) < chunk ? (uint32_t)(rows - pos) : chunk;
        struct coord_seq_step s = {.seq_id = 0, .pos = (uint32_t)pos, .n_tokens = m,
                                   .tokens = ids + pos, .all_logits = true};
        if ((rc = coord_engine_step(g, &s, 1, e)))
            goto out;
        if (save && fwrite(s.logits, (size_t)vocab * sizeof(float), m, save) != m) {
            rc = coord_fail(e, -EIO, "%s/%s: write failed", o->save_dir, f[4]);
            goto out;
        }
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
    if (save)
        rc = save_line(o, orig, e);
out:
    if (save && fclose(save) != 0 && !rc)
        rc = coord_fail(e, -EIO, "%s/%s: write failed", o->save_dir, f[4]);
    free(buf);
    free(ids);
    free(orig);
    return rc;
}

int coord_eval(const struct coord_eval_opts *o, struct coord_err *e)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/greedy.tsv", o->ref_dir);
    FILE *f = fopen(path, "r");
    if (!f)
        return coord_fail(e, -errno, "%s: %s", path, strerror(errno));
    if (o->save_dir) {
        char tsv[4096];
        snprintf(tsv, sizeof(tsv), "%s/greedy.tsv", o->save_dir);
        if ((mkdir(o->save_dir, 0755) < 0 && errno != EEXIST) || (unlink(tsv) < 0 && errno != ENOENT)) {
            fclose(f);
            return coord_fail(e, -errno, "--save %s: %s", o->save_dir, strerror(errno));
        }
    }
    struct coord_engine g;
    struct coord_engine_opts eo = o->engine;
    int rc = coord_engine_start(&g, &eo, e);
    if (rc) {
        fclose(f);
        return rc;
    }
    int vocab = (int)g.img.hdr->cfg.vocab_size;
    double *lp = malloc((size_t)vocab * sizeof(double)), *lq = malloc((size_t)vocab * sizeof(double));
    char *line = NULL;
    size_t cap = 0;
    struct eval_acc total = {0};
    if (!lp || !lq) {
        rc = coord_fail(e, -ENOMEM, "out of memory");
        goto out;
    }
    for (int no = 1; getline(&line, &cap, f) > 0; no++) {
        if (line[0] == '\n' || line[0] == '#')
            continue;
        if ((rc = eval_line(&g, o, line, no, &total, lp, lq, e)))
            goto out;
    }
    if (total.positions == 0) {
        rc = coord_fail(e, -EINVAL, "%s: no reference sequences", path);
        goto out;
    }
    report("overall", &total);
out:
    if (o->engine.load.stats)
        coord_engine_print_stats(&g, 0, stderr);
    free(line);
    free(lp);
    free(lq);
    fclose(f);
    coord_engine_stop(&g);
    return rc;
}
