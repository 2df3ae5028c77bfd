/* coordinator/: model segment, worker lifecycle and steps. */
#include "engine.h"

#include "proto.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#define HELLO_TIMEOUT_MS 10000
#define READY_TIMEOUT_MS 60000
#define SHUTDOWN_GRACE_MS 2000
#define LOAD_CHUNK (8u << 20)
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

/* Copies the .shlm file into the weights segment and validates it there, so what the workers
 * map is exactly what was checked. */
static int load_weights(struct coord_engine *g, const char *path, struct coord_err *e)
{
    int rc, fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return coord_fail(e, -errno, "%s: %s", path, strerror(errno));
    struct stat st;
    struct shlm_header h;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        rc = coord_fail(e, -EINVAL, "%s: not a regular file", path);
        goto out_close;
    }
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
    if (h.file_bytes != (uint64_t)st.st_size) {
        rc = coord_fail(e, -EINVAL, "%s: header field file_bytes is %llu but the file has %lld "
                        "bytes (truncated?)", path, (unsigned long long)h.file_bytes,
                        (long long)st.st_size);
        goto out_close;
    }
    char spath[PATH_MAX];
    seg_path(spath, sizeof(spath), g->rundir, getpid(), "weights.r0");
    if ((rc = seg_create(&g->weights, spath, (size_t)st.st_size))) {
        coord_fail(e, rc, "weights segment %s (%lld bytes): %s", spath, (long long)st.st_size,
                   strerror(-rc));
        goto out_close;
    }
    for (size_t off = 0; off < (size_t)st.st_size;) {
        size_t n = (size_t)st.st_size - off < LOAD_CHUNK ? (size_t)st.st_size - off : LOAD_CHUNK;
        ssize_t r = pread(fd, (char *)g->weights.base + off, n, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            rc = coord_fail(e, r < 0 ? -errno : -EIO, "%s: read failed at byte %zu (file changed?)",
                            path, off);
            goto out_close;
        }
        off += (size_t)r;
    }
    char err[512];
    if ((rc = shlm_parse(&g->img, g->weights.base, g->weights.size, path, err, sizeof(err))) ||
        (rc = shlm_verify_data(&g->img, path, err, sizeof(err))))
        coord_fail(e, rc, "%s", err);
out_close:
    close(fd);
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

/* fork + exec of the worker; an exec failure comes back through a close-on-exec pipe. */
static int spawn_worker(struct coord_engine *g, struct coord_err *e)
{
    char path[PATH_MAX], pid[16];
    worker_path(path, sizeof(path));
    snprintf(pid, sizeof(pid), "%d", (int)getpid());
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
        char *argv[] = {path, "--endpoint", g->endpoint, "--rank", "0", "--coordinator-pid", pid,
                        NULL};
        close(pfd[0]);
        execv(path, argv);
        int err = errno;
        (void)!write(pfd[1], &err, sizeof(err));
        _exit(127);
    }
    close(pfd[1]);
    g->worker = child;
    int err = 0;
    ssize_t r;
    while ((r = read(pfd[0], &err, sizeof(err))) < 0 && errno == EINTR)
        ;
    close(pfd[0]);
    if (r == (ssize_t)sizeof(err))
        return coord_fail(e, -err, "cannot start worker %s: %s (set SHARDLM_WORKER to its path)",
                          path, strerror(err));
    return 0;
}

/* Whether the worker is still running; reaps it and describes its end into @e if not. */
static bool worker_alive(struct coord_engine *g, struct coord_err *e)
{
    if (!g->worker || g->worker_reaped)
        return false;
    int st;
    pid_t r = waitpid(g->worker, &st, WNOHANG);
    if (r == 0)
        return true;
    g->worker_reaped = true;
    g->worker_status = st;
    if (r < 0)
        coord_fail(e, -ECHILD, "worker rank 0 (pid %d) is gone", (int)g->worker);
    else if (WIFSIGNALED(st))
        coord_fail(e, -ECHILD, "worker rank 0 (pid %d) was killed by signal %d (%s)",
                   (int)g->worker, WTERMSIG(st), strsignal(WTERMSIG(st)));
    else
        coord_fail(e, -ECHILD, "worker rank 0 (pid %d) exited with status %d", (int)g->worker,
                   WEXITSTATUS(st));
    return false;
}

/* Waits for a message of case @want from rank 0 (-1: wait as long as it lives). Error replies,
 * the worker's death, a signal and anything unexpected end the wait with @e set. */
