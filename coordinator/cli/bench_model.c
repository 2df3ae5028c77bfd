/* SPDX-License-Identifier: MIT */
/* coordinator/cli/bench_model.c: `shardlm bench -m MODEL` - prefill and decode speed through the
 * real engine (coordinator, workers, segments), printed in the table format of llama-bench, with
 * the bytes of weights a decode token reads, the machine's read bandwidth measured here, and the
 * share of that roofline decode reaches. */
#include "bench.h"

#include "cli.h"
#include "grammar.h"
#include "kn.h"
#include "scheduler.h"
#include "tensors.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static const char usage_bench_model[] =
    "usage: shardlm bench -m MODEL.shlm [-p N] [-n N] [-t T[,T...]] [-r REPS] [--workers W]\n"
    "                     [--batch B[,B...] | --prefix-cache P | --json-schema FILE]\n"
    "                     [--json]\n"
    "\n"
    "Runs prefill (ppN: N prompt tokens in one step) and decode (tgN: N tokens one step each)\n"
    "through the engine, REPS times each after one untimed warm-up (the prefill and one decode\n"
    "step, as llama-bench warms up), and prints llama-bench's table: model, size, params,\n"
    "backend, threads, test, t/s (median +- standard deviation). Then, per thread count, the\n"
    "bytes of weights one decode token reads (of a mixture of experts: the chosen experts'),\n"
    "the read bandwidth of this machine measured with 1 GiB of arrays, and decode's share of\n"
    "that roofline (bytes per token x tok/s / bandwidth).\n"
    "  -p N            prompt tokens of the prefill test (default 512; 0 skips it)\n"
    "  -n N            tokens of the decode test (default 128; 0 skips it)\n"
    "  -t T,...        threads per worker (default: every CPU of one worker)\n"
    "  -r REPS         repetitions (default 3)\n"
    "  --workers W     tensor-parallel workers (default 1), each with T threads\n"
    "  --batch B,...   instead: B sequences at once (up to 256), as llama-batched-bench runs "
    "them:\n"
    "                  each prefills its own N-token prompt (-p; steps of up to a context of\n"
    "                  tokens), then -n decode steps carry one token of every sequence; prints\n"
    "                  llama-batched-bench's table (PP, TG, B, N_KV = B x (PP + TG), times and\n"
    "                  tokens/s of the prefill, of the decode and of both; medians of REPS,\n"
    "                  after one untimed warm-up of the largest B with one decode step)\n"
    "  --prefix-cache P  instead: time to first token of a prompt of P shared tokens and 16 of\n"
    "                  its own after another prompt with the same P tokens ran, with the prefix\n"
    "                  cache and without (each a fresh scheduler on one engine), medians of REPS:\n"
    "                  prefix_cache prefix=<P> suffix=16 ttft_cold_ms=<x> ttft_cached_ms=<y>\n"
    "                  speedup=<x/y> cached_tokens=<n> logprobs_identical=<0|1> (the first\n"
    "                  token's top-20 log-probabilities, bit for bit)\n"
    "  --json-schema FILE  instead: B sequences at once (--batch's count, default 16) through\n"
    "                  the scheduler, sampling (temperature 1, seeded) B x N tokens (-n) after\n"
    "                  prompts of 16 tokens, under the JSON Schema FILE and free, alternating\n"
    "                  REPS times (no prefix cache; a sequence the grammar ends before N tokens\n"
    "                  is followed by a new one, so B run at once); needs a model with its\n"
    "                  tokenizer. Prints the medians: structured batch=<B> n=<N>\n"
    "                  free_tps=<x> schema_tps=<y> ratio=<y/x> grammar_share=<the steps' time\n"
    "                  in masks and commits> tokens=<free>/<schema> seqs=<free>/<schema>\n"
    "                  compile_ms=<c> (seqs: the sequences one run started)\n"
    "  --json          one JSON object per line instead of the table\n"
    "The workers run the fastest kernel table of this CPU (SHARDLM_ISA=ref|avx2|avx512|amx forces\n"
    "one); the engine names it on stderr at start.\n";

#define BENCH_MAX_T 16
#define BENCH_MAX_BATCH 256

struct stats {
    double median, stddev;
};

static struct stats summarize(double *v, int n)
{
    struct stats s = {0, 0};
    if (n == 0)
        return s;
    double mean = 0;
    for (int i = 0; i < n; i++)
        mean += v[i];
    mean /= n;
    for (int i = 0; i < n; i++)
        s.stddev += (v[i] - mean) * (v[i] - mean);
    s.stddev = n > 1 ? sqrt(s.stddev / (n - 1)) : 0;
    s.median = coord_sort_median(v, n);
    return s;
}

/* Bytes of weights one decode token reads: every matrix and vector once but the experts, of
 * which each MoE layer reads the chosen n_experts_used of n_experts (all of one size), the LM
 * head whole, the embedding one row (the tied head already counts its rows). */
