/* SPDX-License-Identifier: MIT */
/* coordinator/cli/bench_experts.c: `shardlm bench experts`: how a mixture of experts' two
 * placements over R ranks would share a step's expert reads, simulated from routing statistics:
 * the model's own routing of a token sequence (run in this process) and, beside it, routings
 * whose expert popularity is skewed (Zipf), as trained models' are to a degree synthetic weights
 * do not show. */
#include "bench.h"
#include "cli.h"
#include "model.h"
#include "plan.h"
#include "pool.h"
#include "seg.h"
#include "tensors.h"
#include "util.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static const char usage_bench_experts[] =
    "usage: shardlm bench experts -m MODEL.shlm [-n TOKENS] [--ranks R,...] [--batch B,...]\n"
    "\n"
    "Runs TOKENS seeded pseudo-random token ids through a mixture of experts in this process\n"
    "(one rank, every CPU), records every MoE layer's routing, and simulates the two placements\n"
    "of the experts over R ranks (SHARDLM_EXPERTS: tp, every rank its share of every expert;\n"
    "ep, each rank a contiguous range of whole experts) for steps of B consecutive tokens: the\n"
    "bytes of expert weights the busiest rank reads per step (a decode step's time, the memory\n"
    "being the bound) under each, the same from routings whose expert popularity follows Zipf's\n"
    "law with exponent S (0: uniform; a random order of the experts per layer), one line each:\n"
    "  experts source=<model|zipf-S> ranks=<R> batch=<B> distinct=<experts read per layer and\n"
    "  step> tp_mb=<busiest rank's MB per step> ep_mb=<the same> ep_over_tp=<ratio>\n"
    "The bytes are the file's (the attention and the rest, the same in both, are left out).\n"
    "  -n TOKENS       routed tokens (default 512)\n"
    "  --ranks R,...   rank counts (default 2,4; at most the model's experts)\n"
    "  --batch B,...   tokens per step (default 1,8,64; at most TOKENS)\n";

#define MAX_LIST 8
#define CHUNK 64

struct experts_args {
    const char *model;
    long tokens;
    int ranks[MAX_LIST], n_ranks, batch[MAX_LIST], n_batch;
};

/* The routing of every MoE layer: [moe layer][token][k] expert ids. */
struct trace {
    int layers, tokens, k, n_experts;
    int *ids;
    int *filled; /* (layers) tokens recorded so far */
    const struct shlm_config_ext *x;
};

/* wrk_model.route_observe: a chunk's rows follow those recorded before (one sequence, in
 * order) */
static void record(void *ctx, uint32_t layer, const int *experts, int n, int k)
{
    struct trace *t = ctx;
    int moe = 0;
    for (uint32_t l = 0; l < layer; l++)
        moe += shlm_layer_moe(t->x, l);
    int at = t->filled[moe];
    memcpy(t->ids + ((size_t)moe * t->tokens + at) * k, experts, (size_t)n * k * sizeof(int));
    t->filled[moe] = at + n;
}

/* Runs @tokens ids through the model @img in chunks of CHUNK on every CPU, its routing into @t.
 * Returns 0 or -errno with @e set. */
