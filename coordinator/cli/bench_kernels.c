/* SPDX-License-Identifier: MIT */
/* coordinator/cli/bench_kernels.c: `shardlm bench kernels` - each matrix kernel of this machine's
 * tables on one thread, on the shapes of a 1B-class model: GEMV in GB/s of weights streamed from
 * memory (as decode reads them), GEMM in GOP/s (2 M N K per product, as prefill runs them), next to
 * the read bandwidth of one thread measured the way `bench -m` does. */
#include "bench.h"

#include "cli.h"
#include "kn.h"
#include "util.h"

#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage_bench_kernels[] =
    "usage: shardlm bench kernels [--isa NAME] [-r REPS] [--json]\n"
    "\n"
    "Times the matrix kernels on one thread with random weights. GEMV (M=1) streams copies of\n"
    "the matrix totalling 512 MiB, so weights come from memory as in decode, and prints GB/s of\n"
    "weights read; M=8 (batched decode) streams them too and prints GOP/s (2*M*N*K per\n"
    "product) beside the GB/s; GEMM (M=64, 512: prefill chunks) reuses one copy, GOP/s. Shapes "
    "NxK: 2048x2048, 8192x2048 and 2048x8192 (a 1B model's\n"
    "attention, FFN up and down). The W4A8 tile, q8 and q6 GEMVs (decode's) pick their software\n"
    "prefetch by timing calls once a first pass over the copies is done, as the workers do\n"
    "after their first over the weights (the line says which); the lines\n"
    "after it force each: 'pf hw' none, 'pf l1' 4 KiB ahead into L1, 'pf l2' 8 KiB ahead into\n"
    "L2, their repetitions interleaved. Last, this thread's read bandwidth over 1 GiB of arrays.\n"
    "  --isa NAME   one table (ref, avx2, avx512, amx; default: every table but ref)\n"
    "  -r REPS      repetitions, median reported (default 3)\n"
    "  --json       one JSON object per line\n";

#define STREAM_BYTES (512ul << 20)
#define MIN_NS 200000000ull /* time each repetition for at least 0.2 s */

static const struct {
    int n, k;
} shapes[] = {{2048, 2048}, {8192, 2048}, {2048, 8192}};

static const struct {
    enum kn_dtype dt;
    const char *name;
    int gemm;    /* also timed as GEMM */
    int batched; /* also timed as batched decode (M=8 from memory) */
} formats[] = {
    {KN_DT_W4A8_T, "w4a8 tiles", 1, 1},
    {KN_DT_W4A16_T, "w4a16 tiles", 1, 0},
    {KN_DT_W4A8, "w4a8 rows", 0, 0},
    {KN_DT_W4A16, "w4a16 rows", 0, 0},
    {KN_DT_Q8, "q8", 0, 1},
    {KN_DT_Q6, "q6", 0, 1},
    {KN_DT_BF16, "bf16", 0, 0},
};

/* Tokens of the batched decode case: its matrices stream from memory, as the GEMV's do. */
#define BATCHED_M 8

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd32(void)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng >> 32);
}

/* A random matrix of @dt in its layout at @buf (kn_mat_bytes): any codes, scales near 0.01.
 * Returns 0 or -ENOMEM. */
static int fill_matrix(enum kn_dtype dt, int n, int k, int group, uint8_t *buf)
{
    enum kn_dtype canon = dt == KN_DT_W4A8_T ? KN_DT_W4A8 : dt == KN_DT_W4A16_T ? KN_DT_W4A16 : dt;
    size_t bytes = kn_mat_bytes(canon, n, k, group);
    uint8_t *c = kn_is_tiled(dt) ? malloc(bytes) : buf;
    if (!c)
        return -ENOMEM;
    struct kn_mat m;
    kn_mat_view(&m, canon, n, k, group, c);
    for (size_t i = 0; i < bytes; i++)
        c[i] = (uint8_t)rnd32();
    size_t rows = (size_t)n, ng = (size_t)kn_ngroups(k, group);
    if (dt == KN_DT_F32)
        for (size_t i = 0; i < rows * (size_t)k; i++)
            ((float *)c)[i] = (float)(rnd32() % 2001) * 1e-5f - 0.01f;
    if (dt == KN_DT_BF16)
        for (size_t i = 0; i < rows * (size_t)k; i++)
            ((uint16_t *)c)[i] = kn_f32_to_bf16((float)(rnd32() % 2001) * 1e-5f - 0.01f);
    if (dt == KN_DT_Q8)
        for (size_t i = 0; i < rows; i++)
            ((float *)m.scales)[i] = 1e-4f;
    if (dt == KN_DT_Q6)
        for (size_t i = 0; i < rows * (size_t)kn_q6_blocks(k) * 8; i++)
            ((uint16_t *)m.scales)[i] = kn_f32_to_f16(1e-3f);
    if (kn_is_w4(canon))
        for (size_t i = 0; i < rows * ng; i++) {
            ((uint16_t *)m.scales)[i] = kn_f32_to_f16(0.01f);
            if (m.zeros)
                ((uint8_t *)m.zeros)[i] = 8;
        }
    if (kn_is_tiled(dt)) {
        kn_repack_tiles(&m, 0, (n + KN_TILE_ROWS - 1) / KN_TILE_ROWS, buf);
        free(c);
    }
    return 0;
}

