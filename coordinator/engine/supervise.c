/* SPDX-License-Identifier: MIT */
/* coordinator/engine/supervise.c: the worker processes - spawn, handshake, reap, recover, stop. */
#include "engine_internal.h"

#include "allreduce.h"
#include "cpus.h"
#include "peer.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

#ifndef SHARDLM_WORKER_REL
#define SHARDLM_WORKER_REL "../libexec/shardlm/shardlm-worker"
#endif

/* The worker binary: opts.worker_path, else shardlm-worker beside this process's executable (a
 * build tree), else where an install puts it relative to the executable (SHARDLM_WORKER_REL,
 * bin/ -> libexec/shardlm/: an installed tree works wherever its prefix is). */
static void worker_path(char *out, size_t len, const char *opt)
{
    if (opt && *opt) {
        snprintf(out, len, "%s", opt);
        return;
    }
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0) {
        snprintf(out, len, "shardlm-worker");
        return;
    }
    self[n] = 0;
    const char *dir = dirname(self);
    snprintf(out, len, "%s/shardlm-worker", dir);
    if (access(out, X_OK) == 0)
        return;
    char installed[PATH_MAX];
    snprintf(installed, sizeof(installed), "%s/%s", dir, SHARDLM_WORKER_REL);
    if (access(installed, X_OK) == 0)
        snprintf(out, len, "%s", installed);
}

/* The workers inherit this process's environment; the kernel table and the prefetch mode they
 * run are on their command line (opts.isa, opts.prefetch; checked by check_options). */
int coord_workers_prepare(struct coord_engine *g, const struct coord_engine_opts *o,
                          struct shardlm_err *e)
{
    worker_path(g->worker_path, sizeof(g->worker_path), o->worker_path);
    g->worker_isa = o->isa;
    g->worker_prefetch = o->prefetch;
    return 0;
}

