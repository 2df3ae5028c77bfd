/* SPDX-License-Identifier: MIT */
/* coordinator/cli/bench_sampler.c: `shardlm bench sampler`: what sampling costs per step of a
 * batch - the coordinator's share of a step that the scheduler's `--stats` reports, measured
 * alone over logits shaped like a model's. */
#include "bench.h"
#include "cli.h"
#include "sampler.h"
#include "util.h"

#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage_bench_sampler[] =
    "usage: shardlm bench sampler [--vocab V] [--seqs S] [-r REPS]\n"
    "\n"
    "Samples one token for each of S sequences from V logits (normal, sd 3: a peaked\n"
    "distribution like a model's) per step, REPS steps per setting, and prints per setting:\n"
    "  sampler vocab=<V> seqs=<S> mode=<m> median_ms=<step> per_token_us=<x>\n"
    "modes: greedy; temp (temperature 0.8 alone); top-p (0.8, top-p 0.9: the CLI's default\n"
    "kind); top-k (0.8, top-k 40); min-p (0.8, min-p 0.05); all (top-p, top-k, min-p,\n"
    "repetition and frequency penalties over 256 earlier tokens, 5 log-probabilities).\n"
    "  --vocab V       vocabulary (default 128256, Llama 3's)\n"
    "  --seqs S        sequences per step (default 16)\n"
    "  -r, --reps R    steps per setting (default 20)\n";

float coord_bench_normal(uint64_t *s)
{
    double u[2];
    for (int i = 0; i < 2; i++) {
        *s ^= *s >> 12;
        *s ^= *s << 25;
        *s ^= *s >> 27;
        u[i] = ((double)((*s * 0x2545F4914F6CDD1Dull) >> 11) + 0.5) / 9007199254740992.0;
    }
    return (float)(sqrt(-2.0 * log(u[0])) * cos(6.283185307179586 * u[1]));
}

/* What the command line asks for. */
struct sampler_args {
    long vocab, seqs, reps;
};

/* The sampler settings timed, one line each. */
static const struct sampler_mode {
    const char *name;
    struct coord_sampling p;
    int logprobs; /* log-probabilities asked for (-1: none) */
} modes[] = {
    {"greedy", {.top_p = 1.0f, .repetition_penalty = 1.0f}, -1},
    {"temp", {.temp = 0.8f, .top_p = 1.0f, .repetition_penalty = 1.0f}, -1},
    {"top-p", {.temp = 0.8f, .top_p = 0.9f, .repetition_penalty = 1.0f}, -1},
    {"top-k", {.temp = 0.8f, .top_p = 1.0f, .top_k = 40, .repetition_penalty = 1.0f}, -1},
    {"min-p", {.temp = 0.8f, .top_p = 1.0f, .min_p = 0.05f, .repetition_penalty = 1.0f}, -1},
    {"all",
     {.temp = 0.8f,
      .top_p = 0.9f,
      .top_k = 40,
      .min_p = 0.05f,
      .repetition_penalty = 1.1f,
      .frequency_penalty = 0.2f},
     5},
};

/* @argv into @a. Returns -1 when the bench is to run, else the exit code (0 after --help, 2
 * after a bad value, with the usage). */
