/* shardlm-worker: one rank of the engine. Connects to its coordinator, maps the segments it is
 * told to, and runs the steps it is sent until Shutdown or until the coordinator goes away. */
#include "pin.h"
#include "serve.h"

#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

static int send_socket(struct wrk *w, const proto_env *env)
{
    int rc = proto_send(w->sock, NULL, 0, env);
    if (rc)
        wrk_log(w, "send failed: %s", zmq_strerror(-rc));
    return rc;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: shardlm-worker --endpoint ENDPOINT --rank R --coordinator-pid PID\n"
            "                      [--node N] [--cpus LIST] [--threads T] [--keys DIR]\n"
            "Started by `shardlm`, not by hand: connects to the coordinator at ENDPOINT, pins\n"
            "itself to NUMA node N and the CPUs of LIST (one pool thread per CPU, the first T),\n"
            "maps the segments it is told to and runs its steps. Exits when the coordinator\n"
            "does.\n");
}

int main(int argc, char **argv)
{
    struct wrk w = {.node = -1, .send = send_socket};
    const char *endpoint = NULL, *cpus = NULL, *keys = NULL;
    long coord = 0, threads = 0;
    static const struct option opts[] = {{"endpoint", required_argument, 0, 'e'},
                                         {"rank", required_argument, 0, 'r'},
                                         {"coordinator-pid", required_argument, 0, 'c'},
                                         {"node", required_argument, 0, 'n'},
                                         {"cpus", required_argument, 0, 'C'},
                                         {"threads", required_argument, 0, 't'},
                                         {"keys", required_argument, 0, 'k'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    int o;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'e':
            endpoint = optarg;
            break;
        case 'r':
            w.rank = (unsigned)strtoul(optarg, NULL, 10);
            break;
        case 'c':
            coord = strtol(optarg, NULL, 10);
            break;
        case 'n':
            w.node = (int)strtol(optarg, NULL, 10);
            break;
        case 'C':
            cpus = optarg;
            break;
        case 't':
            threads = strtol(optarg, NULL, 10);
            break;
        case 'k':
            keys = optarg;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (!endpoint || coord <= 0 || threads < 0 || threads > SEG_MAX_CPUS) {
        usage(stderr);
        return 2;
    }
    /* die with the coordinator; if it is already gone, do not start. Ctrl-C reaches the whole
     * process group: the coordinator handles it and shuts us down in order. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    signal(SIGINT, SIG_IGN);
    w.coord = (pid_t)coord;
    if (getppid() != w.coord) {
        wrk_log(&w, "coordinator %ld is not my parent (gone?), exiting", coord);
        return 1;
    }
    int rc = 1;
    int cpu_list[SEG_MAX_CPUS];
    if (cpus) {
        w.n_cpus = seg_cpulist_parse(cpus, strlen(cpus), cpu_list, SEG_MAX_CPUS);
        if (w.n_cpus < 0) {
            wrk_log(&w, "--cpus '%s' is not a CPU list", cpus);
            return 2;
        }
        w.cpus = cpu_list;
    }
    int n_threads = threads ? (int)threads : w.n_cpus ? w.n_cpus : 1;
    if (w.n_cpus && n_threads > w.n_cpus) {
        wrk_log(&w, "--threads %d: only %d CPUs given", n_threads, w.n_cpus);
        return 2;
    }
    int pr = wrk_pin(w.node, w.cpus, w.n_cpus);
    if (pr) {
        wrk_log(&w, "cannot pin to node %d cpus %s: %s", w.node, cpus ? cpus : "-", strerror(-pr));
        return 1;
    }
    if ((pr = wrk_pool_init(&w.pool, n_threads, w.cpus))) {
        wrk_log(&w, "cannot start %d threads: %s", n_threads, strerror(-pr));
        return 1;
    }
    const char *isa = getenv("SHARDLM_ISA");
    char isa_err[256];
    w.ops = kn_ops_select(isa, isa_err, sizeof(isa_err));
    if (*isa_err) /* the coordinator checks the same before it starts workers */
        fprintf(stderr, "shardlm: SHARDLM_ISA=%s: %s; using ref\n", isa, isa_err);
    const char *fault = getenv("SHARDLM_FAULT");
    if (fault && sscanf(fault, "step_delay_ms=%u", &w.fault_step_delay_ms) == 1)
        wrk_log(&w, "fault hook: every step sleeps %u ms", w.fault_step_delay_ms);

    void *ctx = zmq_ctx_new();
    w.sock = zmq_socket(ctx, ZMQ_DEALER);
    char id[32];
    int idlen = snprintf(id, sizeof(id), "rank-%u", w.rank);
    if (keys) { /* a CURVE client: the workers' key pair, the coordinator's public key */
        char path[4200], spub[41], pub[41], sec[41];
        snprintf(path, sizeof(path), "%s/server.key", keys);
        int kr = proto_key_read(path, spub, NULL);
        snprintf(path, sizeof(path), "%s/worker.key", keys);
        if (!kr)
            kr = proto_key_read(path, pub, sec);
        if (kr || !w.sock || proto_curve_client(w.sock, spub, pub, sec)) {
            wrk_log(&w, "--keys %s: cannot read the CURVE keys (%s)", keys,
                    strerror(kr ? -kr : EINVAL));
            goto out_ctx;
        }
    }
    if (!w.sock || proto_socket_setup(w.sock) ||
        zmq_setsockopt(w.sock, ZMQ_ROUTING_ID, id, (size_t)idlen) < 0 ||
        zmq_connect(w.sock, endpoint) < 0) {
        wrk_log(&w, "cannot connect to %s: %s", endpoint, zmq_strerror(zmq_errno()));
        goto out_ctx;
    }
    Shardlm__Hello hello = SHARDLM__HELLO__INIT;
    hello.rank = w.rank;
    hello.pid = (uint32_t)getpid();
    hello.protocol = PROTO_VERSION;
    hello.isa = (char *)w.ops->name;
    proto_env env = SHARDLM__ENVELOPE__INIT;
    env.msg_case = SHARDLM__ENVELOPE__MSG_HELLO;
    env.hello = &hello;
    if (send_socket(&w, &env))
        goto out_ctx;

    for (;;) {
        proto_env *in;
        int r = proto_recv(w.sock, 500, NULL, NULL, &in);
        if (getppid() != w.coord) {
            wrk_log(&w, "coordinator gone, exiting");
            proto_free(in);
            break;
        }
        if (r == -EAGAIN || r == -EINTR)
            continue;
        if (r == -EBADMSG) {
            wrk_reply_error(&w, -EBADMSG, 0, "malformed message from the coordinator");
            continue;
        }
        if (r) {
            wrk_log(&w, "receive failed: %s", zmq_strerror(-r));
            break;
        }
        int stop = wrk_handle(&w, in);
        proto_free(in);
        if (stop) {
            rc = 0;
            break;
        }
    }
out_ctx:
    wrk_detach(&w);
    wrk_pool_free(w.pool);
    if (w.sock)
        zmq_close(w.sock);
    zmq_ctx_term(ctx);
    return rc;
}
