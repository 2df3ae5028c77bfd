/* SPDX-License-Identifier: MIT */
/* shm/seg.c: the runtime directory, segment files (create, reserve, publish, map), the run files
 * of dead coordinators, and the exchange and KV layouts. */
#include "seg.h"
#include "fault.h"

#include "allreduce.h"
#include "kn.h"

#include <dirent.h>
#include <numa.h>
#include <numaif.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int seg_rundir_path(const char *path, char *out, size_t len)
{
    if (path && !*path) { /* set to nothing: a mistake, not a wish for the default */
        snprintf(out, len, "(empty SHARDLM_RUNTIME_DIR)");
        return -EINVAL;
    }
    if (path && strlen(path) >= PATH_MAX) {
        snprintf(out, len, "(SHARDLM_RUNTIME_DIR of %zu bytes)", strlen(path));
        return -ENAMETOOLONG;
    }
    if (path)
        snprintf(out, len, "%s", path);
    else
        seg_rundir_default(out, len);
    return 0;
}

void seg_rundir_default(char *out, size_t len)
{
    snprintf(out, len, "/dev/shm/shardlm-%u", (unsigned)getuid());
}

int seg_rundir_make(const char *path)
{
    if (mkdir(path, 0700) < 0 && errno != EEXIST)
        return -errno;
    struct stat st;
    if (stat(path, &st) < 0)
        return -errno;
    if (!S_ISDIR(st.st_mode) || st.st_uid != getuid() || (st.st_mode & 077))
        return -EPERM;
    return 0;
}

int seg_rundir(const char *path, char *out, size_t len)
{
    int rc = seg_rundir_path(path, out, len);
    return rc ? rc : seg_rundir_make(out);
}

void seg_path(char *out, size_t len, const char *rundir, pid_t pid, const char *what)
{
    snprintf(out, len, "%s/%d.%s", rundir, (int)pid, what);
}

/* Counts @size more bytes against @b (NULL: nothing): 0, or -ENOSPC past its limit (nothing
 * counted). Up to four load lanes (threads) reserve at once: one compare-and-swap, relaxed (the
 * count orders nothing else). */
static int charge(struct seg_budget *b, size_t size)
{
    if (!b)
        return 0;
    uint64_t used = atomic_load_explicit(&b->used, memory_order_relaxed);
    do {
        if (b->limit && (size > b->limit || used > b->limit - size))
            return -ENOSPC;
    } while (!atomic_compare_exchange_weak_explicit(&b->used, &used, used + size,
                                                    memory_order_relaxed, memory_order_relaxed));
    return 0;
}

/* Faults in bytes [off, off + len) of a segment through its mapping @base (MADV_POPULATE_WRITE),
 * so that a tmpfs in huge-page "advise" mode can give 2 MiB pages: 0 or an errno, EINVAL for a
 * kernel without that call (Linux < 5.14), ENOSPC for a full tmpfs (its SIGBUS is EFAULT here). */
static int populate(uint8_t *base, size_t off, size_t len)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE), a = off / page * page;
    int err = 0;
    while (madvise(base + a, off + len - a, MADV_POPULATE_WRITE) < 0 && (err = errno) == EINTR)
        err = 0;
    return err == EFAULT ? ENOSPC : err;
}

/* Allocates bytes [off, off + len) of the segment file @fd, charged to @b: through
 * its mapping @base when *@huge (populate; a kernel without it clears *@huge and the segment goes
 * on with fallocate), else with fallocate. 0 or -errno. tmpfs gives up with EINTR whenever a
 * signal is pending (one the process handles, too): then it goes on. The fault site is
 * SHARDLM_FAULT_FALLOCATE either way. */
static int allocate(struct seg_budget *b, int fd, uint8_t *base, bool *huge, size_t off, size_t len)
{
    int rc = charge(b, len);
    if (rc)
        return rc;
    /* the load's lanes reserve one segment's tensors at once: *huge is shared */
    bool h = __atomic_load_n(huge, __ATOMIC_RELAXED);
    if (h) {
        rc = shardlm_fault(SHARDLM_FAULT_FALLOCATE) ? ENOSPC : populate(base, off, len);
        if (rc == EINVAL)
            __atomic_store_n(huge, h = false, __ATOMIC_RELAXED);
    }
    if (!h)
        while ((rc = shardlm_fallocate(fd, (off_t)off, (off_t)len)) == EINTR) /* not -1 */
            ;
    if (rc && b)
        atomic_fetch_sub_explicit(&b->used, len, memory_order_relaxed);
    return -rc;
}

