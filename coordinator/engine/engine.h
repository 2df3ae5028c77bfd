/* SPDX-License-Identifier: MIT */
/* coordinator/engine/engine.h: the engine's API - start, step, stop over opaque state. */

/* coord_engine_start() opens the .shlm file, plans the shards (shm/plan.h), finds or creates for
 * every rank a weights segment holding its shard (persistent ones, named after the model, layout
 * and plan, are mapped as they are; missing ones are filled by one streaming pass over the file,
 * load.h) and a KV segment, both bound to the rank's NUMA node before the first page is touched,
 * and one exchange segment for the group; binds a ROUTER socket in the runtime directory, spawns
 * one shardlm-worker per rank pinned to its CPUs, and waits for their Hello and, after Attach,
 * their Ready. coord_engine_step() runs one step on every rank; a worker that dies in a step is
 * started again on its CPUs over the same segments and the step run again (opts.restarts times at
 * most), a worker's Error ends the step with a clear message. coord_engine_stop() shuts the
 * workers down, removes every segment and socket file, whatever state start left, and frees the
 * engine.
 *
 * A library: the engine never prints (it reports through opts.log), never reads the environment
 * (the CLI fills opts from it) and never installs a signal handler (it stops when opts.cancel is
 * set). Every function returns 0 or -errno with a one-line message in @e.
 */
#ifndef SHARDLM_COORD_ENGINE_H
#define SHARDLM_COORD_ENGINE_H

#include "access.h"
#include "layout.h"
#include "load.h"
#include "log.h"
#include "seg.h"
#include "shlm.h"
#include "util.h"

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/* Opaque: made by coord_engine_start(), freed by coord_engine_stop(). */
struct coord_engine;

/* Worker restarts a step may make by default: a worker that dies again and again fails it. */
#define COORD_RESTARTS 3

/* Where the workers reach the coordinator (access.h). */
struct coord_access_opts {
    const char *listen; /* NULL: ipc in the runtime directory; "tcp"; "tcp://HOST:PORT" */
    const char *keys;   /* CURVE keys of `shardlm keygen` (required off loopback) */
};

