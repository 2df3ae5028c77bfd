/* SPDX-License-Identifier: MIT */
/* shm/common.h: what every shardlm process shares - the one error struct, strict integer parsing,
 * the monotonic clock. */
#ifndef SHARDLM_COMMON_H
#define SHARDLM_COMMON_H

#include <stdbool.h>
#include <stdint.h>

/* One-line error text, filled by the function that failed and reported once by its caller (the
 * CLI prints it; a worker replies it). Functions take a `struct shardlm_err *` and return 0 or
 * -errno. */
struct shardlm_err {
    char msg[512];
};
/* Formats @fmt into @e and returns @rc (a negative errno), for `return shardlm_fail(...)`. */
int shardlm_fail(struct shardlm_err *e, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Parses the whole of @s as a decimal integer within [@lo, @hi] into *@out (left alone on
 * failure): false for an empty string, trailing characters ("12x", "1.5"), an overflow or a value
 * out of range. strtol's leading blanks and sign are accepted. For every integer a command line
 * or the environment gives. */
bool shardlm_parse_long(const char *s, long lo, long hi, long *out);

/* CLOCK_MONOTONIC in nanoseconds: comparable across the processes of one machine. */
uint64_t shardlm_now_ns(void);

#endif
