/* coordinator/: model segment, worker lifecycle and steps. */
#include "engine.h"

#include "allreduce.h"
#include "cpus.h"
#include "load.h"
#include "peer.h"
#include "plan.h"
#include "proto.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#define HELLO_TIMEOUT_MS 10000
#define READY_TIMEOUT_MS 60000
#define SHUTDOWN_GRACE_MS 2000
#define LOGITS_BUDGET (64u << 20) /* bytes of logits one step may return */
#define KV_RESERVE_STEP 256u      /* KV positions reserved at a time as a sequence grows */

volatile sig_atomic_t coord_stop_signal;

static void on_signal(int sig) { coord_stop_signal = sig; }

void coord_signals_install(void)
{
    struct sigaction sa = {0};
    sa.sa_handler = on_signal; /* no SA_RESTART: waits wake up and see the flag */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* The name of rank @r's persistent weights segment: the model (its checksum, which covers every
 * tensor's), the layout and the shard plan (ranks, rank, node). */
static void persist_name(const struct coord_engine *g, int r, const struct shlm_header *h,
                         char *out, size_t len)
{
    seg_weights_name(out, len, h->source_checksum, h->layout, r, g->n_ranks,
                     g->layout.ranks[r].node);
}

/* Maps the persistent segment @path if it is complete and holds exactly @want's shard (with
 * @verify, its data also matches its tensors' checksums); else removes it when it exists (a load
 * killed half way, another layout, changed data) and returns -ENOENT.
 * A warm start trusts the header: its checksum, the model's checksum, the layout and the shard;
 * the data is what this process's load wrote and checksummed, unless --verify reads it again. */
static int map_persistent(struct seg *s, const char *path, const struct shlm_header *want,
                          bool verify)
{
    struct shlm_model m;
    struct shardlm_err err;
    int rc = seg_map(s, path, want->file_bytes, false);
    if (rc == -ENOENT)
        return rc;
    bool ours = !rc && !(rc = shlm_parse(&m, s->base, s->size, path, &err)) &&
                m.hdr->source_checksum == want->source_checksum &&
                m.hdr->layout == want->layout && m.hdr->shard_rank == want->shard_rank &&
                m.hdr->shard_count == want->shard_count;
    if (ours && (!verify || !(rc = shlm_verify_data(&m, path, &err))))
        return 0;
    fprintf(stderr, "shardlm: %s: %s; rebuilding it\n", path,
            (rc == -EINVAL || rc == -EIO) && s->base ? err.msg
                                                      : "not a complete segment of this shard");
    seg_free(s);
    unlink(path);
    return -ENOENT;
}

/* The weights segment of every rank: a complete persistent one is mapped as it is; the others
 * are created (under a temporary name, or as memfds with no_persist), filled by one streaming
 * pass over the file, and published under their persistent names. */
static int make_weights(struct coord_engine *g, const struct coord_engine_opts *o,
                        struct shardlm_err *e)
{
    int n = 0, rc = 0, R = g->n_ranks;
    uint64_t t0 = shardlm_now_ns();
    struct coord_load_dest *dest = calloc((size_t)R, sizeof(*dest));
    struct shlm_tensor *table = calloc(SHLM_MAX_TENSORS, sizeof(*table));
    struct shlm_header *h = calloc((size_t)R, sizeof(*h));
    char(*name)[NAME_MAX + 1] = calloc((size_t)R, sizeof(*name));
    if (!dest || !table || !h || !name) {
        rc = shardlm_fail(e, -ENOMEM, "out of memory");
        goto out;
    }
    for (int r = 0; r < R; r++) {
        struct coord_rank *cr = &g->ranks[r];
        char path[PATH_MAX + NAME_MAX + 2];
        if (coord_shard_layout(&g->img, R, r, &h[r], table) < 0) {
            rc = shardlm_fail(e, -EINVAL, "cannot split the model over %d ranks", R);
            goto out;
        }
        int node = g->layout.ranks[r].node;
        if (o->load.no_persist) {
            snprintf(path, sizeof(path), "shardlm-weights-r%d", r);
            rc = seg_create_on(&cr->weights, path, h[r].file_bytes, node, SEG_ANON | SEG_LAZY);
        } else {
            persist_name(g, r, &h[r], name[r], sizeof(name[r]));
            snprintf(path, sizeof(path), "%s/%s", g->rundir, name[r]);
            if (map_persistent(&cr->weights, path, &h[r], o->load.verify) == 0) {
                g->stats.reused++;
                continue;
            }
            seg_path(path, sizeof(path), g->rundir, getpid(), name[r]);
            rc = seg_create_on(&cr->weights, path, h[r].file_bytes, node, SEG_LAZY);
        }
        if (rc) {
            shardlm_fail(e, rc, "weights segment of rank %d (%llu bytes) in %s: %s", r,
                       (unsigned long long)h[r].file_bytes,
                       o->load.no_persist ? "a memfd" : g->rundir, strerror(-rc));
            goto out;
        }
        dest[n++] = (struct coord_load_dest){r, &cr->weights};
    }
    if (n && (rc = coord_load_shards(&g->file, R, dest, n, o->load.io, &g->stats.load, e)))
        goto out;
    g->stats.load.ns = shardlm_now_ns() - t0; /* with the segments' allocation */
    g->stats.peak_anon = g->stats.load.peak_anon;
    g->stats.built = n;
    for (int i = 0; i < n && !o->load.no_persist; i++) {
        int r = dest[i].rank;
        char path[PATH_MAX + NAME_MAX + 2];
        snprintf(path, sizeof(path), "%s/%s", g->rundir, name[r]);
        rc = seg_publish(&g->ranks[r].weights, path);
        if (rc == -EEXIST) { /* another coordinator published the same shard first: ours goes */
            seg_free(&g->ranks[r].weights);
            rc = map_persistent(&g->ranks[r].weights, path, &h[r], o->load.verify);
        }
        if (rc) {
            shardlm_fail(e, rc, "publish %s: %s", path, strerror(-rc));
            goto out;
        }
    }
out:
    free(dest);
    free(table);
    free(h);
    free(name);
    return rc;
}

static void worker_path(char *out, size_t len)
{
    const char *env = getenv("SHARDLM_WORKER");
    if (env && *env) {
        snprintf(out, len, "%s", env);
        return;
    }
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0) {
        snprintf(out, len, "shardlm-worker");
        return;
    }
    self[n] = 0;
    snprintf(out, len, "%s/shardlm-worker", dirname(self));
}

