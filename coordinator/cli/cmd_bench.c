/* SPDX-License-Identifier: MIT */
/* coordinator/cli/cmd_bench.c: `shardlm bench`: which benchmark a command line names, and `shardlm
 * bench allreduce`: the latency of the shared-memory all-reduce of a tensor-parallel group, without
 * a model. Each case forks one process per rank, as the workers are, over a shared anonymous
 * mapping that holds the all-reduce area and the results. */
#include "bench.h"
#include "allreduce.h"
#include "cli.h"
#include "util.h"

#include <errno.h>
#include <getopt.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define BENCH_MAX_LIST 16
#define BENCH_MAX_FLOATS (1L << 26) /* 256 MiB per slot: far past any hidden size */

static const char usage_bench_allreduce[] =
    "usage: shardlm bench allreduce [--ranks R[,R...]] [--floats N[,N...]] [-r REPS]\n"
    "                               [--iters K]\n"
    "\n"
    "Measures the shared-memory all-reduce of a tensor-parallel group. For each number of ranks\n"
    "and each length, forks one process per rank (rank i pinned to the i-th allowed CPU, modulo\n"
    "their number), which run a warm-up and then REPS times K all-reduces. One line per case:\n"
    "  allreduce ranks=<R> floats=<N> bytes=<4N> median_us=<x> min_us=<y> p90_us=<z> reps=<r>\n"
    "the time of one all-reduce seen by rank 0 (the mean over K calls): median, minimum and 90th\n"
    "percentile over the repetitions. On a machine with fewer cores than ranks the figures\n"
    "include oversubscription: ranks share cores and their barriers sleep on futexes.\n"
    "  --ranks R,...   group sizes, 1..64 (default 2,4)\n"
    "  --floats N,...  floats per all-reduce, 0 = barrier only (default 64,2048: the hidden\n"
    "                  size of stories260K and of a 1-2B model)\n"
    "  -r, --reps R    repetitions per case (default 5)\n"
    "  --iters K       all-reduces per repetition (default 2000)\n";

/* What the ranks of one case leave in the shared mapping, ahead of the area. */
struct bench_res {
    int rc[SEG_AR_MAX_RANKS]; /* each rank's outcome: 0 or -errno */
    double rep_ns[];          /* rank 0: mean ns per all-reduce, per repetition */
};

struct bench_opts {
    long ranks[BENCH_MAX_LIST], floats[BENCH_MAX_LIST];
    int n_ranks_list, n_floats_list;
    int reps, iters;
    int cpus[CPU_SETSIZE]; /* the CPUs this process may run on, in order */
    int n_cpus;
};

#define bench_bad_usage(...)                                                                       \
    coord_usage_error("bench allreduce", usage_bench_allreduce, __VA_ARGS__)

/* Parses "a,b,c" (at most BENCH_MAX_LIST values in lo..hi) into @out. Returns how many, or -1. */
static int bench_parse_list(const char *s, long lo, long hi, long *out)
{
    char tmp[512];
    if (snprintf(tmp, sizeof(tmp), "%s", s) >= (int)sizeof(tmp))
        return -1;
    int n = 0;
    char *save = NULL;
    for (char *tok = strtok_r(tmp, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (n == BENCH_MAX_LIST || !coord_parse_long(tok, lo, hi, &out[n]))
            return -1;
        n++;
    }
    return n > 0 && s[strlen(s) - 1] != ',' && s[0] != ',' && !strstr(s, ",,") ? n : -1;
}

/* Pins the calling process to one CPU; best effort (a restricted cpuset may refuse). */
static void bench_pin(int cpu)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    (void)sched_setaffinity(0, sizeof(set), &set);
}

/* One rank of a case, in its own process: checks one all-reduce, warms up, then times
 * o->reps x o->iters all-reduces (rank 0 writes the means). Returns 0 or -errno (-EIO when
 * the checked sum is wrong). */
