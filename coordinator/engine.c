/* coordinator/: model segment, worker lifecycle and steps. */
#include "engine.h"

#include "allreduce.h"
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
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#define HELLO_TIMEOUT_MS 10000
#define READY_TIMEOUT_MS 60000
#define SHUTDOWN_GRACE_MS 2000
#define LOGITS_BUDGET (64u << 20) /* bytes of logits one step may return */

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

/* Maps the .shlm file read-only and verifies it whole (structure, then every checksum). */
static int open_model(struct coord_engine *g, const char *path, struct coord_err *e)
{
    struct stat st;
    struct shlm_header h;
    int rc, fd = coord_open_regular(path, &st, e);
    if (fd < 0)
        return fd;
    if (st.st_size < (off_t)sizeof(h) || pread(fd, &h, sizeof(h), 0) != (ssize_t)sizeof(h)) {
        rc = coord_fail(e, -EINVAL, "%s: truncated: %lld bytes, shorter than the .shlm header",
                        path, (long long)st.st_size);
        goto out_close;
    }
    if (memcmp(h.magic, SHLM_MAGIC, sizeof(SHLM_MAGIC)) != 0) {
        rc = coord_fail(e, -EINVAL, "%s: not a .shlm file (convert it with `shardlm convert`)",
                        path);
        goto out_close;
    }
    /* FIXME: a file truncated while mapped raises SIGBUS; the streaming load reads instead */
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
        rc = coord_fail(e, -errno, "%s: mmap: %s", path, strerror(errno));
        goto out_close;
    }
    g->file_map = map;
    g->file_bytes = (size_t)st.st_size;
    char err[512];
    if ((rc = shlm_parse(&g->img, map, g->file_bytes, path, err, sizeof(err))) ||
        (rc = shlm_verify_data(&g->img, path, err, sizeof(err))))
        coord_fail(e, rc, "%s", err);
    else if (g->img.hdr->shard_count)
        rc = coord_fail(e, -EINVAL, "%s: a weights segment, not a model file", path);
out_close:
    close(fd);
    return rc;
}

/* Rows [r0, r1) of tensor @name of the shard, the slice of @src that the rank's plan says,
 * into @dst in the canonical layout. */
static void shard_rows(const struct kn_mat *src, const char *name, const struct seg_plan *p, int hd,
                       int r0, int r1, void *dst)
{
    const char *part = strrchr(name, '.');
    part = part ? part + 1 : name;
    struct kn_mat rows;
    kn_mat_rows(src, r0, r1, &rows);
    if (!strcmp(part, "attn_q"))
        kn_repack_rows(src, p->q0 * hd + r0, p->q0 * hd + r1, dst);
    else if (!strcmp(part, "attn_k") || !strcmp(part, "attn_v"))
        kn_repack_rows(src, p->kv0 * hd + r0, p->kv0 * hd + r1, dst);
    else if (!strcmp(part, "ffn_gate") || !strcmp(part, "ffn_up"))
        kn_repack_rows(src, p->f0 + r0, p->f0 + r1, dst);
    else if (!strcmp(part, "attn_o"))
        kn_repack_cols(&rows, p->q0 * hd, p->q1 * hd, p->o_pad, dst);
    else if (!strcmp(part, "ffn_down"))
        kn_repack_cols(&rows, p->f0, p->f1, p->down_pad, dst);
    else if (!strcmp(part, "attn_q_bias")) /* (1, q_dim): our heads' columns */
        kn_repack_cols(&rows, p->q0 * hd, p->q1 * hd, 0, dst);
    else if (!strcmp(part, "attn_k_bias") || !strcmp(part, "attn_v_bias"))
        kn_repack_cols(&rows, p->kv0 * hd, p->kv1 * hd, 0, dst);
    else if (!strcmp(part, "attn_gate")) /* (heads, dim): our heads' rows */
        kn_repack_rows(src, p->q0 + r0, p->q0 + r1, dst);
    else if (!strcmp(part, "output"))
        kn_repack_rows(src, p->v0 + r0, p->v0 + r1, dst);
    else /* replicated: embedding, norms */
        kn_repack_rows(src, r0, r1, dst);
}

/* Rows per step of the tile repack: the canonical slice of this many rows is the only copy. */
#define TILE_STEP_ROWS 256

