/* SPDX-License-Identifier: MIT */
/* coordinator/engine/layout.c: where the workers run - ranks, NUMA nodes, CPUs, threads. */
#include "layout.h"

#include "cpus.h"
#include "seg.h"

#include <errno.h>
#include <numa.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void coord_layout_free(struct coord_layout *l)
{
    for (int r = 0; l->ranks && r < l->n_ranks; r++)
        free(l->ranks[r].cpus);
    free(l->ranks);
    memset(l, 0, sizeof(*l));
}

/* The CPUs this process may run on, grouped by NUMA node (one pseudo-node without NUMA). */
struct node_cpus {
    int node, n, cpus[SEG_MAX_CPUS];
};

static int host_nodes(struct node_cpus **out)
{
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof(allowed), &allowed) < 0)
        return -errno;
    bool numa = numa_available() >= 0;
    int max_node = numa ? numa_max_node() : 0, count = 0;
    struct node_cpus *nodes = calloc((size_t)max_node + 1, sizeof(*nodes));
    if (!nodes)
        return -ENOMEM;
    for (int nd = 0; nd <= max_node; nd++) {
        struct node_cpus *x = &nodes[count];
        x->node = numa ? nd : -1;
        for (int c = 0; c < SEG_MAX_CPUS && c < CPU_SETSIZE; c++)
            if (CPU_ISSET(c, &allowed) && (!numa || numa_node_of_cpu(c) == nd))
                x->cpus[x->n++] = c;
        if (x->n)
            count++;
    }
    *out = nodes;
    return count;
}

static int set_rank(struct coord_rank_layout *r, int node, const int *cpus, int n)
{
    r->node = node;
    r->n_cpus = n;
    r->cpus = malloc((size_t)n * sizeof(int));
    if (!r->cpus)
        return -ENOMEM;
    memcpy(r->cpus, cpus, (size_t)n * sizeof(int));
    return 0;
}

/* --cpus "A:B:...": one CPU list per rank. */
static int explicit_layout(struct coord_layout *l, const struct coord_layout_opts *o,
                           struct shardlm_err *e)
{
    cpu_set_t allowed;
    sched_getaffinity(0, sizeof(allowed), &allowed);
    int n = 1;
    for (const char *p = o->cpus; *p; p++)
        n += *p == ':';
    if (o->workers && o->workers != n)
        return shardlm_fail(e, -EINVAL, "--workers %d but --cpus lists %d ranks", o->workers, n);
    l->n_ranks = n;
    l->ranks = calloc((size_t)n, sizeof(*l->ranks));
    if (!l->ranks)
        return shardlm_fail(e, -ENOMEM, "out of memory");
    const char *p = o->cpus;
    int cpus[SEG_MAX_CPUS];
    for (int r = 0; r < n; r++) {
        const char *end = strchr(p, ':');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        int c = seg_cpulist_parse(p, len, cpus, SEG_MAX_CPUS);
        if (c == -EEXIST)
            return shardlm_fail(e, -EINVAL, "--cpus '%s': rank %d's list '%.*s' names a CPU twice",
                                o->cpus, r, (int)len, p);
        if (c < 0)
            return shardlm_fail(e, -EINVAL,
                                "--cpus '%s': rank %d's list '%.*s' is not a CPU list "
                                "like 0-3,8",
                                o->cpus, r, (int)len, p);
        for (int i = 0; i < c; i++)
            if (cpus[i] >= CPU_SETSIZE || !CPU_ISSET(cpus[i], &allowed))
                return shardlm_fail(e, -EINVAL, "--cpus: CPU %d is not available to this process",
                                    cpus[i]);
        int node = numa_available() >= 0 ? numa_node_of_cpu(cpus[0]) : -1;
        if (set_rank(&l->ranks[r], node, cpus, c))
            return shardlm_fail(e, -ENOMEM, "out of memory");
        p += len + 1;
    }
    return 0;
}

/* Spreads @workers ranks over the nodes: as many per node as its share of the CPUs (at least
 * one each while ranks remain), then splits each node's CPUs among its ranks. */
static int derived_layout(struct coord_layout *l, const struct coord_layout_opts *o,
                          struct node_cpus *nodes, int n_nodes, struct shardlm_err *e)
{
    int total = 0;
    for (int i = 0; i < n_nodes; i++)
        total += nodes[i].n;
    int workers = o->workers ? o->workers : n_nodes;
    if (workers < 1 || workers > SEG_MAX_CPUS)
        return shardlm_fail(e, -EINVAL, "--workers %d: out of range", workers);
    if (workers > total)
        return shardlm_fail(e, -EINVAL,
                            "--workers %d: more workers than the %d CPUs available "
                            "(give --cpus to share CPUs between workers)",
                            workers, total);
    int used = workers < n_nodes ? workers : n_nodes; /* nodes that get ranks */
    int per[SEG_MAX_CPUS] = {0}, left = workers - used;
    for (int i = 0; i < used; i++)
        per[i] = 1;
    /* the rest by largest share of CPUs per rank, never more ranks than CPUs on a node */
    while (left > 0) {
        int best = -1;
        for (int i = 0; i < used; i++)
            if (per[i] < nodes[i].n &&
                (best < 0 || nodes[i].n * per[best] > nodes[best].n * per[i]))
                best = i;
        per[best]++;
        left--;
    }
    l->n_ranks = workers;
    l->ranks = calloc((size_t)workers, sizeof(*l->ranks));
    if (!l->ranks)
        return shardlm_fail(e, -ENOMEM, "out of memory");
    int r = 0;
    for (int i = 0; i < used; i++)
        for (int k = 0; k < per[i]; k++) {
            int a = nodes[i].n * k / per[i], b = nodes[i].n * (k + 1) / per[i];
            if (set_rank(&l->ranks[r++], nodes[i].node, nodes[i].cpus + a, b - a))
                return shardlm_fail(e, -ENOMEM, "out of memory");
        }
    return 0;
}

int coord_layout_make(struct coord_layout *l, const struct coord_layout_opts *o,
                      struct shardlm_err *e)
{
    memset(l, 0, sizeof(*l));
    int rc;
    if (o->workers < 0 || o->workers > 256 || o->threads < 0)
        return shardlm_fail(e, -EINVAL, "--workers and --threads must be positive");
    if (o->cpus) {
        rc = explicit_layout(l, o, e);
    } else {
        struct node_cpus *nodes = NULL;
        int n = host_nodes(&nodes);
        int err = n ? n : -ENODEV;
        rc = n > 0 ? derived_layout(l, o, nodes, n, e)
                   : shardlm_fail(e, err, "cannot read the CPUs of this machine: %s",
                                  strerror(-err));
        free(nodes);
    }
    if (rc) {
        coord_layout_free(l);
        return rc;
    }
    if (o->threads)
        for (int r = 0; r < l->n_ranks; r++) {
            if (o->threads > l->ranks[r].n_cpus) {
                rc = shardlm_fail(e, -EINVAL, "--threads %d: rank %d has %d CPUs", o->threads, r,
                                  l->ranks[r].n_cpus);
                coord_layout_free(l);
                return rc;
            }
            l->ranks[r].n_cpus = o->threads;
        }
    return 0;
}
