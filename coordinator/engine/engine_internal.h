/* SPDX-License-Identifier: MIT */
/* coordinator/engine/engine_internal.h: the engine's state, shared by engine/'s files only. */

/* Callers outside engine/ use engine.h's accessors.
 *
 * Who trusts what: the KV and exchange segments are mapped writable by every worker, so their
 * headers are the workers' to scribble on. The engine writes each header once at start, keeps
 * its own copy (kv_layout, exch_layout, max_seqs, kv_blocks) and reads only that copy afterwards: a
 * worker that changes a capacity or an offset cannot make the coordinator read or write out of
 * bounds.
 */
#ifndef SHARDLM_COORD_ENGINE_INTERNAL_H
#define SHARDLM_COORD_ENGINE_INTERNAL_H

#include "engine.h"
#include "proto.h"
#include "seg.h"

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#define HELLO_TIMEOUT_MS 10000
#define READY_TIMEOUT_MS 60000
#define SHUTDOWN_GRACE_MS 2000
/* A worker whose connection is gone (a send fails with EHOSTUNREACH) is on its way out: its
 * sockets close in its exit before it becomes a zombie. Time given to that exit to be seen
 * (coord_link_send). */
#define PEER_GONE_MS 2000
#define LOGITS_BUDGET (64u << 20) /* bytes of logits one step may return */

struct coord_rank {
    struct seg weights, kv;
    struct seg_kv kv_layout; /* the KV header as written at start: the only one read */
    pid_t pid;
    bool reaped, hello, ready, done;
    char isa[32];
    uint64_t compute_ns, allreduce_ns; /* of the last step */
    uint64_t expert_bytes;             /* of the last step: a MoE model's expert weights read */
    uint64_t peak_anon;                /* the worker's RssAnon, the highest sample */
};

struct coord_engine {
    char rundir[PATH_MAX];
    bool made_rundir; /* this start created it: a failed start removes it again if empty */
    char sock_path[PATH_MAX];
    char endpoint[PATH_MAX + 8];
    struct coord_model_file file; /* header, table and tokenizer read; the data streamed */
    enum seg_experts experts;     /* a mixture of experts' placement (the weights segments') */
    struct shlm_model img;        /* file.img: no tensor data */
    struct coord_engine_stats stats;
    struct coord_layout layout;
    int n_ranks;
    struct coord_rank *ranks; /* (n_ranks) */
    struct seg exch;
    struct seg_exchange exch_layout; /* its header as written at start: the only one read */
    uint32_t max_seqs;               /* sequences a step may carry */
    uint32_t kv_blocks;              /* blocks of every rank's KV cache */
    uint8_t *kv_reserved;     /* (kv_blocks) whether a block's memory is reserved on every rank */
    uint32_t *tables;         /* (exchange max_blocks) a step's block tables as checked */
    uint32_t logits_reserved; /* rows of logits whose memory is reserved in the exchange */
    int max_restarts;         /* per step */
    int idle_restarts;        /* restarts between steps since the last step that ran */
    uint64_t heartbeat_seq;
    bool anon_segments; /* segments are memfds (--no-persist) */
    void *zctx, *sock;
    struct coord_curve *curve; /* CURVE server and its ZAP handler, with --keys */
    const char *keys;          /* passed on to the workers */
    char worker_path[PATH_MAX];
    const char *worker_isa;      /* --isa of the workers (opts.isa, checked), NULL for none */
    const char *worker_prefetch; /* --prefetch of the workers (opts.prefetch), NULL for none */
    uint64_t step_id;
    uint64_t last_wall_ns;
    struct coord_log log;
    const volatile sig_atomic_t *cancel;
    struct seg_budget shm_budget; /* what the segments it creates are charged to (opts.shm_limit) */
};

/* segments.c: the runtime directory, the weights, KV and exchange segments. */
/* The runtime directory's path, opts.rundir or the default, into g->rundir (nothing made). */
int coord_rundir_path(struct coord_engine *g, const struct coord_engine_opts *o,
                      struct shardlm_err *e);
/* Creates (0700) or checks that directory: it must be ours and private. */
int coord_rundir_open(struct coord_engine *g, struct shardlm_err *e);
/* Every rank's weights (found or loaded) and KV segment, and the exchange segment. */
int coord_segments_make(struct coord_engine *g, const struct coord_engine_opts *o,
                        struct shardlm_err *e);