static int bench_rank(const struct bench_opts *o, struct bench_res *res, void *area, int rank,
                      int n_ranks, size_t n)
{
    struct seg_ar_rank r;
    int rc = 0;
    if (o->n_cpus > 0)
        bench_pin(o->cpus[rank % o->n_cpus]);
    seg_ar_attach(&r, area, rank, getpid());
    float *buf = aligned_alloc(64, ((n ? n : 1) * sizeof(float) + 63) / 64 * 64);
    if (!buf)
        return -ENOMEM;
    /* one checked call: 1 + 2 + ... + n_ranks on every element */
    for (size_t i = 0; i < n; i++)
        buf[i] = (float)(rank + 1);
    if ((rc = seg_ar_allreduce(&r, buf, n)))
        goto out_free;
    for (size_t i = 0; i < n; i++)
        if (buf[i] != (float)(n_ranks * (n_ranks + 1) / 2)) {
            rc = -EIO;
            goto out_free;
        }
    /* zeros stay zeros: no overflow, no denormals, whatever the number of calls */
    memset(buf, 0, n * sizeof(float));
    int warm = o->iters < 100 ? o->iters : 100 + o->iters / 10;
    for (int k = 0; k < warm; k++)
        if ((rc = seg_ar_allreduce(&r, buf, n)))
            goto out_free;
    for (int rep = 0; rep < o->reps; rep++) {
        if ((rc = seg_ar_barrier(&r)))
            goto out_free;
        uint64_t t0 = shardlm_now_ns();
        for (int k = 0; k < o->iters; k++)
            if ((rc = seg_ar_allreduce(&r, buf, n)))
                goto out_free;
        if (rank == 0)
            res->rep_ns[rep] = (double)(shardlm_now_ns() - t0) / o->iters;
    }
out_free:
    free(buf);
    return rc;
}

/* Runs one case and writes rank 0's mean ns per repetition into @rep_ns (o->reps values).
 * Returns 0 or -errno with @e set. */
static int bench_case(const struct bench_opts *o, int n_ranks, size_t n, double *rep_ns,
                      struct shardlm_err *e)
{
    size_t ar_bytes = seg_ar_bytes(n_ranks, n);
    if (!ar_bytes)
        return shardlm_fail(e, -EINVAL, "ranks=%d floats=%zu: area too large", n_ranks, n);
    size_t head = (sizeof(struct bench_res) + (size_t)o->reps * sizeof(double) + 63) / 64 * 64;
    void *map = mmap(NULL, head + ar_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                     -1, 0);
    if (map == MAP_FAILED)
        return shardlm_fail(e, -errno, "ranks=%d floats=%zu: mmap of %zu bytes: %s", n_ranks, n,
                            head + ar_bytes, strerror(errno));
    struct bench_res *res = map;
    void *area = (char *)map + head;
    seg_ar_init(area, n_ranks, n);

    pid_t pids[SEG_AR_MAX_RANKS];
    int started = 0, rc = 0;
    fflush(stdout);
    fflush(stderr);
    for (; started < n_ranks; started++) {
        pid_t pid = fork();
        if (pid < 0) {
            rc = shardlm_fail(e, -errno, "ranks=%d floats=%zu: fork: %s", n_ranks, n,
                              strerror(errno));
            seg_ar_abort(area); /* the ranks already started give up at once */
            break;
        }
        if (pid == 0) {
            res->rc[started] = bench_rank(o, res, area, started, n_ranks, n);
            if (res->rc[started])
                seg_ar_abort(area); /* e.g. a wrong sum: the others stop waiting for us */
            _exit(res->rc[started] ? 1 : 0);
        }
        pids[started] = pid;
    }