/* Sizes, maps and binds the fresh segment file @fd into @s, and allocates its memory unless
 * SEG_LAZY. -errno on error. */
static int setup(struct seg *s, int fd, size_t size, int node, unsigned flags)
{
    int rc = 0;
    if (ftruncate(fd, (off_t)size) < 0)
        return -errno;
    void *p = shardlm_mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return -errno;
    /* before the first page: a kernel or tmpfs without transparent huge pages says EINVAL, and
     * the segment has 4 KiB pages (seg_huge_bytes tells) */
    if (flags & SEG_HUGE)
        s->huge = madvise(p, size, MADV_HUGEPAGE) == 0;
    /* on tmpfs the policy of a shared mapping is the file's: it governs every page allocated
     * for it from now on, by anyone - so bind before fallocate touches the first page */
    if (node >= 0 && numa_available() >= 0) {
        unsigned long mask[16] = {0};
        rc = node >= (int)(sizeof(mask) * 8) ? -EINVAL : 0;
        if (!rc) {
            mask[node / (8 * sizeof(long))] = 1ul << (node % (8 * sizeof(long)));
            if (shardlm_fault(SHARDLM_FAULT_MBIND))
                rc = -ENOMEM;
            else if (mbind(p, size, MPOL_BIND, mask, sizeof(mask) * 8, 0) < 0)
                rc = -errno;
        }
    }
    if (!rc && !(flags & SEG_LAZY))
        rc = allocate(s->budget, fd, p, &s->huge, 0, size);
    if (rc) {
        s->huge = false;
        munmap(p, size);
        return rc;
    }
    s->base = p;
    s->size = size;
    return 0;
}

int seg_create_in(struct seg *s, struct seg_budget *b, const char *path, size_t size, int node,
                  unsigned flags)
{
    memset(s, 0, sizeof(*s));
    s->fd = -1;
    s->budget = b;
    int rc, fd;
    if (flags & SEG_ANON)
        fd = memfd_create(path, MFD_CLOEXEC);
    else
        fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return -errno;
    if (!(flags & SEG_ANON))
        (void)flock(fd, LOCK_SH); /* in use while it lives (published or not): see seg_map */
    if ((rc = setup(s, fd, size, node, flags))) {
        close(fd);
        if (!(flags & SEG_ANON))
            unlink(path);
        return rc;
    }
    s->fd = fd;
    if (flags & SEG_ANON) {
        snprintf(s->path, sizeof(s->path), "/proc/%d/fd/%d", (int)getpid(), fd);
    } else {
        snprintf(s->path, sizeof(s->path), "%s", path);
        s->owner = true;
    }
    return 0;
}

int seg_create_on(struct seg *s, const char *path, size_t size, int node, unsigned flags)
{
    return seg_create_in(s, NULL, path, size, node, flags);
}

int seg_create(struct seg *s, const char *path, size_t size)
{
    return seg_create_on(s, path, size, -1, 0);
}

int seg_reserve(struct seg *s, size_t off, size_t len)
{
    KN_ASSERT(s->fd >= 0 && off <= s->size && len <= s->size - off);
    return allocate(s->budget, s->fd, s->base, &s->huge, off, len);
}

long long seg_huge_bytes(struct seg *s)
{
    if (!s->base)
        return -EINVAL;
    (void)madvise(s->base, s->size, MADV_POPULATE_READ); /* EINVAL before Linux 5.14 */
    FILE *f = fopen("/proc/self/smaps", "re");
    if (!f)
        return -errno;
    char line[256];
    unsigned long start, end;
    unsigned long long kb = 0;
    bool in = false, found = false;
    while (fgets(line, sizeof(line), f)) {
        if (sscanf(line, "%lx-%lx ", &start, &end) == 2) { /* a mapping's first line */
            in = start == (unsigned long)(uintptr_t)s->base;
            found |= in;
        } else if (in && sscanf(line, "ShmemPmdMapped: %llu kB", &kb) == 1) {
            break;
        }
    }
    fclose(f);
    return found ? (long long)kb * 1024 : -ENOENT;
}

int seg_publish(struct seg *s, const char *path)
{
    if (link(s->path, path) < 0)
        return -errno;
    unlink(s->path);
    snprintf(s->path, sizeof(s->path), "%s", path);
    s->owner = false;
    return 0;
}