static uint64_t decode_bytes(const struct shlm_model *m, uint64_t *params)
{
    const struct shlm_config_ext *x = &m->hdr->cfgx;
    uint64_t bytes = 0, expert_bytes = 0;
    *params = 0;
    for (uint32_t i = 0; i < m->hdr->n_tensors; i++) {
        const struct shlm_tensor *t = &m->tensors[i];
        enum shlm_kind kind;
        uint32_t layer, expert;
        bool known =
            shlm_kind_parse(t->name, m->hdr->cfg.n_layers, x->n_experts, &kind, &layer, &expert);
        KN_ASSERT(known); /* shlm_parse() checked every name */
        *params += (uint64_t)t->rows * t->cols;
        if (shlm_kinds[kind].expert)
            expert_bytes += t->bytes;
        else if (kind == SHLM_KIND_TOK_EMBD && !m->hdr->cfg.tied_embd)
            bytes += t->bytes / t->rows;
        else
            bytes += t->bytes;
    }
    return bytes + (x->n_experts ? expert_bytes / x->n_experts * x->n_experts_used : 0);
}

/* ---- read bandwidth: each thread sums its slice of a 1 GiB array, 4 streams of 64 bytes ---- */

struct bw_job {
    const uint8_t *p;
    size_t n;
    int cpu;
    double sink;
};

typedef float v16 __attribute__((vector_size(64)));

static void *bw_thread(void *arg)
{
    struct bw_job *j = arg;
    if (j->cpu >= 0) {
        cpu_set_t s;
        CPU_ZERO(&s);
        CPU_SET(j->cpu, &s);
        pthread_setaffinity_np(pthread_self(), sizeof(s), &s);
    }
    v16 a = {0}, b = {0}, c = {0}, d = {0};
    const v16 *v = (const v16 *)j->p;
    size_t n = j->n / sizeof(v16);
    for (size_t i = 0; i + 4 <= n; i += 4) {
        a += v[i];
        b += v[i + 1];
        c += v[i + 2];
        d += v[i + 3];
    }
    v16 s = a + b + c + d;
    for (int i = 0; i < 16; i++)
        j->sink += s[i];
    return NULL;
}

double coord_read_bandwidth(int n_threads, const int *cpus, int reps)
{
    const size_t total = 1ul << 30;
    uint8_t *buf = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED)
        return 0;
    memset(buf, 1, total); /* real pages, not the shared zero page */
    double gbs[16];
    reps = reps > 16 ? 16 : reps;
    for (int r = 0; r < reps; r++) {
        struct bw_job jobs[BENCH_MAX_T * 4];
        pthread_t th[BENCH_MAX_T * 4];
        size_t part = total / (size_t)n_threads / 256 * 256;
        uint64_t t0 = shardlm_now_ns();
        for (int t = 0; t < n_threads; t++) {
            jobs[t] = (struct bw_job){buf + part * (size_t)t, part, cpus ? cpus[t] : -1, 0};
            pthread_create(&th[t], NULL, bw_thread, &jobs[t]);
        }
        for (int t = 0; t < n_threads; t++)
            pthread_join(th[t], NULL);
        gbs[r] = (double)part * n_threads / (double)(shardlm_now_ns() - t0);
    }
    munmap(buf, total);
    return summarize(gbs, reps).median;
}

struct model_opts {
    struct coord_engine_opts engine; /* the environment's (coord_cli_engine_env) */
    const char *model;
    int pp, tg, reps, workers, json;
    long threads[BENCH_MAX_T];
    int n_threads;
    long batch[BENCH_MAX_T]; /* --batch: sequences at once */
    int n_batch;
    int prefix; /* --prefix-cache: tokens two prompts share */
    const char *schema; /* --json-schema: the structured batch's schema file */
};

/* What one thread count ran on: the model's and the layout's columns of its lines, and the
 * workers' CPUs. */
struct bench_result {
    char name[128];         /* the model file's name and scheme */
    size_t size;            /* bytes of the tensors */
    uint64_t params, bytes; /* parameters; bytes of weights one decode token reads */
    int n_ranks, threads;
    int cpus[BENCH_MAX_T * 4], n_cpus; /* the workers' CPUs */
};

/* @n pseudo-random token ids below @vocab (the same ones each run): a prompt, and the decode
 * test's inputs. */
static void random_tokens(int32_t *tok, int n, uint32_t vocab)
{
    uint64_t rnd = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < n; i++) {
        rnd = rnd * 6364136223846793005ull + 1442695040888963407ull;
        tok[i] = (int32_t)((rnd >> 33) % vocab);
    }
}

/* @reps runs of the tests on the started engine @g: prefill of o->pp tokens of @tok in one step
 * (its tokens/s into @pp) and decode of o->tg tokens one step each (into @tg); a test of 0
 * tokens is skipped. Returns 0 or the first failed step's -errno with @e set. */