    /* Reap each rank as it ends, so that the others see a dead one at once (a zombie still
     * counts as alive); a rank that dies of a signal aborts the rest. */
    bool done[SEG_AR_MAX_RANKS] = {false};
    int left = started, died = -1, sig = 0;
    while (left > 0) {
        for (int i = 0; i < started; i++) {
            int st;
            if (done[i] || waitpid(pids[i], &st, WNOHANG) != pids[i])
                continue;
            done[i] = true;
            left--;
            if (WIFSIGNALED(st) && died < 0) {
                died = i;
                sig = WTERMSIG(st);
                seg_ar_abort(area);
            }
        }
        if (left > 0)
            usleep(1000);
    }
    if (rc)
        goto out_unmap;
    if (died >= 0) {
        rc = shardlm_fail(e, -ECHILD, "ranks=%d floats=%zu: rank %d killed by signal %d", n_ranks,
                          n, died, sig);
        goto out_unmap;
    }
    for (int i = 0; i < n_ranks; i++)
        if (res->rc[i]) {
            /* the first rank to fail says why; the others then see -ECONNABORTED */
            int j = i;
            for (int k = 0; k < n_ranks; k++)
                if (res->rc[k] && res->rc[k] != -ECONNABORTED) {
                    j = k;
                    break;
                }
            rc = shardlm_fail(e, res->rc[j], "ranks=%d floats=%zu: rank %d: %s", n_ranks, n, j,
                              res->rc[j] == -EIO ? "wrong sum" : strerror(-res->rc[j]));
            goto out_unmap;
        }
    memcpy(rep_ns, res->rep_ns, (size_t)o->reps * sizeof(double));
out_unmap:
    munmap(map, head + ar_bytes);
    return rc;
}

/* Option @c of getopt_long (its value in optarg) into @o. Returns -1 to go on, else the exit
 * code: 0 after --help, 2 after a bad value, a missing value or an unknown option. */
static int bench_option(int c, char **argv, struct bench_opts *o)
{
    int n;
    long v;
    switch (c) {
    case 'R':
        if ((n = bench_parse_list(optarg, 1, SEG_AR_MAX_RANKS, o->ranks)) < 0)
            return bench_bad_usage("--ranks '%s': expected a list of 1..64 (at most 16)", optarg);
        o->n_ranks_list = n;
        return -1;
    case 'F':
        if ((n = bench_parse_list(optarg, 0, BENCH_MAX_FLOATS, o->floats)) < 0)
            return bench_bad_usage(
                "--floats '%s': expected a list of counts 0..67108864 (at most 16)", optarg);
        o->n_floats_list = n;
        return -1;
    case 'r':
        if (!coord_parse_long(optarg, 1, 10000, &v))
            return bench_bad_usage("-r '%s': expected 1..10000 repetitions", optarg);
        o->reps = (int)v;
        return -1;
    case 'K':
        if (!coord_parse_long(optarg, 1, 1000000000, &v))
            return bench_bad_usage("--iters '%s': expected 1..1000000000", optarg);
        o->iters = (int)v;
        return -1;
    case 'h':
        fputs(usage_bench_allreduce, stdout);
        return 0;
    case ':':
        return bench_bad_usage("option '%s' needs a value", argv[optind - 1]);
    default: { /* a long option names itself; a short one may sit inside "-xyz" */
        const char *arg = argv[optind - 1];
        char opt[3] = {'-', (char)optopt, 0};
        return bench_bad_usage("bad option '%s'",
                               strncmp(arg, "--", 2) == 0 || !optopt ? arg : opt);
    }
    }
}

/* @argv into @o (see usage_bench_allreduce), and the CPUs this process may run on. Returns -1
 * when the cases are to run, else the exit code (as bench_option). */
static int bench_parse(int argc, char **argv, struct bench_opts *o)
{
    static const struct option opts[] = {{"ranks", required_argument, 0, 'R'},
                                         {"floats", required_argument, 0, 'F'},
                                         {"reps", required_argument, 0, 'r'},
                                         {"iters", required_argument, 0, 'K'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    int c, rc;
    optind = 0; /* glibc: start afresh, whatever parsed argv before */
    opterr = 0; /* our own one-line messages in bench_option */
    while ((c = getopt_long(argc, argv, ":r:h", opts, NULL)) != -1)
        if ((rc = bench_option(c, argv, o)) >= 0)
            return rc;
    if (optind != argc)
        return bench_bad_usage("unexpected argument '%s'", argv[optind]);
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof(allowed), &allowed) == 0)
        for (int i = 0; i < CPU_SETSIZE; i++)
            if (CPU_ISSET(i, &allowed))
                o->cpus[o->n_cpus++] = i;
    return -1;
}