/* fork + exec of rank @r's worker; an exec failure comes back through a close-on-exec pipe. */
static int spawn_worker(struct coord_engine *g, int r, struct shardlm_err *e)
{
    const struct coord_rank_layout *L = &g->layout.ranks[r];
    char path[PATH_MAX], pid[16], rank[16], node[16], threads[16], cpus[1024];
    worker_path(path, sizeof(path));
    snprintf(pid, sizeof(pid), "%d", (int)getpid());
    snprintf(rank, sizeof(rank), "%d", r);
    snprintf(node, sizeof(node), "%d", L->node);
    snprintf(threads, sizeof(threads), "%d", L->n_cpus);
    seg_cpulist_format(L->cpus, L->n_cpus, cpus, sizeof(cpus));
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC) < 0)
        return shardlm_fail(e, -errno, "pipe: %s", strerror(errno));
    pid_t child = fork();
    if (child < 0) {
        close(pfd[0]);
        close(pfd[1]);
        return shardlm_fail(e, -errno, "fork: %s", strerror(errno));
    }
    if (child == 0) {
        char *argv[] = {path,
                        "--endpoint",
                        g->endpoint,
                        "--rank",
                        rank,
                        "--coordinator-pid",
                        pid,
                        "--node",
                        node,
                        "--cpus",
                        cpus,
                        "--threads",
                        threads,
                        g->keys ? "--keys" : NULL,
                        (char *)g->keys,
                        NULL};
        close(pfd[0]);
        execv(path, argv);
        int err = errno;
        (void)!write(pfd[1], &err, sizeof(err));
        _exit(127);
    }
    close(pfd[1]);
    g->ranks[r].pid = child;
    int err = 0;
    ssize_t n;
    while ((n = read(pfd[0], &err, sizeof(err))) < 0 && errno == EINTR)
        ;
    close(pfd[0]);
    if (n == (ssize_t)sizeof(err))
        return shardlm_fail(e, -err, "cannot start worker %s: %s (set SHARDLM_WORKER to its path)",
                          path, strerror(err));
    return 0;
}

/* Whether rank @r's worker still runs; reaps it and describes its end into @e if not. */
static bool worker_alive(struct coord_engine *g, int r, struct shardlm_err *e)
{
    struct coord_rank *cr = &g->ranks[r];
    if (!cr->pid || cr->reaped)
        return false;
    int st;
    pid_t w = waitpid(cr->pid, &st, WNOHANG);
    if (w == 0)
        return true;
    cr->reaped = true;
    if (w < 0)
        shardlm_fail(e, -ECHILD, "worker rank %d (pid %d) is gone", r, (int)cr->pid);
    else if (WIFSIGNALED(st))
        shardlm_fail(e, -ECHILD, "worker rank %d (pid %d) was killed by signal %d (%s)", r,
                   (int)cr->pid, WTERMSIG(st), strsignal(WTERMSIG(st)));
    else
        shardlm_fail(e, -ECHILD, "worker rank %d (pid %d) exited with status %d", r, (int)cr->pid,
                   WEXITSTATUS(st));
    return false;
}

/* Fails the group: barriers in the exchange stop waiting, so no worker hangs on a dead peer. */
static int fail_group(struct coord_engine *g, int rc)
{
    if (g->exch.base)
        seg_ar_abort(seg_exchange_ar(g->exch.base));
    return rc;
}

/* Receives the next message of case @want from any rank (-1 timeout: as long as all live) and
 * returns its rank in *@rank. Error replies, a death, a signal and anything unexpected end the
 * wait with @e set, after failing the group's barriers. */
static int wait_any(struct coord_engine *g, int want, int timeout_ms, proto_env **out, int *rank,
                    struct shardlm_err *e)
{
    uint64_t deadline = shardlm_now_ns() + (uint64_t)(timeout_ms < 0 ? 0 : timeout_ms) * 1000000ull;
    *out = NULL;
    for (;;) {
        if (coord_stop_signal)
            return fail_group(g, shardlm_fail(e, -EINTR, "interrupted by signal %d",
                                            (int)coord_stop_signal));
        char id[PROTO_MAX_ID];
        size_t idlen = 0;
        proto_env *env;
        int rc = proto_recv(g->sock, 100, id, &idlen, &env);
        if (rc == -EAGAIN || rc == -EINTR) {
            for (int r = 0; r < g->n_ranks; r++)
                if (!worker_alive(g, r, e))
                    return fail_group(g, -ECHILD);
            if (timeout_ms >= 0 && shardlm_now_ns() > deadline)
                return fail_group(g, shardlm_fail(e, -ETIMEDOUT, "workers did not answer within "
                                                "%d ms", timeout_ms));
            continue;
        }
        if (rc == -EBADMSG) {
            fprintf(stderr, "shardlm: dropped a malformed message from a worker\n");
            continue;
        }
        if (rc)
            return fail_group(g, shardlm_fail(e, rc, "receive from workers: %s", zmq_strerror(-rc)));
        int r, v = coord_peer_classify(g->n_ranks, id, idlen, env, want, &r, e);
        if (v > 0) {
            *out = env;
            *rank = r;
            return 0;
        }
        proto_free(env);
        if (v < 0)
            return fail_group(g, v);
        if (e->msg[0]) /* a stranger's message: say so, go on */
            fprintf(stderr, "shardlm: %s\n", e->msg);
    }
}