static int bench_reps(struct coord_engine *g, const struct model_opts *o, const int32_t *tok,
                      int reps, double *pp, double *tg, struct shardlm_err *e)
{
    int rc = 0;
    for (int r = 0; r < reps && !rc; r++) {
        if (o->pp) {
            struct coord_seq_step s = {.pos = 0, .n_tokens = (uint32_t)o->pp, .tokens = tok};
            uint64_t t0 = shardlm_now_ns();
            rc = coord_engine_step(g, &s, 1, e);
            pp[r] = o->pp / ((double)(shardlm_now_ns() - t0) / 1e9);
        }
        if (o->tg && !rc) {
            uint64_t t0 = shardlm_now_ns();
            for (int i = 0; i < o->tg && !rc; i++) {
                struct coord_seq_step s = {.pos = (uint32_t)i, .n_tokens = 1, .tokens = &tok[i]};
                rc = coord_engine_step(g, &s, 1, e);
            }
            tg[r] = o->tg / ((double)(shardlm_now_ns() - t0) / 1e9);
        }
    }
    return rc;
}

/* The model and layout of the engine @g into @r: name, size, parameters, decode bytes per token,
 * ranks, the threads a worker ran (-t, or without it every CPU of the worker: the layout's count,
 * never the 0 that asked for it), and the CPUs the workers had (where the bandwidth threads go
 * once they are gone). */
static void bench_describe(struct coord_engine *g, const char *model, struct bench_result *r)
{
    const struct shlm_model *m = coord_engine_model(g);
    const struct shlm_header *h = m->hdr;
    r->bytes = decode_bytes(m, &r->params);
    r->size = 0;
    for (uint32_t i = 0; i < h->n_tensors; i++)
        r->size += m->tensors[i].bytes;
    const char *base = strrchr(model, '/');
    snprintf(r->name, sizeof(r->name), "%s %s", base ? base + 1 : model,
             shlm_scheme_name((enum shlm_scheme)h->scheme));
    /* the bandwidth threads sit on the CPUs the workers had */
    const struct coord_layout *lay = coord_engine_layout(g);
    r->n_cpus = 0;
    for (int w = 0; w < lay->n_ranks; w++)
        for (int c = 0; c < lay->ranks[w].n_cpus && r->n_cpus < BENCH_MAX_T * 4; c++)
            r->cpus[r->n_cpus++] = lay->ranks[w].cpus[c];
    r->n_ranks = coord_engine_n_ranks(g);
    if (!r->threads && lay->n_ranks > 0)
        r->threads = lay->ranks[0].n_cpus; /* one pool thread per CPU of the rank */
}

/* The lines of @r with the medians and deviations @sp and @st of the tests, read bandwidth @bw
 * and decode's GB/s @used: one JSON object, or the table's rows and the roofline line. */
static void bench_print(const struct model_opts *o, const struct bench_result *r, struct stats sp,
                        struct stats st, double bw, double used)
{
    if (o->json) {
        printf("{\"model\": \"%s\", \"size\": %zu, \"params\": %llu, \"workers\": %d, "
               "\"threads\": %d, \"pp\": %d, \"pp_ts\": %.3f, \"pp_sd\": %.3f, \"tg\": %d, "
               "\"tg_ts\": %.3f, \"tg_sd\": %.3f, \"decode_bytes_per_token\": %llu, "
               "\"read_bw_gbs\": %.2f, \"decode_gbs\": %.2f, \"roofline\": %.3f}\n",
               r->name, r->size, (unsigned long long)r->params, r->n_ranks, r->threads, o->pp,
               sp.median, sp.stddev, o->tg, st.median, st.stddev, (unsigned long long)r->bytes, bw,
               used, bw > 0 ? used / bw : 0);
        return;
    }
    char sz[32], pr[32];
    snprintf(sz, sizeof(sz), "%.2f MiB", (double)r->size / (1 << 20));
    if (r->params >= 1000000000ull)
        snprintf(pr, sizeof(pr), "%.2f B", (double)r->params / 1e9);
    else
        snprintf(pr, sizeof(pr), "%.2f M", (double)r->params / 1e6);
    if (o->pp)
        printf("| %-28s | %10s | %7s | CPU %dw | %7d | %6s%-4d | %8.2f ± %.2f |\n", r->name, sz, pr,
               r->n_ranks, r->threads, "pp", o->pp, sp.median, sp.stddev);
    if (o->tg)
        printf("| %-28s | %10s | %7s | CPU %dw | %7d | %6s%-4d | %8.2f ± %.2f |\n", r->name, sz, pr,
               r->n_ranks, r->threads, "tg", o->tg, st.median, st.stddev);
    if (o->tg)
        printf("decode: %.1f MB of weights per token x %.2f tok/s = %.2f GB/s; read bandwidth "
               "%.2f GB/s (%d threads): %.1f%% of the roofline\n",
               (double)r->bytes / 1e6, st.median, used, bw, r->n_cpus,
               bw > 0 ? 100 * used / bw : 0);
}

/* One thread count: the engine started once, then pp and tg REPS times each, then the read
 * bandwidth on the workers' CPUs once the engine has stopped. Prints the results. Returns 0 or
 * -errno with @e set. */
