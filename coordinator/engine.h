/* coordinator/: the engine - model segment, worker process, steps.
 *
 * coord_engine_start() loads the .shlm file into the weights segment, creates the KV and exchange
 * segments, binds a ROUTER socket in the runtime directory, spawns shardlm-worker, and waits
 * for its Hello and, after Attach, its Ready. coord_engine_step() runs one step; the worker's
 * death or an Error reply ends it with a clear message. coord_engine_stop() shuts the worker
 * down and removes every segment and socket file, whatever state start left things in.
 */
#ifndef SHARDLM_COORD_ENGINE_H
#define SHARDLM_COORD_ENGINE_H

#include "seg.h"
#include "shlm.h"
#include "util.h"

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

struct coord_engine_opts {
    const char *model_path;
    uint32_t n_seqs; /* KV slots; 0 means 1 */
    bool verbose;    /* layout and per-step timings on stderr */
};

struct coord_engine {
    char rundir[PATH_MAX];
    char sock_path[PATH_MAX];
    char endpoint[PATH_MAX + 8];
    struct seg weights, kv, exch;
    struct shlm_model img; /* over the weights segment */
    void *zctx, *sock;
    pid_t worker;
    int worker_status; /* wait status once reaped */
    bool worker_reaped;
    char worker_isa[32];
    uint64_t step_id;
    uint64_t last_compute_ns, last_wall_ns;
    bool verbose;
};

/* A sequence's slice of one step (see StepSeq in proto/shardlm.proto). */
struct coord_seq_step {
    uint32_t seq_id, pos, n_tokens;
    const int32_t *tokens;
    bool all_logits;
    const float *logits; /* out: first logits row in the exchange segment, valid until the next step */
};

/* Set by the SIGINT/SIGTERM handler; waits return -EINTR when it is. */
extern volatile sig_atomic_t coord_stop_signal;
/* Installs SIGINT/SIGTERM handlers that set coord_stop_signal, and ignores SIGPIPE. */
void coord_signals_install(void);

/* Returns 0 or -errno with @e set; on error everything is already cleaned up. */
int coord_engine_start(struct coord_engine *g, const struct coord_engine_opts *o,
                       struct coord_err *e);
/* Runs one step over @n sequences. Returns 0 or -errno with @e set. */
int coord_engine_step(struct coord_engine *g, struct coord_seq_step *seqs, int n,
                      struct coord_err *e);
/* Logit rows one step can return, and tokens it can carry. */
uint32_t coord_engine_logit_rows(const struct coord_engine *g);
uint32_t coord_engine_max_tokens(const struct coord_engine *g);
/* Shuts down the worker (SIGKILL after 2 s), removes segments and socket files. Idempotent. */
void coord_engine_stop(struct coord_engine *g);

#endif