static int route_model(const struct shlm_model *img, struct trace *t, struct shardlm_err *e)
{
    const struct shlm_config *c = &img->hdr->cfg;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    struct wrk_pool *pool = NULL;
    struct wrk_model m;
    int rc = wrk_pool_init(&pool, cpus > 0 ? (int)cpus : 1, NULL);
    if (rc)
        return shardlm_fail(e, rc, "threads: %s", strerror(-rc));
    if ((rc = wrk_model_init(&m, img, kn_ops_select(NULL, NULL, 0), CHUNK, pool, NULL))) {
        wrk_pool_free(pool);
        return shardlm_fail(e, rc, "out of memory for the model");
    }
    m.route_observe = record;
    m.observe_ctx = t;
    uint32_t kvd = (uint32_t)m.plan.kv_dim, blocks = (uint32_t)(t->tokens / SEG_KV_BLOCK + 1);
    void *kv = calloc(1, seg_kv_bytes(blocks, c->n_layers, kvd, m.plan.kv_keys_only));
    uint32_t *table = malloc(blocks * sizeof(*table));
    int32_t *ids = malloc((size_t)t->tokens * sizeof(*ids));
    float *logits = malloc((size_t)c->vocab_size * sizeof(float));
    if (!kv || !table || !ids || !logits) {
        rc = shardlm_fail(e, -ENOMEM, "out of memory for %d tokens", t->tokens);
        goto out;
    }
    seg_kv_init(kv, blocks, c->n_layers, kvd, m.plan.kv_keys_only);
    for (uint32_t b = 0; b < blocks; b++)
        table[b] = b;
    uint32_t x = 1; /* the LCG of the ik references (tools/ik_ref/make_refs.sh) */
    for (int i = 0; i < t->tokens; i++) {
        x = (1103515245u * x + 12345u) & 0x7fffffffu;
        ids[i] = (int32_t)((x >> 8) % (c->vocab_size > 2 ? c->vocab_size - 2 : 1));
    }
    for (int p = 0; p < t->tokens && !rc; p += CHUNK) {
        int n = t->tokens - p < CHUNK ? t->tokens - p : CHUNK;
        if ((rc = wrk_forward(&m, kv, table, ids + p, n, p, logits, false)))
            shardlm_fail(e, rc, "forward: %s", strerror(-rc));
    }
out:
    free(kv);
    free(table);
    free(ids);
    free(logits);
    wrk_model_free(&m);
    wrk_pool_free(pool);
    return rc;
}

/* A routing of @t's shape whose experts are drawn by popularity 1 / (j + 1)^@s for the j-th of a
 * random order per layer, k distinct ones per token. Returns 0 or -ENOMEM. */
static int route_zipf(struct trace *t, double s)
{
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    double *p = malloc((size_t)t->n_experts * sizeof(double));
    int *order = malloc((size_t)t->n_experts * sizeof(int));
    bool *taken = malloc((size_t)t->n_experts);
    for (int l = 0; p && order && taken && l < t->layers; l++) {
        for (int j = 0; j < t->n_experts; j++)
            order[j] = j;
        for (int j = t->n_experts - 1; j > 0; j--) { /* Fisher-Yates */
            rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
            int r = (int)((rng * 0x2545F4914F6CDD1Dull >> 33) % (uint64_t)(j + 1)), tmp = order[j];
            order[j] = order[r];
            order[r] = tmp;
        }
        for (int j = 0; j < t->n_experts; j++)
            p[order[j]] = 1.0 / pow(j + 1, s);
        for (int tok = 0; tok < t->tokens; tok++) {
            memset(taken, 0, (size_t)t->n_experts);
            for (int c = 0; c < t->k; c++) {
                double total = 0, u;
                for (int j = 0; j < t->n_experts; j++)
                    total += taken[j] ? 0 : p[j];
                rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
                u = (double)((rng * 0x2545F4914F6CDD1Dull) >> 11) / 9007199254740992.0 * total;
                int pick = -1;
                for (int j = 0; j < t->n_experts && pick < 0; j++)
                    if (!taken[j] && (u -= p[j]) < 0)
                        pick = j;
                for (int j = t->n_experts - 1; pick < 0 && j >= 0; j--) /* rounding: the last */
                    pick = taken[j] ? -1 : j;
                taken[pick] = true;
                t->ids[((size_t)l * t->tokens + tok) * t->k + c] = pick;
            }
        }
    }
    int rc = p && order && taken ? 0 : -ENOMEM;
    free(p);
    free(order);
    free(taken);
    return rc;
}

/* The busiest rank's expert bytes per step of @batch tokens over @ranks ranks under each
 * placement (@expert_bytes an expert's gate, up and down), and the distinct experts a layer
 * reads per step, averaged over the steps. */
