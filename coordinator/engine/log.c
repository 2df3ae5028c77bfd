/* SPDX-License-Identifier: MIT */
/* coordinator/engine/log.c: formatting a message for the log callback. */
#include "log.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>

void coord_logf(const struct coord_log *l, enum coord_log_level level, const char *fmt, ...)
{
    if (!coord_log_on(l, level))
        return;
    char msg[PATH_MAX + 1024]; /* a path and what is said about it */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    l->fn(l->ctx, level, msg);
}
