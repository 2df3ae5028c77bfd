/* SPDX-License-Identifier: MIT */
/* coordinator/format/sniff.c: a file's format by its content - one test per magic, in the order
 * every command applies them. */
#include "sniff.h"

#include "shlm.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SNIFF_HEAD 4096 /* bytes of a file coord_format_sniff() reads */

_Static_assert(sizeof(SHLM_MAGIC) == 8, "a .shlm file starts with 8 magic bytes");
_Static_assert(sizeof(COORD_FORMAT_TOK_BLOB_MAGIC) == 8,
               "a tokenizer blob starts with 8 magic bytes");

enum coord_format coord_format_sniff_image(const uint8_t *buf, size_t size)
{
    if (size >= 8 && memcmp(buf, SHLM_MAGIC, 8) == 0)
        return COORD_FORMAT_SHLM;
    if (size >= 4 && memcmp(buf, "GGUF", 4) == 0)
        return COORD_FORMAT_GGUF;
    if (size >= 8 && memcmp(buf, COORD_FORMAT_TOK_BLOB_MAGIC, 8) == 0)
        return COORD_FORMAT_TOK_BLOB;
    size_t i = 0;
    while (i < size && (buf[i] == ' ' || buf[i] == '\t' || buf[i] == '\n' || buf[i] == '\r'))
        i++;
    if (i < size && buf[i] == '{')
        return COORD_FORMAT_JSON;
    return COORD_FORMAT_OTHER;
}

int coord_format_sniff(const char *path, enum coord_format *fmt, struct shardlm_err *e)
{
    struct stat st;
    if (stat(path, &st) < 0)
        return shardlm_fail(e, -errno, "%s: %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode)) {
        *fmt = COORD_FORMAT_HF_DIR;
        return 0;
    }
    int fd = coord_open_regular(path, &st, e);
    if (fd < 0)
        return fd;
    uint8_t head[SNIFF_HEAD];
    size_t n = 0;
    while (n < sizeof(head)) { /* a short read before the end of the file is no end */
        ssize_t r = pread(fd, head + n, sizeof(head) - n, (off_t)n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            int rc = shardlm_fail(e, -errno, "%s: %s", path, strerror(errno));
            close(fd);
            return rc;
        }
        if (r == 0)
            break;
        n += (size_t)r;
    }
    close(fd);
    *fmt = coord_format_sniff_image(head, n);
    return 0;
}