struct coord_engine_opts {
    const char *model_path;
    struct coord_access_opts access;
    uint32_t max_seqs; /* sequences one step may carry; 0 means 1 */
    /* Blocks of COORD_KV_BLOCK positions in every rank's KV cache (memory is reserved as they
     * are first used): kv_blocks, else as many as kv_mem bytes over all ranks hold, else enough
     * for max_seqs whole contexts - with kv_fit, no more than half the memory available on the
     * node and in the runtime directory allow (at least one block). */
    uint32_t kv_blocks;
    uint64_t kv_mem;
    bool kv_fit;
    /* No prefix cache: blocks past max_seqs whole contexts would hold nothing, so kv_blocks and
     * kv_mem are capped there. With it they hold cached prefixes, and only memory caps them. */
    bool kv_no_prefixes;
    struct coord_layout_opts layout;
    struct coord_load_opts load;
    bool verbose; /* COORD_LOG_DEBUG messages too: layout and per-step timings */
    int restarts; /* times a step may restart dead workers: 0 means COORD_RESTARTS, -1 none */
    /* Where the segments and the socket live (created 0700 if missing; it must be private and
     * ours); NULL: /dev/shm/shardlm-<uid>. */
    const char *rundir;
    /* Bytes of segment memory the engine may allocate (shm/seg.h's struct seg_budget: past it a
     * segment fails as on a full tmpfs); 0: no cap. */
    uint64_t shm_limit;
    /* The worker binary; NULL: shardlm-worker next to this process's executable. */
    const char *worker_path;
    /* The kernel table every worker must run (ref, avx2, avx512, amx): one this CPU cannot run
     * fails the start; NULL: the fastest this CPU has. Passed on the workers' command line. */
    const char *isa;
    /* The workers' software prefetch of the decode GEMVs (kn_pf_parse's names: auto, hw, l1,
     * l2); another fails the start; NULL: auto. Passed on the workers' command line. */
    const char *prefetch;
    /* Where the engine's messages go (log.h); NULL: nowhere. */
    coord_log_fn log;
    void *log_ctx;
    /* Set nonzero (by a signal handler, another thread) to stop: the start or step under way
     * returns -ECANCELED soon after, a load at its next tensor. NULL: never. */
    const volatile sig_atomic_t *cancel;
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

/* One rank as the engine sees it. */
struct coord_rank_info {
    pid_t pid;                         /* its worker (0: none running) */
    const char *isa;                   /* the kernel table it said it runs */
    size_t weights_bytes, kv_bytes;    /* its segments */
    uint64_t compute_ns, allreduce_ns; /* of the last step */
    uint64_t peak_anon;                /* the worker's RssAnon, the highest sample */
};

/* Positions per KV cache block, and the blocks of @n positions. */
#define COORD_KV_BLOCK SEG_KV_BLOCK
static inline uint32_t coord_kv_blocks_for(uint64_t n)
{
    return (uint32_t)((n + COORD_KV_BLOCK - 1) / COORD_KV_BLOCK);
}

/* A sequence's slice of one step (see StepSeq in proto/shardlm.proto): @n_tokens tokens at
 * positions @pos.., its KV in the cache blocks @blocks[0 .. (pos + n_tokens - 1) /
 * COORD_KV_BLOCK] (its block table; no two sequences of a step may write one block). @blocks
 * NULL: slot @seq_id's own whole context, blocks seq_id * B + j with B the blocks of a context
 * (callers without a block pool: eval, bench; the default kv_blocks holds max_seqs slots). */
struct coord_seq_step {
    uint32_t seq_id, pos, n_tokens;
    const int32_t *tokens;
    const uint32_t *blocks;
    bool all_logits;
    const float
        *logits; /* out: first logits row in the exchange segment, valid until the next step */
};

/* Starts the engine into *@out. Returns 0, -ECANCELED when opts.cancel stopped it, or -errno with
 * @e set; on error everything is already cleaned up and *@out is NULL. */
int coord_engine_start(struct coord_engine **out, const struct coord_engine_opts *o,
                       struct shardlm_err *e);
/* Runs one step over @n sequences on every rank. Returns 0, -ECANCELED when opts.cancel stopped
 * it, or -errno with @e set. */
int coord_engine_step(struct coord_engine *g, struct coord_seq_step *seqs, int n,
                      struct shardlm_err *e);
/* Between steps (from the thread that calls coord_engine_step()): a worker that died since the
 * last step is restarted now, within as many restarts as a step may take, counted until a step
 * runs; with none left, its death is returned (-ECHILD, "...; no restarts left (N between
 * steps)"), as a step would have returned it. 0: all alive. */
int coord_engine_check(struct coord_engine *g, struct shardlm_err *e);
/* Shuts down the workers (SIGKILL after 2 s), removes segments and socket files, frees @g.
 * NULL is fine. */
void coord_engine_stop(struct coord_engine *g);

/* The model: header, config, tokenizer and tensor table (no tensor data). */
const struct shlm_model *coord_engine_model(const struct coord_engine *g);
/* The model file's path. */
const char *coord_engine_model_path(const struct coord_engine *g);
/* The runtime directory. */
const char *coord_engine_rundir(const struct coord_engine *g);
/* Ranks (workers) and where they run. */
int coord_engine_n_ranks(const struct coord_engine *g);
const struct coord_layout *coord_engine_layout(const struct coord_engine *g);
/* Rank @r (0 <= @r < coord_engine_n_ranks()) into *@out; valid until the next call into @g. */
void coord_engine_rank(const struct coord_engine *g, int r, struct coord_rank_info *out);
/* Logit rows one step can return; sequences a step can carry; blocks of every rank's KV cache,
 * and the bytes of one (over all ranks). */
uint32_t coord_engine_logit_rows(const struct coord_engine *g);
uint32_t coord_engine_max_seqs(const struct coord_engine *g);
uint32_t coord_engine_kv_blocks(const struct coord_engine *g);
size_t coord_engine_kv_block_bytes(const struct coord_engine *g);
/* Bytes of the exchange segment. */
size_t coord_engine_exchange_bytes(const struct coord_engine *g);
/* What starting cost (the peaks as of the last coord_engine_sample()). */
const struct coord_engine_stats *coord_engine_stats(const struct coord_engine *g);
/* Samples the RssAnon of the coordinator and every worker into the stats' peaks. */
void coord_engine_sample(struct coord_engine *g);

#endif
