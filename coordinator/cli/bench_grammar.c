/* SPDX-License-Identifier: MIT */
/* coordinator/cli/bench_grammar.c: `shardlm bench grammar` - the grammar engine alone over
 * MaskBench's data (guidance-ai/jsonschemabench, maskbench/data): for each schema, the compile
 * (time to first mask), then each test instance written as Python's json.dumps writes it,
 * tokenized, and for every token the mask computed and the token committed (refused where the
 * mask forbids it), in MaskBench's terms. */
#include "bench.h"
#include "cli.h"
#include "grammar.h"
#include "tokenizer.h"
#include "util.h"

#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static const char usage_bench_grammar[] =
    "usage: shardlm bench grammar --tokenizer FILE --data DIR [--json] [--limit N]\n"
    "                             [--timeout S] [-v]\n"
    "\n"
    "The grammar engine alone over a folder of JSON files in MaskBench's format\n"
    "({\"schema\": ..., \"tests\": [{\"valid\": bool, \"data\": ...}]}), on one thread: each\n"
    "schema compiled (TTFM), then each instance (as Python's json.dumps writes it) tokenized and\n"
    "walked token by token: the mask before each token (TBM), the token committed, refused\n"
    "where the mask forbids it. A schema passes when it compiles and every valid instance is\n"
    "accepted and every invalid one refused. Prints\n"
    "  grammar schemas=<n> passing=<n> compile_errors=<n> validation_errors=<n>\n"
    "    invalidation_errors=<n> crashes_timeouts=<n> tests=<n> tokens=<n>\n"
    "  tbm_us avg=<x> p25=<x> p50=<x> p75=<x> p90=<x> p95=<x> p99=<x> p99.9=<x> max=<x>\n"
    "  ttfm_us (the same)\n"
    "(each on one line).\n"
    "  --tokenizer FILE  the tokenizer (a tokenizer.json, GGUF, .shlm or blob; required)\n"
    "  --data DIR        the folder of *.json files (required)\n"
    "  --json            one JSON object instead of the lines\n"
    "  --limit N         the first N files (by name) only\n"
    "  --timeout S       seconds a schema may take, its tests included (default 60)\n"
    "  -v                each schema that fails, and why, on stderr (else, on a terminal, the\n"
    "                    progress)\n";

#define BENCH_GRAMMAR_MAX_TOKENS (1 << 20)

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

struct sbuf {
    char *p;
    size_t n, cap;
};

static void sb_put(struct sbuf *s, const char *t, size_t n)
{
    if (s->n + n + 1 > s->cap) {
        size_t nc = s->cap ? s->cap : 256;
        while (nc < s->n + n + 1)
            nc *= 2;
        char *q = realloc(s->p, nc);
        if (!q)
            abort(); /* a bench tool: out of memory ends it */
        s->p = q;
        s->cap = nc;
    }
    memcpy(s->p + s->n, t, n);
    s->n += n;
    s->p[s->n] = 0;
}

/* Python's repr of a float: the shortest decimal that reads back, fixed notation for exponents
 * -4..15 (with ".0" when whole), else d.ddde+XX. */
static void py_float(struct sbuf *s, double d)
{
    char buf[64], dig[32];
    int p;
    for (p = 1; p <= 17; p++) {
        snprintf(buf, sizeof(buf), "%.*e", p - 1, d);
        if (strtod(buf, NULL) == d)
            break;
    }
    /* buf: [-]d.ddde[+-]XX */
    const char *m = buf;
    bool neg = *m == '-';
    if (neg)
        m++;
    int nd = 0;
    for (const char *q = m; *q && *q != 'e'; q++)
        if (*q != '.')
            dig[nd++] = *q;
    dig[nd] = 0;
    while (nd > 1 && dig[nd - 1] == '0')
        dig[--nd] = 0;
    int ex = atoi(strchr(buf, 'e') + 1);
    char out[80];
    int o = 0;
    if (neg)
        out[o++] = '-';
    if (ex >= -4 && ex < 16) {
        if (ex < 0) {
            out[o++] = '0';
            out[o++] = '.';
            for (int i = 0; i < -ex - 1; i++)
                out[o++] = '0';
            for (int i = 0; i < nd; i++)
                out[o++] = dig[i];
        } else {
            for (int i = 0; i <= ex; i++)
                out[o++] = i < nd ? dig[i] : '0';
            out[o++] = '.';
            if (nd > ex + 1)
                for (int i = ex + 1; i < nd; i++)
                    out[o++] = dig[i];
            else
                out[o++] = '0';
        }
        out[o] = 0;
    } else {
        out[o++] = dig[0];
        if (nd > 1) {
            out[o++] = '.';
            for (int i = 1; i < nd; i++)
                out[o++] = dig[i];
        }
        o += snprintf(out + o, sizeof(out) - (size_t)o, "e%c%02d", ex < 0 ? '-' : '+',
                      ex < 0 ? -ex : ex);
    }
    sb_put(s, out, (size_t)o);
}