/* Writes tensor @t of the shard (its table entry) at @dst: the canonical slice, or for a tiled
 * tensor the slice TILE_STEP_ROWS rows at a time through @tmp into tiles. */
static void shard_tensor(const struct kn_mat *src, const struct shlm_tensor *t,
                         const struct seg_plan *p, int hd, void *tmp, uint8_t *dst)
{
    int rows = (int)t->rows, cols = (int)t->cols, group = (int)t->group;
    if (!kn_is_tiled((enum kn_dtype)t->dtype)) {
        shard_rows(src, t->name, p, hd, 0, rows, dst);
        return;
    }
    size_t bb = kn_tile_block_bytes((enum kn_dtype)t->dtype, cols, group);
    for (int r = 0; r < rows; r += TILE_STEP_ROWS) {
        int n = rows - r < TILE_STEP_ROWS ? rows - r : TILE_STEP_ROWS;
        struct kn_mat slice;
        shard_rows(src, t->name, p, hd, r, r + n, tmp);
        kn_mat_view(&slice, src->dtype, n, cols, group, tmp);
        kn_repack_tiles(&slice, 0, (n + KN_TILE_ROWS - 1) / KN_TILE_ROWS,
                        dst + (size_t)(r / KN_TILE_ROWS) * bb);
    }
}

