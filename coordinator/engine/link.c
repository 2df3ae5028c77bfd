/* SPDX-License-Identifier: MIT */
/* coordinator/engine/link.c: the ZeroMQ link to the workers - socket, send, the receive loop. */

/* Every wait goes through the one receive loop here; the messages the coordinator builds are
 * here too (what it makes of the workers' messages is peer.c's). */
#include "engine_internal.h"

#include "peer.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#define POLL_MS 100 /* a wait looks at the workers' processes and the cancel flag this often */

int coord_link_open(struct coord_engine *g, const struct coord_access_opts *o,
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
    if (o->keys && (rc = coord_curve_start(&g->curve, g->zctx, g->sock, o->keys, &g->log, e)))
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
    coord_logf(&g->log, COORD_LOG_DEBUG, "coordinator listens on %s%s", g->endpoint,
               g->curve ? " (CURVE)" : "");
    return 0;
}

void coord_link_close(struct coord_engine *g)
{
    if (g->sock)
        zmq_close(g->sock);
    if (g->zctx)
        zmq_ctx_term(g->zctx); /* ends the ZAP handler, which closes its socket */
    coord_curve_stop(g->curve);
    g->curve = NULL;
    g->sock = g->zctx = NULL;
    if (g->sock_path[0])
        unlink(g->sock_path);
}

int coord_link_send(struct coord_engine *g, int r, proto_env *env, struct shardlm_err *e)
{
    char id[32];
    int len = snprintf(id, sizeof(id), "rank-%d", r);
    int rc = proto_send(g->sock, id, (size_t)len, env);
    /* the rank's connection is gone: a worker's exit closes its sockets before it becomes a
     * zombie, so under load a send sees the one long before waitpid sees the other (test_tp
     * failed now and then with "Host unreachable" instead of restarting the killed worker).
     * Reported as the death it is, for every caller. */
    if (rc == -EHOSTUNREACH && coord_worker_dies_within(g, r, PEER_GONE_MS, e))
        return -ECHILD;
    if (rc)
        return shardlm_fail(e, rc, "send %s to worker rank %d: %s", proto_case_name(env), r,
                            zmq_strerror(-rc));
    return 0;
}

int coord_link_send_all(struct coord_engine *g, proto_env *env, struct shardlm_err *e)
{
    for (int r = 0; r < g->n_ranks; r++) {
        int rc = coord_link_send(g, r, env, e);
        if (rc)
            return coord_group_fail(g, rc);
    }
    return 0;
}

/* Nothing came for POLL_MS: a death ends a strict wait, @deadline (0: none) any wait; a lenient
 * one returns -EAGAIN to its caller. */
static int quiet(struct coord_engine *g, const struct coord_wait *w, uint64_t deadline,
                 struct shardlm_err *e)
{
    if (!w->lenient)
        for (int r = 0; r < g->n_ranks; r++)
            if (!coord_worker_alive(g, r, e))
                return coord_group_fail(g, -ECHILD);
    if (deadline && shardlm_now_ns() > deadline)
        return coord_group_fail(g, shardlm_fail(e, -ETIMEDOUT,
                                                "workers did not answer within "
                                                "%d ms",
                                                w->timeout_ms));
    return w->lenient ? -EAGAIN : 0;
}

/* What the wait @w makes of @env from routing id @id: 1 take it (*@rank its sender), 0 skip it,
 * <0 fail. */
static int classify(struct coord_engine *g, const struct coord_wait *w, const char *id,
                    size_t idlen, const proto_env *env, int *rank, struct shardlm_err *e)
{
    int v = coord_peer_classify(g->n_ranks, id, idlen, env, w->want, rank, e);
    if (v > 0 && w->want == SHARDLM__ENVELOPE__MSG_HEARTBEAT)
        return coord_peer_heartbeat(env->heartbeat, w->seq); /* an earlier round's: skip */
    if (v == 0 && e->msg[0]) /* a stranger's message: say so, go on */
        coord_logf(&g->log, COORD_LOG_WARN, "%s", e->msg);
    return v < 0 && w->lenient ? 0 : v; /* recovering: what the failed step left is dropped */
}

int coord_link_wait(struct coord_engine *g, const struct coord_wait *w, proto_env **out, int *rank,
                    struct shardlm_err *e)
{
    uint64_t deadline = w->timeout_ms < 0 ? 0 : shardlm_now_ns() + w->timeout_ms * 1000000ull;
    *out = NULL;
    for (;;) {
        if (coord_cancelled(g->cancel))
            return coord_group_fail(g, shardlm_fail(e, -ECANCELED, "cancelled"));
        char id[PROTO_MAX_ID];
        size_t idlen = 0;
        proto_env *env;
        int rc = proto_recv(g->sock, POLL_MS, id, &idlen, &env);
        if (rc == -EAGAIN || rc == -EINTR) {
            if ((rc = quiet(g, w, deadline, e)))
                return rc;
            continue;
        }
        if (rc == -EBADMSG) {
            coord_logf(&g->log, COORD_LOG_WARN, "dropped a malformed message from a worker");
            continue;
        }
        if (rc)
            return coord_group_fail(
                g, shardlm_fail(e, rc, "receive from workers: %s", zmq_strerror(-rc)));
        int v = classify(g, w, id, idlen, env, rank, e);
        if (v > 0) {
            *out = env;
            return 0;
        }
        proto_free(env);
        if (v < 0)
            return coord_group_fail(g, v);
    }
}

void coord_msg_attach(const struct coord_engine *g, proto_env *env, Shardlm__Attach *a, int r)
{
    shardlm__attach__init(a);
    a->n_ranks = (uint32_t)g->n_ranks;
    a->exchange_path = (char *)g->exch.path;
    a->exchange_bytes = g->exch.size;
    a->rank = (uint32_t)r;
    a->weights_path = (char *)g->ranks[r].weights.path;
    a->kv_path = (char *)g->ranks[r].kv.path;
    a->weights_bytes = g->ranks[r].weights.size;
    a->kv_bytes = g->ranks[r].kv.size;
    *env = (proto_env)SHARDLM__ENVELOPE__INIT;
    env->msg_case = SHARDLM__ENVELOPE__MSG_ATTACH;
    env->attach = a;
}

void coord_msg_heartbeat(proto_env *env, Shardlm__Heartbeat *hb, uint64_t seq)
{
    shardlm__heartbeat__init(hb);
    hb->seq = seq;
    *env = (proto_env)SHARDLM__ENVELOPE__INIT;
    env->msg_case = SHARDLM__ENVELOPE__MSG_HEARTBEAT;
    env->heartbeat = hb;
}