static int send_to(struct coord_engine *g, int r, proto_env *env, struct shardlm_err *e)
{
    char id[32];
    int len = snprintf(id, sizeof(id), "rank-%d", r);
    int rc = proto_send(g->sock, id, (size_t)len, env);
    if (rc)
        return shardlm_fail(e, rc, "send %s to worker rank %d: %s", proto_case_name(env), r,
                          zmq_strerror(-rc));
    return 0;
}

uint32_t coord_engine_logit_rows(const struct coord_engine *g)
{
    return ((const struct seg_exchange *)g->exch.base)->logit_rows;
}

/* Creates a run segment (KV, exchange): a file "<pid>.<what>" in the runtime directory, or with
 * no_persist a memfd. */
static int run_segment(struct coord_engine *g, bool anon, struct seg *s, const char *what,
                       size_t size, int node, unsigned flags, struct shardlm_err *e)
{
    char path[PATH_MAX];
    if (anon)
        snprintf(path, sizeof(path), "shardlm-%s", what);
    else
        seg_path(path, sizeof(path), g->rundir, getpid(), what);
    int rc = seg_create_on(s, path, size, node, flags | (anon ? SEG_ANON : 0));
    if (rc)
        return shardlm_fail(e, rc, "%s segment (%zu bytes) in %s: %s", what, size,
                          anon ? "a memfd" : g->rundir, strerror(-rc));
    return 0;
}

static int make_segments(struct coord_engine *g, const struct coord_engine_opts *o,
                         struct shardlm_err *e)
{
    const struct shlm_config *c = &g->img.hdr->cfg;
    int group = g->img.hdr->scheme >= SHLM_SCHEME_W4A16 ? (int)g->img.hdr->group : 0, rc;
    uint32_t n_seqs = o->n_seqs ? o->n_seqs : 1;
    char what[32];
    g->anon_segments = o->load.no_persist;
    if ((rc = make_weights(g, o, e)))
        return rc;
    for (int r = 0; r < g->n_ranks; r++) {
        struct seg_plan p;
        seg_plan_make(&p, c, group, g->n_ranks, r);
        uint32_t kvd = (uint32_t)(p.kv1 - p.kv0) * c->head_dim;
        size_t kv_bytes = seg_kv_bytes(n_seqs, c->n_layers, c->seq_len, kvd);
        snprintf(what, sizeof(what), SEG_RUN_KV_FMT, r);
        /* positions are reserved as sequences grow (reserve_kv): a long context costs memory
         * only when it is used */
        if ((rc = run_segment(g, o->load.no_persist, &g->ranks[r].kv, what, kv_bytes,
                              g->layout.ranks[r].node, SEG_LAZY, e)))
            return rc;
        if ((rc = seg_reserve(&g->ranks[r].kv, 0, 64)))
            return shardlm_fail(e, rc, "KV segment of rank %d: %s", r, strerror(-rc));
        seg_kv_init(g->ranks[r].kv.base, n_seqs, c->n_layers, c->seq_len, kvd);
    }
    if (!(g->kv_reserved = calloc(n_seqs, sizeof(*g->kv_reserved))))
        return shardlm_fail(e, -ENOMEM, "out of memory");
    uint32_t rows = LOGITS_BUDGET / (c->vocab_size * 4u);
    rows = rows < 1 ? 1 : rows > c->seq_len ? c->seq_len : rows;
    size_t x_bytes = seg_exchange_bytes(c->seq_len, c->vocab_size, rows, (uint32_t)g->n_ranks,
                                        c->dim);
    /* the logits rows are reserved as steps need them (reserve_logits) */
    if ((rc = run_segment(g, o->load.no_persist, &g->exch, SEG_RUN_EXCHANGE, x_bytes, -1, SEG_LAZY, e)))
        return rc;
    struct seg_exchange x;
    seg_exchange_layout(c->seq_len, c->vocab_size, rows, (uint32_t)g->n_ranks, c->dim, &x);
    if ((rc = seg_reserve(&g->exch, 0, x.logits_off)) ||
        (rc = seg_reserve(&g->exch, x.ar_off, x.bytes - x.ar_off)))
        return shardlm_fail(e, rc, "exchange segment (%zu bytes): %s", x_bytes, strerror(-rc));
    seg_exchange_init(g->exch.base, c->seq_len, c->vocab_size, rows, (uint32_t)g->n_ranks, c->dim);
    return 0;
}

