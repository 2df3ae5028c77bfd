/* SPDX-License-Identifier: MIT */
/* coordinator/engine/peer.c: what the coordinator makes of each message a worker sends. */
#include "peer.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

int coord_peer_rank(const char *id, size_t len, int n_ranks)
{
    char buf[PROTO_MAX_ID + 1];
    if (len > PROTO_MAX_ID)
        return -1;
    memcpy(buf, id, len);
    buf[len] = 0;
    int r, used = 0;
    if (sscanf(buf, "rank-%d%n", &r, &used) != 1 || (size_t)used != len || r < 0 || r >= n_ranks)
        return -1;
    return r;
}

int coord_peer_classify(int n_ranks, const char *id, size_t idlen, const proto_env *env, int want,
                        int *rank, struct shardlm_err *e)
{
    e->msg[0] = 0;
    int r = coord_peer_rank(id, idlen, n_ranks);
    if (r < 0) {
        shardlm_fail(e, 0, "dropped %s from an unknown peer", proto_case_name(env));
        return 0;
    }
    if ((int)env->msg_case == want) {
        *rank = r;
        return 1;
    }
    if (env->msg_case == SHARDLM__ENVELOPE__MSG_HEARTBEAT)
        return 0;
    if (env->msg_case == SHARDLM__ENVELOPE__MSG_ERROR)
        return shardlm_fail(e, env->error->code < 0 ? env->error->code : -EPROTO,
                            "worker rank %d: %s", r, env->error->message);
    return shardlm_fail(e, -EPROTO, "worker rank %d sent %s out of turn", r, proto_case_name(env));
}

int coord_peer_hello(const Shardlm__Hello *h, int rank, bool seen, struct shardlm_err *e)
{
    if (h->protocol != PROTO_VERSION || h->rank != (uint32_t)rank || seen)
        return shardlm_fail(e, -EPROTO, "worker rank %d: protocol %u as rank %u, expected %d once",
                            rank, h->protocol, h->rank, PROTO_VERSION);
    return 0;
}

int coord_peer_ready(const Shardlm__Ready *r, int rank, bool seen, struct shardlm_err *e)
{
    if (r->rank != (uint32_t)rank || seen)
        return shardlm_fail(e, -EPROTO, "worker rank %d: Ready as rank %u, expected once", rank,
                            r->rank);
    return 0;
}

int coord_peer_step_done(const Shardlm__StepDone *d, int rank, uint64_t step_id, bool seen,
                         struct shardlm_err *e)
{
    if (d->step_id != step_id || seen)
        return shardlm_fail(e, -EPROTO, "worker rank %d finished step %llu, expected %llu once",
                            rank, (unsigned long long)d->step_id, (unsigned long long)step_id);
    return 0;
}

bool coord_peer_heartbeat(const Shardlm__Heartbeat *h, uint64_t seq)
{
    return h->reply && h->seq == seq;
}