int seg_map(struct seg *s, const char *path, size_t size, bool writable)
{
    memset(s, 0, sizeof(*s));
    s->fd = -1;
    int rc = 0, fd = open(path, (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    struct stat st, now;
    if (fstat(fd, &st) < 0) {
        rc = -errno;
        goto out_close;
    }
    if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size != size || size == 0) {
        rc = -EINVAL;
        goto out_close;
    }
    /* in use from here (shm purge takes LOCK_EX to remove one); if purge removed it between the
     * open and the lock, the name no longer leads here */
    while ((rc = flock(fd, LOCK_SH)) < 0 && errno == EINTR)
        ;
    if (rc < 0) {
        rc = -errno;
        goto out_close;
    }
    if (stat(path, &now) < 0 || now.st_dev != st.st_dev || now.st_ino != st.st_ino) {
        rc = -ENOENT;
        goto out_close;
    }
    void *p = shardlm_mmap(NULL, size, PROT_READ | (writable ? PROT_WRITE : 0), MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        rc = -errno;
        goto out_close;
    }
    snprintf(s->path, sizeof(s->path), "%s", path);
    s->base = p;
    s->size = size;
    s->fd = fd; /* held for the lock */
    return 0;
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
    if (s->fd > 0) /* a zeroed struct has 0 here, which is never a descriptor of ours */
        close(s->fd);
    memset(s, 0, sizeof(*s));
}

/* Name matching: advances *@p over 1..@max characters of @set, or over the text @lit. */
static bool span(const char **p, const char *set, size_t max)
{
    size_t n = strspn(*p, set);
    if (n == 0 || n > max)
        return false;
    *p += n;
    return true;
}

static bool lit(const char **p, const char *lit)
{
    size_t n = strlen(lit);
    if (strncmp(*p, lit, n))
        return false;
    *p += n;
    return true;
}

#define DIGITS "0123456789"

void seg_weights_name(char *out, size_t len, uint64_t checksum, uint32_t layout, int rank,
                      int ranks, int node, uint32_t experts)
{
    char n[16] = "x";
    if (node >= 0)
        snprintf(n, sizeof(n), "%d", node);
    snprintf(out, len, SEG_PERSIST_PREFIX "%016llx-l%u-r%dof%d%s-n%s.weights",
             (unsigned long long)checksum, layout, rank, ranks, experts ? "e" : "", n);
}

bool seg_is_weights_name(const char *name)
{
    const char *p = name;
    return lit(&p, SEG_PERSIST_PREFIX) && span(&p, "0123456789abcdef", 16) && p == name + 18 &&
           lit(&p, "-l") && span(&p, DIGITS, 10) && lit(&p, "-r") && span(&p, DIGITS, 4) &&
           lit(&p, "of") && span(&p, DIGITS, 4) && (lit(&p, "e") || true) && lit(&p, "-n") &&
           (lit(&p, "x") || span(&p, DIGITS, 4)) && strcmp(p, ".weights") == 0;
}

pid_t seg_run_pid(const char *name)
{
    const char *p = name;
    if (!span(&p, DIGITS, 10) || *p != '.')
        return 0;
    long v = strtol(name, NULL, 10);
    const char *what = ++p;
    bool ours = !strcmp(what, SEG_RUN_SOCK) || !strcmp(what, SEG_RUN_EXCHANGE) ||
                (lit(&p, "kv.r") && span(&p, DIGITS, 4) && !*p) || seg_is_weights_name(what);
    return ours && v > 0 && v <= 0x3fffffff ? (pid_t)v : 0;
}

bool seg_pid_alive(pid_t pid) { return kill(pid, 0) == 0 || errno == EPERM; }

static int clean(const char *rundir, pid_t only)
{
    DIR *d = opendir(rundir);
    if (!d)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        pid_t pid = seg_run_pid(e->d_name);
        struct stat st;
        if (!pid || (only ? pid != only : seg_pid_alive(pid)))
            continue;
        /* what we make: regular files, and the socket; never a link or a folder of that name */
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 ||
            !(S_ISREG(st.st_mode) || S_ISSOCK(st.st_mode)))
            continue;
        if (unlinkat(dirfd(d), e->d_name, 0) == 0)
            n++;
    }
    closedir(d);
    return n;
}

int seg_clean_stale(const char *rundir) { return clean(rundir, 0); }

int seg_clean_pid(const char *rundir, pid_t pid) { return clean(rundir, pid); }

