/* coordinator/: the engine - weight shards, worker processes, steps.
 *
 * coord_engine_start() opens the .shlm file, plans the shards (shm/plan.h), finds or creates for
 * every rank a weights segment holding its shard (persistent ones, named after the model, layout
 * and plan, are mapped as they are; missing ones are filled by one streaming pass over the file,
 * load.h) and a KV segment, both bound to the rank's NUMA node before the first page is touched,
 * and one exchange segment for the group; binds a
 * ROUTER socket in the runtime directory, spawns one shardlm-worker per rank pinned to its CPUs,
 * and waits for their Hello and, after Attach, their Ready. coord_engine_step() runs one step on
 * every rank; a worker's death or Error ends it with a clear message. coord_engine_stop() shuts
 * the workers down and removes every segment and socket file, whatever state start left.
 */
#ifndef SHARDLM_COORD_ENGINE_H
#define SHARDLM_COORD_ENGINE_H

#include "access.h"
#include "layout.h"
#include "load.h"
#include "seg.h"
#include "shlm.h"
#include "util.h"

#include <signal.h>
#include <stdio.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

struct coord_engine;

/* Worker restarts a step may make by default: a worker that dies again and again fails it. */
#define COORD_RESTARTS 3

/* How the weights get into shared memory (load.h). */
struct coord_load_opts {
    bool no_persist; /* memfd segments that go with the processes, instead of persistent ones */
    enum coord_io io;
    bool stats; /* print coord_engine_print_stats() at the end */
    bool verify; /* check a persistent segment's data against its checksums before using it */
};

/* Where the workers reach the coordinator (access.h). */
struct coord_access_opts {
    const char *listen; /* NULL: ipc in the runtime directory; "tcp"; "tcp://HOST:PORT" */
    const char *keys;   /* CURVE keys of `shardlm keygen` (required off loopback) */
};

struct coord_engine_opts {
    const char *model_path;
    struct coord_access_opts access;
    uint32_t n_seqs; /* KV slots; 0 means 1 */
    struct coord_layout_opts layout;
    struct coord_load_opts load;
    bool verbose; /* layout and per-step timings on stderr */
    int restarts; /* times a step may restart dead workers: 0 means COORD_RESTARTS, -1 none */
    /* Work of the caller's to overlap with the workers' start (the tokenizer, say): called once
     * the workers are spawned, before waiting for them; an error fails the start. */
    int (*while_starting)(struct coord_engine *g, void *arg, struct shardlm_err *e);
    void *arg;
};

/* What starting cost: the load, and the memory of the process tree. */
struct coord_engine_stats {
    uint64_t start_ns, ready_ns; /* coord_engine_start entered; the workers ready */
    int built, reused;           /* weights segments read from the file; found complete */
    struct coord_load_stats load;
    uint64_t peak_anon; /* the coordinator's RssAnon, the highest sample */
};

struct coord_rank {
    struct seg weights, kv;
    pid_t pid;
    bool reaped, hello, ready, done;
    char isa[32];
    uint64_t compute_ns, allreduce_ns; /* of the last step */
    uint64_t peak_anon;                /* the worker's RssAnon, the highest sample */
};

struct coord_engine {
    char rundir[PATH_MAX];
    bool made_rundir; /* this start created it: a failed start removes it again if empty */
    char sock_path[PATH_MAX];
    char endpoint[PATH_MAX + 8];
    struct coord_model_file file; /* header, table and tokenizer read; the data streamed */
    struct shlm_model img;        /* file.img: no tensor data */
    struct coord_engine_stats stats;
    struct coord_layout layout;
    int n_ranks;
    struct coord_rank *ranks; /* (n_ranks) */
    struct seg exch;
    uint32_t *kv_reserved; /* per KV slot: positions whose memory is reserved on every rank */
    uint32_t logits_reserved; /* rows of logits whose memory is reserved in the exchange */
    int max_restarts;         /* per step */
    uint64_t heartbeat_seq;
    bool anon_segments; /* segments are memfds (--no-persist) */
    void *zctx, *sock;
    struct coord_curve *curve; /* CURVE server and its ZAP handler, with --keys */
    const char *keys;          /* passed on to the workers */
    uint64_t step_id;
    uint64_t last_wall_ns;
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
                       struct shardlm_err *e);
/* Runs one step over @n sequences on every rank. Returns 0 or -errno with @e set. */
int coord_engine_step(struct coord_engine *g, struct coord_seq_step *seqs, int n,
                      struct shardlm_err *e);
/* Logit rows one step can return. */
uint32_t coord_engine_logit_rows(const struct coord_engine *g);
/* Samples the RssAnon of the coordinator and every worker into the stats' peaks. */
void coord_engine_sample(struct coord_engine *g);
/* The load and memory report of `--stats` on @f, ending with the line scripts read:
 *   load segments_bytes=<n> peak_anon_bytes=<n> seconds=<s>
 * @first_token_ns: when the first token came (0: none). */
void coord_engine_print_stats(struct coord_engine *g, uint64_t first_token_ns, FILE *f);
/* Shuts down the workers (SIGKILL after 2 s), removes segments and socket files. Idempotent. */
void coord_engine_stop(struct coord_engine *g);

#endif