/* The line of one case on stdout from rank 0's @rep_ns (o->reps values; sorted here). */
static void bench_print_case(const struct bench_opts *o, int ranks, size_t floats, double *rep_ns)
{
    double med = coord_sort_median(rep_ns, o->reps);
    int p90 = (9 * o->reps + 9) / 10 - 1; /* nearest rank: ceil(0.9 reps) - 1 */
    printf("allreduce ranks=%d floats=%zu bytes=%zu median_us=%.3f min_us=%.3f "
           "p90_us=%.3f reps=%d\n",
           ranks, floats, floats * sizeof(float), med / 1e3, rep_ns[0] / 1e3, rep_ns[p90] / 1e3,
           o->reps);
    fflush(stdout);
}

/* Parses the options (see usage_bench_allreduce) and runs every (ranks, floats) case, stopping
 * at the first that fails. */
int coord_bench_allreduce(int argc, char **argv)
{
    struct bench_opts o = {.ranks = {2, 4}, .floats = {64, 2048}, .n_ranks_list = 2,
                           .n_floats_list = 2, .reps = 5, .iters = 2000};
    int ret = bench_parse(argc, argv, &o);
    if (ret >= 0)
        return ret;
    double *rep_ns = malloc((size_t)o.reps * sizeof(double));
    if (!rep_ns) {
        fprintf(stderr, "shardlm bench allreduce: out of memory\n");
        return 1;
    }
    ret = 0;
    for (int i = 0; i < o.n_ranks_list && !ret; i++)
        for (int j = 0; j < o.n_floats_list && !ret; j++) {
            struct shardlm_err e;
            if (bench_case(&o, (int)o.ranks[i], (size_t)o.floats[j], rep_ns, &e)) {
                fprintf(stderr, "shardlm bench allreduce: %s\n", e.msg);
                ret = 1;
                break;
            }
            bench_print_case(&o, (int)o.ranks[i], (size_t)o.floats[j], rep_ns);
        }
    free(rep_ns);
    return ret;
}

/* The benchmarks `shardlm bench WORD` names; the model bench takes options only. A new one is a
 * row here (and its line in main.c's usage). */
static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
} bench_kinds[] = {
    {"allreduce", coord_bench_allreduce}, {"kernels", coord_bench_kernels},
    {"tokenizer", coord_bench_tokenizer}, {"sampler", coord_bench_sampler},
    {"quant", coord_bench_quant},         {"experts", coord_bench_experts},
    {"grammar", coord_bench_grammar},
};
#define N_BENCH_KINDS (sizeof(bench_kinds) / sizeof(bench_kinds[0]))

int coord_cmd_bench(int argc, char **argv)
{
    for (size_t i = 0; argc >= 2 && i < N_BENCH_KINDS; i++)
        if (strcmp(argv[1], bench_kinds[i].name) == 0)
            return bench_kinds[i].run(argc - 1, argv + 1);
    /* the model bench takes options only: a word here is a subcommand misspelt */
    if (argc >= 2 && argv[1][0] != '-') {
        fprintf(stderr, "shardlm bench: unknown bench subcommand '%s': expected ", argv[1]);
        for (size_t i = 0; i < N_BENCH_KINDS; i++) /* "a, b, c or d" */
            fprintf(stderr, "%s%s",
                    i == 0                   ? ""
                    : i + 1 == N_BENCH_KINDS ? " or "
                                             : ", ",
                    bench_kinds[i].name);
        fprintf(stderr, ", or the model bench's options (-m MODEL...)\n"
                        "`shardlm bench --help` and `shardlm bench SUBCOMMAND --help` describe "
                        "them\n");
        return 2;
    }
    return coord_bench_model(argc, argv);
}