static void py_string(struct sbuf *s, const char *t, size_t n)
{
    sb_put(s, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)t[i];
        char esc[8];
        switch (ch) {
        case '"':
            sb_put(s, "\\\"", 2);
            break;
        case '\\':
            sb_put(s, "\\\\", 2);
            break;
        case '\n':
            sb_put(s, "\\n", 2);
            break;
        case '\r':
            sb_put(s, "\\r", 2);
            break;
        case '\t':
            sb_put(s, "\\t", 2);
            break;
        case '\b':
            sb_put(s, "\\b", 2);
            break;
        case '\f':
            sb_put(s, "\\f", 2);
            break;
        default:
            if (ch < 0x20) {
                snprintf(esc, sizeof(esc), "\\u%04x", ch);
                sb_put(s, esc, 6);
            } else {
                sb_put(s, (const char *)&ch, 1);
            }
        }
    }
    sb_put(s, "\"", 1);
}

/* @j as Python's json.dumps(j, indent=None, ensure_ascii=False) writes it. */
static void py_dumps(struct sbuf *s, json_t *j, bool ints_as_reals)
{
    char buf[64];
    switch (json_typeof(j)) {
    case JSON_NULL:
        sb_put(s, "null", 4);
        return;
    case JSON_TRUE:
        sb_put(s, "true", 4);
        return;
    case JSON_FALSE:
        sb_put(s, "false", 5);
        return;
    case JSON_INTEGER:
        sb_put(s, buf,
               (size_t)snprintf(buf, sizeof(buf), "%lld", (long long)json_integer_value(j)));
        return;
    case JSON_REAL:
        if (ints_as_reals && json_real_value(j) == floor(json_real_value(j)) &&
            fabs(json_real_value(j)) < 1e30) {
            sb_put(s, buf, (size_t)snprintf(buf, sizeof(buf), "%.0f", json_real_value(j)));
            return;
        }
        py_float(s, json_real_value(j));
        return;
    case JSON_STRING:
        py_string(s, json_string_value(j), json_string_length(j));
        return;
    case JSON_ARRAY: {
        sb_put(s, "[", 1);
        size_t i;
        json_t *x;
        json_array_foreach(j, i, x)
        {
            if (i)
                sb_put(s, ", ", 2);
            py_dumps(s, x, ints_as_reals);
        }
        sb_put(s, "]", 1);
        return;
    }
    case JSON_OBJECT: {
        sb_put(s, "{", 1);
        const char *k;
        size_t kl;
        json_t *x;
        bool first = true;
        void *tmp;
        json_object_keylen_foreach_safe(j, tmp, k, kl, x)
        {
            if (!first)
                sb_put(s, ", ", 2);
            first = false;
            py_string(s, k, kl);
            sb_put(s, ": ", 2);
            py_dumps(s, x, ints_as_reals);
        }
        sb_put(s, "}", 1);
        return;
    }
    }
}

struct times {
    double *v;
    size_t n, cap;
};

