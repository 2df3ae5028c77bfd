/* SPDX-License-Identifier: MIT */
/* coordinator/util/util.h: small shared helpers - files opened, read, mapped and written whole;
 * RssAnon; medians; integer parsing. */
#ifndef SHARDLM_COORD_UTIL_H
#define SHARDLM_COORD_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include "common.h"


/* Opens the regular file @path read-only (close-on-exec) and fills *@st, without waiting on a FIFO
 * or a device. Returns the descriptor or -errno with @e naming the file (-EINVAL: not a regular
 * file, and which kind it is). */
int coord_open_regular(const char *path, struct stat *st, struct shardlm_err *e);

/* What kind of file @mode is ("a FIFO", "a folder", "a symbolic link", ...), for messages. */
const char *coord_file_kind(mode_t mode);
/* 0 where @path is a folder (symbolic links followed), else -errno with @e naming it and, for
 * another kind of file, which (-ENOTDIR). */
int coord_check_folder(const char *path, struct shardlm_err *e);

/* Outputs. A file is written whole under a temporary name beside it (coord_out_open) and renamed
 * over @path at the end (coord_out_commit), so a failed write leaves what was there. @path must be
 * absent or a regular file, and none of @inputs (compared by device and inode: a hard link or
 * another path to an input is caught; for a folder, its *.json and *.safetensors): a device,
 * FIFO, folder or symbolic link is refused, never replaced. coord_out_check returns 0 or -errno (-EEXIST for
 * these) with @e set; call it before the work starts. */
int coord_out_check(const char *path, const char *const *inputs, int n_inputs,
                    struct shardlm_err *e);
/* Creates @path's temporary file (@tmp, @len bytes) exclusively. Returns its descriptor or
 * -errno. */
int coord_out_open(const char *path, char *tmp, size_t len, struct shardlm_err *e);
/* Removes the temporary files of @path (@path.tmp.<pid>) that processes no longer running left
 * (killed, or stopped where nothing could clean up): regular files of this user only. Returns how
 * many went; the first one's path into @first (@len bytes; may be NULL). */
int coord_out_clean_stale(const char *path, char *first, size_t len);
/* Checks @path again and renames @tmp (written, synced and closed) over it, then syncs the
 * folder. Returns 0 or -errno with @e set; @tmp is removed on failure. */
int coord_out_commit(const char *tmp, const char *path, struct shardlm_err *e);

/* Reads the whole of @path (at most @max bytes) into a malloc'd buffer. Returns 0 or -errno
 * with @e set (-EFBIG past @max). Free *@out with free(). */
int coord_read_file(const char *path, size_t max, uint8_t **out, size_t *len, struct shardlm_err *e);

/* Resident anonymous memory (RssAnon) of process @pid (0: this one) in bytes; 0 if unknown. */
uint64_t coord_rss_anon(int pid);
/* Sorts @v ascending in place and returns its median (the mean of the middle two for even n;
 * 0 for n = 0). For benchmark repetitions. */
double coord_sort_median(double *v, int n);

/* Maps the regular file @path read-only: *@map (NULL for an empty file) and *@size. Returns 0 or
 * -errno with @e naming the file. Release with munmap(*map, *size) when *map is not NULL. */
int coord_map_file(const char *path, void **map, size_t *size, struct shardlm_err *e);
/* coord_map_file() for a file that must hold something: an empty one is -EINVAL, "PATH: an empty
 * file". Release with munmap(*map, *size). */
int coord_map_nonempty(const char *path, void **map, size_t *size, struct shardlm_err *e);

/* Strict integer parsing of @s within [lo, hi] into *@out (shardlm_parse_long). */
bool coord_parse_long(const char *s, long lo, long hi, long *out);

/* Writes the @len bytes at @s into @buf (@cap >= 8 bytes, NUL-terminated) for a terminal or a
 * log line: printable ASCII and well-formed, printable UTF-8 as they are; \n, \t, \r and \\ as
 * those escapes; other control characters (C1 and bidirectional overrides included) and bytes
 * of invalid UTF-8 as \xNN; cut with "..." where @cap runs out. For every string a model file, a
 * tokenizer or a client gives that reaches a message. Returns @buf. */
const char *coord_escape(char *buf, size_t cap, const char *s, size_t len);
/* coord_escape() of the C string @s ("(null)" for NULL). */
const char *coord_escape_str(char *buf, size_t cap, const char *s);

#endif
