/* shm/common.c: the error struct's formatter and the monotonic clock. */
#include "common.h"

#include <stdarg.h>
#include <stdio.h>
#include <time.h>

int shardlm_fail(struct shardlm_err *e, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
    va_end(ap);
    return rc;
}

uint64_t shardlm_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
