/* SPDX-License-Identifier: MIT */
/* Fuzz target for the coordinator's side of the protocol (coordinator/peer.c): what it makes of
 * each message a worker sends, as wait_any() and the handshake, step and recovery loops use it.
 *
 * The first byte picks the group size (1..4) and the step id being waited for; then frames - a
 * routing id (1 length byte, then the id, at most PROTO_MAX_ID as proto_recv caps it), a 2-byte
 * little-endian length and an Envelope. Each frame is classified while waiting for Hello, Ready
 * and StepDone in turn, and what is taken is checked with the state so far (a rank's second
 * Hello, Ready or StepDone must be refused). Nothing may crash; a taken message's rank is in the
 * group; an Error reply or a message out of turn fails the wait. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "frames.h"
#include "peer.h"

#define FRAMES_MAX 64

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int n_ranks = 1 + data[0] % 4;
    uint64_t step_id = data[0] >> 2;
    bool hello[4] = {0}, ready[4] = {0}, done[4] = {0};
    static const int wants[] = {SHARDLM__ENVELOPE__MSG_HELLO, SHARDLM__ENVELOPE__MSG_READY,
                                SHARDLM__ENVELOPE__MSG_STEP_DONE};
    size_t off = 1;
    for (int f = 0; f < FRAMES_MAX && off < size; f++) {
        char id[PROTO_MAX_ID];
        size_t idlen = data[off++];
        if (idlen > size - off)
            idlen = size - off;
        size_t keep = idlen < PROTO_MAX_ID ? idlen : PROTO_MAX_ID; /* as proto_recv */
        memcpy(id, data + off, keep);
        off += idlen;
        if (off + 2 > size)
            break;
        proto_env *env = fuzz_next_envelope(data, size, &off);
        if (!env)
            continue;
        struct shardlm_err e;
        int want = wants[f % 3], r = -1;
        int v = coord_peer_classify(n_ranks, id, keep, env, want, &r, &e);
        if (v > 0) {
            if (r < 0 || r >= n_ranks || (int)env->msg_case != want)
                __builtin_trap();
            int rc = 0;
            if (want == SHARDLM__ENVELOPE__MSG_HELLO) {
                rc = coord_peer_hello(env->hello, r, hello[r], &e);
                if (!rc && (hello[r] || env->hello->rank != (uint32_t)r))
                    __builtin_trap(); /* a second Hello, or one for another rank, accepted */
                hello[r] = true;
            } else if (want == SHARDLM__ENVELOPE__MSG_READY) {
                rc = coord_peer_ready(env->ready, r, ready[r], &e);
                if (!rc && ready[r])
                    __builtin_trap();
                ready[r] = true;
            } else {
                rc = coord_peer_step_done(env->step_done, r, step_id, done[r], &e);
                if (!rc && (done[r] || env->step_done->step_id != step_id))
                    __builtin_trap();
                done[r] = true;
            }
            (void)rc;
        } else if (v < 0 && env->msg_case != SHARDLM__ENVELOPE__MSG_ERROR &&
                   (int)env->msg_case == want) {
            __builtin_trap(); /* the wanted case from a group member is never a failure */
        }
        proto_free(env);
    }
    return 0;
}
