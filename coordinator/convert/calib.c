/* SPDX-License-Identifier: MIT */
/* coordinator/convert/calib.c: calibration statistics from the model's own forward (see calib.h).
 *
 * The source is converted to a bf16 image in memory and run by worker/model.c in this process,
 * its rows split over a thread pool. The calibration tokens are the given text, tokenized and cut
 * into sequences that each start with BOS, or text the model samples from BOS at temperature 1
 * (a fixed seed: the same source gives the same file). A pass feeds every sequence through the
 * forward with wrk_model.observe set: the first collects every layer's per-channel mean squares;
 * Hessians (cols x cols each, 64 MiB for one 4096-wide input) are collected for the layers that
 * fit in a third of the available memory (see calib.h), and the next range by another pass when the
 * converter asks for a layer beyond them (it asks in file order, layer by layer). */
#include "calib.h"

#include "convert.h"
#include "kn.h"
#include "model.h"
#include "pool.h"
#include "seg.h"
#include "tokenizer.h"
#include "utf8.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define CALIB_CHUNK 128 /* tokens per forward call (prefill rows) */
#define CALIB_SEQ 512   /* tokens per sequence at most */
#define CALIB_SLOTS 8   /* sequences sampled together (one weight read per step for all) */
#define CALIB_SEED 0x5eed5eedULL

/* One product input's sums over the calibration tokens. */
struct site_stats {
    int cols;
    double *sumsq; /* (cols) */
    float *h;      /* (cols x cols) lower triangle while collecting; NULL when not held */
    float *x;      /* (COORD_CALIB_SAMPLES x cols) kept input rows, or NULL */
    int n_x;       /* rows kept */
    long seen;     /* rows seen by the first pass */
};

struct coord_calib {
    struct shlm_config cfg;
    void *image;
    size_t image_size;
    struct shlm_model img;
    struct wrk_pool *pool;
    const struct kn_ops *ops; /* of the forward and the Hessians, chosen once */
    struct wrk_model m;
    void *kv;
    float *logits;   /* (CALIB_CHUNK, vocab) when the head's input is collected */
    uint32_t *table; /* block table of CALIB_SLOTS whole sequences */
    int bpc;         /* blocks per sequence */
    int seq_len;     /* tokens per calibration sequence */
    int32_t *tok;    /* the calibration tokens, sequences one after another */
    long n_tok;
    int *seq_len_of; /* (n_seqs) */
    int n_seqs;
    struct site_stats *s; /* ((n_layers + 1) * WRK_SITES): layer l, site k at l * WRK_SITES + k */
    long rows_seen;       /* tokens through the forward in the pass that collected sumsq */
    bool want_h;
    uint32_t h0, h1; /* layers whose Hessians are held: [h0, h1) */
    bool collect_sumsq;
    float *out_imat, *out_h; /* what coord_calib_stats returned last */
    /* the held-out slice (opts.holdout): sequences of ho_len[i] tokens one after another */
    int32_t *ho_tok;
    int *ho_len;
    int ho_n;
    const struct coord_calib_opts *o;
};

static struct site_stats *stats_of(struct coord_calib *c, uint32_t layer, enum wrk_site site)
{
    return &c->s[(size_t)layer * WRK_SITES + site];
}

/* ---- the text ---- */

