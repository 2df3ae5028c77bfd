/* SPDX-License-Identifier: MIT */
/* shm/cpus.h: CPU lists like "0-3,8,10-11" - in layouts (--cpus), worker arguments and the
 * placement a worker reports back. */
#ifndef SHARDLM_SEG_CPUS_H
#define SHARDLM_SEG_CPUS_H

#include <stddef.h>

/* The most CPUs a list may hold, and one past the highest CPU number it may name. */
#define SEG_MAX_CPUS 1024

/* Parses @len bytes of @s into @out (at most @max, no CPU twice). Returns the count, -EEXIST for
 * a CPU listed twice, or -EINVAL. */
int seg_cpulist_parse(const char *s, size_t len, int *out, int max);
/* Formats @n CPUs with ranges into @out: "0-3,8". */
void seg_cpulist_format(const int *cpus, int n, char *out, size_t len);

#endif
