/* SPDX-License-Identifier: MIT */
/* coordinator/cli/bench_quant.c: `shardlm bench quant` - how fast the W4 quantizers' exact
 * search over every fp16 scale (kernels/kn_quant.c) rounds normal weights, per group, on one
 * thread or on a pool of the worker's, as `shardlm convert` runs it. */
#include "bench.h"

#include "cli.h"
#include "kn.h"
#include "pool.h"
#include "util.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage_bench_quant[] =
    "usage: shardlm bench quant [-t THREADS] [-r REPS]\n"
    "\n"
    "Rounds a 64 x 4096 matrix of normal weights (standard deviation 0.02, the same every time)\n"
    "to w4a8 (group 128) and w4a16 (group 64), REPS times each, and prints one line per scheme:\n"
    "  quant <scheme> group=<g> rows=<r> cols=<c> threads=<t> us_per_group=<x> reps=<n>\n"
    "the median time of one group's search (the wall time over the matrix, per group).\n"
    "  -t, --threads T  quantizer threads, 1..1024 (default 1)\n"
    "  -r, --reps R     repetitions, median reported (default 3)\n";

#define QB_ROWS 64
#define QB_COLS 4096
#define QB_MAX_REPS 100

/* Normal weights of standard deviation @sd from a fixed seed. */
static void normal_weights(float *w, size_t n, float sd)
{
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < n; i++)
        w[i] = sd * coord_bench_normal(&s);
}

int coord_bench_quant(int argc, char **argv)
{
    static const struct option opts[] = {{"threads", required_argument, 0, 't'},
                                         {"reps", required_argument, 0, 'r'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    static const struct coord_cli_cmd cmd = {"bench quant", usage_bench_quant, "t:r:h", opts,
                                             NULL};
    int reps = 3, threads = 1, c, rc;
    long v;
    optind = 1;
    while ((c = coord_cli_getopt(&cmd, argc, argv, &rc)) != -1) {
        switch (c) {
        case COORD_CLI_EXIT:
            return rc;
        case 't':
            if (!coord_parse_long(optarg, 1, 1024, &v))
                return coord_usage_error("bench quant", usage_bench_quant,
                                         "--threads '%s': expected 1..1024", optarg);
            threads = (int)v;
            break;
        case 'r':
            if (!coord_parse_long(optarg, 1, QB_MAX_REPS, &v))
                return coord_usage_error("bench quant", usage_bench_quant,
                                         "-r '%s': expected 1..%d repetitions", optarg,
                                         QB_MAX_REPS);
            reps = (int)v;
            break;
        }
    }
    if (optind != argc)
        return coord_usage_error("bench quant", usage_bench_quant, "unexpected argument '%s'",
                                 argv[optind]);

    struct wrk_pool *pool = NULL;
    rc = wrk_pool_init(&pool, threads, NULL);
    float *w = malloc(sizeof(float) * QB_ROWS * QB_COLS);
    void *buf = malloc(kn_mat_bytes(KN_DT_W4A16, QB_ROWS, QB_COLS, 32));
    if (rc || !w || !buf) {
        fprintf(stderr, "shardlm bench quant: %s\n",
                rc ? "cannot start the quantizer threads" : "out of memory");
        rc = 1;
        goto out_free;
    }
    normal_weights(w, (size_t)QB_ROWS * QB_COLS, 0.02f);
    struct kn_par par = wrk_pool_par(pool);
    for (int asym = 0; asym < 2; asym++) {
        int group = asym ? 64 : 128;
        double us[QB_MAX_REPS];
        for (int r = 0; r < reps; r++) {
            uint64_t t0 = shardlm_now_ns();
            kn_quant_w4(w, QB_ROWS, QB_COLS, group, asym, NULL, buf, &par);
            us[r] = (double)(shardlm_now_ns() - t0) / 1e3 / (QB_ROWS * (QB_COLS / group));
        }
        printf("quant %s group=%d rows=%d cols=%d threads=%d us_per_group=%.2f reps=%d\n",
               asym ? "w4a16" : "w4a8", group, QB_ROWS, QB_COLS, threads,
               coord_sort_median(us, reps), reps);
    }
out_free:
    free(buf);
    free(w);
    wrk_pool_free(pool);
    return rc;
}
