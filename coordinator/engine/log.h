/* SPDX-License-Identifier: MIT */
/* coordinator/engine/log.h: how the engine reports and stops - log callback, cancel flag. */

/* Nothing below cli/ prints: every line the engine has to say (the weight path, a segment rebuilt,
 * a worker restarted, load progress and, when verbose, the layout and per-step timings) goes to the
 * caller's callback, which decides where it goes. And nothing below cli/ owns a signal: the engine
 * stops its waits when the flag it is given becomes nonzero. */
#ifndef SHARDLM_COORD_LOG_H
#define SHARDLM_COORD_LOG_H

#include <signal.h>
#include <stdbool.h>

enum coord_log_level {
    COORD_LOG_DEBUG, /* only with the engine's verbose option: layout, timings (a format that
                      * tools read: the CLI prints it as it is) */
    COORD_LOG_INFO,  /* what a run chose or did: the weight path, load progress */
    COORD_LOG_WARN,  /* something went wrong and was mended: a segment rebuilt, a worker
                      * restarted, a message dropped */
};

/* One message, without a trailing newline. Called from the engine's caller's thread and, for a
 * peer the CURVE handler refuses, from that handler's thread: it must be thread-safe. */
typedef void (*coord_log_fn)(void *ctx, enum coord_log_level level, const char *msg);

/* Where the engine's parts (load, access) send their lines. A zeroed one logs nothing. */
struct coord_log {
    coord_log_fn fn;
    void *ctx;
    bool debug; /* pass COORD_LOG_DEBUG messages on too */
};

/* Whether a message of @level would reach the callback (to skip formatting it when not). */
static inline bool coord_log_on(const struct coord_log *l, enum coord_log_level level)
{
    return l && l->fn && (level != COORD_LOG_DEBUG || l->debug);
}

/* Formats a message and hands it to the callback (nothing when coord_log_on() is false). */
void coord_logf(const struct coord_log *l, enum coord_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Whether the caller asked to stop: @flag set and nonzero (NULL: never). */
static inline bool coord_cancelled(const volatile sig_atomic_t *flag) { return flag && *flag; }

#endif
