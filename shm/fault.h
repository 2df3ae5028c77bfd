/* SPDX-License-Identifier: MIT */
/* shm/fault.h: fault injection - make the Nth call of one kind (malloc, mmap, fallocate, mbind,
 * io_uring submission) fail, so that tests can walk every error path of a start, a load and a step
 * (SQLite's fault simulation). Off unless a test arms it: one relaxed atomic load per site. */
#ifndef SHARDLM_FAULT_H
#define SHARDLM_FAULT_H

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <sys/mman.h>
#include <sys/types.h>

enum shardlm_fault_site {
    SHARDLM_FAULT_MALLOC,    /* malloc/calloc/realloc of our code (tests link with --wrap) */
    SHARDLM_FAULT_MMAP,      /* mapping a segment or a file */
    SHARDLM_FAULT_FALLOCATE, /* reserving a segment's pages */
    SHARDLM_FAULT_MBIND,     /* binding a segment to its NUMA node */
    SHARDLM_FAULT_URING,     /* an io_uring submission of the load */
    SHARDLM_FAULT_FSYNC,     /* syncing a written output before its rename (fails with EIO) */
    SHARDLM_FAULT_N_SITES,
};

/* The name of @site ("malloc", "mmap", ...), for messages. */
const char *shardlm_fault_name(enum shardlm_fault_site site);

/* Called at each site just before the real call: true when the armed fault fires here, and the
 * site then fails as the real call would (ENOMEM, ENOSPC, ...). Thread-safe. */
bool shardlm_fault(enum shardlm_fault_site site);

/* Arms @site to fail its @nth call from now (1 = the next one) and that call only; 0 disarms it.
 * Resets the site's count of calls. */
void shardlm_fault_arm(enum shardlm_fault_site site, long nth);
/* Arms the site a test names in @spec, "SITE=N" (SITE as shardlm_fault_name gives it, N >= 1):
 * how a test arms a fault in a process it starts (shardlm-worker reads SHARDLM_FAULT). Returns 0
 * or -EINVAL for anything else. */
int shardlm_fault_arm_spec(const char *spec);
/* The calls @site has seen since it was last armed (counted only while armed). */
long shardlm_fault_calls(enum shardlm_fault_site site);
/* Whether the armed fault of @site has fired. */
bool shardlm_fault_fired(enum shardlm_fault_site site);

/* mmap(2) behind the SHARDLM_FAULT_MMAP site: a fault is MAP_FAILED with errno ENOMEM. */
static inline void *shardlm_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
    if (shardlm_fault(SHARDLM_FAULT_MMAP)) {
        errno = ENOMEM;
        return MAP_FAILED;
    }
    return mmap(addr, len, prot, flags, fd, off);
}

/* posix_fallocate(3) behind the SHARDLM_FAULT_FALLOCATE site: a fault is ENOSPC (returned, as
 * posix_fallocate returns its error). */
static inline int shardlm_fallocate(int fd, off_t off, off_t len)
{
    return shardlm_fault(SHARDLM_FAULT_FALLOCATE) ? ENOSPC : posix_fallocate(fd, off, len);
}

#endif
