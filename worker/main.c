/* SPDX-License-Identifier: MIT */
/* worker/main.c: shardlm-worker, one rank of the engine. Parses its arguments, places itself on
 * its node and CPUs, connects to its coordinator and runs the steps it is sent until Shutdown or
 * until the coordinator goes away. */
#include "allreduce.h"
#include "common.h"
#include "cpus.h"
#include "fault.h"
#include "pin.h"
#include "serve.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>
#include <zmq.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: shardlm-worker --endpoint ENDPOINT --rank R --coordinator-pid PID\n"
            "                      [--node N] [--cpus LIST] [--threads T] [--keys DIR]\n"
            "                      [--isa ref|avx2|avx512|amx] [--prefetch auto|hw|l1|l2]\n"
            "Started by `shardlm`, not by hand: connects to the coordinator at ENDPOINT, pins\n"
            "itself to NUMA node N and the CPUs of LIST (one pool thread per CPU, the first T),\n"
            "maps the segments it is told to and runs its steps. Exits when the coordinator\n"
            "does. --isa: the kernel table (default: the fastest this CPU runs); --prefetch: the\n"
            "decode GEMVs' software prefetch (default auto: timed per matrix shape).\n");
}

/* What the command line says, every value checked. */
struct wrk_args {
    const char *endpoint, *keys, *cpus; /* cpus: the text of --cpus, NULL if not given */
    long rank, coord, node, threads;    /* node -1: none; threads 0: one per CPU */
    const char *isa;                    /* the kernel table; NULL: the fastest here */
    int prefetch;                       /* kn_pf_force's mode; -1: tuned */
    int n_cpus, cpu_list[SEG_MAX_CPUS]; /* --cpus parsed */
    bool help;
};

/* The integer value @arg of option @opt into *@out: 0, or -EINVAL unless it is a whole number
 * within [@lo, @hi]. */
static int int_arg(const char *opt, const char *arg, long lo, long hi, long *out,
                   struct shardlm_err *e)
{
    if (!shardlm_parse_long(arg, lo, hi, out))
        return shardlm_fail(e, -EINVAL, "%s '%s': expected %ld..%ld", opt, arg, lo, hi);
    return 0;
}

/* What one option says, or what is wrong with it. */
static int args_option(struct wrk_args *a, int o, char **argv, struct shardlm_err *e)
{
    switch (o) {
    case 'e':
        a->endpoint = optarg;
        return *optarg ? 0 : shardlm_fail(e, -EINVAL, "--endpoint is empty");
    case 'r':
        return int_arg("--rank", optarg, 0, SEG_AR_MAX_RANKS - 1, &a->rank, e);
    case 'c':
        return int_arg("--coordinator-pid", optarg, 1, INT_MAX, &a->coord, e);
    case 'n':
        return int_arg("--node", optarg, -1, WRK_MAX_NODES - 1, &a->node, e);
    case 't':
        return int_arg("--threads", optarg, 0, SEG_MAX_CPUS, &a->threads, e);
    case 'C':
        a->cpus = optarg;
        a->n_cpus = seg_cpulist_parse(optarg, strlen(optarg), a->cpu_list, SEG_MAX_CPUS);
        if (a->n_cpus < 0)
            return shardlm_fail(e, -EINVAL, "--cpus '%s' is not a CPU list%s", optarg,
                                a->n_cpus == -EEXIST ? " (a CPU twice)" : "");
        return 0;
    case 'k':
        a->keys = optarg;
        return 0;
    case 'i': {
        char why[256];
        a->isa = optarg;
        return kn_ops_find(optarg, why, sizeof(why))
                   ? 0
                   : shardlm_fail(e, -EINVAL, "--isa '%s': %s", optarg, why);
    }
    case 'p':
        a->prefetch = kn_pf_parse(optarg);
        return a->prefetch >= -1
                   ? 0
                   : shardlm_fail(e, -EINVAL, "--prefetch '%s': expected auto, hw, l1 or l2",
                                  optarg);
    case 'h':
        a->help = true;
        return 0;
    case ':':
        return shardlm_fail(e, -EINVAL, "option '%s' needs a value", argv[optind - 1]);
    default:
        return shardlm_fail(e, -EINVAL, "unknown option '%s'", argv[optind - 1]);
    }
}

/* Parses @argv into @a: every integer strict and within its range, no unknown option, no
 * argument left over, the required ones there (all but --help). Returns 0 or -EINVAL with @e
 * saying which argument and what was expected. */