/* Builds rank @r's weights segment on its node: the shard image in the .shlm layout. */
static int build_shard(struct coord_engine *g, int r, struct coord_err *e)
{
    const struct shlm_header *fh = g->img.hdr;
    const struct shlm_config *c = &fh->cfg;
    struct seg_plan plan;
    int group = fh->scheme >= SHLM_SCHEME_W4A16 ? (int)fh->group : 0, rc;
    if (seg_plan_make(&plan, c, group, g->n_ranks, r))
        return coord_fail(e, -EINVAL, "cannot split the model over %d ranks", g->n_ranks);
    struct shlm_tensor_spec *specs = calloc(SHLM_MAX_TENSORS, sizeof(*specs));
    struct shlm_tensor *table = calloc(SHLM_MAX_TENSORS, sizeof(*table));
    struct shlm_header h = *fh;
    void *tmp = NULL;
    if (!specs || !table) {
        rc = coord_fail(e, -ENOMEM, "out of memory");
        goto out;
    }
    int n = shlm_expected_tensors(c, (enum shlm_scheme)fh->scheme, (int)fh->group,
                                  (int)fh->head_bits, &plan, specs, SHLM_MAX_TENSORS);
    KN_ASSERT(n > 0); /* the file's header passed the same check */
    /* int4 matrices go to the workers in tiles: every kernel table runs them, faster */
    enum shlm_layout layout =
        fh->scheme >= SHLM_SCHEME_W4A16 ? SHLM_LAYOUT_TILES : SHLM_LAYOUT_CANONICAL;
    size_t tmp_bytes = 0;
    for (int i = 0; i < n; i++) {
        enum kn_dtype canon = specs[i].dtype;
        specs[i].dtype = shlm_layout_dtype(canon, layout);
        if (kn_is_tiled(specs[i].dtype)) {
            size_t b = kn_mat_bytes(canon, TILE_STEP_ROWS, specs[i].cols, specs[i].group);
            tmp_bytes = b > tmp_bytes ? b : tmp_bytes;
        }
    }
    if (tmp_bytes && !(tmp = malloc(tmp_bytes))) {
        rc = coord_fail(e, -ENOMEM, "out of memory");
        goto out;
    }
    shlm_layout(&h, table, specs, n, fh->tok_bytes);
    h.layout = layout;
    h.shard_rank = (uint32_t)r;
    h.shard_count = (uint32_t)g->n_ranks;
    char path[PATH_MAX], what[32];
    snprintf(what, sizeof(what), "weights.r%d", r);
    seg_path(path, sizeof(path), g->rundir, getpid(), what);
    struct coord_rank *cr = &g->ranks[r];
    if ((rc = seg_create_on(&cr->weights, path, h.file_bytes, g->layout.ranks[r].node))) {
        coord_fail(e, rc, "weights segment %s (%llu bytes): %s", path,
                   (unsigned long long)h.file_bytes, strerror(-rc));
        goto out;
    }
    uint8_t *base = cr->weights.base;
    for (int i = 0; i < n; i++) {
        struct kn_mat src;
        shlm_view(&g->img, shlm_find(&g->img, table[i].name), &src);
        shard_tensor(&src, &table[i], &plan, (int)c->head_dim, tmp, base + table[i].offset);
        table[i].checksum = shlm_hash(base + table[i].offset, table[i].bytes);
    }
    memcpy(base + h.tok_offset, g->img.base + fh->tok_offset, fh->tok_bytes);
    memcpy(base + h.table_offset, table, (size_t)n * sizeof(*table));
    shlm_seal(&h, table);
    memcpy(base, &h, sizeof(h));
out:
    free(tmp);
    free(specs);
    free(table);
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
static int spawn_worker(struct coord_engine *g, int r, struct coord_err *e)
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
        return coord_fail(e, -errno, "pipe: %s", strerror(errno));
    pid_t child = fork();
    if (child < 0) {
        close(pfd[0]);
        close(pfd[1]);
        return coord_fail(e, -errno, "fork: %s", strerror(errno));
    }
    if (child == 0) {
        char *argv[] = {path,   "--endpoint", g->endpoint, "--rank",    rank,    "--coordinator-pid",
                        pid,    "--node",     node,        "--cpus",    cpus,    "--threads",
                        threads, NULL};
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
        return coord_fail(e, -err, "cannot start worker %s: %s (set SHARDLM_WORKER to its path)",
                          path, strerror(err));
    return 0;
}

/* Whether rank @r's worker still runs; reaps it and describes its end into @e if not. */
static bool worker_alive(struct coord_engine *g, int r, struct coord_err *e)
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
        coord_fail(e, -ECHILD, "worker rank %d (pid %d) is gone", r, (int)cr->pid);
    else if (WIFSIGNALED(st))
        coord_fail(e, -ECHILD, "worker rank %d (pid %d) was killed by signal %d (%s)", r,
                   (int)cr->pid, WTERMSIG(st), strsignal(WTERMSIG(st)));
    else
        coord_fail(e, -ECHILD, "worker rank %d (pid %d) exited with status %d", r, (int)cr->pid,
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

/* Rank of a routing id "rank-<r>", or -1. */
static int id_rank(const struct coord_engine *g, const char *id, size_t len)
{
    char buf[PROTO_MAX_ID + 1];
    memcpy(buf, id, len);
    buf[len] = 0;
    int r, used = 0;
    if (sscanf(buf, "rank-%d%n", &r, &used) != 1 || (size_t)used != len || r < 0 ||
        r >= g->n_ranks)
        return -1;
    return r;
}

/* Receives the next message of case @want from any rank (-1 timeout: as long as all live) and
 * returns its rank in *@rank. Error replies, a death, a signal and anything unexpected end the
 * wait with @e set, after failing the group's barriers. */
static int wait_any(struct coord_engine *g, int want, int timeout_ms, proto_env **out, int *rank,
                    struct coord_err *e)
{
    uint64_t deadline = coord_now_ns() + (uint64_t)(timeout_ms < 0 ? 0 : timeout_ms) * 1000000ull;
    *out = NULL;
    for (;;) {
        if (coord_stop_signal)
            return fail_group(g, coord_fail(e, -EINTR, "interrupted by signal %d",
                                            (int)coord_stop_signal));
        char id[PROTO_MAX_ID];
        size_t idlen = 0;
        proto_env *env;
        int rc = proto_recv(g->sock, 100, id, &idlen, &env);
        if (rc == -EAGAIN || rc == -EINTR) {
            for (int r = 0; r < g->n_ranks; r++)
                if (!worker_alive(g, r, e))
                    return fail_group(g, -ECHILD);
            if (timeout_ms >= 0 && coord_now_ns() > deadline)
                return fail_group(g, coord_fail(e, -ETIMEDOUT, "workers did not answer within "
                                                "%d ms", timeout_ms));
            continue;
        }
        if (rc == -EBADMSG) {
            fprintf(stderr, "shardlm: dropped a malformed message from a worker\n");
            continue;
        }
        if (rc)
            return fail_group(g, coord_fail(e, rc, "receive from workers: %s", zmq_strerror(-rc)));
        int r = id_rank(g, id, idlen);
        if (r < 0) {
            fprintf(stderr, "shardlm: dropped %s from an unknown peer\n", proto_case_name(env));
            proto_free(env);
            continue;
        }
        if ((int)env->msg_case == want) {
            *out = env;
            *rank = r;
            return 0;
        }
        if (env->msg_case == SHARDLM__ENVELOPE__MSG_HEARTBEAT) {
            proto_free(env);
            continue;
        }
        if (env->msg_case == SHARDLM__ENVELOPE__MSG_ERROR)
            rc = coord_fail(e, env->error->code < 0 ? env->error->code : -EPROTO,
                            "worker rank %d: %s", r, env->error->message);
        else
            rc = coord_fail(e, -EPROTO, "worker rank %d sent %s out of turn", r,
                            proto_case_name(env));
        proto_free(env);
        return fail_group(g, rc);
    }
}

static int send_to(struct coord_engine *g, int r, proto_env *env, struct coord_err *e)
{
    char id[32];
    int len = snprintf(id, sizeof(id), "rank-%d", r);
    int rc = proto_send(g->sock, id, (size_t)len, env);
    if (rc)
        return coord_fail(e, rc, "send %s to worker rank %d: %s", proto_case_name(env), r,
                          zmq_strerror(-rc));
    return 0;
}

uint32_t coord_engine_logit_rows(const struct coord_engine *g)
{
    return ((const struct seg_exchange *)g->exch.base)->logit_rows;
}

static int make_segments(struct coord_engine *g, uint32_t n_seqs, struct coord_err *e)
{
    const struct shlm_config *c = &g->img.hdr->cfg;
    int group = g->img.hdr->scheme >= SHLM_SCHEME_W4A16 ? (int)g->img.hdr->group : 0, rc;
    char path[PATH_MAX], what[32];
    for (int r = 0; r < g->n_ranks; r++) {
        if ((rc = build_shard(g, r, e)))
            return rc;
        struct seg_plan p;
        seg_plan_make(&p, c, group, g->n_ranks, r);
        uint32_t kvd = (uint32_t)(p.kv1 - p.kv0) * c->head_dim;
        size_t kv_bytes = seg_kv_bytes(n_seqs, c->n_layers, c->seq_len, kvd);
        snprintf(what, sizeof(what), "kv.r%d", r);
        seg_path(path, sizeof(path), g->rundir, getpid(), what);
        if ((rc = seg_create_on(&g->ranks[r].kv, path, kv_bytes, g->layout.ranks[r].node)))
            return coord_fail(e, rc, "KV segment %s (%zu bytes): %s", path, kv_bytes,
                              strerror(-rc));
        seg_kv_init(g->ranks[r].kv.base, n_seqs, c->n_layers, c->seq_len, kvd);
    }
    uint32_t rows = LOGITS_BUDGET / (c->vocab_size * 4u);
    rows = rows < 1 ? 1 : rows > c->seq_len ? c->seq_len : rows;
    size_t x_bytes = seg_exchange_bytes(c->seq_len, c->vocab_size, rows, (uint32_t)g->n_ranks,
                                        c->dim);
    seg_path(path, sizeof(path), g->rundir, getpid(), "exchange");
    if ((rc = seg_create(&g->exch, path, x_bytes)))
        return coord_fail(e, rc, "exchange segment %s (%zu bytes): %s", path, x_bytes,
                          strerror(-rc));
    seg_exchange_init(g->exch.base, c->seq_len, c->vocab_size, rows, (uint32_t)g->n_ranks, c->dim);
    return 0;
}

static int open_socket(struct coord_engine *g, struct coord_err *e)
{
    seg_path(g->sock_path, sizeof(g->sock_path), g->rundir, getpid(), "sock");
    snprintf(g->endpoint, sizeof(g->endpoint), "ipc://%s", g->sock_path);
    int one = 1;
    g->zctx = zmq_ctx_new();
    if (!g->zctx || !(g->sock = zmq_socket(g->zctx, ZMQ_ROUTER)) || proto_socket_setup(g->sock) ||
        zmq_setsockopt(g->sock, ZMQ_ROUTER_MANDATORY, &one, sizeof(one)) < 0 ||
        zmq_bind(g->sock, g->endpoint) < 0)
        return coord_fail(e, -zmq_errno(), "bind %s: %s", g->endpoint, zmq_strerror(zmq_errno()));
    chmod(g->sock_path, 0600);
    return 0;
}

/* Sends every rank the same message (its own rank filled in by @fill when not NULL). */
static int send_all(struct coord_engine *g, proto_env *env, void (*fill)(proto_env *, int, void *),
                    void *arg, struct coord_err *e)
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

static int handshake(struct coord_engine *g, struct coord_err *e)
{
    proto_env *env;
    int rc, r;
    for (int got = 0; got < g->n_ranks;) {
        if ((rc = wait_any(g, SHARDLM__ENVELOPE__MSG_HELLO, HELLO_TIMEOUT_MS, &env, &r, e))) {
            if (rc == -ETIMEDOUT)
                coord_fail(e, rc, "%d of %d workers did not say Hello within %d ms",
                           g->n_ranks - got, g->n_ranks, HELLO_TIMEOUT_MS);
            return rc;
        }
        const Shardlm__Hello *h = env->hello;
        if (h->protocol != PROTO_VERSION || h->rank != (uint32_t)r || g->ranks[r].hello) {
            rc = coord_fail(e, -EPROTO, "worker rank %d: protocol %u as rank %u, expected %d "
                            "once", r, h->protocol, h->rank, PROTO_VERSION);
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
    uint64_t t0 = coord_now_ns();
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
            return fail_group(g, coord_fail(e, rc, "no heartbeat from the workers: %s",
                                            strerror(-rc)));
        bool ok = env->msg_case == SHARDLM__ENVELOPE__MSG_HEARTBEAT && env->heartbeat->reply;
        proto_free(env);
        if (!ok)
            return fail_group(g, coord_fail(e, -EPROTO, "expected heartbeat replies"));
    }
    if (g->verbose)
        fprintf(stderr, "heartbeat rtt %.1f us for %d ranks\n",
                (double)(coord_now_ns() - t0) / 1e3, g->n_ranks);
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
                       struct coord_err *e)
{
    memset(g, 0, sizeof(*g));
    g->verbose = o->verbose;
    int rc = seg_rundir(g->rundir, sizeof(g->rundir));
    if (rc)
        return coord_fail(e, rc, "runtime directory %s: %s", g->rundir,
                          rc == -EPERM ? "not a private directory owned by this user"
                                       : strerror(-rc));
    seg_clean_stale(g->rundir);
    const char *isa = getenv("SHARDLM_ISA");
    char err[256];
    if (isa && *isa && !kn_ops_find(isa, err, sizeof(err)))
        return coord_fail(e, -ENOTSUP, "SHARDLM_ISA=%s: %s", isa, err);
    if ((rc = coord_layout_make(&g->layout, &o->layout, e)))
        return rc;
    if ((rc = open_model(g, o->model_path, e)))
        goto out_fail;
    const struct shlm_config *c = &g->img.hdr->cfg;
    g->n_ranks = g->layout.n_ranks;
    if ((uint32_t)g->n_ranks > c->n_heads) {
        rc = coord_fail(e, -EINVAL, "%d workers: more than the model's %u attention heads",
                        g->n_ranks, c->n_heads);
        goto out_fail;
    }
    g->ranks = calloc((size_t)g->n_ranks, sizeof(*g->ranks));
    if (!g->ranks) {
        rc = coord_fail(e, -ENOMEM, "out of memory");
        goto out_fail;
    }
    if ((rc = make_segments(g, o->n_seqs ? o->n_seqs : 1, e)) || (rc = open_socket(g, e)))
        goto out_fail;
    for (int r = 0; r < g->n_ranks; r++)
        if ((rc = spawn_worker(g, r, e)))
            goto out_fail;
    if ((rc = handshake(g, e)))
        goto out_fail;
    print_weight_path(g);
    return 0;
out_fail:
    coord_engine_stop(g);
    return rc;
}

int coord_engine_step(struct coord_engine *g, struct coord_seq_step *seqs, int n,
                      struct coord_err *e)
{
    const struct seg_exchange *x = g->exch.base;
    const struct seg_kv *kv = g->ranks[0].kv.base;
    if (n < 1 || (uint32_t)n > kv->n_seqs)
        return coord_fail(e, -EINVAL, "a step carries 1..%u sequences, not %d", kv->n_seqs, n);
    Shardlm__StepSeq *sq = calloc((size_t)n, sizeof(*sq));
    Shardlm__StepSeq **sp = calloc((size_t)n, sizeof(*sp));
    if (!sq || !sp) {
        free(sq);
        free(sp);
        return coord_fail(e, -ENOMEM, "out of memory");
    }
    int32_t *tok = seg_exchange_tokens(g->exch.base);
    uint32_t tokens = 0, rows = 0;
    int rc = 0;
    for (int i = 0; i < n; i++) {
        struct coord_seq_step *s = &seqs[i];
        uint32_t r = s->all_logits ? s->n_tokens : 1;
        if (s->n_tokens == 0 || s->n_tokens > x->max_tokens - tokens ||
            r > x->logit_rows - rows) {
            rc = coord_fail(e, -E2BIG, "step too large for the exchange segment");
            goto out;
        }
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
    Shardlm__Step st = SHARDLM__STEP__INIT;
    st.step_id = ++g->step_id;
    st.kind = tokens > (uint32_t)n ? SHARDLM__STEP_KIND__STEP_PREFILL : SHARDLM__STEP_KIND__STEP_DECODE;
    st.n_seqs = (size_t)n;
    st.seqs = sp;
    proto_env env = SHARDLM__ENVELOPE__INIT;
    env.msg_case = SHARDLM__ENVELOPE__MSG_STEP;
    env.step = &st;
    uint64_t t0 = coord_now_ns();
    if ((rc = send_all(g, &env, NULL, NULL, e)))
        goto out;
    for (int r = 0; r < g->n_ranks; r++)
        g->ranks[r].done = false;
    for (int got = 0; got < g->n_ranks; got++) {
        proto_env *in;
        int r;
        if ((rc = wait_any(g, SHARDLM__ENVELOPE__MSG_STEP_DONE, -1, &in, &r, e)))
            goto out;
        const Shardlm__StepDone *d = in->step_done;
        if (d->step_id != st.step_id || g->ranks[r].done) {
            rc = fail_group(g, coord_fail(e, -EPROTO, "worker rank %d finished step %llu, "
                                          "expected %llu once", r,
                                          (unsigned long long)d->step_id,
                                          (unsigned long long)st.step_id));
            proto_free(in);
            goto out;
        }
        g->ranks[r].done = true;
        g->ranks[r].compute_ns = d->compute_ns;
        g->ranks[r].allreduce_ns = d->allreduce_ns;
        proto_free(in);
    }
    g->last_wall_ns = coord_now_ns() - t0;
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

void coord_engine_stop(struct coord_engine *g)
{
    struct coord_err ignore;
    if (g->ranks) {
        fail_group(g, 0); /* nobody may wait on a barrier for a peer that is shutting down */
        Shardlm__Shutdown s = SHARDLM__SHUTDOWN__INIT;
        s.reason = "coordinator exiting";
        proto_env env = SHARDLM__ENVELOPE__INIT;
        env.msg_case = SHARDLM__ENVELOPE__MSG_SHUTDOWN;
        env.shutdown = &s;
        for (int r = 0; r < g->n_ranks; r++)
            if (g->sock && worker_alive(g, r, &ignore))
                send_to(g, r, &env, &ignore); /* fails harmlessly if it never connected */
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
        zmq_ctx_term(g->zctx);
    g->sock = g->zctx = NULL;
    if (g->sock_path[0])
        unlink(g->sock_path);
    for (int r = 0; g->ranks && r < g->n_ranks; r++) {
        seg_free(&g->ranks[r].weights);
        seg_free(&g->ranks[r].kv);
    }
    seg_free(&g->exch);
    free(g->ranks);
    g->ranks = NULL;
    if (g->file_map)
        munmap(g->file_map, g->file_bytes);
    g->file_map = NULL;
    coord_layout_free(&g->layout);
    if (g->rundir[0])
        seg_clean_pid(g->rundir, getpid());
}
