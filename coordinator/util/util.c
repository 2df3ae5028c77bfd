/* SPDX-License-Identifier: MIT */
/* coordinator/util/util.c: small shared helpers. */
#include "util.h"
#include "fault.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/mman.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* The kind of a file that is not a regular one, for messages. */
const char *coord_file_kind(mode_t mode)
{
    return S_ISDIR(mode)    ? "a folder"
           : S_ISFIFO(mode) ? "a FIFO"
           : S_ISCHR(mode)  ? "a character device"
           : S_ISBLK(mode)  ? "a block device"
           : S_ISSOCK(mode) ? "a socket"
           : S_ISLNK(mode)  ? "a symbolic link"
                            : "not a regular file";
}

int coord_open_regular(const char *path, struct stat *st, struct shardlm_err *e)
{
    /* O_NONBLOCK: opening a FIFO for reading would wait for a writer; regular files ignore it */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return shardlm_fail(e, -errno, "%s: %s", path, strerror(errno));
    int rc = 0;
    if (fstat(fd, st) < 0)
        rc = shardlm_fail(e, -errno, "%s: %s", path, strerror(errno));
    else if (!S_ISREG(st->st_mode))
        rc = shardlm_fail(e, -EINVAL, "%s: %s, not a regular file", path,
                          coord_file_kind(st->st_mode));
    if (rc) {
        close(fd);
        return rc;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    return fd;
}

/* Whether @name is one a Hugging Face directory is read from (config, index, tokenizer, shards). */
static bool hf_input_name(const char *name)
{
    size_t n = strlen(name);
    return (n > 5 && !strcmp(name + n - 5, ".json")) ||
           (n > 12 && !strcmp(name + n - 12, ".safetensors"));
}

/* Whether @st is the file @in, or for a folder @in one of the files read from it. */
static bool is_input(const struct stat *st, const char *in)
{
    struct stat si;
    if (stat(in, &si) < 0)
        return false;
    if (si.st_dev == st->st_dev && si.st_ino == st->st_ino)
        return true;
    if (!S_ISDIR(si.st_mode))
        return false;
    DIR *d = opendir(in);
    struct dirent *de;
    bool found = false;
    while (d && !found && (de = readdir(d)))
        found = hf_input_name(de->d_name) && fstatat(dirfd(d), de->d_name, &si, 0) == 0 &&
                si.st_dev == st->st_dev && si.st_ino == st->st_ino;
    if (d)
        closedir(d);
    return found;
}

int coord_out_check(const char *path, const char *const *inputs, int n_inputs,
                    struct shardlm_err *e)
{
    struct stat st;
    if (!*path) /* refused now: its rename would fail only after all the work */
        return shardlm_fail(e, -ENOENT, "an empty output path");
    if (lstat(path, &st) < 0)
        return errno == ENOENT ? 0 : shardlm_fail(e, -errno, "%s: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return shardlm_fail(e, -EEXIST, "%s: %s; an output replaces only a regular file", path,
                            coord_file_kind(st.st_mode));
    for (int i = 0; i < n_inputs; i++)
        if (inputs[i] && is_input(&st, inputs[i]))
            return shardlm_fail(e, -EEXIST, "%s is the input %s (the same file): write elsewhere",
                                path, inputs[i]);
    return 0;
}

int coord_out_open(const char *path, char *tmp, size_t len, struct shardlm_err *e)
{
    if (snprintf(tmp, len, "%s.tmp.%d", path, (int)getpid()) >= (int)len)
        return shardlm_fail(e, -ENAMETOOLONG, "%s: path too long", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0)
        return shardlm_fail(e, -errno, "%s: cannot create its temporary file beside it: %s", path,
                            strerror(errno));
    return fd;
}

int coord_out_clean_stale(const char *path, char *first, size_t len)
{
    char dir[4096];
    const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;
    if (!slash)
        snprintf(dir, sizeof(dir), ".");
    else
        snprintf(dir, sizeof(dir), "%.*s", slash == path ? 1 : (int)(slash - path), path);
    size_t blen = strlen(base);
    DIR *d = *base ? opendir(dir) : NULL;
    if (!d)
        return 0;
    int removed = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        const char *n = de->d_name, *digits = n + blen + 5;
        if (strncmp(n, base, blen) || strncmp(n + blen, ".tmp.", 5) || !*digits ||
            digits[strspn(digits, "0123456789")] || strlen(digits) > 9)
            continue;
        long pid = atol(digits);
        struct stat st;
        /* a live process's (this one's too) is its own; a dead one's is ours to remove */
        if (pid <= 0 || pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue;
        if (fstatat(dirfd(d), n, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode) ||
            st.st_uid != geteuid() || unlinkat(dirfd(d), n, 0) < 0)
            continue;
        if (!removed++ && first)
            snprintf(first, len, "%s/%s", dir, n);
    }
    closedir(d);
    return removed;
}

int coord_out_commit(const char *tmp, const char *path, struct shardlm_err *e)
{
    int rc = coord_out_check(path, NULL, 0, e); /* again: it may have changed since the start */
    if (!rc && rename(tmp, path) < 0)
        rc = shardlm_fail(e, -errno, "%s: %s", path, strerror(errno));
    if (rc) {
        unlink(tmp);
        return rc;
    }
    /* the rename itself reaches the disk with the folder */
    char dir[4096];
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(dir, sizeof(dir), ".");
    else
        snprintf(dir, sizeof(dir), "%.*s", slash == path ? 1 : (int)(slash - path), path);
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        (void)fsync(dfd);
        close(dfd);
    }
    return 0;
}

