/* SPDX-License-Identifier: MIT */
/* coordinator/engine/peer.h: what the coordinator makes of each message a worker sends. */

/* Checked before use; apart from the socket so that a fuzz target can feed it
 * (tests/fuzz/fuzz_coord.c). */
#ifndef SHARDLM_COORD_PEER_H
#define SHARDLM_COORD_PEER_H

#include "proto.h"
#include "util.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The rank of routing id @id (@len bytes, "rank-<r>" with r < @n_ranks), or -1. */
int coord_peer_rank(const char *id, size_t len, int n_ranks);

/* A message from routing id @id while the coordinator waits for messages of case @want:
 *   1  it is one: *@rank is its sender;
 *   0  to be skipped: a heartbeat, or a stranger's message (then @e says so, to be logged);
 *   <0 the wait fails: an Error reply or a message out of turn, @e says which. */
int coord_peer_classify(int n_ranks, const char *id, size_t idlen, const proto_env *env, int want,
                        int *rank, struct shardlm_err *e);

/* The checks of what the coordinator takes from rank @rank (@seen: it already sent one).
 * 0, or -EPROTO with @e set. */
int coord_peer_hello(const Shardlm__Hello *h, int rank, bool seen, struct shardlm_err *e);
int coord_peer_ready(const Shardlm__Ready *r, int rank, bool seen, struct shardlm_err *e);
int coord_peer_step_done(const Shardlm__StepDone *d, int rank, uint64_t step_id, bool seen,
                         struct shardlm_err *e);
/* Whether @h answers the coordinator's heartbeat round @seq (not an earlier round's reply). */
bool coord_peer_heartbeat(const Shardlm__Heartbeat *h, uint64_t seq);

#endif
