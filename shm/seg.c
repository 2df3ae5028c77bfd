/* shm/: runtime directory and segments. */
#include "seg.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int seg_rundir(char *out, size_t len)
{
    const char *env = getenv("SHARDLM_RUNTIME_DIR");
    if (env && *env)
        snprintf(out, len, "%s", env);
    else
        snprintf(out, len, "/dev/shm/shardlm-%u", (unsigned)getuid());
    if (mkdir(out, 0700) < 0 && errno != EEXIST)
        return -errno;
    struct stat st;
    if (stat(out, &st) < 0)
        return -errno;
    if (!S_ISDIR(st.st_mode) || st.st_uid != getuid() || (st.st_mode & 077))
        return -EPERM;
    return 0;
}

void seg_path(char *out, size_t len, const char *rundir, pid_t pid, const char *what)
{
    snprintf(out, len, "%s/%d.%s", rundir, (int)pid, what);
}

int seg_create(struct seg *s, const char *path, size_t size)
{
    memset(s, 0, sizeof(*s));
    int rc, fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return -errno;
    rc = posix_fallocate(fd, 0, (off_t)size); /* returns the error, not -1 */
    if (rc)
        goto out_unlink;
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        rc = errno;
        goto out_unlink;
    }
    close(fd);
    snprintf(s->path, sizeof(s->path), "%s", path);
    s->base = p;
    s->size = size;
    s->owner = true;
    return 0;
out_unlink:
    close(fd);
    unlink(path);
    return -rc;
}

int seg_map(struct seg *s, const char *path, size_t size, bool writable)
{
    memset(s, 0, sizeof(*s));
    int rc = 0, fd = open(path, (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    struct stat st;
    if (fstat(fd, &st) < 0) {
        rc = -errno;
        goto out_close;
    }
    if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size != size || size == 0) {
        rc = -EINVAL;
        goto out_close;
    }
    void *p = mmap(NULL, size, PROT_READ | (writable ? PROT_WRITE : 0), MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        rc = -errno;
        goto out_close;
    }
    snprintf(s->path, sizeof(s->path), "%s", path);
    s->base = p;
    s->size = size;
out_close:
    close(fd);
    return rc;
}

void seg_free(struct seg *s)
{
    if (s->base)
        munmap(s->base, s->size);
    if (s->owner)
        unlink(s->path);
    memset(s, 0, sizeof(*s));
}

/* The coordinator pid of a runtime file name "<pid>.<what>", or 0 if it is not one. */
static pid_t name_pid(const char *name)
{
    char *end;
    long v = strtol(name, &end, 10);
    if (end == name || *end != '.' || v <= 0 || v > 0x3fffffff)
        return 0;
    return (pid_t)v;
}

static int clean(const char *rundir, pid_t only)
{
    DIR *d = opendir(rundir);
    if (!d)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        pid_t pid = name_pid(e->d_name);
        if (!pid)
            continue;
        if (only ? pid != only : (kill(pid, 0) == 0 || errno == EPERM))
            continue;
        char p[PATH_MAX];
        snprintf(p, sizeof(p), "%s/%s", rundir, e->d_name);
        if (unlink(p) == 0)
            n++;
    }
    closedir(d);
    return n;
}

int seg_clean_stale(const char *rundir) { return clean(rundir, 0); }

int seg_clean_pid(const char *rundir, pid_t pid) { return clean(rundir, pid); }

size_t seg_exchange_bytes(uint32_t max_tokens, uint32_t vocab, uint32_t logit_rows)
{
    size_t tok = ((size_t)max_tokens * 4 + 63) / 64 * 64;
    return 64 + tok + (size_t)logit_rows * vocab * 4;
}

void seg_exchange_init(void *base, uint32_t max_tokens, uint32_t vocab, uint32_t logit_rows)
{
    struct seg_exchange *h = base;
    h->max_tokens = max_tokens;
    h->vocab = vocab;
    h->logit_rows = logit_rows;
    h->tokens_off = 64;
    h->logits_off = 64 + ((size_t)max_tokens * 4 + 63) / 64 * 64;
    h->bytes = seg_exchange_bytes(max_tokens, vocab, logit_rows);
    __atomic_store_n(&h->magic, SEG_EXCHANGE_MAGIC, __ATOMIC_RELEASE);
}

int seg_exchange_check(const void *base, size_t size, uint32_t vocab)
{
    const struct seg_exchange *h = base;
    if (size < 64 || h->magic != SEG_EXCHANGE_MAGIC || h->vocab != vocab ||
        h->bytes != size || seg_exchange_bytes(h->max_tokens, h->vocab, h->logit_rows) != size ||
        h->tokens_off != 64 ||
        h->logits_off != 64 + ((size_t)h->max_tokens * 4 + 63) / 64 * 64)
        return -EINVAL;
    return 0;
}

size_t seg_kv_bytes(uint32_t n_seqs, uint32_t n_layers, uint32_t seq_len, uint32_t kv_dim)
{
    return 64 + (size_t)n_seqs * n_layers * 2 * seq_len * kv_dim * sizeof(float);
}

void seg_kv_init(void *base, uint32_t n_seqs, uint32_t n_layers, uint32_t seq_len,
                 uint32_t kv_dim)
{
    struct seg_kv *h = base;
    h->n_seqs = n_seqs;
    h->n_layers = n_layers;
    h->seq_len = seq_len;
    h->kv_dim = kv_dim;
    h->data_off = 64;
    h->bytes = seg_kv_bytes(n_seqs, n_layers, seq_len, kv_dim);
    __atomic_store_n(&h->magic, SEG_KV_MAGIC, __ATOMIC_RELEASE);
}

int seg_kv_check(const void *base, size_t size, uint32_t n_layers, uint32_t seq_len,
                 uint32_t kv_dim)
{
    const struct seg_kv *h = base;
    if (size < 64 || h->magic != SEG_KV_MAGIC || h->n_layers != n_layers ||
        h->seq_len != seq_len || h->kv_dim != kv_dim || h->n_seqs == 0 || h->data_off != 64 ||
        h->bytes != size || seg_kv_bytes(h->n_seqs, n_layers, seq_len, kv_dim) != size)
        return -EINVAL;
    return 0;
}