static int wait_for(struct coord_engine *g, int want, int timeout_ms, proto_env **out,
                    struct coord_err *e)
{
    uint64_t deadline = coord_now_ns() + (uint64_t)(timeout_ms < 0 ? 0 : timeout_ms) * 1000000ull;
    *out = NULL;
    for (;;) {
        if (coord_stop_signal)
            return coord_fail(e, -EINTR, "interrupted by signal %d", (int)coord_stop_signal);
        char id[PROTO_MAX_ID];
        size_t idlen = 0;
        proto_env *env;
        int rc = proto_recv(g->sock, 100, id, &idlen, &env);
        if (rc == -EAGAIN || rc == -EINTR) {
            if (!worker_alive(g, e))
                return -ECHILD;
            if (timeout_ms >= 0 && coord_now_ns() > deadline)
                return coord_fail(e, -ETIMEDOUT, "worker rank 0 (pid %d) did not answer within "
                                  "%d ms", (int)g->worker, timeout_ms);
            continue;
        }
        if (rc == -EBADMSG) {
            fprintf(stderr, "shardlm: dropped a malformed message from a worker\n");
            continue;
        }
        if (rc)
            return coord_fail(e, rc, "receive from worker: %s", zmq_strerror(-rc));
        if (idlen != 6 || memcmp(id, "rank-0", 6) != 0) {
            fprintf(stderr, "shardlm: dropped %s from unknown peer\n", proto_case_name(env));
            proto_free(env);
            continue;
        }
        if ((int)env->msg_case == want) {
            *out = env;
            return 0;
        }
        if (env->msg_case == SHARDLM__ENVELOPE__MSG_ERROR) {
            rc = coord_fail(e, env->error->code < 0 ? env->error->code : -EPROTO,
                            "worker rank 0: %s", env->error->message);
        } else if (env->msg_case == SHARDLM__ENVELOPE__MSG_HEARTBEAT) {
            proto_free(env);
            continue;
        } else {
            rc = coord_fail(e, -EPROTO, "worker rank 0 sent %s out of turn", proto_case_name(env));
        }
        proto_free(env);
        return rc;
    }
}

static int send_to_worker(struct coord_engine *g, proto_env *env, struct coord_err *e)
{
    int rc = proto_send(g->sock, "rank-0", 6, env);
    if (rc)
        return coord_fail(e, rc, "send %s to worker rank 0: %s", proto_case_name(env),
                          zmq_strerror(-rc));
    return 0;
}

uint32_t coord_engine_logit_rows(const struct coord_engine *g)
{
    return ((const struct seg_exchange *)g->exch.base)->logit_rows;
}

uint32_t coord_engine_max_tokens(const struct coord_engine *g)
{
    return ((const struct seg_exchange *)g->exch.base)->max_tokens;
}