static int bench_threads(const struct model_opts *o, int threads, struct shardlm_err *e)
{
    struct coord_engine *g;
    struct coord_engine_opts eo = o->engine;
    eo.model_path = o->model;
    eo.layout.workers = o->workers;
    eo.layout.threads = threads;
    int rc = coord_engine_start(&g, &eo, e);
    if (rc)
        return rc;
    const struct shlm_header *h = coord_engine_model(g)->hdr;
    uint32_t ctx = h->cfg.seq_len;
    if ((uint32_t)o->pp > ctx || (uint32_t)o->tg + 1 > ctx) {
        coord_engine_stop(g);
        return shardlm_fail(e, -E2BIG, "-p %d / -n %d: the model's context is %u", o->pp, o->tg,
                            ctx);
    }
    int n_tok = (o->pp > o->tg ? o->pp : o->tg) + 1; /* prompt, and the decode test's inputs */
    int32_t *tok = malloc((size_t)n_tok * sizeof(int32_t));
    double pp[16], tg[16];
    if (!tok) {
        coord_engine_stop(g);
        return shardlm_fail(e, -ENOMEM, "out of memory");
    }
    random_tokens(tok, n_tok, h->cfg.vocab_size);
    int reps = o->reps > 16 ? 16 : o->reps;
    /* untimed, as llama-bench warms up: the first step maps the weights into the workers' page
     * tables and touches the buffers (qwen3-1.7b pp512 at 1 thread: 125 t/s cold, ~175 warm) */
    struct model_opts warm = *o;
    warm.tg = o->tg ? 1 : 0;
    rc = bench_reps(g, &warm, tok, 1, pp, tg, e);
    if (!rc)
        rc = bench_reps(g, o, tok, reps, pp, tg, e);
    struct bench_result r = {.threads = threads};
    bench_describe(g, o->model, &r);
    coord_engine_stop(g);
    free(tok);
    if (rc)
        return rc;
    struct stats sp = summarize(pp, o->pp ? reps : 0), st = summarize(tg, o->tg ? reps : 0);
    double bw = o->tg ? coord_read_bandwidth(r.n_cpus, r.cpus, 3) : 0;
    double used = st.median * (double)r.bytes / 1e9;
    bench_print(o, &r, sp, st, bw, used);
    fflush(stdout);
    return 0;
}

/* One batch size @b on the started engine @g: prefill of o->pp tokens in each of @b sequences
 * (sequence q's prompt starts at @tok + q), packed into steps of at most @cap tokens, then
 * o->tg decode steps of one token in every sequence. Their wall times into @t_pp and @t_tg.
 * Returns 0 or the first failed step's -errno with @e set. */
static int batch_run(struct coord_engine *g, const struct model_opts *o, const int32_t *tok, int b,
                     uint32_t cap, double *t_pp, double *t_tg, struct shardlm_err *e)
{
    struct coord_seq_step s[BENCH_MAX_BATCH];
    int rc = 0, q = 0, done = 0;
    uint64_t t0 = shardlm_now_ns();
    while (!rc && o->pp && q < b) {
        int n = 0;
        for (uint32_t used = 0; q < b && used < cap;) {
            uint32_t take =
                (uint32_t)(o->pp - done) < cap - used ? (uint32_t)(o->pp - done) : cap - used;
            s[n++] = (struct coord_seq_step){.seq_id = (uint32_t)q,
                                             .pos = (uint32_t)done,
                                             .n_tokens = take,
                                             .tokens = tok + q + done};
            used += take;
            if ((done += (int)take) == o->pp) {
                q++;
                done = 0;
            }
        }
        rc = coord_engine_step(g, s, n, e);
    }
    uint64_t t1 = shardlm_now_ns();
    for (int i = 0; i < o->tg && !rc; i++) {
        for (q = 0; q < b; q++)
            s[q] = (struct coord_seq_step){.seq_id = (uint32_t)q,
                                           .pos = (uint32_t)(o->pp + i),
                                           .n_tokens = 1,
                                           .tokens = tok + q + o->pp + i};
        rc = coord_engine_step(g, s, b, e);
    }
    *t_pp = (double)(t1 - t0) / 1e9;
    *t_tg = (double)(shardlm_now_ns() - t1) / 1e9;
    return rc;
}

/* --batch at one thread count: the engine started once with a KV slot per sequence of the
 * largest batch, then each batch size REPS times; prints llama-batched-bench's rows. Returns 0
 * or -errno with @e set. */