static void times_add(struct times *t, double us)
{
    if (t->n == t->cap) {
        t->cap = t->cap ? t->cap * 2 : 4096;
        double *q = realloc(t->v, t->cap * sizeof(double));
        if (!q)
            abort();
        t->v = q;
    }
    t->v[t->n++] = us;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static const double pct[] = {25, 50, 75, 90, 95, 99, 99.9};
static const char *const pct_name[] = {"p25", "p50", "p75", "p90", "p95", "p99", "p99.9"};

/* Average, the percentiles above (nearest rank) and the maximum of @t (sorted here). */
static void times_stats(struct times *t, double *avg, double *p, double *max)
{
    *avg = *max = 0;
    for (int i = 0; i < 7; i++)
        p[i] = 0;
    if (!t->n)
        return;
    qsort(t->v, t->n, sizeof(double), cmp_double);
    double sum = 0;
    for (size_t i = 0; i < t->n; i++)
        sum += t->v[i];
    *avg = sum / (double)t->n;
    for (int i = 0; i < 7; i++) {
        size_t k = (size_t)ceil(pct[i] / 100 * (double)t->n);
        p[i] = t->v[k ? k - 1 : 0];
    }
    *max = t->v[t->n - 1];
}

struct counts {
    long schemas, passing, compile_errors, validation_errors, invalidation_errors, timeouts, tests,
        tokens, skipped;
};

static int cmp_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* One MaskBench file. */
static void run_file(const char *dir, const char *name, const struct coord_tok *tok,
                     const struct gr_vocab *v, double timeout_us, bool verbose, struct counts *c,
                     struct times *tbm, struct times *ttfm, int32_t *ids, uint32_t *mask)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    /* a regular file of at most 64 MiB (a FIFO or a device named *.json is not read) */
    uint8_t *buf = NULL;
    size_t len = 0;
    struct shardlm_err re;
    json_error_t je = {.text = ""};
    const char *why = je.text;
    json_t *f = NULL;
    bool ints_as_reals = false;
    if (coord_read_file(path, 64u << 20, &buf, &len, &re) == 0) {
        f = json_loadb((const char *)buf, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
        if (!f && strstr(je.text, "too big integer")) { /* past int64: read them as numbers */
            f = json_loadb((const char *)buf, len,
                           JSON_DECODE_ANY | JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, &je);
            ints_as_reals = true;
        }
    } else {
        why = re.msg;
    }
    free(buf);
    c->schemas++;
    if (!f || !json_object_get(f, "schema")) {
        /* what the server's JSON reader refuses too (a NUL in an object key): the schema is
         * refused, a compile error */
        if (verbose)
            fprintf(stderr, "%s: compile error: the file cannot be read: %s\n", name,
                    f ? "no \"schema\"" : why);
        c->compile_errors++;
        json_decref(f);
        return;
    }
    char *schema = json_dumps(json_object_get(f, "schema"),
                              JSON_COMPACT | JSON_ENCODE_ANY | JSON_REAL_PRECISION(17));
    struct shardlm_err e = {{0}};
    struct gr_grammar *g = NULL;
    double t0 = now_us();
    int rc = gr_compile_json_schema(schema, strlen(schema), NULL, &g, &e);
    double t1 = now_us();
    free(schema);
    if (rc) {
        c->compile_errors++;
        if (verbose)
            fprintf(stderr, "%s: compile error: %s\n", name, e.msg);
        json_decref(f);
        return;
    }
    times_add(ttfm, t1 - t0);
    json_t *tests = json_object_get(f, "tests");
    size_t i;
    json_t *test;
    const char *failure = NULL;
    bool invalidation = false;
    json_array_foreach(tests, i, test)
    {
        c->tests++;
        struct sbuf s = {0};
        py_dumps(&s, json_object_get(test, "data"), ints_as_reals);
        bool valid = json_is_true(json_object_get(test, "valid"));
        int n = coord_tok_encode_ex(tok, s.p ? s.p : "", s.n, 0, ids, BENCH_GRAMMAR_MAX_TOKENS);
        if (n < 0) {
            c->skipped++;
            free(s.p);
            continue;
        }
        struct gr_matcher *m;
        if (gr_matcher_new(g, v, &m, &e)) {
            failure = "matcher";
            free(s.p);
            break;
        }
        bool accepted = true;
        for (int k = 0; k < n; k++) {
            double a = now_us();
            long cnt = gr_matcher_mask(m, mask);
            bool ok = cnt >= 0 && (mask[ids[k] >> 5] >> (ids[k] & 31) & 1);
            if (ok && !gr_matcher_commit(m, ids[k])) {
                failure = "a token in the mask was refused by the commit";
                ok = false;
            }
            double b = now_us();
            times_add(tbm, b - a);
            c->tokens++;
            if (!ok) {
                accepted = false;
                break;
            }
            if (b - t0 > timeout_us)
                break;
        }
        gr_matcher_free(m);
        if (now_us() - t0 > timeout_us) {
            failure = "timeout";
            free(s.p);
            break;
        }
        if (accepted != valid && !failure) {
            failure = valid ? "a valid instance was refused" : "an invalid instance was accepted";
            invalidation = !valid;
            if (verbose)
                fprintf(stderr, "%s: test %zu: %s: %.300s\n", name, i, failure, s.p);
        }
        free(s.p);
        if (failure)
            break;
    }
    if (failure && !strcmp(failure, "timeout"))
        c->timeouts++;
    else if (invalidation)
        c->invalidation_errors++;
    else if (failure)
        c->validation_errors++;
    else
        c->passing++;
    if (failure && verbose && (!strcmp(failure, "timeout") || !strcmp(failure, "matcher")))
        fprintf(stderr, "%s: %s\n", name, failure);
    gr_grammar_free(g);
    json_decref(f);
}

int coord_bench_grammar(int argc, char **argv)
{
    static const struct option opts[] = {{"tokenizer", required_argument, 0, 't'},
                                         {"data", required_argument, 0, 'd'},
                                         {"json", no_argument, 0, 'j'},
                                         {"limit", required_argument, 0, 'l'},
                                         {"timeout", required_argument, 0, 'T'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    static const struct coord_cli_path paths[] = {{'t', "--tokenizer"}, {'d', "--data"}, {0, 0}};
    static const struct coord_cli_cmd cmd = {"bench grammar", usage_bench_grammar, ":vh", opts,
                                             paths};
    const char *tpath = NULL, *dir = NULL;
    bool json = false, verbose = false;
    long limit = -1, timeout_s = 60;
    int c, rc;
    optind = 0;
    opterr = 0;
    while ((c = coord_cli_getopt(&cmd, argc, argv, &rc)) != -1) {
        switch (c) {
        case COORD_CLI_EXIT:
            return rc;
        case 't':
            tpath = optarg;
            break;
        case 'd':
            dir = optarg;
            break;
        case 'j':
            json = true;
            break;
        case 'v':
            verbose = true;
            break;
        case 'l':
            if (!coord_parse_long(optarg, 1, 100000000, &limit))
                return coord_usage_error("bench grammar", usage_bench_grammar,
                                         "--limit '%s': expected 1..100000000", optarg);
            break;
        case 'T':
            if (!coord_parse_long(optarg, 1, 86400, &timeout_s))
                return coord_usage_error("bench grammar", usage_bench_grammar,
                                         "--timeout '%s': expected 1..86400 seconds", optarg);
            break;
        case ':':
            return coord_usage_error("bench grammar", usage_bench_grammar,
                                     "option '%s' needs a value", argv[optind - 1]);
        default:
            return coord_usage_error("bench grammar", usage_bench_grammar, "bad option '%s'",
                                     argv[optind - 1]);
        }
    }
    if (optind != argc)
        return coord_usage_error("bench grammar", usage_bench_grammar, "unexpected argument '%s'",
                                 argv[optind]);
    if (!tpath || !dir)
        return coord_usage_error("bench grammar", usage_bench_grammar, "%s",
                                 !tpath ? "--tokenizer FILE is required"
                                        : "--data DIR is required");
    struct shardlm_err e;
    if (coord_check_folder(dir, &e)) {
        fprintf(stderr, "shardlm bench grammar: %s\n", e.msg);
        return 1;
    }
    struct coord_tok tok;
    void *map;
    size_t size;
    if (coord_cli_open_tok(tpath, 0, &tok, &map, &size, &e)) {
        fprintf(stderr, "shardlm bench grammar: %s\n", e.msg);
        return 1;
    }
    /* the vocabulary: every token's text but control tokens */
    const char **bytes = calloc((size_t)tok.vocab_size, sizeof(char *));
    uint32_t *lens = calloc((size_t)tok.vocab_size, sizeof(uint32_t));
    struct gr_vocab *v = NULL;
    char **names = NULL;
    size_t n_names = 0, cap_names = 0;
    int ret = 1;
    if (!bytes || !lens)
        goto out;
    for (int i = 0; i < tok.vocab_size; i++) {
        if ((tok.attrs[i] & COORD_TOKA_TYPE) == COORD_TOKT_CONTROL)
            continue;
        size_t len;
        bytes[i] = coord_tok_text(&tok, i, &len);
        lens[i] = (uint32_t)len;
    }
    if (gr_vocab_new(tok.vocab_size, bytes, lens, tok.eos_id, &v, &e)) {
        fprintf(stderr, "shardlm bench grammar: %s\n", e.msg);
        goto out;
    }
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "shardlm bench grammar: %s: %s\n", dir, strerror(errno));
        goto out;
    }
    for (struct dirent *de; (de = readdir(d));) {
        size_t l = strlen(de->d_name);
        if (l < 6 || strcmp(de->d_name + l - 5, ".json"))
            continue;
        if (n_names == cap_names) {
            cap_names = cap_names ? cap_names * 2 : 1024;
            char **q = realloc(names, cap_names * sizeof(char *));
            if (!q)
                abort();
            names = q;
        }
        names[n_names++] = strdup(de->d_name);
    }
    closedir(d);
    qsort(names, n_names, sizeof(char *), cmp_name);
    size_t n_run = limit > 0 && (size_t)limit < n_names ? (size_t)limit : n_names;
    int32_t *ids = malloc(sizeof(int32_t) * BENCH_GRAMMAR_MAX_TOKENS);
    uint32_t *mask = malloc(sizeof(uint32_t) * (size_t)gr_mask_words(v));
    if (!ids || !mask) {
        free(ids);
        free(mask);
        goto out;
    }
    struct counts cn = {0};
    struct times tbm = {0}, ttfm = {0};
    bool tty = isatty(STDERR_FILENO);
    for (size_t i = 0; i < n_run; i++) {
        run_file(dir, names[i], &tok, v, (double)timeout_s * 1e6, verbose, &cn, &tbm, &ttfm, ids,
                 mask);
        if (tty && !verbose && (i % 100 == 99 || i + 1 == n_run)) /* progress on a terminal */
            fprintf(stderr, "\rbench grammar: %zu/%zu schemas, %ld passing%s", i + 1, n_run,
                    cn.passing, i + 1 == n_run ? "\n" : "");
    }
    free(ids);
    free(mask);
    double ta, tp[7], tm, fa, fp[7], fm;
    times_stats(&tbm, &ta, tp, &tm);
    times_stats(&ttfm, &fa, fp, &fm);
    if (json) {
        printf(
            "{\"tokenizer\": \"%s\", \"schemas\": %ld, \"passing\": %ld, \"compile_errors\": %ld, "
            "\"validation_errors\": %ld, \"invalidation_errors\": %ld, "
            "\"crashes_timeouts\": %ld, \"tests\": %ld, \"tests_not_tokenized\": %ld, "
            "\"tokens\": %ld",
            tpath, cn.schemas, cn.passing, cn.compile_errors, cn.validation_errors,
            cn.invalidation_errors, cn.timeouts, cn.tests, cn.skipped, cn.tokens);
        for (int k = 0; k < 2; k++) {
            const double *p = k ? fp : tp;
            printf(", \"%s\": {\"avg\": %.1f", k ? "ttfm_us" : "tbm_us", k ? fa : ta);
            for (int i = 0; i < 7; i++)
                printf(", \"%s\": %.1f", pct_name[i], p[i]);
            printf(", \"max\": %.1f}", k ? fm : tm);
        }
        printf("}\n");
    } else {
        printf("grammar schemas=%ld passing=%ld compile_errors=%ld validation_errors=%ld "
               "invalidation_errors=%ld crashes_timeouts=%ld tests=%ld tokens=%ld\n",
               cn.schemas, cn.passing, cn.compile_errors, cn.validation_errors,
               cn.invalidation_errors, cn.timeouts, cn.tests, cn.tokens);
        for (int k = 0; k < 2; k++) {
            const double *p = k ? fp : tp;
            printf("%s avg=%.1f", k ? "ttfm_us" : "tbm_us", k ? fa : ta);
            for (int i = 0; i < 7; i++)
                printf(" %s=%.1f", pct_name[i], p[i]);
            printf(" max=%.1f\n", k ? fm : tm);
        }
    }
    free(tbm.v);
    free(ttfm.v);
    ret = 0;
out:
    for (size_t i = 0; i < n_names; i++)
        free(names[i]);
    free(names);
    gr_vocab_free(v);
    free(bytes);
    free(lens);
    coord_tok_free(&tok);
    munmap(map, size);
    return ret;
}