static int open_socket(struct coord_engine *g, const struct coord_access_opts *o,
                       struct shardlm_err *e)
{
    bool loopback = true;
    int rc, one = 1;
    if (o->listen) {
        if ((rc = coord_listen_endpoint(o->listen, g->endpoint, sizeof(g->endpoint), &loopback, e)))
            return rc;
        if (!loopback && !o->keys)
            return shardlm_fail(e, -EPERM,
                              "--listen %s: an address other than loopback needs "
                              "CURVE keys (--keys DIR, made by `shardlm keygen -o DIR`)",
                              o->listen);
    } else {
        seg_path(g->sock_path, sizeof(g->sock_path), g->rundir, getpid(), SEG_RUN_SOCK);
        snprintf(g->endpoint, sizeof(g->endpoint), "ipc://%s", g->sock_path);
    }
    g->zctx = zmq_ctx_new();
    if (!g->zctx || !(g->sock = zmq_socket(g->zctx, ZMQ_ROUTER)) || proto_socket_setup(g->sock) ||
        zmq_setsockopt(g->sock, ZMQ_ROUTER_MANDATORY, &one, sizeof(one)) < 0 ||
        /* a restarted worker reuses its rank's routing id: the new connection takes it over */
        zmq_setsockopt(g->sock, ZMQ_ROUTER_HANDOVER, &one, sizeof(one)) < 0)
        return shardlm_fail(e, -zmq_errno(), "socket: %s", zmq_strerror(zmq_errno()));
    if (o->keys && (rc = coord_curve_start(&g->curve, g->zctx, g->sock, o->keys, e)))
        return rc;
    g->keys = o->keys;
    if (zmq_bind(g->sock, g->endpoint) < 0)
        return shardlm_fail(e, -zmq_errno(), "bind %s: %s", g->endpoint, zmq_strerror(zmq_errno()));
    if (g->sock_path[0]) {
        chmod(g->sock_path, 0600);
    } else { /* the port the kernel chose for :0 */
        size_t len = sizeof(g->endpoint);
        zmq_getsockopt(g->sock, ZMQ_LAST_ENDPOINT, g->endpoint, &len);
    }
    if (g->verbose)
        fprintf(stderr, "coordinator listens on %s%s\n", g->endpoint, g->curve ? " (CURVE)" : "");
    return 0;
}

/* Sends every rank the same message (its own rank filled in by @fill when not NULL). */
static int send_all(struct coord_engine *g, proto_env *env, void (*fill)(proto_env *, int, void *),
                    void *arg, struct shardlm_err *e)
{
    for (int r = 0; r < g->n_ranks; r++) {
        if (fill)
            fill(env, r, arg);
        int rc = send_to(g, r, env, e);
        if (rc)
            return fail_group(g, rc);
    }
    return 0;
}

static void fill_attach(proto_env *env, int r, void *arg)
{
    struct coord_engine *g = arg;
    Shardlm__Attach *a = env->attach;
    a->rank = (uint32_t)r;
    a->weights_path = g->ranks[r].weights.path;
    a->kv_path = g->ranks[r].kv.path;
    a->weights_bytes = g->ranks[r].weights.size;
    a->kv_bytes = g->ranks[r].kv.size;
}

static int handshake(struct coord_engine *g, struct shardlm_err *e)
{
    proto_env *env;
    int rc, r;
    for (int got = 0; got < g->n_ranks;) {
        if ((rc = wait_any(g, SHARDLM__ENVELOPE__MSG_HELLO, HELLO_TIMEOUT_MS, &env, &r, e))) {
            if (rc == -ETIMEDOUT)
                shardlm_fail(e, rc, "%d of %d workers did not say Hello within %d ms",
                           g->n_ranks - got, g->n_ranks, HELLO_TIMEOUT_MS);
            return rc;
        }
        const Shardlm__Hello *h = env->hello;
        if ((rc = coord_peer_hello(h, r, g->ranks[r].hello, e))) {
            proto_free(env);
            return fail_group(g, rc);
        }
        g->ranks[r].hello = true;
        snprintf(g->ranks[r].isa, sizeof(g->ranks[r].isa), "%s", h->isa ? h->isa : "?");
        proto_free(env);
        got++;
    }

    Shardlm__Attach a = SHARDLM__ATTACH__INIT;
    a.n_ranks = (uint32_t)g->n_ranks;
    a.exchange_path = g->exch.path;
    a.exchange_bytes = g->exch.size;
    proto_env out = SHARDLM__ENVELOPE__INIT;
    out.msg_case = SHARDLM__ENVELOPE__MSG_ATTACH;
    out.attach = &a;
    if ((rc = send_all(g, &out, fill_attach, g, e)))
        return rc;
    for (int got = 0; got < g->n_ranks; got++) {
        if ((rc = wait_any(g, SHARDLM__ENVELOPE__MSG_READY, READY_TIMEOUT_MS, &env, &r, e)))
            return rc;
        const Shardlm__Ready *rd = env->ready;
        if ((rc = coord_peer_ready(rd, r, g->ranks[r].ready, e))) {
            proto_free(env);
            return fail_group(g, rc);
        }
        if (g->verbose) {
            /* the layout the worker read back from the kernel; a contract other tools read */
            fprintf(stderr, "rank %d node %d cpus %s pid %d\n", r, rd->node,
                    rd->cpus ? rd->cpus : "?", (int)g->ranks[r].pid);
            fprintf(stderr, "rank %d isa %s threads %u weights %zu bytes kv %zu bytes\n", r,
                    g->ranks[r].isa, rd->threads, g->ranks[r].weights.size, g->ranks[r].kv.size);
        }
        g->ranks[r].ready = true;
        proto_free(env);
    }

    /* one heartbeat round trip to every rank: the control path works, and what it costs */
    uint64_t t0 = shardlm_now_ns();
    Shardlm__Heartbeat hb = SHARDLM__HEARTBEAT__INIT;
    hb.seq = 1;
    out.msg_case = SHARDLM__ENVELOPE__MSG_HEARTBEAT;
    out.heartbeat = &hb;
    if ((rc = send_all(g, &out, NULL, NULL, e)))
        return rc;
    for (int got = 0; got < g->n_ranks; got++) {
        /* wait_any skips heartbeats, so count replies here */
        char id[PROTO_MAX_ID];
        size_t idlen;
        rc = proto_recv(g->sock, HELLO_TIMEOUT_MS, id, &idlen, &env);
        if (rc)
            return fail_group(g, shardlm_fail(e, rc, "no heartbeat from the workers: %s",
                                            strerror(-rc)));
        bool ok = env->msg_case == SHARDLM__ENVELOPE__MSG_HEARTBEAT && env->heartbeat->reply;
        proto_free(env);
        if (!ok)
            return fail_group(g, shardlm_fail(e, -EPROTO, "expected heartbeat replies"));
    }
    if (g->verbose)
        fprintf(stderr, "heartbeat rtt %.1f us for %d ranks\n",
                (double)(shardlm_now_ns() - t0) / 1e3, g->n_ranks);
    return 0;
}