static int bench_batch(const struct model_opts *o, int threads, struct shardlm_err *e)
{
    struct coord_engine *g;
    struct coord_engine_opts eo = o->engine;
    int max_b = 1;
    for (int i = 0; i < o->n_batch; i++)
        max_b = o->batch[i] > max_b ? (int)o->batch[i] : max_b;
    eo.model_path = o->model;
    eo.layout.workers = o->workers;
    eo.layout.threads = threads;
    eo.max_seqs = (uint32_t)max_b;
    int rc = coord_engine_start(&g, &eo, e);
    if (rc)
        return rc;
    const struct shlm_header *h = coord_engine_model(g)->hdr;
    uint32_t ctx = h->cfg.seq_len;
    if ((uint32_t)(o->pp + o->tg) > ctx) {
        coord_engine_stop(g);
        return shardlm_fail(e, -E2BIG, "-p %d + -n %d: the model's context is %u", o->pp, o->tg,
                            ctx);
    }
    if ((uint32_t)max_b > coord_engine_logit_rows(g)) {
        coord_engine_stop(g);
        return shardlm_fail(e, -E2BIG, "--batch %d: a step returns at most %u logits rows here",
                            max_b, coord_engine_logit_rows(g));
    }
    int n_tok = max_b + o->pp + o->tg;
    int32_t *tok = malloc((size_t)n_tok * sizeof(int32_t));
    if (!tok) {
        coord_engine_stop(g);
        return shardlm_fail(e, -ENOMEM, "out of memory");
    }
    random_tokens(tok, n_tok, h->cfg.vocab_size);
    int reps = o->reps > 16 ? 16 : o->reps;
    if (!o->json) {
        printf("\n%s: %d worker(s) x %d thread(s), %d repetition(s)\n\n", o->model,
               coord_engine_n_ranks(g), coord_engine_layout(g)->ranks[0].n_cpus, reps);
        printf("|%6s |%6s |%4s |%7s |%8s |%9s |%8s |%9s |%8s |%9s |\n", "PP", "TG", "B", "N_KV",
               "T_PP s", "S_PP t/s", "T_TG s", "S_TG t/s", "T s", "S t/s");
        printf("|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|\n", "-------", "-------", "-----", "--------",
               "---------", "----------", "---------", "----------", "---------", "----------");
    }
    /* untimed, as the plain bench and llama-batched-bench warm up (bench_threads) */
    struct model_opts warm = *o;
    warm.tg = o->tg ? 1 : 0;
    double wp, wt;
    rc = batch_run(g, &warm, tok, max_b, ctx, &wp, &wt, e);
    for (int i = 0; i < o->n_batch && !rc; i++) {
        int b = (int)o->batch[i];
        double tp[16], tt[16];
        for (int r = 0; r < reps && !rc; r++)
            rc = batch_run(g, o, tok, b, ctx, &tp[r], &tt[r], e);
        if (rc)
            break;
        double t_pp = coord_sort_median(tp, reps), t_tg = coord_sort_median(tt, reps);
        double n_pp = (double)b * o->pp, n_tg = (double)b * o->tg, t = t_pp + t_tg;
        double s_pp = t_pp > 0 ? n_pp / t_pp : 0, s_tg = t_tg > 0 ? n_tg / t_tg : 0;
        if (o->json)
            printf("{\"threads\": %d, \"workers\": %d, \"pp\": %d, \"tg\": %d, \"b\": %d, "
                   "\"n_kv\": %d, \"t_pp\": %.3f, \"s_pp\": %.2f, \"t_tg\": %.3f, \"s_tg\": %.2f, "
                   "\"t\": %.3f, \"s\": %.2f}\n",
                   coord_engine_layout(g)->ranks[0].n_cpus, coord_engine_n_ranks(g), o->pp, o->tg,
                   b, b * (o->pp + o->tg), t_pp, s_pp, t_tg, s_tg, t,
                   t > 0 ? (n_pp + n_tg) / t : 0);
        else
            printf("|%6d |%6d |%4d |%7d |%8.3f |%9.2f |%8.3f |%9.2f |%8.3f |%9.2f |\n", o->pp,
                   o->tg, b, b * (o->pp + o->tg), t_pp, s_pp, t_tg, s_tg, t,
                   t > 0 ? (n_pp + n_tg) / t : 0);
        fflush(stdout);
    }
    coord_engine_stop(g);
    free(tok);
    return rc;
}

/* What one request of --prefix-cache saw. */
struct ttft {
    uint64_t submit_ns, first_ns;
    int cached;
    struct coord_logprobs lp;
};

static void ttft_event(void *ctx, const struct coord_event *ev)
{
    struct ttft *t = ctx;
    if (!t->first_ns && ev->token >= 0) {
        t->first_ns = shardlm_now_ns();
        t->cached = ev->cached_tokens;
        if (ev->logprobs)
            t->lp = *ev->logprobs;
    }
}

/* One request of @n tokens through a scheduler to its first token. */
static int ttft_one(struct coord_sched *s, const int32_t *tok, int n, struct ttft *t,
                    struct shardlm_err *e)
{
    struct coord_request r = {.prompt = tok,
                              .n_prompt = n,
                              .max_tokens = 1,
                              .sampling = {.top_p = 1.0f, .repetition_penalty = 1.0f},
                              .logprobs = COORD_MAX_LOGPROBS,
                              .on_event = ttft_event,
                              .ctx = t};
    uint64_t id;
    memset(t, 0, sizeof(*t));
    t->submit_ns = shardlm_now_ns();
    int rc = coord_sched_submit(s, &r, &id, e);
    return rc ? rc : coord_sched_run(s, e);
}

/* --prefix-cache at one thread count: REPS times, on fresh schedulers over one engine, prompt A
 * (the shared P tokens and 16 of its own) then prompt B (the same P and 16 others) with the
 * prefix cache, and B alone without it; prints the medians of B's time to first token. */