struct run {
    const struct kn_ops *ops;
    struct kn_mat *mats; /* copies (GEMV) or one (GEMM) */
    int n_mats, m;
    const struct kn_act *x;
    float *y;
    const struct kn_scratch *scratch; /* the GEMM's (NULL: the table needs none) */
};

/* Output rows [n0, n1) of the product with @w. */
static void run_rows(const struct run *r, const struct kn_mat *w, int n0, int n1)
{
    if (r->m == 1)
        r->ops->gemv(w, r->x, r->y, n0, n1);
    else
        r->ops->gemm(w, r->x, r->m, r->y, w->rows, n0, n1, r->scratch);
}

/* A product runs in blocks of rows of at most BLOCK_NS each, so that SIGINT or SIGTERM stops the
 * bench within about that: the reference table's M=512 GEMM takes tens of seconds in one call
 * (bench kernels --isa ref took 13-37 s to stop), a fast table's products stay whole. */
#define BLOCK_NS 20000000ull

/* The rows of one call: blocks of 16, 32, 64... rows of the first matrix are timed until one
 * takes BLOCK_NS or the whole matrix is reached (this warms up too). Returns 0 when a signal
 * stopped it. */
static int block_rows(const struct run *r)
{
    const struct kn_mat *w = &r->mats[0];
    for (int block = KN_TILE_ROWS;; block = block * 2 < w->rows ? block * 2 : w->rows) {
        if (coord_stop_signal)
            return 0;
        uint64_t t0 = shardlm_now_ns();
        run_rows(r, w, 0, block);
        if (shardlm_now_ns() - t0 >= BLOCK_NS || block == w->rows)
            return block;
    }
}

/* Runs the product over the copies until MIN_NS passed, in calls of @block rows; returns the
 * products per second, or -1 when a signal stopped it (seen between calls). */
static double time_run(const struct run *r, int block)
{
    uint64_t t0 = shardlm_now_ns(), t;
    long done = 0;
    do {
        for (int i = 0; i < r->n_mats; i++) {
            const struct kn_mat *w = &r->mats[i];
            for (int n0 = 0; n0 < w->rows; n0 += block) {
                if (coord_stop_signal)
                    return -1;
                run_rows(r, w, n0, n0 + block < w->rows ? n0 + block : w->rows);
            }
        }
        done += r->n_mats;
    } while ((t = shardlm_now_ns()) - t0 < MIN_NS);
    return (double)done / ((double)(t - t0) / 1e9);
}

/* The buffers of one case: copies of the matrix (GEMV) or one (GEMM), M activations. */
struct bench_bufs {
    uint8_t *buf;
    struct kn_mat *mats;
    struct kn_act *x;
    float *y, *xv;
    int n_act;
};

static void bufs_free(struct bench_bufs *b)
{
    for (int i = 0; i < b->n_act; i++)
        kn_act_free(&b->x[i]);
    free(b->x);
    free(b->xv);
    free(b->y);
    free(b->mats);
    free(b->buf);
}

/* Fills @b for format @dt, n x k, @m activations, @copies matrices. Returns 0, or -ENOMEM or
 * -ECANCELED (a signal, seen between copies) with @b freed. */
static int bufs_make(struct bench_bufs *b, const struct kn_ops *ops, enum kn_dtype dt, int n, int k,
                     int group, int m, int copies)
{
    size_t bytes = kn_mat_bytes(dt, n, k, group), stride = (bytes + 4095) / 4096 * 4096;
    *b = (struct bench_bufs){aligned_alloc(4096, stride * (size_t)copies),
                             calloc((size_t)copies, sizeof(*b->mats)),
                             calloc((size_t)m, sizeof(*b->x)),
                             malloc((size_t)m * (size_t)n * sizeof(float)),
                             malloc((size_t)k * 4),
                             0};
    if (!b->buf || !b->mats || !b->x || !b->y || !b->xv || fill_matrix(dt, n, k, group, b->buf))
        goto fail;
    for (int i = 0; i < copies; i++) {
        if (coord_stop_signal) {
            bufs_free(b);
            return -ECANCELED;
        }
        if (i)
            memcpy(b->buf + stride * (size_t)i, b->buf, bytes);
        kn_mat_view(&b->mats[i], dt, n, k, group, b->buf + stride * (size_t)i);
    }
    for (; b->n_act < m; b->n_act++) {
        if (kn_act_alloc(&b->x[b->n_act], k, group ? group : 32))
            goto fail;
        for (int j = 0; j < k; j++)
            b->xv[j] = (float)(rnd32() % 2001) * 1e-3f - 1.0f;
        ops->act_prepare(&b->x[b->n_act], b->xv);
    }
    return 0;
fail:
    bufs_free(b);
    return -ENOMEM;
}