/* One line on stderr: the weight format the workers run, in which layout, on which kernels,
 * and the CPU features that chose them. */
static void print_weight_path(const struct coord_engine *g)
{
    const struct shlm_header *h = g->img.hdr;
    struct kn_cpu cpu;
    char feat[128], scheme[64];
    kn_cpu_probe(&cpu);
    kn_cpu_describe(&cpu, feat, sizeof(feat));
    if (h->scheme >= SHLM_SCHEME_W4A16)
        snprintf(scheme, sizeof(scheme), "%s g%u in tiles, head %s", shlm_scheme_name(h->scheme),
                 h->group, h->head_bits == 8 ? "int8" : "int4");
    else
        snprintf(scheme, sizeof(scheme), "%s", shlm_scheme_name(h->scheme));
    fprintf(stderr, "shardlm: weights %s; kernels %s (cpu: %s)\n", scheme, g->ranks[0].isa, feat);
}

int coord_engine_start(struct coord_engine *g, const struct coord_engine_opts *o,
                       struct shardlm_err *e)
{
    memset(g, 0, sizeof(*g));
    g->file.fd = -1;
    g->max_restarts = o->restarts < 0 ? 0 : o->restarts ? o->restarts : COORD_RESTARTS;
    g->stats.start_ns = shardlm_now_ns();
    g->verbose = o->verbose;
    /* what can be checked is, before anything is created */
    const char *isa = getenv("SHARDLM_ISA");
    char err[256];
    if (isa && *isa && !kn_ops_find(isa, err, sizeof(err)))
        return shardlm_fail(e, -ENOTSUP, "SHARDLM_ISA=%s: %s", isa, err);
    int rc = seg_rundir_path(g->rundir, sizeof(g->rundir));
    if (rc)
        return shardlm_fail(e, rc, "SHARDLM_RUNTIME_DIR is set but empty");
    if (!o->access.listen) { /* the workers' socket: an AF_UNIX path has 107 bytes at most */
        char sock[PATH_MAX];
        seg_path(sock, sizeof(sock), g->rundir, getpid(), SEG_RUN_SOCK);
        if (strlen(sock) >= sizeof(((struct sockaddr_un *)0)->sun_path))
            return shardlm_fail(e, -ENAMETOOLONG, "runtime directory %s: too long a path for the "
                              "workers' socket (%zu bytes, at most %zu); choose a shorter "
                              "SHARDLM_RUNTIME_DIR or --listen tcp", g->rundir, strlen(sock),
                              sizeof(((struct sockaddr_un *)0)->sun_path) - 1);
    }
    if ((rc = coord_layout_make(&g->layout, &o->layout, e)))
        return rc;
    if ((rc = coord_model_open(&g->file, o->model_path, e)))
        goto out_fail;
    g->made_rundir = access(g->rundir, F_OK) < 0;
    rc = seg_rundir(g->rundir, sizeof(g->rundir));
    if (rc) {
        shardlm_fail(e, rc, "runtime directory %s: %s", g->rundir,
                   rc == -EPERM ? "not a private directory owned by this user" : strerror(-rc));
        goto out_fail;
    }
    seg_clean_stale(g->rundir);
    g->img = g->file.img;
    const struct shlm_config *c = &g->img.hdr->cfg;
    g->n_ranks = g->layout.n_ranks;
    if ((uint32_t)g->n_ranks > c->n_heads) {
        rc = shardlm_fail(e, -EINVAL, "%d workers: more than the model's %u attention heads",
                        g->n_ranks, c->n_heads);
        goto out_fail;
    }
    g->ranks = calloc((size_t)g->n_ranks, sizeof(*g->ranks));
    if (!g->ranks) {
        rc = shardlm_fail(e, -ENOMEM, "out of memory");
        goto out_fail;
    }
    if ((rc = make_segments(g, o, e)) || (rc = open_socket(g, &o->access, e)))
        goto out_fail;
    for (int r = 0; r < g->n_ranks; r++)
        if ((rc = spawn_worker(g, r, e)))
            goto out_fail;
    if (o->while_starting && (rc = o->while_starting(g, o->arg, e)))
        goto out_fail;
    if ((rc = handshake(g, e)))
        goto out_fail;
    g->stats.ready_ns = shardlm_now_ns();
    coord_engine_sample(g);
    print_weight_path(g);
    return 0;
out_fail:
    coord_engine_stop(g);
    if (g->made_rundir)
        rmdir(g->rundir); /* only if empty: a segment another start published stays */
    return rc;
}

/* Reserves the KV memory of sequence @seq for positions below @need on every rank, a step of
 * KV_RESERVE_STEP positions at a time: a full tmpfs is an error here, not SIGBUS in a worker. */
static int reserve_kv(struct coord_engine *g, uint32_t seq, uint32_t need, struct shardlm_err *e)
{
    uint32_t have = g->kv_reserved[seq];
    if (need <= have)
        return 0;
    const struct seg_kv *h0 = g->ranks[0].kv.base;
    uint32_t upto = (need + KV_RESERVE_STEP - 1) / KV_RESERVE_STEP * KV_RESERVE_STEP;
    upto = upto < h0->seq_len ? upto : h0->seq_len;
    for (int r = 0; r < g->n_ranks; r++) {
        struct seg *kv = &g->ranks[r].kv;
        size_t row = (size_t)((const struct seg_kv *)kv->base)->kv_dim * sizeof(float);
        for (uint32_t l = 0; l < h0->n_layers; l++)
            for (int v = 0; v < 2; v++) {
                const float *p =
                    v ? seg_kv_values(kv->base, seq, l) : seg_kv_keys(kv->base, seq, l);
                size_t off = (size_t)((const char *)p - (const char *)kv->base) + have * row;
                int rc = seg_reserve(kv, off, (upto - have) * row);
                if (rc)
                    return shardlm_fail(e, rc,
                                      "KV cache of rank %d: no memory for positions %u..%u "
                                      "of sequence %u in %s: %s",
                                      r, have, upto - 1, seq,
                                      g->anon_segments ? "a memfd" : g->rundir, strerror(-rc));
            }
    }
    g->kv_reserved[seq] = upto;
    return 0;
}