int coord_check_folder(const char *path, struct shardlm_err *e)
{
    struct stat st;
    if (stat(path, &st) < 0)
        return shardlm_fail(e, -errno, "%s: %s", path, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return shardlm_fail(e, -ENOTDIR, "%s: %s, not a folder", path, coord_file_kind(st.st_mode));
    return 0;
}

int coord_read_file(const char *path, size_t max, uint8_t **out, size_t *len, struct shardlm_err *e)
{
    struct stat st;
    int fd = coord_open_regular(path, &st, e);
    if (fd < 0)
        return fd;
    if ((uint64_t)st.st_size > max) {
        close(fd);
        return shardlm_fail(e, -EFBIG, "%s: %lld bytes, more than the %zu expected", path,
                            (long long)st.st_size, max);
    }
    size_t n = (size_t)st.st_size, got = 0;
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf) {
        close(fd);
        return shardlm_fail(e, -ENOMEM, "%s: out of memory", path);
    }
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            int rc = r < 0 ? -errno : -EIO;
            free(buf);
            close(fd);
            return shardlm_fail(e, rc, "%s: read failed at byte %zu", path, got);
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

int coord_map_file(const char *path, void **map, size_t *size, struct shardlm_err *e)
{
    struct stat st;
    int fd = coord_open_regular(path, &st, e);
    if (fd < 0)
        return fd;
    *size = (size_t)st.st_size;
    *map = NULL;
    if (*size) {
        void *m = shardlm_mmap(NULL, *size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            int rc = -errno;
            close(fd);
            return shardlm_fail(e, rc, "%s: mmap of %zu bytes: %s", path, *size, strerror(-rc));
        }
        *map = m;
    }
    close(fd);
    return 0;
}

int coord_map_nonempty(const char *path, void **map, size_t *size, struct shardlm_err *e)
{
    int rc = coord_map_file(path, map, size, e);
    if (!rc && !*map)
        rc = shardlm_fail(e, -EINVAL, "%s: an empty file", path);
    return rc;
}

bool coord_parse_long(const char *s, long lo, long hi, long *out)
{
    return shardlm_parse_long(s, lo, hi, out);
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