static int args_parse(struct wrk_args *a, int argc, char **argv, struct shardlm_err *e)
{
    static const struct option opts[] = {{"endpoint", required_argument, 0, 'e'},
                                         {"rank", required_argument, 0, 'r'},
                                         {"coordinator-pid", required_argument, 0, 'c'},
                                         {"node", required_argument, 0, 'n'},
                                         {"cpus", required_argument, 0, 'C'},
                                         {"threads", required_argument, 0, 't'},
                                         {"keys", required_argument, 0, 'k'},
                                         {"isa", required_argument, 0, 'i'},
                                         {"prefetch", required_argument, 0, 'p'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    *a = (struct wrk_args){.rank = -1, .node = -1, .prefetch = -1};
    int o, rc;
    opterr = 0; /* our own one-line messages */
    while ((o = getopt_long(argc, argv, ":", opts, NULL)) != -1)
        if ((rc = args_option(a, o, argv, e)) || a->help)
            return rc;
    if (optind < argc)
        return shardlm_fail(e, -EINVAL, "unexpected argument '%s'", argv[optind]);
    const char *missing = !a->endpoint  ? "--endpoint"
                          : a->rank < 0 ? "--rank"
                          : !a->coord   ? "--coordinator-pid"
                                        : NULL;
    if (missing)
        return shardlm_fail(e, -EINVAL, "%s is required", missing);
    if (a->n_cpus && a->threads > a->n_cpus)
        return shardlm_fail(e, -EINVAL, "--threads %ld: only %d CPUs given", a->threads, a->n_cpus);
    return 0;
}

/* Dies with the coordinator (SIGKILL when the parent goes) and leaves Ctrl-C to it: it reaches
 * the whole process group, and the coordinator shuts us down in order. Returns false if the
 * coordinator is already gone (or was never our parent): then do not start. */
static bool coordinator_watch(struct wrk *w)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    signal(SIGINT, SIG_IGN);
    if (getppid() != w->coord) {
        wrk_log(w, "coordinator %ld is not my parent (gone?), exiting", (long)w->coord);
        return false;
    }
    return true;
}

/* Forces the prefetch mode *@arg on the calling pool member (kn_pf_force is per thread). */
static void force_prefetch(void *arg, int i, int n)
{
    (void)i, (void)n;
    kn_pf_force(*(const int *)arg);
}

/* Pins this process to its node and CPUs, starts the thread pool and picks the kernel table and
 * the prefetch mode of its command line. Returns 0 or -errno with @e set. */
static int place(struct wrk *w, const struct wrk_args *a, struct shardlm_err *e)
{
    int n_threads = a->threads ? (int)a->threads : w->n_cpus ? w->n_cpus : 1;
    int rc = wrk_pin(w->node, w->cpus, w->n_cpus);
    if (rc)
        return shardlm_fail(e, rc, "cannot pin to node %d cpus %s: %s", w->node,
                            a->cpus ? a->cpus : "-", strerror(-rc));
    if ((rc = wrk_pool_init(&w->pool, n_threads, w->cpus)))
        return shardlm_fail(e, rc, "cannot start %d threads: %s", n_threads, strerror(-rc));
    w->ops = kn_ops_select(a->isa, NULL, 0); /* args_parse checked that it runs here */
    wrk_pool_run(w->pool, force_prefetch, (void *)&a->prefetch);
    return 0;
}

static int send_socket(struct wrk *w, const proto_env *env)
{
    int rc = proto_send(w->sock, NULL, 0, env);
    if (rc)
        wrk_log(w, "send failed: %s", zmq_strerror(-rc));
    return rc;
}

/* Opens the DEALER socket in @ctx (a CURVE client with the keys of @a->keys), connects it to the
 * coordinator under the routing id "rank-R" and says Hello. Returns 0 or -errno with @e set;
 * w->sock is closed by the caller. */
static int coordinator_connect(struct wrk *w, void *ctx, const struct wrk_args *a,
                               struct shardlm_err *e)
{
    char id[32];
    int idlen = snprintf(id, sizeof(id), "rank-%u", w->rank);
    w->sock = zmq_socket(ctx, ZMQ_DEALER);
    if (a->keys) { /* a CURVE client: the workers' key pair, the coordinator's public key */
        char path[4200], spub[41], pub[41], sec[41];
        snprintf(path, sizeof(path), "%s/server.key", a->keys);
        int kr = proto_key_read(path, spub, NULL);
        snprintf(path, sizeof(path), "%s/worker.key", a->keys);
        if (!kr)
            kr = proto_key_read(path, pub, sec);
        if (kr || !w->sock || proto_curve_client(w->sock, spub, pub, sec))
            return shardlm_fail(e, kr ? kr : -EINVAL, "--keys %s: cannot read the CURVE keys (%s)",
                                a->keys, strerror(kr ? -kr : EINVAL));
    }
    if (!w->sock || proto_socket_setup(w->sock) ||
        zmq_setsockopt(w->sock, ZMQ_ROUTING_ID, id, (size_t)idlen) < 0 ||
        zmq_connect(w->sock, a->endpoint) < 0)
        return shardlm_fail(e, -zmq_errno(), "cannot connect to %s: %s", a->endpoint,
                            zmq_strerror(zmq_errno()));
    Shardlm__Hello hello = SHARDLM__HELLO__INIT;
    hello.rank = w->rank;
    hello.pid = (uint32_t)getpid();
    hello.protocol = PROTO_VERSION;
    hello.isa = (char *)w->ops->name;
    proto_env env = SHARDLM__ENVELOPE__INIT;
    env.msg_case = SHARDLM__ENVELOPE__MSG_HELLO;
    env.hello = &hello;
    int rc = proto_send(w->sock, NULL, 0, &env);
    return rc ? shardlm_fail(e, rc, "send failed: %s", zmq_strerror(-rc)) : 0;
}

/* Receives and handles the coordinator's messages until Shutdown (0), or until the coordinator is
 * gone (-ESRCH) or the socket fails (-errno); those are logged. */
static int serve(struct wrk *w)
{
    for (;;) {
        proto_env *in;
        int r = proto_recv(w->sock, 500, NULL, NULL, &in);
        if (getppid() != w->coord) {
            wrk_log(w, "coordinator gone, exiting");
            proto_free(in);
            return -ESRCH;
        }
        if (r == -EAGAIN || r == -EINTR)
            continue;
        if (r == -EBADMSG) {
            struct shardlm_err e;
            shardlm_fail(&e, r, "malformed message from the coordinator");
            wrk_reply_error(w, r, 0, &e);
            continue;
        }
        if (r) {
            wrk_log(w, "receive failed: %s", zmq_strerror(-r));
            return r;
        }
        bool shutdown;
        wrk_handle(w, in, &shutdown); /* a reply that cannot be sent is logged by send_socket */
        proto_free(in);
        if (shutdown)
            return 0;
    }
}

/* Undoes whatever of place() and coordinator_connect() was done. */
static void cleanup(struct wrk *w, void *ctx)
{
    wrk_detach(w);
    wrk_pool_free(w->pool);
    if (w->sock)
        zmq_close(w->sock);
    if (ctx)
        zmq_ctx_term(ctx);
}

/* Exit codes: 0 after Shutdown, 2 for a usage error, 1 for anything else (the coordinator gone,
 * no placement, no connection). */
int main(int argc, char **argv)
{
    struct wrk_args a;
    struct shardlm_err e = {{0}};
    if (args_parse(&a, argc, argv, &e)) {
        fprintf(stderr, "shardlm-worker: %s (see --help)\n", e.msg);
        return 2;
    }
    if (a.help) {
        usage(stdout);
        return 0;
    }
    struct wrk w = {.rank = (unsigned)a.rank,
                    .coord = (pid_t)a.coord,
                    .node = (int)a.node,
                    .n_cpus = a.n_cpus,
                    .cpus = a.n_cpus ? a.cpu_list : NULL,
                    .send = send_socket};
    if (!coordinator_watch(&w))
        return 1;
    int rc = 1;
    void *ctx = NULL;
    if (place(&w, &a, &e))
        goto out_log;
    /* tests: SHARDLM_FAULT=step_delay_ms=N (slow steps) or SITE=N (shm/fault.h: the Nth call
     * of that kind fails) */
    const char *fault = getenv("SHARDLM_FAULT");
    if (fault && sscanf(fault, "step_delay_ms=%u", &w.fault_step_delay_ms) == 1)
        wrk_log(&w, "fault hook: every step sleeps %u ms", w.fault_step_delay_ms);
    else if (fault && shardlm_fault_arm_spec(fault) == 0)
        wrk_log(&w, "fault hook: %s", fault);
    if (!(ctx = zmq_ctx_new())) {
        shardlm_fail(&e, -zmq_errno(), "zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
        goto out_log;
    }
    if (coordinator_connect(&w, ctx, &a, &e))
        goto out_log;
    rc = serve(&w) ? 1 : 0;
    goto out_cleanup;
out_log:
    wrk_log(&w, "%s", e.msg);
out_cleanup:
    cleanup(&w, ctx);
    return rc;
}