/* Reserves the exchange segment's logits rows below @rows. */
static int reserve_logits(struct coord_engine *g, uint32_t rows, struct shardlm_err *e)
{
    const struct seg_exchange *x = g->exch.base;
    if (rows <= g->logits_reserved)
        return 0;
    size_t row = (size_t)x->vocab * sizeof(float);
    int rc = seg_reserve(&g->exch, x->logits_off + g->logits_reserved * row,
                         (rows - g->logits_reserved) * row);
    if (rc)
        return shardlm_fail(e, rc, "exchange segment: no memory for %u rows of logits in %s: %s",
                          rows, g->anon_segments ? "a memfd" : g->rundir, strerror(-rc));
    g->logits_reserved = rows;
    return 0;
}

/* True when some worker has died (reaped, described into @e). */
static bool any_dead(struct coord_engine *g, struct shardlm_err *e)
{
    bool dead = false;
    for (int r = 0; r < g->n_ranks; r++)
        dead |= !worker_alive(g, r, e);
    return dead;
}

/* Sends step @st to every rank and waits for all of them to finish it. -ECHILD when a worker
 * died (whatever else the survivors said about it first), else 0 or -errno with @e set. */
static int run_step(struct coord_engine *g, Shardlm__Step *st, struct shardlm_err *e)
{
    proto_env env = SHARDLM__ENVELOPE__INIT;
    env.msg_case = SHARDLM__ENVELOPE__MSG_STEP;
    env.step = st;
    for (int r = 0; r < g->n_ranks; r++)
        g->ranks[r].done = false;
    int rc = send_all(g, &env, NULL, NULL, e);
    for (int got = 0; !rc && got < g->n_ranks; got++) {
        proto_env *in;
        int r;
        if ((rc = wait_any(g, SHARDLM__ENVELOPE__MSG_STEP_DONE, -1, &in, &r, e)))
            break;
        const Shardlm__StepDone *d = in->step_done;
        if ((rc = coord_peer_step_done(d, r, st->step_id, g->ranks[r].done, e))) {
            fail_group(g, rc);
            proto_free(in);
            break;
        }
        g->ranks[r].done = true;
        g->ranks[r].compute_ns = d->compute_ns;
        g->ranks[r].allreduce_ns = d->allreduce_ns;
        proto_free(in);
    }
    if (rc && rc != -ECHILD && rc != -EINTR && any_dead(g, e))
        rc = fail_group(g, -ECHILD); /* the survivors' complaints follow from the death */
    return rc;
}

/* After a worker died in a step: the survivors give the step up (abort flag; a heartbeat each
 * answers once they are idle), the dead are started again on their CPUs, the all-reduce area is
 * reset, and every rank attaches to it again - the new ones with Attach (the same segments: no
 * reload), the others with Rejoin. Returns 0 when all are Ready. */
static int recover(struct coord_engine *g, struct shardlm_err *e)
{
    fail_group(g, 0);
    Shardlm__Heartbeat hb = SHARDLM__HEARTBEAT__INIT;
    hb.seq = ++g->heartbeat_seq;
    proto_env env = SHARDLM__ENVELOPE__INIT;
    env.msg_case = SHARDLM__ENVELOPE__MSG_HEARTBEAT;
    env.heartbeat = &hb;
    struct shardlm_err ignore;
    for (int r = 0; r < g->n_ranks; r++)
        g->ranks[r].done = !worker_alive(g, r, &ignore) || send_to(g, r, &env, &ignore);
    uint64_t deadline = shardlm_now_ns() + (uint64_t)HELLO_TIMEOUT_MS * 1000000ull;
    for (;;) {
        bool idle = true;
        for (int r = 0; r < g->n_ranks; r++)
            idle &= g->ranks[r].done || !worker_alive(g, r, &ignore);
        if (idle)
            break;
        if (shardlm_now_ns() > deadline)
            return shardlm_fail(e, -ETIMEDOUT,
                              "the surviving workers did not give up the failed "
                              "step within %d ms",
                              HELLO_TIMEOUT_MS);
        char id[PROTO_MAX_ID];
        size_t idlen = 0;
        proto_env *in;
        if (proto_recv(g->sock, 100, id, &idlen, &in))
            continue;
        int r = coord_peer_rank(id, idlen, g->n_ranks);
        if (r >= 0 && in->msg_case == SHARDLM__ENVELOPE__MSG_HEARTBEAT && in->heartbeat->reply &&
            in->heartbeat->seq == hb.seq)
            g->ranks[r].done = true; /* everything it sent for the failed step came before */
        proto_free(in);
    }
    bool *fresh = calloc((size_t)g->n_ranks, sizeof(*fresh));
    if (!fresh)
        return shardlm_fail(e, -ENOMEM, "out of memory");
    int rc = 0, n_fresh = 0;
    for (int r = 0; r < g->n_ranks && !rc; r++) {
        struct coord_rank *cr = &g->ranks[r];
        if (worker_alive(g, r, &ignore))
            continue;
        cr->pid = 0;
        cr->reaped = cr->hello = cr->ready = false;
        fresh[r] = true;
        n_fresh++;
        rc = spawn_worker(g, r, e);
    }
    const struct shlm_config *c = &g->img.hdr->cfg;
    seg_ar_init(seg_exchange_ar(g->exch.base), g->n_ranks, (size_t)SEG_MAX_CHUNK * c->dim);
    for (int got = 0; !rc && got < n_fresh; got++) {
        proto_env *in;
        int r;
        if ((rc = wait_any(g, SHARDLM__ENVELOPE__MSG_HELLO, HELLO_TIMEOUT_MS, &in, &r, e)))
            break;
        rc = coord_peer_hello(in->hello, r, g->ranks[r].hello || !fresh[r], e);
        g->ranks[r].hello = true;
        proto_free(in);
    }
    Shardlm__Attach a = SHARDLM__ATTACH__INIT;
    a.n_ranks = (uint32_t)g->n_ranks;
    a.exchange_path = g->exch.path;
    a.exchange_bytes = g->exch.size;
    Shardlm__Rejoin j = SHARDLM__REJOIN__INIT;
    for (int r = 0; r < g->n_ranks; r++)
        g->ranks[r].ready = false;
    for (int r = 0; r < g->n_ranks && !rc; r++) {
        env = (proto_env)SHARDLM__ENVELOPE__INIT;
        if (fresh[r]) {
            env.msg_case = SHARDLM__ENVELOPE__MSG_ATTACH;
            env.attach = &a;
            fill_attach(&env, r, g);
        } else {
            j.rank = (uint32_t)r;
            env.msg_case = SHARDLM__ENVELOPE__MSG_REJOIN;
            env.rejoin = &j;
        }
        rc = send_to(g, r, &env, e);
    }
    for (int got = 0; !rc && got < g->n_ranks; got++) {
        proto_env *in;
        int r;
        if ((rc = wait_any(g, SHARDLM__ENVELOPE__MSG_READY, READY_TIMEOUT_MS, &in, &r, e)))
            break;
        rc = coord_peer_ready(in->ready, r, g->ranks[r].ready, e);
        g->ranks[r].ready = true;
        proto_free(in);
    }
    free(fresh);
    return rc;
}