int coord_calib_read_text(const char *path, char **text, size_t *len, struct shardlm_err *e)
{
    *text = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return shardlm_fail(e, -errno, "--calib %s: %s", path, strerror(errno));
    struct stat st;
    int rc = 0;
    if (fstat(fd, &st) < 0) {
        rc = shardlm_fail(e, -errno, "--calib %s: %s", path, strerror(errno));
    } else if (!S_ISREG(st.st_mode)) {
        rc = shardlm_fail(e, -EINVAL, "--calib %s: not a regular file", path);
    } else if ((uint64_t)st.st_size > COORD_CALIB_MAX_BYTES) {
        rc = shardlm_fail(e, -EFBIG,
                          "--calib %s: %lld bytes, more than the %u MiB a calibration "
                          "text may have",
                          path, (long long)st.st_size, COORD_CALIB_MAX_BYTES >> 20);
    } else if (st.st_size == 0) {
        rc = shardlm_fail(e, -EINVAL, "--calib %s: empty", path);
    }
    char *buf = rc ? NULL : malloc((size_t)st.st_size + 1);
    if (!rc && !buf)
        rc = shardlm_fail(e, -ENOMEM, "out of memory for --calib %s", path);
    size_t got = 0;
    while (!rc && got < (size_t)st.st_size) {
        ssize_t r = read(fd, buf + got, (size_t)st.st_size - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            rc = shardlm_fail(e, r < 0 ? -errno : -EIO, "--calib %s: %s", path,
                              r < 0 ? strerror(errno) : "shorter than its size");
        else
            got += (size_t)r;
    }
    close(fd);
    /* UTF-8 without NUL bytes; the offset of the first byte that is not */
    size_t bad = 0;
    const char *nul = rc ? NULL : memchr(buf, 0, got);
    if (!rc && (!coord_utf8_valid(buf, got, &bad) || nul)) {
        if (nul && (size_t)(nul - buf) < bad)
            bad = (size_t)(nul - buf);
        rc = shardlm_fail(e, -EINVAL, "--calib %s: not UTF-8 text (byte %zu)", path, bad);
    }
    if (rc) {
        free(buf);
        return rc;
    }
    buf[got] = 0;
    *text = buf;
    *len = got;
    return 0;
}

/* Appends a sequence of @n tokens (the caller made room). */
static void seq_add(struct coord_calib *c, const int32_t *t, int n)
{
    memcpy(c->tok + c->n_tok, t, (size_t)n * sizeof(*t));
    c->n_tok += n;
    c->seq_len_of[c->n_seqs++] = n;
}

/* The next piece of @text from @at: up to and including a newline, at most CALIB_PIECE bytes
 * (ending on a character boundary). Encoding piece by piece keeps the tokenizer's cost linear in
 * the text (llama2.c's merges are quadratic in what they are given) and stops once there are
 * enough tokens. */
#define CALIB_PIECE 4096
static size_t next_piece(const char *text, size_t len, size_t at)
{
    size_t end = at;
    while (end < len && end - at < CALIB_PIECE && text[end] != '\n')
        end++;
    if (end < len && text[end] == '\n')
        return end + 1 - at;
    while (end > at + 1 && end < len && ((unsigned char)text[end] & 0xc0) == 0x80)
        end--;
    return end - at;
}

/* Whether the caller's cancel flag is set: the calibration stops with -ECANCELED. */
static bool cancelled(const struct coord_calib *c) { return c->o->cancel && *c->o->cancel; }

static int cancel_fail(struct shardlm_err *e)
{
    return shardlm_fail(e, -ECANCELED, "calibration stopped");
}

/* The text of o->text tokenized, cut into sequences of seq_len tokens that each start with BOS,
 * until @want tokens. */
static int tokens_from_text(struct coord_calib *c, struct coord_source *src, long want,
                            struct shardlm_err *e)
{
    char *text;
    size_t len;
    int rc = coord_calib_read_text(c->o->text, &text, &len, e);
    if (rc)
        return rc;
    struct coord_tok t;
    if ((rc = coord_tok_from_image(&t, src->tok, src->tok_len, c->cfg.vocab_size, src->path, e))) {
        free(text);
        return rc;
    }
    int32_t seq[CALIB_SEQ], ids[CALIB_PIECE + 8];
    int n = 0;
    for (size_t at = 0; at < len && c->n_tok + n < want;) {
        if (cancelled(c)) {
            rc = cancel_fail(e);
            break;
        }
        size_t k = next_piece(text, len, at);
        struct shardlm_err why;
        int got = coord_tok_encode_err(&t, text + at, k, 0, ids, CALIB_PIECE + 8, &why);
        if (got < 0) {
            rc = shardlm_fail(e, got, "--calib %s: cannot tokenize the text at byte %zu: %s",
                              c->o->text, at, why.msg);
            break;
        }
        at += k;
        for (int i = 0; i < got && c->n_tok + n < want; i++) {
            if (n == 0)
                seq[n++] = (int32_t)c->img.hdr->bos_id;
            seq[n++] = ids[i];
            if (n >= c->seq_len || c->n_tok + n >= want) {
                seq_add(c, seq, n);
                n = 0;
            }
        }
    }
    if (!rc && n > 1)
        seq_add(c, seq, n);
    free(text);
    coord_tok_free(&t);
    if (!rc && c->n_tok < 16)
        rc = shardlm_fail(e, -EINVAL,
                          "--calib %s: %ld tokens, too few to calibrate on (at "
                          "least 16)",
                          c->o->text, c->n_tok);
    return rc;
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* A token drawn from softmax(@logits) (temperature 1). */
static int32_t sample(const float *logits, int n, uint64_t *rng)
{
    float mx = logits[0];
    for (int i = 1; i < n; i++)
        mx = fmaxf(mx, logits[i]);
    double sum = 0.0;
    for (int i = 0; i < n; i++)
        sum += exp((double)(logits[i] - mx));
    double u = (double)(rng_next(rng) >> 11) * 0x1.0p-53 * sum, acc = 0.0;
    for (int i = 0; i < n; i++) {
        acc += exp((double)(logits[i] - mx));
        if (acc > u)
            return i;
    }
    return n - 1;
}

/* The model's own text: CALIB_SLOTS sequences sampled together from BOS, each ending at EOS or
 * at seq_len tokens, until @want tokens. */
static int tokens_from_model(struct coord_calib *c, long want, struct shardlm_err *e)
{
    int V = (int)c->cfg.vocab_size, L = c->seq_len;
    int32_t *cur = malloc((size_t)CALIB_SLOTS * (size_t)L * sizeof(int32_t));
    float *logits = malloc((size_t)CALIB_SLOTS * (size_t)V * sizeof(float));
    int len[CALIB_SLOTS] = {0};
    struct wrk_run runs[CALIB_SLOTS];
    uint64_t rng = CALIB_SEED;
    if (!cur || !logits) {
        free(cur);
        free(logits);
        return shardlm_fail(e, -ENOMEM, "out of memory for the calibration text");
    }
    long pending = 0; /* tokens in the slots, not yet in c->tok */
    int rc = 0;
    while (!rc && c->n_tok + pending < want) {
        if (cancelled(c)) {
            free(cur);
            free(logits);
            return cancel_fail(e);
        }
        int nr = 0;
        for (int s = 0; s < CALIB_SLOTS; s++) {
            if (len[s] == 0) {
                cur[(size_t)s * L] = (int32_t)c->img.hdr->bos_id;
                len[s] = 1;
                pending++;
            }
            int p = len[s] - 1;
            runs[nr++] = (struct wrk_run){.seq = (uint32_t)s,
                                          .tokens = &cur[(size_t)s * L + p],
                                          .n = 1,
                                          .pos = p,
                                          .blocks = c->table + (size_t)s * c->bpc,
                                          .logits = logits + (size_t)s * V};
        }
        if ((rc = wrk_forward_batch(&c->m, c->kv, runs, nr)))
            break;
        for (int s = 0; s < CALIB_SLOTS && c->n_tok + pending < want; s++) {
            int32_t t = sample(logits + (size_t)s * V, V, &rng);
            cur[(size_t)s * L + len[s]++] = t;
            pending++;
            if (t == (int32_t)c->img.hdr->eos_id || len[s] == L) {
                seq_add(c, &cur[(size_t)s * L], len[s]);
                pending -= len[s];
                len[s] = 0;
            }
        }
        if (c->o->progress)
            c->o->progress(c->o->progress_ctx, "tokens", c->n_tok + pending, want);
    }
    for (int s = 0; s < CALIB_SLOTS; s++) /* the unfinished sequences count too */
        if (len[s] > 1)
            seq_add(c, &cur[(size_t)s * L], len[s]);
    free(cur);
    free(logits);
    return rc ? shardlm_fail(e, rc, "calibration forward failed") : 0;
}

/* The held-out slice (opts.holdout): the last n_tok / COORD_CALIB_HELDOUT_PART tokens leave the
 * sequences the passes run - whole sequences from the end, and of the sequence the cut falls in
 * its tail, after a BOS of its own (what stays of it keeps 2 tokens at least, else it goes
 * whole). Returns 0, -ENOMEM, or -EINVAL when the slice would be under COORD_CALIB_HELDOUT_MIN. */
static int holdout_split(struct coord_calib *c, struct shardlm_err *e)
{
    long hold = c->n_tok / COORD_CALIB_HELDOUT_PART, acc = 0, part;
    if (hold < COORD_CALIB_HELDOUT_MIN)
        return shardlm_fail(e, -EINVAL,
                            "--method auto: %ld calibration tokens, too few to hold %d of them "
                            "out (at least %d: --calib-tokens, or a longer --calib text)",
                            c->n_tok, COORD_CALIB_HELDOUT_MIN,
                            COORD_CALIB_HELDOUT_MIN * COORD_CALIB_HELDOUT_PART);
    int q = c->n_seqs;
    while (q > 1 && acc + c->seq_len_of[q - 1] <= hold)
        acc += c->seq_len_of[--q];
    part = hold - acc; /* the tail of sequence q - 1 */
    if (part > 0 && c->seq_len_of[q - 1] - part < 2) {
        acc += c->seq_len_of[--q];
        part = 0;
    }
    c->ho_tok = malloc((size_t)(acc + part + 1) * sizeof(*c->ho_tok));
    c->ho_len = malloc((size_t)(c->n_seqs - q + 1) * sizeof(*c->ho_len));
    if (!c->ho_tok || !c->ho_len)
        return shardlm_fail(e, -ENOMEM, "out of memory");
    long fit = c->n_tok - acc - part, at = 0;
    if (part > 0) {
        c->ho_tok[at++] = (int32_t)c->img.hdr->bos_id;
        memcpy(c->ho_tok + at, c->tok + fit, (size_t)part * sizeof(*c->tok));
        at += part;
        c->ho_len[c->ho_n++] = (int)(part + 1);
        c->seq_len_of[q - 1] -= (int)part;
    }
    memcpy(c->ho_tok + at, c->tok + fit + part, (size_t)acc * sizeof(*c->tok));
    for (int i = q; i < c->n_seqs; i++)
        c->ho_len[c->ho_n++] = c->seq_len_of[i];
    c->n_seqs = q;
    c->n_tok = fit;
    return 0;
}

void coord_calib_heldout(const struct coord_calib *c, const int32_t **tok, const int **len, int *n)
{
    *tok = c->ho_tok;
    *len = c->ho_len;
    *n = c->ho_n;
}

void coord_calib_want_hessians(struct coord_calib *c, bool want)
{
    c->want_h = want && c->o->hessians;
}

/* ---- the statistics ---- */

/* The lower triangle of H += x^T x for @n rows of @x (@ld apart), split by rows of H; whole
 * 8 x 16 tiles by the kernel table's gram_tile (kernels/arch/kn_gram.h). */
struct hess_job {
    float *h;
    const float *x;
    int n, ld, cols;
    void (*tile)(float *h, int cols, const float *x, int n, int ld, int i0, int k0);
};

/* The same for one element, for the edges the tiles leave. */
static void hess_one(float *h, int cols, const float *x, int n, int ld, int i, int k)
{
    float s = 0.0f;
    for (int r = 0; r < n; r++)
        s += x[(size_t)r * ld + i] * x[(size_t)r * ld + k];
    h[(size_t)i * cols + k] += s;
}

/* Columns of x a pass of tiles reads, for all of a thread's bands: 128 rows of them stay in L2. */
#define HESS_KBLOCK 256

static void hess_part(void *arg, int t, int nt)
{
    const struct hess_job *j = arg;
    int cols = j->cols;
    /* rows i of the triangle cost i: split the area evenly, in bands of 8 rows */
    double tot = (double)cols * cols;
    int i0 = (int)sqrt(tot * t / nt) / 8 * 8;
    int i1 = t + 1 == nt ? cols : (int)sqrt(tot * (t + 1) / nt) / 8 * 8;
    int full = cols / 8 * 8; /* rows in whole bands */
    /* whole 8 x 16 tiles left of each band's diagonal (they write some of the upper triangle,
     * which nothing reads), a block of columns at a time */
    for (int kb = 0; kb < (i1 < full ? i1 : full); kb += HESS_KBLOCK)
        for (int ib = i0; ib < i1 && ib < full; ib += 8) {
            int kend = (ib + 8) / 16 * 16, kmax = kb + HESS_KBLOCK;
            for (int kt = kb; kt < kend && kt < kmax; kt += 16)
                j->tile(j->h, cols, j->x, j->n, j->ld, ib, kt);
        }
    /* then what the tiles leave: the columns right of a band's last tile, the rows past the
     * last whole band */
    for (int i = i0; i < i1; i++)
        for (int k = i < full ? (i / 8 * 8 + 8) / 16 * 16 : 0; k <= i; k++)
            hess_one(j->h, cols, j->x, j->n, j->ld, i, k);
}

void coord_calib_hessian_add(float *h, const float *x, int n, int ld, int cols,
                             const struct kn_ops *ops, struct wrk_pool *pool)
{
    struct hess_job j = {h, x, n, ld, cols, ops->gram_tile};
    if (pool)
        wrk_pool_run(pool, hess_part, &j);
    else
        hess_part(&j, 0, 1);
}

static void observe(void *ctx, uint32_t layer, enum wrk_site site, const float *x, int n, int ld,
                    int cols)
{
    struct coord_calib *c = ctx;
    struct site_stats *st = stats_of(c, layer, site);
    if (c->collect_sumsq) {
        /* samples: every stride-th row, spread over the whole text */
        long stride = c->n_tok / COORD_CALIB_SAMPLES > 1 ? c->n_tok / COORD_CALIB_SAMPLES : 1;
        for (int r = 0; r < n; r++, st->seen++) {
            for (int i = 0; i < cols; i++)
                st->sumsq[i] += (double)x[(size_t)r * ld + i] * x[(size_t)r * ld + i];
            if (st->x && st->seen % stride == 0 && st->n_x < COORD_CALIB_SAMPLES)
                memcpy(st->x + (size_t)st->n_x++ * cols, x + (size_t)r * ld,
                       (size_t)cols * sizeof(float));
        }
    }
    if (st->h)
        coord_calib_hessian_add(st->h, x, n, ld, cols, c->ops, c->pool);
}

/* Runs every calibration sequence through the forward once, collecting what the stats ask for. */
static int run_pass(struct coord_calib *c, struct shardlm_err *e)
{
    long done = 0;
    for (int q = 0, at = 0; q < c->n_seqs; at += c->seq_len_of[q++]) {
        for (int p = 0; p < c->seq_len_of[q]; p += CALIB_CHUNK) {
            if (cancelled(c))
                return cancel_fail(e);
            int n = c->seq_len_of[q] - p < CALIB_CHUNK ? c->seq_len_of[q] - p : CALIB_CHUNK;
            /* the head runs (and its input is seen) only for rows that want logits */
            int rc = wrk_forward(&c->m, c->kv, c->table, c->tok + at + p, n, p, c->logits,
                                 c->logits != NULL);
            if (rc)
                return shardlm_fail(e, rc, "calibration forward failed");
            done += n;
            if (c->o->progress)
                c->o->progress(c->o->progress_ctx, "statistics", done, c->n_tok);
        }
    }
    return 0;
}

static size_t hess_bytes(int cols) { return (size_t)cols * (size_t)cols * sizeof(float); }

static void hessians_drop(struct coord_calib *c)
{
    for (uint32_t l = c->h0; l < c->h1; l++)
        for (int k = 0; k < WRK_SITES; k++) {
            free(stats_of(c, l, k)->h);
            stats_of(c, l, k)->h = NULL;
        }
    c->h0 = c->h1 = 0;
}

/* A third of MemAvailable (free memory and the page cache the kernel can drop: after reading a
 * large source, most of the memory is cache), within the bounds of calib.h. */
static size_t hessian_budget(void)
{
    unsigned long long kb = 0;
    char line[128];
    FILE *f = fopen("/proc/meminfo", "re");
    while (f && fgets(line, sizeof(line), f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
            break;
    if (f)
        fclose(f);
    size_t b = kb ? (size_t)(kb * 1024 / 3) : COORD_CALIB_HESSIAN_MIN;
    return b < COORD_CALIB_HESSIAN_MIN   ? COORD_CALIB_HESSIAN_MIN
           : b > COORD_CALIB_HESSIAN_MAX ? COORD_CALIB_HESSIAN_MAX
                                         : b;
}

/* Collects the Hessians of layers [l, ...) that fit the budget (at least layer l's) by a pass. */
static int hessians_from(struct coord_calib *c, uint32_t l, struct shardlm_err *e)
{
    hessians_drop(c);
    size_t used = 0, budget = hessian_budget();
    uint32_t end = l;
    for (; end <= c->cfg.n_layers; end++) {
        size_t need = 0;
        for (int k = 0; k < WRK_SITES; k++)
            if (stats_of(c, end, k)->cols)
                need += hess_bytes(stats_of(c, end, k)->cols);
        if (end > l && used + need > budget)
            break;
        used += need;
        for (int k = 0; k < WRK_SITES; k++) {
            struct site_stats *st = stats_of(c, end, k);
            if (st->cols && !(st->h = calloc(1, hess_bytes(st->cols)))) {
                c->h0 = l, c->h1 = end + 1;
                hessians_drop(c);
                return shardlm_fail(e, -ENOMEM,
                                    "out of memory for the Hessians of layer %u "
                                    "(%zu MiB)",
                                    end, need >> 20);
            }
        }
    }
    c->h0 = l;
    c->h1 = end;
    return run_pass(c, e);
}

/* ---- setup ---- */

static int model_open(struct coord_calib *c, struct coord_source *src, struct shardlm_err *e)
{
    int rc = coord_convert_image(src, SHLM_SCHEME_BF16, c->o->cancel, &c->image, &c->image_size, e);
    if (rc)
        return rc;
    if ((rc = shlm_parse(&c->img, c->image, c->image_size, "calibration image", e)))
        return rc;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = c->o->threads > 0 ? c->o->threads : cpus > 0 ? (int)cpus : 1;
    if ((rc = wrk_pool_init(&c->pool, threads, NULL)))
        return shardlm_fail(e, rc, "calibration threads: %s", strerror(-rc));
    c->ops = kn_ops_select(NULL, NULL, 0); /* the forward's and the Hessians' table: the fastest */
    if ((rc = wrk_model_init(&c->m, &c->img, c->ops, CALIB_CHUNK, c->pool, NULL)))
        return shardlm_fail(e, rc, "out of memory for the calibration forward");
    c->m.observe = observe;
    c->m.observe_ctx = c;
    uint32_t kvd = (uint32_t)c->m.plan.kv_dim;
    c->bpc = (c->seq_len + SEG_KV_BLOCK - 1) / SEG_KV_BLOCK;
    uint32_t blocks = (uint32_t)(c->bpc * CALIB_SLOTS);
    c->kv = calloc(1, seg_kv_bytes(blocks, c->cfg.n_layers, kvd, c->m.plan.kv_keys_only));
    c->table = malloc((size_t)blocks * sizeof(*c->table));
    if (c->o->head)
        c->logits = malloc((size_t)CALIB_CHUNK * c->cfg.vocab_size * sizeof(float));
    if (!c->kv || !c->table || (c->o->head && !c->logits))
        return shardlm_fail(e, -ENOMEM, "out of memory for the calibration KV cache");
    seg_kv_init(c->kv, blocks, c->cfg.n_layers, kvd, c->m.plan.kv_keys_only);
    for (uint32_t b = 0; b < blocks; b++)
        c->table[b] = b;
    return 0;
}

static int stats_alloc(struct coord_calib *c, struct shardlm_err *e)
{
    const struct shlm_config *g = &c->cfg;
    c->s = calloc(((size_t)g->n_layers + 1) * WRK_SITES, sizeof(*c->s));
    if (!c->s)
        return shardlm_fail(e, -ENOMEM, "out of memory");
    for (uint32_t l = 0; l <= g->n_layers; l++) {
        /* O's input: our heads' value widths */
        int cols[WRK_SITES] = {(int)g->dim, (int)(g->n_heads * shlm_v_dim(g, &c->m.cfgx)),
                               (int)g->dim, (int)g->hidden_dim, 0};
        if (l == g->n_layers) { /* the head's input, after the last layer */
            memset(cols, 0, sizeof(cols));
            cols[WRK_SITE_HEAD] = c->o->head ? (int)g->dim : 0;
        }
        for (int k = 0; k < WRK_SITES; k++) {
            struct site_stats *st = stats_of(c, l, k);
            st->cols = cols[k];
            if (st->cols && !(st->sumsq = calloc((size_t)st->cols, sizeof(double))))
                return shardlm_fail(e, -ENOMEM, "out of memory");
            if (st->cols && c->o->samples &&
                !(st->x = malloc((size_t)COORD_CALIB_SAMPLES * st->cols * sizeof(float))))
                return shardlm_fail(e, -ENOMEM, "out of memory");
        }
    }
    return 0;
}

int coord_calib_open(struct coord_calib **out, struct coord_source *src,
                     const struct coord_calib_opts *o, struct shardlm_err *e)
{
    struct coord_calib *c = calloc(1, sizeof(*c));
    *out = NULL;
    if (!c)
        return shardlm_fail(e, -ENOMEM, "out of memory");
    c->o = o;
    c->cfg = src->cfg;
    c->want_h = o->hessians;
    c->seq_len = (int)(c->cfg.seq_len < CALIB_SEQ ? c->cfg.seq_len : CALIB_SEQ);
    if (c->seq_len < 2) { /* BOS and at least one token */
        int len = c->seq_len;
        free(c);
        return shardlm_fail(e, -EINVAL, "a context of %d: calibration needs at least 2 (--ctx)",
                            len);
    }
    long want = o->tokens > 0 ? o->tokens : COORD_CALIB_TOKENS;
    /* room for the tokens and a sequence per token at worst (one EOS after another) */
    c->tok = malloc((size_t)(want + c->seq_len + CALIB_SLOTS) * sizeof(*c->tok));
    c->seq_len_of = malloc((size_t)(want + c->seq_len + CALIB_SLOTS) * sizeof(int));
    int rc;
    if (!c->tok || !c->seq_len_of) {
        rc = shardlm_fail(e, -ENOMEM, "out of memory");
        goto fail;
    }
    if ((rc = model_open(c, src, e)) || (rc = stats_alloc(c, e)))
        goto fail;
    rc = o->text ? tokens_from_text(c, src, want, e) : tokens_from_model(c, want, e);
    if (!rc && c->n_tok < 16)
        rc = shardlm_fail(e, -EINVAL, "%ld calibration tokens, too few (at least 16)", c->n_tok);
    if (!rc && o->holdout)
        rc = holdout_split(c, e);
    if (rc)
        goto fail;
    /* the first pass: every layer's mean squares (and the first Hessians, when wanted) */
    c->collect_sumsq = true;
    rc = c->want_h ? hessians_from(c, 0, e) : run_pass(c, e);
    c->collect_sumsq = false;
    if (rc)
        goto fail;
    c->rows_seen = c->n_tok;
    *out = c;
    return 0;
fail:
    coord_calib_free(c);
    return rc;
}

void coord_calib_free(struct coord_calib *c)
{
    if (!c)
        return;
    if (c->s)
        for (size_t i = 0; i < ((size_t)c->cfg.n_layers + 1) * WRK_SITES; i++) {
            free(c->s[i].sumsq);
            free(c->s[i].h);
            free(c->s[i].x);
        }
    free(c->s);
    if (c->m.layers)
        wrk_model_free(&c->m);
    if (c->pool)
        wrk_pool_free(c->pool);
    if (c->image)
        munmap(c->image, c->image_size);
    free(c->kv);
    free(c->logits);
    free(c->table);
    free(c->tok);
    free(c->seq_len_of);
    free(c->out_imat);
    free(c->out_h);
    free(c->ho_tok);
    free(c->ho_len);
    free(c);
}

long coord_calib_tokens(const struct coord_calib *c) { return c->n_tok; }

void coord_calib_samples(const struct coord_calib *c, uint32_t layer, int site, int cols,
                         const float **x, int *n)
{
    const struct site_stats *st = &c->s[(size_t)layer * WRK_SITES + site];
    KN_ASSERT(!st->x || st->cols == cols);
    *x = st->x;
    *n = st->x ? st->n_x : 0;
}

const double *coord_calib_sumsq(const struct coord_calib *c, uint32_t layer, int site, long *rows)
{
    const struct site_stats *st = &c->s[(size_t)layer * WRK_SITES + site];
    *rows = c->rows_seen;
    return st->cols ? st->sumsq : NULL;
}

/* The layer and site whose input the tensor of kind @k of layer @l multiplies, from its kind's row
 * of the tensor table; false for other tensors (the embedding lookup, the f32 vectors and the
 * head gate, which are not quantized). */
static bool site_of(const struct shlm_config *g, int k, uint32_t l, uint32_t *layer,
                    enum wrk_site *site)
{
    if ((unsigned)k >= SHLM_KIND_COUNT)
        return false;
    const struct shlm_kind_traits *t = &shlm_kinds[k];
    /* a tied embedding is the LM head */
    enum shlm_site s = k == SHLM_KIND_TOK_EMBD && g->tied_embd ? SHLM_SITE_HEAD : t->site;
    if (s == SHLM_SITE_NONE || t->dtc == SHLM_DTC_F32)
        return false;
    *layer = s == SHLM_SITE_HEAD ? g->n_layers : l;
    *site = (enum wrk_site)s;
    return true;
}

long coord_calib_site(const struct coord_calib *c, int kind, uint32_t layer)
{
    uint32_t l;
    enum wrk_site k;
    return site_of(&c->cfg, kind, layer, &l, &k) ? (long)l * WRK_SITES + k : -1;
}

int coord_calib_stats(struct coord_calib *c, int kind, uint32_t layer, int cols,
                      const float **imatrix, const float **hessian, struct shardlm_err *e)
{
    *imatrix = *hessian = NULL;
    uint32_t l;
    enum wrk_site k;
    if (!site_of(&c->cfg, kind, layer, &l, &k))
        return 0;
    struct site_stats *st = stats_of(c, l, k);
    if (!st->cols) /* the head, not collected */
        return 0;
    KN_ASSERT(st->cols == cols);
    free(c->out_imat);
    free(c->out_h);
    c->out_h = NULL;
    if (!(c->out_imat = malloc((size_t)cols * sizeof(float))))
        return shardlm_fail(e, -ENOMEM, "out of memory");
    for (int i = 0; i < cols; i++)
        c->out_imat[i] = (float)(st->sumsq[i] / (double)c->rows_seen);
    *imatrix = c->out_imat;
    if (!c->want_h)
        return 0;
    int rc;
    if ((l < c->h0 || l >= c->h1) && (rc = hessians_from(c, l, e)))
        return rc;
    if (!(c->out_h = malloc(hess_bytes(cols))))
        return shardlm_fail(e, -ENOMEM, "out of memory for a Hessian (%zu MiB)",
                            hess_bytes(cols) >> 20);
    float inv = 1.0f / (float)c->n_tok;
    for (int i = 0; i < cols; i++)
        for (int j = 0; j <= i; j++)
            c->out_h[(size_t)i * cols + j] = c->out_h[(size_t)j * cols + i] =
                st->h[(size_t)i * cols + j] * inv;
    *hessian = c->out_h;
    return 0;
}