static void simulate(const struct trace *t, int ranks, int batch, double expert_bytes, double *tp,
                     double *ep, double *distinct)
{
    int steps = t->tokens / batch, *per_rank = calloc((size_t)ranks, sizeof(int));
    int *owner = malloc((size_t)t->n_experts * sizeof(int));
    bool *used = malloc((size_t)t->n_experts);
    *tp = *ep = *distinct = 0;
    if (!per_rank || !owner || !used)
        steps = 0; /* out of memory: nothing to say (zeros) */
    /* seg_plan_place's expert-parallel ranges: rank r holds [N r / R, N (r + 1) / R) */
    for (int r = 0; owner && r < ranks; r++)
        for (long x = (long)t->n_experts * r / ranks; x < (long)t->n_experts * (r + 1) / ranks; x++)
            owner[x] = r;
    double tp_sum = 0, ep_sum = 0, d_sum = 0;
    for (int s = 0; s < steps; s++)
        for (int l = 0; l < t->layers; l++) {
            memset(used, 0, (size_t)t->n_experts);
            memset(per_rank, 0, (size_t)ranks * sizeof(int));
            int n = 0, most = 0;
            for (int i = s * batch * t->k; i < (s + 1) * batch * t->k; i++) {
                int x = t->ids[(size_t)l * t->tokens * t->k + i];
                if (used[x])
                    continue;
                used[x] = true;
                n++;
                int r = owner[x];
                per_rank[r]++;
                most = per_rank[r] > most ? per_rank[r] : most;
            }
            tp_sum += n * expert_bytes / ranks;
            ep_sum += most * expert_bytes;
            d_sum += n;
        }
    if (steps) {
        *tp = tp_sum / steps;
        *ep = ep_sum / steps;
        *distinct = d_sum / steps / t->layers;
    }
    free(per_rank);
    free(owner);
    free(used);
}

static void print_source(const struct experts_args *a, const struct trace *t, const char *source,
                         double expert_bytes)
{
    for (int ri = 0; ri < a->n_ranks; ri++)
        for (int bi = 0; bi < a->n_batch; bi++) {
            double tp, ep, d;
            simulate(t, a->ranks[ri], a->batch[bi], expert_bytes, &tp, &ep, &d);
            printf("experts source=%s ranks=%d batch=%d distinct=%.2f tp_mb=%.3f ep_mb=%.3f "
                   "ep_over_tp=%.3f\n",
                   source, a->ranks[ri], a->batch[bi], d, tp / 1e6, ep / 1e6, tp > 0 ? ep / tp : 0);
        }
}

/* A comma list of up to MAX_LIST integers in [1, @hi] into @out; false on a bad one. */
static bool parse_list(const char *s, long hi, int *out, int *n)
{
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", s);
    *n = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        long v;
        if (*n == MAX_LIST || !coord_parse_long(tok, 1, hi, &v))
            return false;
        out[(*n)++] = (int)v;
    }
    return *n > 0;
}

#define EXPERTS_USAGE(...) coord_usage_error("bench experts", usage_bench_experts, __VA_ARGS__)