static int bench_prefix(const struct model_opts *o, int threads, struct shardlm_err *e)
{
    struct coord_engine *g;
    struct coord_engine_opts eo = o->engine;
    eo.model_path = o->model;
    eo.layout.workers = o->workers;
    eo.layout.threads = threads;
    eo.max_seqs = 1;
    int rc = coord_engine_start(&g, &eo, e);
    if (rc)
        return rc;
    const struct shlm_header *h = coord_engine_model(g)->hdr;
    int n = o->prefix + 16;
    if ((uint32_t)n >= h->cfg.seq_len) {
        coord_engine_stop(g);
        return shardlm_fail(e, -E2BIG, "--prefix-cache %d: the model's context is %u", o->prefix,
                            h->cfg.seq_len);
    }
    int32_t *a = malloc(2 * (size_t)n * sizeof(int32_t)), *b = a ? a + n : NULL;
    if (!a) {
        coord_engine_stop(g);
        return shardlm_fail(e, -ENOMEM, "out of memory");
    }
    random_tokens(a, 2 * n, h->cfg.vocab_size);
    memcpy(b, a, (size_t)o->prefix * sizeof(int32_t)); /* b: the prefix, then its own 16 */
    int reps = o->reps > 16 ? 16 : o->reps, cached = 0, same = 1;
    double cold[16], warm[16];
    for (int r = 0; r < reps && !rc; r++) {
        struct coord_sched *s = NULL;
        struct ttft ta, tb, tc;
        for (int cache = 1; cache >= 0 && !rc; cache--) {
            struct coord_sched_opts so = {.max_seqs = 1, .no_prefix_cache = !cache};
            if ((rc = coord_sched_init(&s, g, NULL, &so, e)))
                break;
            if (cache && !(rc = ttft_one(s, a, n, &ta, e)))
                rc = ttft_one(s, b, n, &tb, e);
            else if (!cache)
                rc = ttft_one(s, b, n, &tc, e);
            coord_sched_free(s);
        }
        if (rc)
            break;
        warm[r] = (double)(tb.first_ns - tb.submit_ns) / 1e6;
        cold[r] = (double)(tc.first_ns - tc.submit_ns) / 1e6;
        cached = tb.cached;
        same &= tb.lp.n_top == tc.lp.n_top && tb.lp.logprob == tc.lp.logprob &&
                !memcmp(tb.lp.top, tc.lp.top, sizeof(tb.lp.top[0]) * (size_t)tb.lp.n_top);
    }
    int n_cpus = coord_engine_layout(g)->ranks[0].n_cpus;
    coord_engine_stop(g);
    free(a);
    if (rc)
        return rc;
    double c = coord_sort_median(cold, reps), w = coord_sort_median(warm, reps);
    printf("prefix_cache threads=%d prefix=%d suffix=16 ttft_cold_ms=%.2f ttft_cached_ms=%.2f "
           "speedup=%.1f cached_tokens=%d logprobs_identical=%d\n",
           threads ? threads : n_cpus, o->prefix, c, w, w > 0 ? c / w : 0.0, cached, same);
    fflush(stdout);
    return 0;
}

/* One slot of a --json-schema run: its sequence's tokens asked for and come, whether it ended. */
struct structured_seq {
    long want, n;
    bool done;
};

static void count_event(void *ctx, const struct coord_event *ev)
{
    struct structured_seq *q = ctx;
    q->n += ev->token >= 0;
    q->done |= ev->finish != COORD_FINISH_NONE;
}

/* One run of --json-schema on a fresh scheduler: @b sequences at once after their 16-token
 * prompts (rows of @prompts), under @g (NULL: free), until @b x o->tg tokens came; a slot whose
 * sequence the grammar ended early takes a new one, so that @b run in every step as a server's
 * would. Its tokens/s into *@tps, the share of the steps' time spent in grammars into *@share,
 * its tokens into *@tokens, its sequences into *@seqs. */
static int structured_run(struct coord_engine *eng, const struct coord_tok *tok,
                          const struct model_opts *o, const int32_t *prompts, int b,
                          struct gr_grammar *g, double *tps, double *share, long *tokens,
                          long *seqs, struct shardlm_err *e)
{
    struct coord_sched *s = NULL;
    struct coord_sched_opts so = {.max_seqs = (uint32_t)b, .no_prefix_cache = true};
    struct structured_seq *seq = calloc((size_t)b, sizeof(*seq));
    if (!seq)
        return shardlm_fail(e, -ENOMEM, "out of memory");
    int rc = coord_sched_init(&s, eng, tok, &so, e);
    long budget = (long)b * o->tg, given = 0, got = 0; /* tokens to run, asked for, come */
    uint64_t t0 = shardlm_now_ns(), round = 0;
    for (bool first = true; !rc && (first || !coord_sched_idle(s)); first = false) {
        if (!first)
            rc = coord_sched_step(s, e);
        for (int i = 0; i < b && !rc; i++) {
            struct structured_seq *q = &seq[i];
            if (q->want && !q->done)
                continue;  /* running */
            if (q->want) { /* ended: its tokens count, what it left unused goes back */
                got += q->n;
                given -= q->want - q->n;
            }
            long want = budget - given < o->tg ? budget - given : o->tg;
            *q = (struct structured_seq){.want = want > 0 ? want : 0};
            if (want <= 0)
                continue;
            struct coord_request r = {.prompt = prompts + 16 * i,
                                      .n_prompt = 16,
                                      .max_tokens = (int)want,
                                      .sampling = {.temp = 1.0f,
                                                   .top_p = 1.0f,
                                                   .repetition_penalty = 1.0f,
                                                   .seed = 1000 + round++},
                                      .ignore_eos = true,
                                      .logprobs = -1,
                                      .grammar = g,
                                      .on_event = count_event,
                                      .ctx = q};
            uint64_t id;
            rc = coord_sched_submit(s, &r, &id, e);
            given += want;
        }
    }
    double secs = (double)(shardlm_now_ns() - t0) / 1e9;
    struct coord_sched_stats st = {0};
    if (s)
        coord_sched_stats(s, &st);
    coord_sched_free(s);
    free(seq);
    if (rc)
        return rc;
    *tps = secs > 0 ? (double)got / secs : 0;
    *share = st.step_ns ? (double)st.grammar_ns / (double)st.step_ns : 0;
    *tokens = got;
    *seqs = (long)round;
    return 0;
}