static int make_segments(struct coord_engine *g, uint32_t n_seqs, struct coord_err *e)
{
    const struct shlm_config *c = &g->img.hdr->cfg;
    char path[PATH_MAX];
    uint32_t kvd = c->n_kv_heads * c->head_dim;
    size_t kv_bytes = seg_kv_bytes(n_seqs, c->n_layers, c->seq_len, kvd);
    int rc;
    seg_path(path, sizeof(path), g->rundir, getpid(), "kv.r0");
    if ((rc = seg_create(&g->kv, path, kv_bytes)))
        return coord_fail(e, rc, "KV segment %s (%zu bytes): %s", path, kv_bytes, strerror(-rc));
    seg_kv_init(g->kv.base, n_seqs, c->n_layers, c->seq_len, kvd);

    uint32_t rows = LOGITS_BUDGET / (c->vocab_size * 4u);
    rows = rows < 1 ? 1 : rows > c->seq_len ? c->seq_len : rows;
    size_t x_bytes = seg_exchange_bytes(c->seq_len, c->vocab_size, rows);
    seg_path(path, sizeof(path), g->rundir, getpid(), "exchange");
    if ((rc = seg_create(&g->exch, path, x_bytes)))
        return coord_fail(e, rc, "exchange segment %s (%zu bytes): %s", path, x_bytes,
                          strerror(-rc));
    seg_exchange_init(g->exch.base, c->seq_len, c->vocab_size, rows);
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

static int handshake(struct coord_engine *g, struct coord_err *e)
{
    proto_env *env;
    int rc = wait_for(g, SHARDLM__ENVELOPE__MSG_HELLO, HELLO_TIMEOUT_MS, &env, e);
    if (rc) {
        if (rc == -ETIMEDOUT)
            coord_fail(e, rc, "worker rank 0 (pid %d) did not say Hello within %d ms",
                       (int)g->worker, HELLO_TIMEOUT_MS);
        return rc;
    }
    const Shardlm__Hello *h = env->hello;
    if (h->protocol != PROTO_VERSION || h->rank != 0) {
        rc = coord_fail(e, -EPROTO, "worker speaks protocol %u as rank %u, expected %d as rank 0",
                        h->protocol, h->rank, PROTO_VERSION);
        proto_free(env);
        return rc;
    }
    snprintf(g->worker_isa, sizeof(g->worker_isa), "%s", h->isa ? h->isa : "?");
    proto_free(env);

    Shardlm__Attach a = SHARDLM__ATTACH__INIT;
    a.rank = 0;
    a.n_ranks = 1;
    a.weights_path = g->weights.path;
    a.kv_path = g->kv.path;
    a.exchange_path = g->exch.path;
    a.weights_bytes = g->weights.size;
    a.kv_bytes = g->kv.size;
    a.exchange_bytes = g->exch.size;
    proto_env out = SHARDLM__ENVELOPE__INIT;
    out.msg_case = SHARDLM__ENVELOPE__MSG_ATTACH;
    out.attach = &a;
    if ((rc = send_to_worker(g, &out, e)))
        return rc;
    if ((rc = wait_for(g, SHARDLM__ENVELOPE__MSG_READY, READY_TIMEOUT_MS, &env, e)))
        return rc;
    proto_free(env);

    /* one heartbeat round trip: the control path works, and what it costs */
    uint64_t t0 = coord_now_ns();
    Shardlm__Heartbeat hb = SHARDLM__HEARTBEAT__INIT;
    hb.seq = 1;
    out.msg_case = SHARDLM__ENVELOPE__MSG_HEARTBEAT;
    out.heartbeat = &hb;
    if ((rc = send_to_worker(g, &out, e)) ||
        (rc = wait_for(g, SHARDLM__ENVELOPE__MSG_HEARTBEAT, HELLO_TIMEOUT_MS, &env, e)))
        return rc;
    proto_free(env);
    if (g->verbose)
        fprintf(stderr, "rank 0 pid %d isa %s weights %zu bytes, heartbeat rtt %.1f us\n",
                (int)g->worker, g->worker_isa, g->weights.size,
                (double)(coord_now_ns() - t0) / 1e3);
    return 0;
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
    if ((rc = load_weights(g, o->model_path, e)) ||
        (rc = make_segments(g, o->n_seqs ? o->n_seqs : 1, e)) || (rc = open_socket(g, e)) ||
        (rc = spawn_worker(g, e)) || (rc = handshake(g, e))) {
        coord_engine_stop(g);
        return rc;
    }
    return 0;
}

int coord_engine_step(struct coord_engine *g, struct coord_seq_step *seqs, int n,
                      struct coord_err *e)
{
    const struct seg_exchange *x = g->exch.base;
    const struct seg_kv *kv = g->kv.base;
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
    if ((rc = send_to_worker(g, &env, e)))
        goto out;
    proto_env *in;
    if ((rc = wait_for(g, SHARDLM__ENVELOPE__MSG_STEP_DONE, -1, &in, e)))
        goto out;
    if (in->step_done->step_id != st.step_id)
        rc = coord_fail(e, -EPROTO, "worker rank 0 finished step %llu, expected %llu",
                        (unsigned long long)in->step_done->step_id,
                        (unsigned long long)st.step_id);
    g->last_compute_ns = in->step_done->compute_ns;
    g->last_wall_ns = coord_now_ns() - t0;
    proto_free(in);
    if (g->verbose && !rc)
        fprintf(stderr, "step %llu %s tokens %u wall %.3f ms compute rank0 %.3f ms\n",
                (unsigned long long)st.step_id, tokens > (uint32_t)n ? "prefill" : "decode",
                tokens, (double)g->last_wall_ns / 1e6, (double)g->last_compute_ns / 1e6);
out:
    free(sq);
    free(sp);
    return rc;
}

void coord_engine_stop(struct coord_engine *g)
{
    struct coord_err ignore;
    if (g->worker && !g->worker_reaped) {
        if (g->sock) {
            Shardlm__Shutdown s = SHARDLM__SHUTDOWN__INIT;
            s.reason = "coordinator exiting";
            proto_env env = SHARDLM__ENVELOPE__INIT;
            env.msg_case = SHARDLM__ENVELOPE__MSG_SHUTDOWN;
            env.shutdown = &s;
            proto_send(g->sock, "rank-0", 6, &env); /* fails harmlessly if it never connected */
        }
        for (int waited = 0; waited < SHUTDOWN_GRACE_MS && worker_alive(g, &ignore); waited += 10)
            sleep_ms(10);
        if (worker_alive(g, &ignore)) {
            kill(g->worker, SIGKILL);
            waitpid(g->worker, &g->worker_status, 0);
            g->worker_reaped = true;
        }
    }
    if (g->sock)
        zmq_close(g->sock);
    if (g->zctx)
        zmq_ctx_term(g->zctx);
    g->sock = g->zctx = NULL;
    if (g->sock_path[0])
        unlink(g->sock_path);
    seg_free(&g->weights);
    seg_free(&g->kv);
    seg_free(&g->exch);
    if (g->rundir[0])
        seg_clean_pid(g->rundir, getpid());
    g->worker = 0;
}
