/* SPDX-License-Identifier: MIT */
/* worker/pin.c: binding a worker to its node and CPUs, and reading back what the kernel applied. */
#include "pin.h"

#include "common.h"
#include "cpus.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <numa.h>
#include <numaif.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int wrk_pin(int node, const int *cpus, int n_cpus)
{
    if (node >= 0 && numa_available() >= 0) {
        unsigned long mask[WRK_MAX_NODES / (8 * sizeof(long))] = {0};
        if (node >= (int)(sizeof(mask) * 8))
            return -EINVAL;
        mask[node / (8 * sizeof(long))] = 1ul << (node % (8 * sizeof(long)));
        if (set_mempolicy(MPOL_BIND, mask, sizeof(mask) * 8) < 0)
            return -errno;
        if (numa_run_on_node(node) < 0)
            return -errno;
    }
    if (n_cpus > 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        for (int i = 0; i < n_cpus; i++) {
            if (cpus[i] < 0 || cpus[i] >= CPU_SETSIZE)
                return -EINVAL;
            CPU_SET(cpus[i], &set);
        }
        if (sched_setaffinity(0, sizeof(set), &set) < 0)
            return -errno;
    }
    return 0;
}

int wrk_read_back(char *cpus, size_t len)
{
    cpu_set_t all;
    CPU_ZERO(&all);
    DIR *d = opendir("/proc/self/task");
    struct dirent *e;
    while (d && (e = readdir(d))) {
        long tid; /* "." and ".." are not threads */
        cpu_set_t one;
        if (shardlm_parse_long(e->d_name, 1, INT_MAX, &tid) &&
            sched_getaffinity((pid_t)tid, sizeof(one), &one) == 0)
            CPU_OR(&all, &all, &one);
    }
    if (d)
        closedir(d);
    int list[SEG_MAX_CPUS], n = 0;
    for (int c = 0; c < CPU_SETSIZE && n < SEG_MAX_CPUS; c++)
        if (CPU_ISSET(c, &all))
            list[n++] = c;
    seg_cpulist_format(list, n, cpus, len);
    if (numa_available() < 0)
        return -1;
    int mode;
    unsigned long mask[WRK_MAX_NODES / (8 * sizeof(long))] = {0};
    if (get_mempolicy(&mode, mask, sizeof(mask) * 8, NULL, 0) < 0 || mode != MPOL_BIND)
        return -1;
    for (int b = 0; b < (int)(sizeof(mask) * 8); b++)
        if (mask[b / (8 * sizeof(long))] & (1ul << (b % (8 * sizeof(long)))))
            return b;
    return -1;
}