void coord_segments_free(struct coord_engine *g);
/* Reserves the memory of KV block @b on every rank. */
int coord_reserve_kv(struct coord_engine *g, uint32_t b, struct shardlm_err *e);
/* Reserves the exchange segment's logits rows below @rows. */
int coord_reserve_logits(struct coord_engine *g, uint32_t rows, struct shardlm_err *e);
/* The exchange's parts, at the offsets of exch_layout. */
int32_t *coord_exch_tokens(const struct coord_engine *g);
uint32_t *coord_exch_blocks(const struct coord_engine *g);
float *coord_exch_logits(const struct coord_engine *g);
void *coord_exch_ar(const struct coord_engine *g);
/* Fails the group: barriers in the exchange stop waiting, so no worker hangs on a dead peer.
 * Returns @rc. */
int coord_group_fail(struct coord_engine *g, int rc);

/* link.c: the ZeroMQ socket to the workers. */
int coord_link_open(struct coord_engine *g, const struct coord_access_opts *o,
                    struct shardlm_err *e);
void coord_link_close(struct coord_engine *g);
/* Sends @env to rank @r. */
int coord_link_send(struct coord_engine *g, int r, proto_env *env, struct shardlm_err *e);
/* Sends every rank the same message; a failure fails the group. */
int coord_link_send_all(struct coord_engine *g, proto_env *env, struct shardlm_err *e);
/* What a wait takes. */
struct coord_wait {
    int want;       /* the message case waited for */
    uint64_t seq;   /* want heartbeat: replies to this round only */
    int timeout_ms; /* -1: as long as the workers live */
    /* recovery: an Error or a message out of turn is skipped (the failed step's), a death is no
     * error, and the wait returns -EAGAIN whenever nothing came for a while, so that the caller
     * can look at who is left */
    bool lenient;
};
/* Receives the next message of case w->want from any rank and returns its rank in *@rank;
 * heartbeats (but the awaited ones), and strangers' messages (logged) are skipped. -ECANCELED
 * when the cancel flag is set; an Error reply, a death, the deadline and anything unexpected end
 * the wait with @e set, after failing the group. */
int coord_link_wait(struct coord_engine *g, const struct coord_wait *w, proto_env **out, int *rank,
                    struct shardlm_err *e);
/* The messages the coordinator builds, each into a body of the caller's that @env then carries:
 * rank @r's Attach (its segments and the group's exchange), a Heartbeat of round @seq. */
void coord_msg_attach(const struct coord_engine *g, proto_env *env, Shardlm__Attach *a, int r);
void coord_msg_heartbeat(proto_env *env, Shardlm__Heartbeat *hb, uint64_t seq);

/* supervise.c: the worker processes. */
/* Fills g->worker_path, g->worker_isa and g->worker_prefetch from the options. */
int coord_workers_prepare(struct coord_engine *g, const struct coord_engine_opts *o,
                          struct shardlm_err *e);
/* fork + exec of rank @r's worker. */
int coord_worker_spawn(struct coord_engine *g, int r, struct shardlm_err *e);
/* Whether rank @r's worker still runs; reaps it and describes its end into @e if not. */
bool coord_worker_alive(struct coord_engine *g, int r, struct shardlm_err *e);
/* True when some worker has died (reaped, described into @e). */
bool coord_workers_any_dead(struct coord_engine *g, struct shardlm_err *e);
/* Whether rank @r's worker is dead or dies within @ms (coord_worker_alive() polled every
 * millisecond; its end described into @e). */
bool coord_worker_dies_within(struct coord_engine *g, int r, int ms, struct shardlm_err *e);
/* Hello from every rank, Attach, Ready, one heartbeat round. */
int coord_workers_handshake(struct coord_engine *g, struct shardlm_err *e);
/* After a worker died in a step: all ranks Ready again over the same segments. */
int coord_workers_recover(struct coord_engine *g, struct shardlm_err *e);
/* After a failed recovery: SIGKILLs (and reaps) every worker that is not Ready or did not give
 * the failed step up - a new one that never attached, a survivor that did not answer - so that
 * the next recovery starts them anew. */
void coord_workers_kill_unready(struct coord_engine *g);
/* Shutdown to every worker, SIGKILL after SHUTDOWN_GRACE_MS; frees the environment. */
void coord_workers_stop(struct coord_engine *g);

/* stats.c */
/* The weight format the workers run, in which layout, on which kernels, and the CPU features
 * that chose them: one COORD_LOG_INFO line. */
void coord_log_weight_path(const struct coord_engine *g);

#endif
