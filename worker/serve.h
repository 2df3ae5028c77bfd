/* SPDX-License-Identifier: MIT */
/* worker/serve.h: the worker's side of the protocol, apart from its socket (main.c) so that a fuzz
 * target can feed it messages (tests/fuzz/fuzz_worker.c). */
#ifndef SHARDLM_WRK_SERVE_H
#define SHARDLM_WRK_SERVE_H

#include "common.h"
#include "model.h"
#include "pool.h"
#include "proto.h"
#include "seg.h"
#include "shlm.h"

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

struct wrk {
    unsigned rank;
    pid_t coord;
    void *sock;
    const struct kn_ops *ops;
    int node;          /* NUMA node of our memory, -1: none */
    int n_cpus, *cpus; /* one pool thread per CPU */
    struct wrk_pool *pool;
    bool attached;
    struct seg weights, kv, exch;
    struct shlm_model img;
    struct seg_ar_rank ar;
    struct wrk_model model;
    uint64_t last_step;
    unsigned fault_step_delay_ms; /* SHARDLM_FAULT=step_delay_ms=N: tests of slow steps */
    /* how replies leave: the socket in the worker, a sink in the fuzz target */
    int (*send)(struct wrk *w, const proto_env *env);
    bool quiet; /* no log lines (the fuzz target) */
};

/* Handles one message from the coordinator: Attach, Step, Rejoin, Heartbeat, Shutdown. Replies
 * go out through w->send: Ready, StepDone, Heartbeat, or an Error for a message that cannot be
 * carried out (that is not fatal: the worker goes on). Sets *@shutdown on Shutdown, else clears
 * it. Returns 0, or the -errno of a reply that could not be sent. */
int wrk_handle(struct wrk *w, const proto_env *in, bool *shutdown);
/* Replies Error{@code, @e's message, @step_id} and logs it. Returns 0 or the -errno of the
 * send. */
int wrk_reply_error(struct wrk *w, int code, uint64_t step_id, const struct shardlm_err *e);
/* Unmaps the segments and frees the model view. */
void wrk_detach(struct wrk *w);
/* "shardlm-worker[rank]: ..." on stderr (unless quiet). */
void wrk_log(const struct wrk *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