/* Offsets of the parts: header, tokens, block tables, logits, all-reduce area, each 64-byte
 * aligned. */
void seg_exchange_layout(const struct seg_exchange_dims *d, struct seg_exchange *h)
{
    h->max_tokens = d->max_tokens;
    h->vocab = d->vocab;
    h->logit_rows = d->logit_rows;
    h->n_ranks = d->n_ranks;
    h->dim = d->dim;
    h->max_blocks = d->max_blocks;
    h->reserved = 0;
    h->tokens_off = (sizeof(*h) + 63) / 64 * 64;
    h->blocks_off = h->tokens_off + ((size_t)d->max_tokens * 4 + 63) / 64 * 64;
    h->logits_off = h->blocks_off + ((size_t)d->max_blocks * 4 + 63) / 64 * 64;
    h->ar_off = h->logits_off + ((size_t)d->logit_rows * d->vocab * 4 + 63) / 64 * 64;
    h->bytes = h->ar_off + seg_ar_bytes((int)d->n_ranks, (size_t)SEG_MAX_CHUNK * d->dim);
}

size_t seg_exchange_bytes(const struct seg_exchange_dims *d)
{
    struct seg_exchange h;
    seg_exchange_layout(d, &h);
    return h.bytes;
}

void seg_exchange_init(void *base, const struct seg_exchange_dims *d)
{
    struct seg_exchange *h = base;
    seg_exchange_layout(d, h);
    seg_ar_init(seg_exchange_ar(base), (int)d->n_ranks, (size_t)SEG_MAX_CHUNK * d->dim);
    __atomic_store_n(&h->magic, SEG_EXCHANGE_MAGIC, __ATOMIC_RELEASE);
}

int seg_exchange_check(const void *base, size_t size, uint32_t vocab, uint32_t n_ranks,
                       uint32_t dim)
{
    const struct seg_exchange *h = base;
    struct seg_exchange want;
    if (size < sizeof(*h) || h->magic != SEG_EXCHANGE_MAGIC || h->vocab != vocab ||
        h->n_ranks != n_ranks || h->dim != dim || h->max_tokens == 0 || h->logit_rows == 0 ||
        h->max_blocks == 0)
        return -EINVAL;
    struct seg_exchange_dims d = {h->max_tokens, vocab, h->logit_rows, n_ranks, dim, h->max_blocks};
    seg_exchange_layout(&d, &want);
    if (h->tokens_off != want.tokens_off || h->blocks_off != want.blocks_off ||
        h->logits_off != want.logits_off || h->ar_off != want.ar_off || h->bytes != want.bytes ||
        want.bytes != size)
        return -EINVAL;
    return seg_ar_check((const char *)base + h->ar_off, size - h->ar_off, (int)n_ranks,
                        (size_t)SEG_MAX_CHUNK * dim);
}

_Static_assert(sizeof(struct seg_kv) <= 64, "the KV header fits before data_off");

size_t seg_kv_bytes(uint32_t n_blocks, uint32_t n_layers, uint32_t kv_dim, bool keys_only)
{
    return 64 + (size_t)n_blocks * seg_kv_block_bytes(n_layers, kv_dim, keys_only);
}

void seg_kv_init(void *base, uint32_t n_blocks, uint32_t n_layers, uint32_t kv_dim, bool keys_only)
{
    struct seg_kv *h = base;
    h->n_blocks = n_blocks;
    h->n_layers = n_layers;
    h->block_tokens = SEG_KV_BLOCK;
    h->kv_dim = kv_dim;
    h->keys_only = keys_only;
    h->data_off = 64;
    h->bytes = seg_kv_bytes(n_blocks, n_layers, kv_dim, keys_only);
    __atomic_store_n(&h->magic, SEG_KV_MAGIC, __ATOMIC_RELEASE);
}

int seg_kv_check(const void *base, size_t size, uint32_t n_layers, uint32_t kv_dim, bool keys_only)
{
    const struct seg_kv *h = base;
    if (size < 64 || h->magic != SEG_KV_MAGIC || h->n_layers != n_layers ||
        h->block_tokens != SEG_KV_BLOCK || h->kv_dim != kv_dim ||
        h->keys_only != (uint32_t)keys_only || h->n_blocks == 0 || h->data_off != 64 ||
        h->bytes != size || seg_kv_bytes(h->n_blocks, n_layers, kv_dim, keys_only) != size)
        return -EINVAL;
    return 0;
}