int coord_engine_step(struct coord_engine *g, struct coord_seq_step *seqs, int n,
                      struct shardlm_err *e)
{
    const struct seg_exchange *x = g->exch.base;
    const struct seg_kv *kv = g->ranks[0].kv.base;
    if (n < 1 || (uint32_t)n > kv->n_seqs)
        return shardlm_fail(e, -EINVAL, "a step carries 1..%u sequences, not %d", kv->n_seqs, n);
    Shardlm__StepSeq *sq = calloc((size_t)n, sizeof(*sq));
    Shardlm__StepSeq **sp = calloc((size_t)n, sizeof(*sp));
    if (!sq || !sp) {
        free(sq);
        free(sp);
        return shardlm_fail(e, -ENOMEM, "out of memory");
    }
    int32_t *tok = seg_exchange_tokens(g->exch.base);
    uint32_t tokens = 0, rows = 0;
    int rc = 0;
    for (int i = 0; i < n; i++) {
        struct coord_seq_step *s = &seqs[i];
        uint32_t r = s->all_logits ? s->n_tokens : 1;
        if (s->n_tokens == 0 || s->n_tokens > x->max_tokens - tokens ||
            r > x->logit_rows - rows) {
            rc = shardlm_fail(e, -E2BIG, "step too large for the exchange segment");
            goto out;
        }
        if (s->seq_id >= kv->n_seqs) {
            rc = shardlm_fail(e, -EINVAL, "sequence %u: the KV cache has %u slots", s->seq_id,
                            kv->n_seqs);
            goto out;
        }
        if ((rc = reserve_kv(g, s->seq_id, s->pos + s->n_tokens, e)))
            goto out;
        shardlm__step_seq__init(&sq[i]);
        sq[i].seq_id = s->seq_id;
        sq[i].pos = s->pos;
        sq[i].n_tokens = s->n_tokens;
        sq[i].token_offset = tokens;
        sq[i].all_logits = s->all_logits;
        sq[i].logits_row = rows;
        sp[i] = &sq[i];
        memcpy(tok + tokens, s->tokens, (size_t)s->n_tokens * sizeof(int32_t));
        s->logits = seg_exchange_logits(g->exch.base) + (size_t)rows * x->vocab;
        tokens += s->n_tokens;
        rows += r;
    }
    if ((rc = reserve_logits(g, rows, e)))
        goto out;
    Shardlm__Step st = SHARDLM__STEP__INIT;
    st.kind = tokens > (uint32_t)n ? SHARDLM__STEP_KIND__STEP_PREFILL : SHARDLM__STEP_KIND__STEP_DECODE;
    st.n_seqs = (size_t)n;
    st.seqs = sp;
    uint64_t t0 = shardlm_now_ns();
    for (int attempt = 0;; attempt++) {
        st.step_id = ++g->step_id;
        if (!(rc = run_step(g, &st, e)))
            break;
        /* a worker died: restart it on its CPUs over the same segments and run the step again
         * (its KV rows for these positions are rewritten with the same values) */
        if (rc != -ECHILD || attempt >= g->max_restarts || coord_stop_signal)
            goto out;
        char why[sizeof(e->msg)];
        snprintf(why, sizeof(why), "%s", e->msg);
        uint64_t r0 = shardlm_now_ns();
        if ((rc = recover(g, e)))
            goto out;
        fprintf(stderr,
                "shardlm: %s during step %llu; restarted in %.1f ms, running the step "
                "again\n",
                why, (unsigned long long)st.step_id, (double)(shardlm_now_ns() - r0) / 1e6);
    }
    g->last_wall_ns = shardlm_now_ns() - t0;
    if (g->verbose) {
        uint64_t ar = 0;
        for (int r = 0; r < g->n_ranks; r++)
            ar = g->ranks[r].allreduce_ns > ar ? g->ranks[r].allreduce_ns : ar;
        fprintf(stderr, "step %llu %s tokens %u wall %.3f ms allreduce %.3f ms compute",
                (unsigned long long)st.step_id, tokens > (uint32_t)n ? "prefill" : "decode",
                tokens, (double)g->last_wall_ns / 1e6, (double)ar / 1e6);
        for (int r = 0; r < g->n_ranks; r++)
            fprintf(stderr, " r%d %.3f", r, (double)g->ranks[r].compute_ns / 1e6);
        fprintf(stderr, " ms\n");
    }
out:
    free(sq);
    free(sp);
    return rc;
}

