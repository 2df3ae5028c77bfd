/* SPDX-License-Identifier: MIT */
/* worker/pin.h: placing a worker on its node and CPUs, and reading back what the kernel applied. */
#ifndef SHARDLM_WRK_PIN_H
#define SHARDLM_WRK_PIN_H

#include <stddef.h>

/* NUMA nodes the policy masks here can name: 0..WRK_MAX_NODES - 1. */
#define WRK_MAX_NODES 1024

/* Binds this process's future allocations to NUMA @node (set_mempolicy MPOL_BIND, -1: none),
 * runs it on @node (numa_run_on_node) and then on exactly @cpus (sched_setaffinity). Threads
 * created afterwards inherit both. Returns 0 or -errno. */
int wrk_pin(int node, const int *cpus, int n_cpus);
/* Formats the union of the affinities of every thread of this process into @cpus (as the kernel
 * reports them) and returns the node this process's memory policy binds to (-1: none). */
int wrk_read_back(char *cpus, size_t len);

#endif