/* Timed ways of running one case: as decode runs it (the prefetch tuned, "auto"), then, for
 * the GEMVs that tune their software prefetch (kernels/kn_prefetch.c), each prefetch mode
 * forced; the repetitions of the ways interleave, so that the machine's drifts meet them all. */
#define BENCH_WAYS (1 + KN_PF_COUNT)

static void print_case(const struct kn_ops *ops, size_t fi, int n, int k, int m, int way,
                       int chosen, size_t bytes, double med, int json)
{
    double us = 1e6 / med, gbs = (double)bytes * med / 1e9;
    double gops = 2.0 * m * (double)n * k * med / 1e9;
    char kernel[32];
    snprintf(kernel, sizeof(kernel), "%s%s%s", formats[fi].name, way ? " pf " : "",
             way ? kn_pf_name(way - 1) : "");
    if (json) {
        char pf[64] = "";
        if (way)
            snprintf(pf, sizeof(pf), ", \"prefetch\": \"%s\"", kn_pf_name(way - 1));
        else if (chosen >= 0)
            snprintf(pf, sizeof(pf), ", \"prefetch\": \"auto\", \"chosen\": \"%s\"",
                     kn_pf_name(chosen));
        printf("{\"isa\": \"%s\", \"kernel\": \"%s\", \"n\": %d, \"k\": %d, \"m\": %d, "
               "\"us\": %.2f, \"gbs\": %.2f, \"gops\": %.2f%s}\n",
               ops->name, formats[fi].name, n, k, m, us, gbs, gops, pf);
    } else if (m == 1)
        printf("| %-6s | %-16s | %5d x %-5d | %4s | %10.1f | %8.2f GB/s |%s%s\n", ops->name, kernel,
               n, k, "gemv", us, gbs, chosen >= 0 ? " prefetch chosen: " : "",
               chosen >= 0 ? kn_pf_name(chosen) : "");
    else if (m == BATCHED_M)
        printf("| %-6s | %-16s | %5d x %-5d | %4d | %10.1f | %7.1f GOP/s | %.2f GB/s\n", ops->name,
               kernel, n, k, m, us, gops, gbs);
    else
        printf("| %-6s | %-16s | %5d x %-5d | %4d | %10.1f | %7.1f GOP/s |\n", ops->name, kernel, n,
               k, m, us, gops);
    fflush(stdout);
}

/* One (table, format, shape, M) case: prints its line (and those of the forced prefetch
 * modes). Returns 0, -ENOMEM, or -ECANCELED when a signal stopped it (nothing printed). */
static int bench_case(const struct kn_ops *ops, size_t fi, int n, int k, int m, int reps, int json)
{
    enum kn_dtype dt = formats[fi].dt;
    int group = kn_is_w4(dt) ? (dt == KN_DT_W4A16 || dt == KN_DT_W4A16_T ? 64 : 128) : 0;
    size_t bytes = kn_mat_bytes(dt, n, k, group);
    int copies = m == 1 || m == BATCHED_M ? (int)((STREAM_BYTES + bytes - 1) / bytes) : 1;
    struct bench_bufs b;
    int rc = bufs_make(&b, ops, dt, n, k, group, m, copies);
    if (rc)
        return rc;
    bool tuned = m == 1 && (dt == KN_DT_W4A8_T || dt == KN_DT_Q8 || dt == KN_DT_Q6) &&
                 ops->isa != KN_ISA_REF;
    int ways = tuned ? BENCH_WAYS : 1;
    size_t sb = kn_gemm_scratch_bytes(ops, &b.mats[0], m); /* the copies share one shape */
    struct kn_scratch scratch = {sb ? aligned_alloc(64, (sb + 63) / 64 * 64) : NULL, sb};
    if (sb && !scratch.buf) {
        bufs_free(&b);
        return -ENOMEM;
    }
    struct run r = {ops, b.mats, copies, m, b.x, b.y, sb ? &scratch : NULL};
    double rate[BENCH_WAYS][16];
    kn_pf_reset(); /* "auto" tunes afresh: an earlier table's choice is not this one's */
    int block = block_rows(&r);
    for (int i = 0; i < reps && block; i++)
        for (int w = 0; w < ways && block; w++) {
            kn_pf_force(w - 1);
            if ((rate[w][i] = time_run(&r, block)) < 0)
                block = 0;
        }
    kn_pf_force(-1);
    free(scratch.buf);
    if (!block) {
        bufs_free(&b);
        return -ECANCELED;
    }
    for (int w = 0; w < ways; w++)
        print_case(ops, fi, n, k, m, w, tuned && !w ? kn_pf_chosen(&b.mats[0], n) : -1, bytes,
                   coord_sort_median(rate[w], reps), json);
    bufs_free(&b);
    return 0;
}

