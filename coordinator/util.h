/* coordinator/: small shared helpers (file reading, errors, time). */
#ifndef SHARDLM_COORD_UTIL_H
#define SHARDLM_COORD_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

/* One-line error text, filled by the function that failed and printed once by the CLI. */
struct coord_err {
    char msg[512];
};
/* Formats @fmt into @e and returns @rc (a negative errno), for `return coord_fail(...)`. */
int coord_fail(struct coord_err *e, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Opens the regular file @path read-only (close-on-exec) and fills *@st. Returns the descriptor
 * or -errno with @e naming the file (-EINVAL: not a regular file). */
int coord_open_regular(const char *path, struct stat *st, struct coord_err *e);

/* Reads the whole of @path (at most @max bytes) into a malloc'd buffer. Returns 0 or -errno
 * with @e set (-EFBIG past @max). Free *@out with free(). */
int coord_read_file(const char *path, size_t max, uint8_t **out, size_t *len, struct coord_err *e);

uint64_t coord_now_ns(void);
/* Resident anonymous memory (RssAnon) of process @pid (0: this one) in bytes; 0 if unknown. */
uint64_t coord_rss_anon(int pid);
/* Sorts @v ascending in place and returns its median (the mean of the middle two for even n;
 * 0 for n = 0). For benchmark repetitions. */
double coord_sort_median(double *v, int n);

/* Maps the regular file @path read-only: *@map (NULL for an empty file) and *@size. Returns 0 or
 * -errno with @e naming the file. Release with munmap(*map, *size) when *map is not NULL. */
int coord_map_file(const char *path, void **map, size_t *size, struct coord_err *e);

/* Command-line helpers: a one-line "shardlm CMD: message" and the usage text on stderr, returning
 * exit code 2; strict integer parsing within [lo, hi]. */
int coord_usage_error(const char *cmd, const char *usage, const char *fmt, const char *arg);
bool coord_parse_long(const char *s, long lo, long hi, long *out);

#endif
