/* SPDX-License-Identifier: MIT */
/* shm/allreduce.h: all-reduce and barrier among the worker processes of one tensor-parallel
 * group, over an area of shared memory (inside the exchange segment). No ZeroMQ inside a layer.
 *
 * Layout: a header (barrier counters, abort flag, rank pids), then 2 x n_ranks slots of
 * max_floats floats, each slot cache-line aligned: [parity][rank]. A rank writes its partial sum
 * into its slot of the current parity, waits at the barrier, then sums all slots of that parity in
 * rank order (so every rank gets bit-identical results). Parity alternates per call, so a rank that
 * is already at the next all-reduce never overwrites a slot another rank is still reading: that
 * rank cannot pass the next barrier before everyone has finished reading.
 *
 * Barriers spin briefly, then sleep on a futex (shared, not private: several processes) with a
 * short timeout, checking on each wake-up the abort flag (set by the coordinator when it gives up
 * on a step) and whether every registered peer pid is still alive. A peer that exited but was
 * not reaped yet (a zombie) still counts as alive: its parent (the coordinator) must reap it, and
 * should then call seg_ar_abort() rather than let the survivors find out.
 *
 * A failure is final: a rank whose wait fails has already been counted at the barrier, so the
 * counters no longer mean anything. It sets the abort flag itself, which wakes the other ranks and
 * makes every later wait of the group fail at once with -ECONNABORTED. The coordinator tears such
 * a group down (new workers, a fresh zeroed area); nothing clears the flag.
 *
 * Ownership: the area belongs to whoever mapped it (the coordinator creates it inside the
 * exchange segment); a struct seg_ar_rank holds no resources and needs no release.
 */
#ifndef SHARDLM_SEG_ALLREDUCE_H
#define SHARDLM_SEG_ALLREDUCE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define SEG_AR_MAX_RANKS 64

/* Bytes the area needs (a multiple of 64); 0 if @n_ranks is not in 1..SEG_AR_MAX_RANKS or the
 * size overflows. */
size_t seg_ar_bytes(int n_ranks, size_t max_floats);
/* Initializes a 64-byte-aligned area of seg_ar_bytes() bytes (zeroed, or one no rank uses any
 * more: the header is rewritten, the slots need not be zero). Called once by the coordinator
 * before any rank attaches; bad arguments abort (a caller's bug). */
void seg_ar_init(void *area, int n_ranks, size_t max_floats);
/* Checks an area mapped by a worker (alignment, magic, n_ranks, max_floats, size).
 * Returns 0 or -EINVAL. */
int seg_ar_check(const void *area, size_t bytes, int n_ranks, size_t max_floats);

/* One rank's handle: its place in the area and its own call counter (for the parity). */
struct seg_ar_rank {
    void *area;
    int rank, n_ranks;
    uint64_t calls;
    int timeout_ms; /* give up when a barrier makes no progress for this long (default 30000;
                       0 or less: never, only abort and dead peers end a wait) */
    uint64_t wait_ns; /* time spent in all-reduce and barriers, for --verbose */
};
/* Attaches rank @rank and registers @pid (its process) for dead-peer checks. Every rank must
 * attach before its first call, and all ranks make the same sequence of calls. */
void seg_ar_attach(struct seg_ar_rank *r, void *area, int rank, pid_t pid);

/* Sums @n floats (n <= max_floats, else abort) of @buf over all ranks into @buf on every rank.
 * Returns 0, -ECONNABORTED (abort flag set, or a registered peer is gone), -ETIMEDOUT; after
 * a failure @buf is unchanged and the group is finished (see the top).
 * With one rank it returns at once. */
int seg_ar_allreduce(struct seg_ar_rank *r, float *buf, size_t n);
/* Waits until every rank has arrived. Same returns. */
int seg_ar_barrier(struct seg_ar_rank *r);

/* Coordinator: makes every current and future wait fail with -ECONNABORTED, and wakes sleepers. */
void seg_ar_abort(void *area);
/* Nanoseconds this process spent inside seg_ar_allreduce/barrier since the last call (reset). */
uint64_t seg_ar_take_wait_ns(struct seg_ar_rank *r);

#endif