/* --json-schema at one thread count: the schema compiled once, then REPS rounds of a free run
 * and a constrained one (in that order) of the same sequences; prints the medians. */
static int bench_structured(const struct model_opts *o, int threads, struct shardlm_err *e)
{
    int b = o->n_batch ? (int)o->batch[0] : 16;
    size_t len;
    uint8_t *text = NULL;
    int rc = coord_read_file(o->schema, 1 << 24, &text, &len, e);
    if (rc)
        return rc;
    struct gr_grammar *g = NULL;
    uint64_t c0 = shardlm_now_ns();
    rc = gr_compile_json_schema((const char *)text, len, &(struct gr_opts){.max_ws = 1}, &g, e);
    double compile_ms = (double)(shardlm_now_ns() - c0) / 1e6;
    free(text);
    if (rc)
        return rc;
    struct coord_engine *eng = NULL;
    struct coord_engine_opts eo = o->engine;
    eo.model_path = o->model;
    eo.layout.workers = o->workers;
    eo.layout.threads = threads;
    eo.max_seqs = (uint32_t)b;
    struct coord_tok tok = {0};
    bool have_tok = false;
    int32_t *prompts = NULL;
    if ((rc = coord_engine_start(&eng, &eo, e)))
        goto out;
    if ((rc = coord_tok_from_shlm(&tok, coord_engine_model(eng), o->model, e)))
        goto out;
    have_tok = true;
    if (16 + o->tg >= (int)coord_engine_model(eng)->hdr->cfg.seq_len) {
        rc = shardlm_fail(e, -E2BIG, "-n %d: the model's context is %u", o->tg,
                          coord_engine_model(eng)->hdr->cfg.seq_len);
        goto out;
    }
    if (!(prompts = malloc(16 * (size_t)b * sizeof(int32_t)))) {
        rc = shardlm_fail(e, -ENOMEM, "out of memory");
        goto out;
    }
    random_tokens(prompts, 16 * b, (uint32_t)tok.vocab_size);
    int reps = o->reps > 16 ? 16 : o->reps;
    double free_tps[16], schema_tps[16], share[16], ignored;
    long n_free = 0, n_schema = 0, s_free = 0, s_schema = 0;
    for (int r = 0; r < reps && !rc; r++) {
        rc = structured_run(eng, &tok, o, prompts, b, NULL, &free_tps[r], &ignored, &n_free,
                            &s_free, e);
        if (!rc)
            rc = structured_run(eng, &tok, o, prompts, b, g, &schema_tps[r], &share[r], &n_schema,
                                &s_schema, e);
    }
    if (!rc) {
        int n_cpus = coord_engine_layout(eng)->ranks[0].n_cpus;
        double f = coord_sort_median(free_tps, reps), c = coord_sort_median(schema_tps, reps);
        printf(o->json ? "{\"test\": \"structured\", \"threads\": %d, \"batch\": %d, \"n\": %d, "
                         "\"free_tps\": %.2f, \"schema_tps\": %.2f, \"ratio\": %.3f, "
                         "\"grammar_share\": %.4f, \"tokens_free\": %ld, \"tokens_schema\": %ld, "
                         "\"seqs_free\": %ld, \"seqs_schema\": %ld, \"compile_ms\": %.2f}\n"
                       : "structured threads=%d batch=%d n=%d free_tps=%.2f schema_tps=%.2f "
                         "ratio=%.3f grammar_share=%.4f tokens=%ld/%ld seqs=%ld/%ld "
                         "compile_ms=%.2f\n",
               threads ? threads : n_cpus, b, o->tg, f, c, f > 0 ? c / f : 0.0,
               coord_sort_median(share, reps), n_free, n_schema, s_free, s_schema, compile_ms);
        fflush(stdout);
    }
out:
    if (eng)
        coord_engine_stop(eng);
    if (have_tok)
        coord_tok_free(&tok);
    free(prompts);
    gr_grammar_free(g);
    return rc;
}

/* Parses a list like "1,2,4" of at most BENCH_MAX_T numbers in [1, @max] into @v. Returns how
 * many, or -1. */
