/* coordinator/: small shared helpers. */
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int coord_fail(struct coord_err *e, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
    va_end(ap);
    return rc;
}

int coord_open_regular(const char *path, struct stat *st, struct coord_err *e)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return coord_fail(e, -errno, "%s: %s", path, strerror(errno));
    if (fstat(fd, st) < 0 || !S_ISREG(st->st_mode)) {
        close(fd);
        return coord_fail(e, -EINVAL, "%s: not a regular file", path);
    }
    return fd;
}

int coord_read_file(const char *path, size_t max, uint8_t **out, size_t *len, struct coord_err *e)
{
    struct stat st;
    int fd = coord_open_regular(path, &st, e);
    if (fd < 0)
        return fd;
    if ((uint64_t)st.st_size > max) {
        close(fd);
        return coord_fail(e, -EFBIG, "%s: %lld bytes, more than the %zu expected", path,
                          (long long)st.st_size, max);
    }
    size_t n = (size_t)st.st_size, got = 0;
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf) {
        close(fd);
        return coord_fail(e, -ENOMEM, "%s: out of memory", path);
    }
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            int rc = r < 0 ? -errno : -EIO;
            free(buf);
            close(fd);
            return coord_fail(e, rc, "%s: read failed at byte %zu", path, got);
        }
        got += (size_t)r;
    }
    close(fd);
    *out = buf;
    *len = n;
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double coord_sort_median(double *v, int n)
{
    if (n <= 0)
        return 0;
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

uint64_t coord_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int coord_map_file(const char *path, void **map, size_t *size, struct coord_err *e)
{
    struct stat st;
    int fd = coord_open_regular(path, &st, e);
    if (fd < 0)
        return fd;
    *size = (size_t)st.st_size;
    *map = NULL;
    if (*size) {
        void *m = mmap(NULL, *size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            int rc = -errno;
            close(fd);
            return coord_fail(e, rc, "%s: mmap of %zu bytes: %s", path, *size, strerror(-rc));
        }
        *map = m;
    }
    close(fd);
    return 0;
}

int coord_usage_error(const char *cmd, const char *usage, const char *fmt, const char *arg)
{
    fprintf(stderr, "shardlm %s: ", cmd);
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n%s", usage);
    return 2;
}

bool coord_parse_long(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

uint64_t coord_rss_anon(int pid)
{
    char path[64], line[256];
    if (pid)
        snprintf(path, sizeof(path), "/proc/%d/status", pid);
    else
        snprintf(path, sizeof(path), "/proc/self/status");
    FILE *f = fopen(path, "re");
    unsigned long long kb = 0;
    if (!f)
        return 0;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "RssAnon: %llu kB", &kb) == 1)
            break;
    fclose(f);
    return (uint64_t)kb * 1024;
}