int coord_bench_experts(int argc, char **argv)
{
    struct experts_args a = {
        .tokens = 512, .ranks = {2, 4}, .n_ranks = 2, .batch = {1, 8, 64}, .n_batch = 3};
    static const struct option longs[] = {{"ranks", required_argument, 0, 'R'},
                                          {"batch", required_argument, 0, 'B'},
                                          {"help", no_argument, 0, 'h'},
                                          {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:n:h", longs, NULL)) != -1) {
        switch (c) {
        case 'm':
            a.model = optarg;
            break;
        case 'n':
            if (!coord_parse_long(optarg, 1, 1 << 16, &a.tokens))
                return EXPERTS_USAGE("-n '%s': expected a count 1..65536", optarg);
            break;
        case 'R':
            if (!parse_list(optarg, 1024, a.ranks, &a.n_ranks))
                return EXPERTS_USAGE("--ranks '%s': expected counts 1..1024, comma-separated",
                                     optarg);
            break;
        case 'B':
            if (!parse_list(optarg, 1 << 16, a.batch, &a.n_batch))
                return EXPERTS_USAGE("--batch '%s': expected counts 1..65536, comma-separated",
                                     optarg);
            break;
        case 'h':
            fputs(usage_bench_experts, stdout);
            return 0;
        default:
            return EXPERTS_USAGE("unknown option");
        }
    }
    if (!a.model)
        return EXPERTS_USAGE("-m MODEL.shlm is required");
    if (optind < argc)
        return EXPERTS_USAGE("unexpected argument '%s'", argv[optind]);
    struct shardlm_err e;
    void *map;
    size_t size;
    struct shlm_model img;
    int rc = coord_map_nonempty(a.model, &map, &size, &e);
    if (rc || (rc = shlm_parse(&img, map, size, a.model, &e))) {
        fprintf(stderr, "shardlm bench experts: %s\n", e.msg);
        if (!rc)
            munmap(map, size);
        return 1;
    }
    const struct shlm_config_ext *x = &img.hdr->cfgx;
    if ((uint32_t)a.tokens > img.hdr->cfg.seq_len) {
        fprintf(stderr, "shardlm bench experts: -n %ld: the model's context is %u\n", a.tokens,
                img.hdr->cfg.seq_len);
        munmap(map, size);
        return 1;
    }
    struct trace t = {.tokens = (int)a.tokens,
                      .k = (int)x->n_experts_used,
                      .n_experts = (int)x->n_experts,
                      .x = x};
    for (uint32_t l = 0; l < img.hdr->cfg.n_layers; l++)
        t.layers += shlm_layer_moe(x, l);
    const struct shlm_tensor *g = NULL, *u = NULL, *d = NULL;
    for (uint32_t l = 0; l < img.hdr->cfg.n_layers && !g; l++)
        if (shlm_layer_moe(x, l)) {
            g = shlm_find_kind(&img, SHLM_KIND_FFN_GATE_EXP, l, 0);
            u = shlm_find_kind(&img, SHLM_KIND_FFN_UP_EXP, l, 0);
            d = shlm_find_kind(&img, SHLM_KIND_FFN_DOWN_EXP, l, 0);
        }
    if (!g || !u || !d) {
        fprintf(stderr, "shardlm bench experts: %s: not a mixture of experts\n", a.model);
        munmap(map, size);
        return 1;
    }
    /* every asked case has a line: a rank count past the experts (expert-parallel gives each
     * rank one at least) or a step past the routed tokens is refused, not left out */
    for (int i = 0; i < a.n_ranks; i++)
        if ((uint32_t)a.ranks[i] > x->n_experts) {
            fprintf(stderr, "shardlm bench experts: --ranks %d: more than the model's %u experts\n",
                    a.ranks[i], x->n_experts);
            munmap(map, size);
            return 1;
        }
    for (int i = 0; i < a.n_batch; i++)
        if (a.batch[i] > a.tokens) {
            fprintf(stderr,
                    "shardlm bench experts: --batch %d: more than the %ld tokens routed "
                    "(-n)\n",
                    a.batch[i], a.tokens);
            munmap(map, size);
            return 1;
        }
    double expert_bytes = (double)(g->bytes + u->bytes + d->bytes);
    t.ids = malloc((size_t)t.layers * t.tokens * t.k * sizeof(int));
    t.filled = calloc((size_t)t.layers, sizeof(int));
    if (!t.ids || !t.filled) {
        free(t.ids);
        free(t.filled);
        fprintf(stderr, "shardlm bench experts: out of memory\n");
        munmap(map, size);
        return 1;
    }
    fprintf(stderr,
            "shardlm bench experts: %s: %d experts of %.2f MB in %d layers, %d per token; "
            "routing %d tokens\n",
            a.model, t.n_experts, expert_bytes / 1e6, t.layers, t.k, t.tokens);
    if ((rc = route_model(&img, &t, &e))) {
        fprintf(stderr, "shardlm bench experts: %s\n", e.msg);
    } else {
        print_source(&a, &t, "model", expert_bytes);
        static const double skews[] = {0.0, 0.5, 1.0};
        for (size_t i = 0; i < sizeof(skews) / sizeof(skews[0]); i++) {
            char src[32];
            snprintf(src, sizeof(src), "zipf-%.1f", skews[i]);
            if ((rc = route_zipf(&t, skews[i]))) {
                fprintf(stderr, "shardlm bench experts: out of memory\n");
                break;
            }
            print_source(&a, &t, src, expert_bytes);
        }
    }
    free(t.ids);
    free(t.filled);
    munmap(map, size);
    return rc ? 1 : 0;
}
