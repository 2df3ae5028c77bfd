/* SPDX-License-Identifier: MIT */
/* shm/fault.c: the fault-injection counters (see fault.h). */
#include "fault.h"

#include "common.h"

#include <errno.h>
#include <limits.h>
#include <stdatomic.h>
#include <string.h>

static struct {
    atomic_long nth;   /* the call that fails, 0: disarmed */
    atomic_long calls; /* calls since armed */
    atomic_bool fired;
} sites[SHARDLM_FAULT_N_SITES];

static const char *const names[SHARDLM_FAULT_N_SITES] = {
    [SHARDLM_FAULT_MALLOC] = "malloc",       [SHARDLM_FAULT_MMAP] = "mmap",
    [SHARDLM_FAULT_FALLOCATE] = "fallocate", [SHARDLM_FAULT_MBIND] = "mbind",
    [SHARDLM_FAULT_URING] = "io_uring",
    [SHARDLM_FAULT_FSYNC] = "fsync",
};

const char *shardlm_fault_name(enum shardlm_fault_site site)
{
    return (unsigned)site < SHARDLM_FAULT_N_SITES ? names[site] : "?";
}

bool shardlm_fault(enum shardlm_fault_site site)
{
    long nth = atomic_load_explicit(&sites[site].nth, memory_order_relaxed);
    if (nth == 0)
        return false;
    if (atomic_fetch_add(&sites[site].calls, 1) + 1 != nth)
        return false;
    atomic_store(&sites[site].fired, true);
    return true;
}

void shardlm_fault_arm(enum shardlm_fault_site site, long nth)
{
    atomic_store(&sites[site].nth, 0);
    atomic_store(&sites[site].calls, 0);
    atomic_store(&sites[site].fired, false);
    atomic_store(&sites[site].nth, nth);
}

long shardlm_fault_calls(enum shardlm_fault_site site) { return atomic_load(&sites[site].calls); }

bool shardlm_fault_fired(enum shardlm_fault_site site) { return atomic_load(&sites[site].fired); }

int shardlm_fault_arm_spec(const char *spec)
{
    const char *eq = strchr(spec, '=');
    long nth;
    if (!eq || !shardlm_parse_long(eq + 1, 1, LONG_MAX, &nth))
        return -EINVAL;
    for (int i = 0; i < SHARDLM_FAULT_N_SITES; i++)
        if (strlen(names[i]) == (size_t)(eq - spec) &&
            !strncmp(spec, names[i], (size_t)(eq - spec))) {
            shardlm_fault_arm((enum shardlm_fault_site)i, nth);
            return 0;
        }
    return -EINVAL;
}
