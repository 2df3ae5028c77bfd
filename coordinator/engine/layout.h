/* SPDX-License-Identifier: MIT */
/* coordinator/engine/layout.h: where the workers run - ranks, NUMA nodes, CPUs, threads. */

/* Default: one rank per NUMA node that has CPUs this process may use, each with all of them.
 * --workers N splits the nodes' CPUs among N ranks (a rank never spans two nodes);
 * --threads T uses the first T of each rank's CPUs; --cpus "0-3:4-7" gives each rank's CPUs
 * explicitly (ranks separated by ':'; CPUs may then be shared between ranks). */
#ifndef SHARDLM_COORD_LAYOUT_H
#define SHARDLM_COORD_LAYOUT_H

#include "util.h"

#include <stdbool.h>
#include <stddef.h>

struct coord_rank_layout {
    int node; /* NUMA node to bind memory to, -1 when the kernel has no NUMA */
    int n_cpus;
    int *cpus; /* (n_cpus) one pool thread per CPU */
};

struct coord_layout {
    int n_ranks;
    struct coord_rank_layout *ranks;
};

struct coord_layout_opts {
    int workers;      /* 0: one per node (or as many as --cpus lists) */
    int threads;      /* 0: every CPU of the rank */
    const char *cpus; /* NULL: derived from the nodes */
};

/* Returns 0 or -EINVAL/-ENOMEM with @e set. Release with coord_layout_free(). */
int coord_layout_make(struct coord_layout *l, const struct coord_layout_opts *o,
                      struct shardlm_err *e);
void coord_layout_free(struct coord_layout *l);

#endif