void coord_engine_sample(struct coord_engine *g)
{
    uint64_t a = coord_rss_anon(0);
    g->stats.peak_anon = a > g->stats.peak_anon ? a : g->stats.peak_anon;
    for (int r = 0; g->ranks && r < g->n_ranks; r++) {
        struct coord_rank *cr = &g->ranks[r];
        a = cr->pid && !cr->reaped ? coord_rss_anon(cr->pid) : 0;
        cr->peak_anon = a > cr->peak_anon ? a : cr->peak_anon;
    }
}

void coord_engine_print_stats(struct coord_engine *g, uint64_t first_token_ns, FILE *f)
{
    const struct coord_engine_stats *st = &g->stats;
    double secs = (double)(st->ready_ns - st->start_ns) / 1e9;
    coord_engine_sample(g);
    if (st->built)
        fprintf(f,
                "shardlm: load: %d weights segment%s built from %s: %llu bytes read in %.3f s "
                "(%.2f GB/s), %s\n",
                st->built, st->built > 1 ? "s" : "", g->file.path,
                (unsigned long long)st->load.bytes, (double)st->load.ns / 1e9,
                (double)st->load.bytes / (double)(st->load.ns ? st->load.ns : 1), st->load.io);
    if (st->reused)
        fprintf(f, "shardlm: load: %d weights segment%s found complete in %s (warm start)\n",
                st->reused, st->reused > 1 ? "s" : "", g->rundir);
    uint64_t w = 0, kv = 0;
    for (int r = 0; r < g->n_ranks; r++) {
        w += g->ranks[r].weights.size;
        kv += g->ranks[r].kv.size;
    }
    uint64_t total = w + kv + g->exch.size, anon = st->peak_anon;
    fprintf(f, "shardlm: segments: weights %llu, kv %llu, exchange %llu: %llu bytes\n",
            (unsigned long long)w, (unsigned long long)kv, (unsigned long long)g->exch.size,
            (unsigned long long)total);
    fprintf(f, "shardlm: peak anonymous memory: coordinator %.1f MiB", (double)anon / 1048576.0);
    for (int r = 0; r < g->n_ranks; r++) {
        fprintf(f, ", rank %d %.1f MiB", r, (double)g->ranks[r].peak_anon / 1048576.0);
        anon += g->ranks[r].peak_anon;
    }
    fprintf(f, "; %.1f MiB in all\n", (double)anon / 1048576.0);
    fprintf(f, "shardlm: start to workers ready %.3f s", secs);
    if (first_token_ns)
        fprintf(f, ", to the first token %.3f s", (double)(first_token_ns - st->start_ns) / 1e9);
    fprintf(f, "\n");
    fprintf(f, "load segments_bytes=%llu peak_anon_bytes=%llu seconds=%.3f\n",
            (unsigned long long)total, (unsigned long long)anon, secs);
}

void coord_engine_stop(struct coord_engine *g)
{
    struct shardlm_err ignore;
    if (g->ranks) {
        fail_group(g, 0); /* nobody may wait on a barrier for a peer that is shutting down */
        Shardlm__Shutdown s = SHARDLM__SHUTDOWN__INIT;
        s.reason = "coordinator exiting";
        proto_env env = SHARDLM__ENVELOPE__INIT;
        env.msg_case = SHARDLM__ENVELOPE__MSG_SHUTDOWN;
        env.shutdown = &s;
        for (int r = 0; r < g->n_ranks; r++) {
            if (!worker_alive(g, r, &ignore))
                continue;
            if (g->sock && g->ranks[r].hello)
                send_to(g, r, &env, &ignore);
            else /* not connected yet (a start stopped early): no message can reach it */
                kill(g->ranks[r].pid, SIGTERM);
        }
        for (int waited = 0; waited < SHUTDOWN_GRACE_MS; waited += 10) {
            bool any = false;
            for (int r = 0; r < g->n_ranks; r++)
                any |= worker_alive(g, r, &ignore);
            if (!any)
                break;
            sleep_ms(10);
        }
        for (int r = 0; r < g->n_ranks; r++)
            if (worker_alive(g, r, &ignore)) {
                kill(g->ranks[r].pid, SIGKILL);
                waitpid(g->ranks[r].pid, NULL, 0);
                g->ranks[r].reaped = true;
            }
    }
    if (g->sock)
        zmq_close(g->sock);
    if (g->zctx)
        zmq_ctx_term(g->zctx); /* ends the ZAP handler, which closes its socket */
    coord_curve_stop(g->curve);
    g->curve = NULL;
    g->sock = g->zctx = NULL;
    if (g->sock_path[0])
        unlink(g->sock_path);
    for (int r = 0; g->ranks && r < g->n_ranks; r++) {
        seg_free(&g->ranks[r].weights);
        seg_free(&g->ranks[r].kv);
    }
    seg_free(&g->exch);
    free(g->kv_reserved);
    g->kv_reserved = NULL;
    free(g->ranks);
    g->ranks = NULL;
    coord_model_close(&g->file);
    coord_layout_free(&g->layout);
    if (g->rundir[0])
        seg_clean_pid(g->rundir, getpid());
}
