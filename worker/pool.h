/* SPDX-License-Identifier: MIT */
/* worker/pool.h: a thread pool pinned one thread per CPU, for splitting a matrix product's rows.
 * The caller's thread is member 0 and works too; the others sleep on a futex between jobs after a
 * short spin. */
#ifndef SHARDLM_WRK_POOL_H
#define SHARDLM_WRK_POOL_H

#include "kn.h"

struct wrk_pool;

/* Starts @n - 1 threads; member i is pinned to cpus[i] when @cpus is not NULL (member 0, the
 * caller, is pinned too). Returns 0 or -errno. Release with wrk_pool_free(). */
int wrk_pool_init(struct wrk_pool **out, int n, const int *cpus);
void wrk_pool_free(struct wrk_pool *p);
int wrk_pool_size(const struct wrk_pool *p);
/* Runs fn(arg, i, n) on every member i (the caller as 0) and returns when all have finished. */
void wrk_pool_run(struct wrk_pool *p, void (*fn)(void *arg, int i, int n), void *arg);
/* The pool as the kernels' parallel for (kn.h's struct kn_par: kernels/ starts no threads);
 * valid while @p is. */
struct kn_par wrk_pool_par(struct wrk_pool *p);

#endif