static int parse_list(const char *arg, long max, long *v)
{
    int n = 0;
    for (const char *p = arg; *p;) {
        char *end;
        long x = strtol(p, &end, 10);
        if (n == BENCH_MAX_T || x < 1 || x > max || end == p || (*end && *end != ','))
            return -1;
        v[n++] = x;
        p = *end ? end + 1 : end;
    }
    return n ? n : -1;
}

int coord_bench_model(int argc, char **argv)
{
    struct model_opts o = {.pp = 512, .tg = 128, .reps = 3, .workers = 1};
    static const struct option opts[] = {{"model", required_argument, 0, 'm'},
                                         {"workers", required_argument, 0, 'W'},
                                         {"batch", required_argument, 0, 'B'},
                                         {"json", no_argument, 0, 'j'},
                                         {"prefix-cache", required_argument, 0, 'P'},
                                         {"json-schema", required_argument, 0, 'S'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    static const struct coord_cli_path paths[] = {{'m', "-m"}, {'S', "--json-schema"}, {0, 0}};
    static const struct coord_cli_cmd cmd = {"bench", usage_bench_model, "m:p:n:t:r:h", opts,
                                             paths};
    int c, rc;
    long v;
    optind = 1;
    while ((c = coord_cli_getopt(&cmd, argc, argv, &rc)) != -1) {
        switch (c) {
        case COORD_CLI_EXIT:
            return rc;
        case 'm':
            o.model = optarg;
            break;
        case 'p':
        case 'n':
        case 'r':
        case 'W':
            if (!coord_parse_long(optarg, c == 'r' || c == 'W' ? 1 : 0, 1 << 20, &v))
                return coord_usage_error("bench", usage_bench_model,
                                         "bad number '%s'", optarg);
            *(c == 'p' ? &o.pp : c == 'n' ? &o.tg : c == 'r' ? &o.reps : &o.workers) = (int)v;
            break;
        case 't':
            if ((o.n_threads = parse_list(optarg, 4096, o.threads)) < 0)
                return coord_usage_error("bench", usage_bench_model,
                                         "-t '%s': expected thread counts like 1,2", optarg);
            break;
        case 'B':
            if ((o.n_batch = parse_list(optarg, BENCH_MAX_BATCH, o.batch)) < 0)
                return coord_usage_error("bench", usage_bench_model,
                                         "--batch '%s': expected sequence counts like 1,2,4 "
                                         "(at most %d)",
                                         optarg, BENCH_MAX_BATCH);
            break;
        case 'j':
            o.json = 1;
            break;
        case 'P':
            if (!coord_parse_long(optarg, 16, 1 << 20, &v))
                return coord_usage_error("bench", usage_bench_model,
                                         "--prefix-cache '%s': expected 16..1048576 tokens",
                                         optarg);
            o.prefix = (int)v;
            break;
        case 'S':
            o.schema = optarg;
            break;
        }
    }
    if (!o.model || optind != argc)
        return coord_usage_error("bench", usage_bench_model, "-m MODEL is required");
    if (!o.n_threads)
        o.threads[o.n_threads++] = 0; /* every CPU of the worker */
    cpu_set_t allowed;
    int n_cpus = sched_getaffinity(0, sizeof(allowed), &allowed) == 0 ? CPU_COUNT(&allowed) : 0;
    for (int i = 0; i < o.n_threads; i++)
        if (n_cpus > 0 && o.threads[i] * o.workers > n_cpus) {
            char what[96];
            snprintf(what, sizeof(what), "%ld threads x %d workers: more than the %d CPUs",
                     o.threads[i], o.workers, n_cpus);
            return coord_usage_error("bench", usage_bench_model, "-t %s this process may use",
                                     what);
        }
    coord_signals_install();
    if ((o.n_batch && o.prefix) || (o.schema && o.prefix))
        return coord_usage_error("bench", usage_bench_model,
                                 "--prefix-cache is a benchmark of its own: not with --batch "
                                 "or --json-schema");
    if (o.schema && o.n_batch > 1)
        return coord_usage_error("bench", usage_bench_model,
                                 "--json-schema runs one batch size: give --batch one count");
    if (o.schema && !o.tg)
        return coord_usage_error("bench", usage_bench_model, "--json-schema needs -n above 0");
    if (!o.n_batch && !o.prefix && !o.schema && !o.json) {
        printf("| %-28s | %10s | %7s | %-6s | %7s | %10s | %16s |\n", "model", "size", "params",
               "backend", "threads", "test", "t/s");
        printf("| %.28s | %.10s | %.7s | %.6s | %.7s | %.10s | %.16s |\n",
               "----------------------------", "---------:", "------:", "------", "------:",
               "---------:", "---------------:");
    }
    struct shardlm_err e = {{0}};
    rc = coord_cli_engine_env(&o.engine, &e);
    for (int i = 0; i < o.n_threads && !rc; i++)
        rc = o.schema    ? bench_structured(&o, (int)o.threads[i], &e)
             : o.n_batch ? bench_batch(&o, (int)o.threads[i], &e)
             : o.prefix  ? bench_prefix(&o, (int)o.threads[i], &e)
                         : bench_threads(&o, (int)o.threads[i], &e);
    return coord_cli_exit("bench", rc, &e); /* a signal: 128 + it, as every command */
}
