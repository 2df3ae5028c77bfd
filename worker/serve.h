/* worker/: the worker's side of the protocol, apart from its socket (main.c) so that a fuzz
 * target can feed it messages (tests/fuzz/fuzz_worker.c). */
#ifndef SHARDLM_WRK_SERVE_H
#define SHARDLM_WRK_SERVE_H

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

/* Handles one message from the coordinator: Attach, Step, Rejoin, Heartbeat (replies go out
 * through w->send). Returns 1 on Shutdown, else 0 (errors are replied, not fatal). */
int wrk_handle(struct wrk *w, const proto_env *in);
/* Replies Error{code, message, step_id} and logs it. Returns @code. */
int wrk_reply_error(struct wrk *w, int code, uint64_t step_id, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Unmaps the segments and frees the model view. */
void wrk_detach(struct wrk *w);
/* "shardlm-worker[rank]: ..." on stderr (unless quiet). */
void wrk_log(const struct wrk *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