int coord_bench_kernels(int argc, char **argv)
{
    static const struct option opts[] = {{"isa", required_argument, 0, 'i'},
                                         {"json", no_argument, 0, 'j'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    static const struct coord_cli_cmd cmd = {"bench kernels", usage_bench_kernels, "r:h", opts,
                                             NULL};
    const char *isa = NULL;
    int reps = 3, json = 0, c, rc;
    long v;
    optind = 1;
    while ((c = coord_cli_getopt(&cmd, argc, argv, &rc)) != -1) {
        switch (c) {
        case COORD_CLI_EXIT:
            return rc;
        case 'i':
            isa = optarg;
            break;
        case 'r':
            if (!coord_parse_long(optarg, 1, 16, &v))
                return coord_usage_error("bench kernels", usage_bench_kernels,
                                         "-r '%s': expected 1..16 repetitions", optarg);
            reps = (int)v;
            break;
        case 'j':
            json = 1;
            break;
        }
    }
    if (optind != argc)
        return coord_usage_error("bench kernels", usage_bench_kernels, "unexpected argument '%s'",
                                 argv[optind]);
    const struct kn_ops *all[8], *run[8];
    int n_all = kn_ops_available(all, 8), n_run = 0;
    for (int i = 0; i < n_all; i++)
        if (isa ? strcmp(all[i]->name, isa) == 0 : all[i]->isa != KN_ISA_REF)
            run[n_run++] = all[i];
    char err[256];
    if (isa && !kn_ops_find(isa, err, sizeof(err))) {
        /* a name no build has is a usage error; one this CPU cannot run, a failure */
        static const struct coord_cli_word isas[] = {{"ref", KN_ISA_REF},
                                                     {"avx2", KN_ISA_AVX2},
                                                     {"avx512", KN_ISA_AVX512},
                                                     {"amx", KN_ISA_AMX},
                                                     {NULL, 0}};
        bool known = coord_cli_word(isas, isa) >= 0;
        fprintf(stderr, "shardlm bench kernels: --isa %s: %s\n", isa, err);
        return known ? 1 : 2;
    }
    if (!n_run)
        run[n_run++] = all[0]; /* only the reference: time that */
    coord_signals_install();
    int cpu = sched_getcpu(); /* stay on one CPU: the kernels, then the bandwidth */
    if (cpu >= 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(cpu, &set);
        pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
    }
    if (!json) {
        printf("| %-6s | %-16s | %13s | %4s | %10s | %13s |\n", "isa", "kernel", "shape N x K", "M",
               "us/product", "speed");
        printf(
            "| ------ | ---------------- | ------------: | ---: | ---------: | ------------: |\n");
    }
    for (int t = 0; t < n_run; t++)
        for (size_t fi = 0; fi < sizeof(formats) / sizeof(formats[0]); fi++)
            for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
                static const int ms[] = {1, BATCHED_M, 64, 512};
                for (size_t mi = 0; mi < 4; mi++) {
                    if (ms[mi] == BATCHED_M ? !formats[fi].batched
                                            : ms[mi] > 1 && !formats[fi].gemm)
                        continue;
                    if (coord_stop_signal)
                        return 128 + (int)coord_stop_signal;
                    int rc = bench_case(run[t], fi, shapes[si].n, shapes[si].k, ms[mi], reps, json);
                    if (rc == -ECANCELED)
                        return 128 + (int)coord_stop_signal;
                    if (rc) {
                        fprintf(stderr, "shardlm bench kernels: out of memory\n");
                        return 1;
                    }
                }
            }
    if (coord_stop_signal)
        return 128 + (int)coord_stop_signal;
    double bw = coord_read_bandwidth(1, cpu >= 0 ? &cpu : NULL, reps);
    if (json)
        printf("{\"read_bw_gbs\": %.2f, \"threads\": 1}\n", bw);
    else
        printf("read bandwidth: %.2f GB/s (1 thread, 1 GiB of arrays, median of %d)\n", bw, reps);
    return 0;
}