static int sampler_parse(int argc, char **argv, struct sampler_args *a)
{
    static const struct option opts[] = {{"vocab", required_argument, 0, 'V'},
                                         {"seqs", required_argument, 0, 'S'},
                                         {"reps", required_argument, 0, 'r'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    static const struct coord_cli_cmd cmd = {"bench sampler", usage_bench_sampler, "r:h", opts,
                                             NULL};
    int c, rc;
    optind = 1;
    while ((c = coord_cli_getopt(&cmd, argc, argv, &rc)) != -1) {
        switch (c) {
        case COORD_CLI_EXIT:
            return rc;
        case 'V':
            if (!coord_parse_long(optarg, 2, 1 << 22, &a->vocab))
                return coord_usage_error("bench sampler", usage_bench_sampler,
                                         "--vocab '%s': expected 2..4194304", optarg);
            break;
        case 'S':
            if (!coord_parse_long(optarg, 1, 256, &a->seqs))
                return coord_usage_error("bench sampler", usage_bench_sampler,
                                         "--seqs '%s': expected 1..256", optarg);
            break;
        case 'r':
            if (!coord_parse_long(optarg, 1, 10000, &a->reps))
                return coord_usage_error("bench sampler", usage_bench_sampler,
                                         "-r '%s': expected 1..10000", optarg);
            break;
        }
    }
    if (optind != argc)
        return coord_cli_extra_argument("bench sampler", usage_bench_sampler, argv);
    return -1;
}

/* Times mode @m: a->reps steps, each sampling one token for every sequence from a copy of
 * @logits (a->seqs rows of a->vocab) in @work, and prints its line. @ms holds a->reps times.
 * Returns 0, or 1 after saying that memory ran out. */
static int sampler_mode(const struct sampler_args *a, const struct sampler_mode *m,
                        const float *logits, float *work, double *ms)
{
    size_t row = (size_t)a->vocab;
    int rc = 0;
    struct coord_sampler *smp = calloc((size_t)a->seqs, sizeof(*smp));
    for (long q = 0; smp && q < a->seqs && !rc; q++) {
        struct coord_sampling p = m->p;
        p.seed = (uint64_t)q + 1;
        rc = coord_sampler_init_ex(&smp[q], (int)a->vocab, &p);
        for (int t = 0; t < 256 && !rc; t++)
            coord_sampler_observe(&smp[q], (int)((uint64_t)t * 7919 % (uint64_t)a->vocab), true);
    }
    if (!smp || rc) {
        fprintf(stderr, "shardlm bench sampler: out of memory\n");
        rc = 1;
    }
    int sink = 0;
    for (long r = 0; r < a->reps && !rc; r++) {
        memcpy(work, logits, (size_t)a->seqs * row * sizeof(float)); /* sampling writes them */
        uint64_t t0 = shardlm_now_ns();
        for (long q = 0; q < a->seqs; q++) {
            float *x = work + (size_t)q * row;
            if (m->logprobs >= 0) {
                struct coord_logprobs lp;
                coord_logprobs(&smp[q], x, 0, m->logprobs, &lp);
                sink += lp.n_top;
            }
            sink += coord_sample(&smp[q], x);
        }
        ms[r] = (double)(shardlm_now_ns() - t0) / 1e6;
    }
    for (long q = 0; smp && q < a->seqs; q++)
        coord_sampler_free(&smp[q]);
    free(smp);
    if (rc)
        return rc;
    double med = coord_sort_median(ms, (int)a->reps);
    printf("sampler vocab=%ld seqs=%ld mode=%s median_ms=%.3f per_token_us=%.1f\n", a->vocab,
           a->seqs, m->name, med, med * 1000.0 / (double)a->seqs);
    fflush(stdout);
    (void)sink;
    return 0;
}

int coord_bench_sampler(int argc, char **argv)
{
    struct sampler_args a = {.vocab = 128256, .seqs = 16, .reps = 20};
    int rc = sampler_parse(argc, argv, &a);
    if (rc >= 0)
        return rc;
    size_t n = (size_t)a.seqs * (size_t)a.vocab;
    float *logits = malloc(n * sizeof(float));
    float *work = malloc(n * sizeof(float));
    double *ms = malloc((size_t)a.reps * sizeof(double));
    if (!logits || !work || !ms) {
        fprintf(stderr, "shardlm bench sampler: out of memory\n");
        free(logits);
        free(work);
        free(ms);
        return 1;
    }
    uint64_t rng = 0x5eed;
    for (size_t i = 0; i < n; i++)
        logits[i] = 3.0f * coord_bench_normal(&rng);
    rc = 0;
    for (size_t m = 0; m < sizeof(modes) / sizeof(modes[0]) && !rc; m++)
        rc = sampler_mode(&a, &modes[m], logits, work, ms);
    free(logits);
    free(work);
    free(ms);
    return rc;
}