int coord_worker_spawn(struct coord_engine *g, int r, struct shardlm_err *e)
{
    const struct coord_rank_layout *L = &g->layout.ranks[r];
    char *path = g->worker_path, pid[16], rank[16], node[16], threads[16], cpus[1024];
    snprintf(pid, sizeof(pid), "%d", (int)getpid());
    snprintf(rank, sizeof(rank), "%d", r);
    snprintf(node, sizeof(node), "%d", L->node);
    snprintf(threads, sizeof(threads), "%d", L->n_cpus);
    seg_cpulist_format(L->cpus, L->n_cpus, cpus, sizeof(cpus));
    int pfd[2]; /* an exec failure comes back through a close-on-exec pipe */
    if (pipe2(pfd, O_CLOEXEC) < 0)
        return shardlm_fail(e, -errno, "pipe: %s", strerror(errno));
    pid_t child = fork();
    if (child < 0) {
        close(pfd[0]);
        close(pfd[1]);
        return shardlm_fail(e, -errno, "fork: %s", strerror(errno));
    }
    if (child == 0) {
        char *argv[24] = {path,   "--endpoint", g->endpoint, "--rank", rank, "--coordinator-pid",
                          pid,    "--node",     node,        "--cpus", cpus, "--threads",
                          threads};
        int n = 13;
        const char *more[][2] = {
            {"--isa", g->worker_isa}, {"--prefetch", g->worker_prefetch}, {"--keys", g->keys}};
        for (size_t i = 0; i < sizeof(more) / sizeof(more[0]); i++)
            if (more[i][1]) { /* NULL: not given */
                argv[n++] = (char *)more[i][0];
                argv[n++] = (char *)more[i][1];
            }
        argv[n] = NULL;
        close(pfd[0]);
        execve(path, argv, environ);
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

bool coord_worker_alive(struct coord_engine *g, int r, struct shardlm_err *e)
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

bool coord_workers_any_dead(struct coord_engine *g, struct shardlm_err *e)
{
    bool dead = false;
    for (int r = 0; r < g->n_ranks; r++)
        dead |= !coord_worker_alive(g, r, e);
    return dead;
}

bool coord_worker_dies_within(struct coord_engine *g, int r, int ms, struct shardlm_err *e)
{
    uint64_t end = shardlm_now_ns() + (uint64_t)ms * 1000000u;
    while (coord_worker_alive(g, r, e)) {
        if (shardlm_now_ns() >= end)
            return false;
        usleep(1000);
    }
    return true;
}

/* A Hello from each rank @fresh marks (NULL: every rank), within HELLO_TIMEOUT_MS each. */
static int await_hellos(struct coord_engine *g, const bool *fresh, int n_fresh,
                        struct shardlm_err *e)
{
    const struct coord_wait w = {.want = SHARDLM__ENVELOPE__MSG_HELLO,
                                 .timeout_ms = HELLO_TIMEOUT_MS};
    for (int got = 0; got < n_fresh;) {
        proto_env *in;
        int r, rc = coord_link_wait(g, &w, &in, &r, e);
        if (rc == -ETIMEDOUT)
            shardlm_fail(e, rc, "%d of %d workers did not say Hello within %d ms", n_fresh - got,
                         n_fresh, HELLO_TIMEOUT_MS);
        if (rc)
            return rc;
        const Shardlm__Hello *h = in->hello;
        struct coord_rank *cr = &g->ranks[r];
        if (fresh && fresh[r] && h->pid != (uint32_t)cr->pid) {
            /* an earlier worker of this rank's, killed in a restart before its Hello was read */
            coord_logf(&g->log, COORD_LOG_DEBUG, "dropped the Hello of rank %d's dead pid %u", r,
                       h->pid);
            proto_free(in);
            continue;
        }
        rc = coord_peer_hello(h, r, cr->hello || (fresh && !fresh[r]), e);
        cr->hello = true;
        snprintf(cr->isa, sizeof(cr->isa), "%s", h->isa ? h->isa : "?");
        proto_free(in);
        if (rc)
            return coord_group_fail(g, rc);
        got++;
    }
    return 0;
}

/* Attach (the segments) to each rank @fresh marks (NULL: every rank), Rejoin to the others,
 * which keep theirs. */
static int attach_all(struct coord_engine *g, const bool *fresh, struct shardlm_err *e)
{
    for (int r = 0; r < g->n_ranks; r++) {
        proto_env env;
        Shardlm__Attach a;
        Shardlm__Rejoin j = SHARDLM__REJOIN__INIT;
        g->ranks[r].ready = false;
        if (!fresh || fresh[r]) {
            coord_msg_attach(g, &env, &a, r);
        } else {
            j.rank = (uint32_t)r;
            env = (proto_env)SHARDLM__ENVELOPE__INIT;
            env.msg_case = SHARDLM__ENVELOPE__MSG_REJOIN;
            env.rejoin = &j;
        }
        int rc = coord_link_send(g, r, &env, e);
        if (rc)
            return coord_group_fail(g, rc);
    }
    return 0;
}

/* A Ready from every rank; with @report, the layout each worker read back from the kernel (a
 * contract other tools read) as COORD_LOG_DEBUG lines. */
static int await_ready(struct coord_engine *g, bool report, struct shardlm_err *e)
{
    const struct coord_wait w = {.want = SHARDLM__ENVELOPE__MSG_READY,
                                 .timeout_ms = READY_TIMEOUT_MS};
    for (int got = 0; got < g->n_ranks; got++) {
        proto_env *in;
        int r, rc = coord_link_wait(g, &w, &in, &r, e);
        if (rc)
            return rc;
        const Shardlm__Ready *rd = in->ready;
        struct coord_rank *cr = &g->ranks[r];
        if ((rc = coord_peer_ready(rd, r, cr->ready, e))) {
            proto_free(in);
            return coord_group_fail(g, rc);
        }
        if (report) {
            coord_logf(&g->log, COORD_LOG_DEBUG, "rank %d node %d cpus %s pid %d", r, rd->node,
                       rd->cpus ? rd->cpus : "?", (int)cr->pid);
            coord_logf(&g->log, COORD_LOG_DEBUG,
                       "rank %d isa %s threads %u weights %zu bytes kv %zu bytes", r, cr->isa,
                       rd->threads, cr->weights.size, cr->kv.size);
        }
        cr->ready = true;
        proto_free(in);
    }
    return 0;
}

/* One heartbeat round trip to every rank: the control path works, and what it costs. */
static int heartbeat_round(struct coord_engine *g, struct shardlm_err *e)
{
    uint64_t t0 = shardlm_now_ns();
    proto_env env;
    Shardlm__Heartbeat hb;
    coord_msg_heartbeat(&env, &hb, ++g->heartbeat_seq);
    int rc = coord_link_send_all(g, &env, e);
    const struct coord_wait w = {
        .want = SHARDLM__ENVELOPE__MSG_HEARTBEAT, .seq = hb.seq, .timeout_ms = HELLO_TIMEOUT_MS};
    for (int got = 0; !rc && got < g->n_ranks; got++) {
        proto_env *in;
        int r;
        if (!(rc = coord_link_wait(g, &w, &in, &r, e)))
            proto_free(in);
    }
    if (!rc)
        coord_logf(&g->log, COORD_LOG_DEBUG, "heartbeat rtt %.1f us for %d ranks",
                   (double)(shardlm_now_ns() - t0) / 1e3, g->n_ranks);
    return rc;
}

int coord_workers_handshake(struct coord_engine *g, struct shardlm_err *e)
{
    int rc = await_hellos(g, NULL, g->n_ranks, e);
    if (!rc)
        rc = attach_all(g, NULL, e);
    if (!rc)
        rc = await_ready(g, true, e);
    return rc ? rc : heartbeat_round(g, e);
}

/* Whether every rank has either died or given the failed step up (done). */
static bool survivors_idle(struct coord_engine *g)
{
    struct shardlm_err ignore;
    bool idle = true;
    for (int r = 0; r < g->n_ranks; r++)
        idle &= g->ranks[r].done || !coord_worker_alive(g, r, &ignore);
    return idle;
}

/* The survivors of a failed step give it up: the abort flag stops their barriers, and a
 * heartbeat each answers once idle (everything it sent for the step came before the reply). */
static int survivors_give_up(struct coord_engine *g, struct shardlm_err *e)
{
    struct shardlm_err ignore;
    proto_env env;
    Shardlm__Heartbeat hb;
    coord_group_fail(g, 0);
    coord_msg_heartbeat(&env, &hb, ++g->heartbeat_seq);
    for (int r = 0; r < g->n_ranks; r++)
        g->ranks[r].done =
            !coord_worker_alive(g, r, &ignore) || coord_link_send(g, r, &env, &ignore);
    uint64_t deadline = shardlm_now_ns() + (uint64_t)HELLO_TIMEOUT_MS * 1000000ull;
    const struct coord_wait w = {
        .want = SHARDLM__ENVELOPE__MSG_HEARTBEAT, .seq = hb.seq, .timeout_ms = -1, .lenient = true};
    while (!survivors_idle(g)) {
        if (shardlm_now_ns() > deadline)
            return shardlm_fail(
                e, -ETIMEDOUT, "the surviving workers did not give up the failed step within %d ms",
                HELLO_TIMEOUT_MS);
        proto_env *in;
        int r, rc = coord_link_wait(g, &w, &in, &r, e);
        if (rc == -EAGAIN)
            continue;
        if (rc)
            return rc;
        g->ranks[r].done = true;
        proto_free(in);
    }
    return 0;
}

/* Starts the dead ranks' workers again on their CPUs, marking them in @fresh. */
static int respawn_dead(struct coord_engine *g, bool *fresh, int *n_fresh, struct shardlm_err *e)
{
    struct shardlm_err ignore;
    *n_fresh = 0;
    for (int r = 0; r < g->n_ranks; r++) {
        struct coord_rank *cr = &g->ranks[r];
        if (coord_worker_alive(g, r, &ignore))
            continue;
        cr->pid = 0;
        cr->reaped = cr->hello = cr->ready = false;
        fresh[r] = true;
        ++*n_fresh;
        int rc = coord_worker_spawn(g, r, e);
        if (rc)
            return rc;
    }
    return 0;
}

/* After a worker died in a step: the survivors give the step up, the dead are started again on
 * their CPUs, the all-reduce area is reset, and every rank attaches to it again - the new ones
 * with Attach (the same segments: no reload), the others with Rejoin. 0 when all are Ready. */
int coord_workers_recover(struct coord_engine *g, struct shardlm_err *e)
{
    int rc = survivors_give_up(g, e), n_fresh = 0;
    if (rc)
        return rc;
    bool *fresh = calloc((size_t)g->n_ranks, sizeof(*fresh));
    if (!fresh)
        return shardlm_fail(e, -ENOMEM, "out of memory");
    rc = respawn_dead(g, fresh, &n_fresh, e);
    seg_ar_init(coord_exch_ar(g), g->n_ranks, (size_t)SEG_MAX_CHUNK * g->img.hdr->cfg.dim);
    if (!rc)
        rc = await_hellos(g, fresh, n_fresh, e);
    if (!rc)
        rc = attach_all(g, fresh, e);
    if (!rc)
        rc = await_ready(g, false, e);
    free(fresh);
    return rc;
}

void coord_workers_kill_unready(struct coord_engine *g)
{
    struct shardlm_err ignore;
    for (int r = 0; r < g->n_ranks; r++) {
        struct coord_rank *cr = &g->ranks[r];
        if ((cr->ready && cr->done) || !coord_worker_alive(g, r, &ignore))
            continue;
        kill(cr->pid, SIGKILL);
        waitpid(cr->pid, NULL, 0);
        cr->reaped = true;
    }
}

void coord_workers_stop(struct coord_engine *g)
{
    struct shardlm_err ignore;
    if (g->ranks) {
        coord_group_fail(g, 0); /* nobody may wait on a barrier for a peer that is shutting down */
        Shardlm__Shutdown s = SHARDLM__SHUTDOWN__INIT;
        s.reason = "coordinator exiting";
        proto_env env = SHARDLM__ENVELOPE__INIT;
        env.msg_case = SHARDLM__ENVELOPE__MSG_SHUTDOWN;
        env.shutdown = &s;
        for (int r = 0; r < g->n_ranks; r++) {
            if (!coord_worker_alive(g, r, &ignore))
                continue;
            if (g->sock && g->ranks[r].hello)
                coord_link_send(g, r, &env, &ignore);
            else /* not connected yet (a start stopped early): no message can reach it */
                kill(g->ranks[r].pid, SIGTERM);
        }
        for (int waited = 0; waited < SHUTDOWN_GRACE_MS; waited += 10) {
            bool any = false;
            for (int r = 0; r < g->n_ranks; r++)
                any |= coord_worker_alive(g, r, &ignore);
            if (!any)
                break;
            sleep_ms(10);
        }
        for (int r = 0; r < g->n_ranks; r++)
            if (coord_worker_alive(g, r, &ignore)) {
                kill(g->ranks[r].pid, SIGKILL);
                waitpid(g->ranks[r].pid, NULL, 0);
                g->ranks[r].reaped = true;
            }
    }
}
