/* SPDX-License-Identifier: MIT */
/* shm/seg.h: the runtime directory, shared-memory segments, and the layouts of the exchange and
 * KV segments.
 *
 * Every segment is a file in the runtime directory, a private (0700) folder on tmpfs: the one
 * its caller names ($SHARDLM_RUNTIME_DIR for the CLI), else /dev/shm/shardlm-<uid>. Files
 * are 0600 and named "<coordinator pid>.<what>", so the segments of a coordinator that died can be
 * told from live ones (seg_clean_stale). The coordinator creates and owns them and unlinks them on
 * exit; workers map them by path.
 */
#ifndef SHARDLM_SEG_H
#define SHARDLM_SEG_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* A cap on the bytes of segment memory the segments charged to it allocate (created whole or
 * reserved; freeing gives none back): past @limit (0: no cap) creation and seg_reserve() fail
 * with -ENOSPC, as on a full tmpfs (the engine's comes from SHARDLM_SHM_LIMIT, for tests where
 * mounting a small tmpfs is impossible). Its owner zeroes it, sets @limit before any segment is
 * charged to it and keeps it while they live. A charge is one compare-and-swap: the cap holds
 * exactly whatever creations in other threads do. */
struct seg_budget {
    uint64_t limit;
    _Atomic uint64_t used; /* bytes allocated so far */
};

struct seg {
    char path[PATH_MAX]; /* a memfd's is /proc/<pid>/fd/<fd>, which other processes can open */
    void *base;
    size_t size;
    bool owner; /* created by this process under a name of its own: seg_free() unlinks it */
    bool huge;  /* SEG_HUGE: MADV_HUGEPAGE, and seg_reserve() faults pages in through the map */
    int fd;     /* held open while it lives: a created segment's (seg_reserve), a mapped one's for
                 * its lock; -1 for none (0 when zeroed) */
    struct seg_budget *budget; /* what its allocations are charged to; NULL: nothing */
};

/* Persistent weights segments, named "w-<model checksum>-l<layout>-r<rank>of<ranks>[e]-n<node>
 * .weights" in the runtime directory (e: a MoE model's experts placed whole on the ranks), outlive
 * their coordinator so that the next one starts warm; `shardlm shm purge` removes them. A process
 * that maps or creates one holds a shared flock(2) on it while it does, so that purge can tell a
 * segment in use (it takes the exclusive lock to remove one). */
#define SEG_PERSIST_PREFIX "w-"
/* Writes the name of a persistent weights segment (@node -1: not bound, "x"; @experts
 * shlm_header.experts_placement) to @out. */
void seg_weights_name(char *out, size_t len, uint64_t checksum, uint32_t layout, int rank,
                      int ranks, int node, uint32_t experts);
/* Whether @name is exactly a persistent weights segment's name. */
bool seg_is_weights_name(const char *name);
/* The <what> of the run files: "<pid>.sock", "<pid>.exchange", "<pid>.kv.r<rank>", and
 * "<pid>.<weights name>" while a weights segment is built. */
#define SEG_RUN_SOCK "sock"
#define SEG_RUN_EXCHANGE "exchange"
#define SEG_RUN_KV_FMT "kv.r%d"

/* Creates (0700) or checks the runtime directory @path (the CLI passes $SHARDLM_RUNTIME_DIR; code
 * below the CLI never reads the environment), or the default /dev/shm/shardlm-<uid> for NULL,
 * and writes its path to @out. Returns 0 or -errno (-EPERM if it exists but is not ours or not
 * private, -EINVAL for "", -ENAMETOOLONG for a path of PATH_MAX bytes or more). */
int seg_rundir(const char *path, char *out, size_t len);
/* The default runtime directory, /dev/shm/shardlm-<uid>, into @out. */
void seg_rundir_default(char *out, size_t len);
/* Creates @path (0700) or checks it: a directory owned by this user, closed to others. Returns 0
 * or -errno (-EPERM if it exists but is not ours or not private). */
int seg_rundir_make(const char *path);
/* The runtime directory's path alone (nothing created): @path, or the default for NULL. Returns
 * 0, -EINVAL for "" (an empty SHARDLM_RUNTIME_DIR), -ENAMETOOLONG as seg_rundir. */
int seg_rundir_path(const char *path, char *out, size_t len);
/* Path of the runtime file "<pid>.<what>". */
void seg_path(char *out, size_t len, const char *rundir, pid_t pid, const char *what);

/* Creates the segment @path (must not exist) of @size bytes, allocated now (so a full tmpfs
 * fails here with -ENOSPC, not later with SIGBUS), and maps it read-write.
 * Returns 0 or -errno; nothing is left behind on error. Release with seg_free(). */
int seg_create(struct seg *s, const char *path, size_t size);
/* The same with the memory bound to NUMA node @node (mbind MPOL_BIND before the first page is
 * allocated; -1: no binding, or the kernel has no NUMA), and @flags: */
#define SEG_ANON                                                                                   \
    1u                  /* an anonymous memfd named @path (for /proc): no file in the runtime      \
                         * directory; the memory goes with the last process that maps it or        \
                         * holds the descriptor */
#define SEG_LAZY 2u     /* allocate nothing yet: seg_reserve() each range before it is touched */
#define SEG_HUGE                                                                                   \
    4u /* ask for 2 MiB pages (MADV_HUGEPAGE): a tmpfs mounted huge=within_size, always or      \
        * advise, or for a memfd shmem_enabled set so, then gives them; else 4 KiB pages */
int seg_create_on(struct seg *s, const char *path, size_t size, int node, unsigned flags);
/* seg_create_on() with the segment's allocations (its creation, seg_reserve) charged to @b
 * (NULL: nothing; seg_create_on charges nothing). */
int seg_create_in(struct seg *s, struct seg_budget *b, const char *path, size_t size, int node,
                  unsigned flags);
/* Allocates the bytes [off, off + len) of a segment this process created (SEG_LAZY): 0, or
 * -ENOSPC when the tmpfs is full - the error a touch of those pages would turn into SIGBUS.
 * A SEG_HUGE segment's pages are faulted in through its mapping (MADV_POPULATE_WRITE), so that a
 * tmpfs in "advise" mode can give 2 MiB pages (fallocate has no mapping to be advised); without
 * that call (Linux < 5.14) they are allocated as for any other segment. */
int seg_reserve(struct seg *s, size_t off, size_t len);
/* Bytes of @s that this process maps with 2 MiB pages (ShmemPmdMapped of its mapping in
 * /proc/self/smaps), after mapping every page of it (MADV_POPULATE_READ). For a segment whose
 * pages all exist, as a loaded weights segment's (on a hole the read would allocate a page); the
 * page size is the file's, so every process that maps it gets the same. Returns the bytes or
 * -errno. */
long long seg_huge_bytes(struct seg *s);
/* Gives the segment @s, created under a temporary name, its final name @path at once (link),
 * so that a segment under its final name is always complete; it then outlives this process
 * (seg_free() no longer unlinks it). -EEXIST: another process published one first. */
int seg_publish(struct seg *s, const char *path);

/* Maps the existing segment @path, which must be exactly @size bytes, and holds a shared lock on
 * it until seg_free(). Returns 0 or -errno (-EINVAL for a size mismatch; -ENOENT also when the
 * file was removed while this opened it). Release with seg_free(). */
int seg_map(struct seg *s, const char *path, size_t size, bool writable);
/* Unmaps, and unlinks if this process created it. Safe on a zeroed struct. */
void seg_free(struct seg *s);

/* The coordinator pid of a run file named exactly "<pid>.<what>" for one of the <what> above, or 0
 * if the name is not one (a user's "123.sock.bak" is not). */
pid_t seg_run_pid(const char *name);
/* Whether process @pid exists (one of another user counts). */
bool seg_pid_alive(pid_t pid);
/* Removes runtime files of coordinators that are no longer alive. Returns how many. */
int seg_clean_stale(const char *rundir);
/* Removes every runtime file of coordinator @pid. Returns how many. */
int seg_clean_pid(const char *rundir, pid_t pid);

/* Exchange segment: step inputs written by the coordinator (tokens and the sequences' KV block
 * tables), logits written by the workers (each its vocabulary columns), and the all-reduce area
 * of the group (allreduce.h). */
#define SEG_EXCHANGE_MAGIC 0x58434853u /* "SHCX" */
#define SEG_MAX_CHUNK 256              /* tokens per forward chunk: sizes the all-reduce slots */
struct seg_exchange {
    uint32_t magic;
    uint32_t max_tokens; /* capacity of tokens[] */
    uint32_t vocab;
    uint32_t logit_rows; /* capacity of logits[] in rows of vocab floats */
    uint32_t n_ranks;
    uint32_t dim;        /* all-reduce slots hold SEG_MAX_CHUNK x dim floats */
    uint32_t max_blocks; /* capacity of blocks[]: the block tables of a step's sequences */
    uint32_t reserved;
    uint64_t tokens_off, blocks_off, logits_off, ar_off, bytes;
};
/* The sizes of an exchange segment. */
struct seg_exchange_dims {
    uint32_t max_tokens, vocab, logit_rows, n_ranks, dim, max_blocks;
};
size_t seg_exchange_bytes(const struct seg_exchange_dims *d);
/* The header fields (offsets of the parts, each 64-byte aligned, and bytes) of such a segment. */
void seg_exchange_layout(const struct seg_exchange_dims *d, struct seg_exchange *h);
/* Writes the header and the all-reduce area into a fresh zeroed segment of
 * seg_exchange_bytes() bytes. */
void seg_exchange_init(void *base, const struct seg_exchange_dims *d);
/* Checks a mapped exchange segment of @size bytes for a group of @n_ranks over a model of
 * @vocab and @dim. 0 or -EINVAL. */
int seg_exchange_check(const void *base, size_t size, uint32_t vocab, uint32_t n_ranks,
                       uint32_t dim);
static inline void *seg_exchange_ar(void *base)
{
    return (char *)base + ((struct seg_exchange *)base)->ar_off;
}
static inline int32_t *seg_exchange_tokens(void *base)
{
    return (int32_t *)((char *)base + ((struct seg_exchange *)base)->tokens_off);
}
static inline uint32_t *seg_exchange_blocks(void *base)
{
    return (uint32_t *)((char *)base + ((struct seg_exchange *)base)->blocks_off);
}
static inline float *seg_exchange_logits(void *base)
{
    return (float *)((char *)base + ((struct seg_exchange *)base)->logits_off);
}

/* KV segment of one rank: a pool of n_blocks blocks of SEG_KV_BLOCK positions that sequences
 * share through block tables (the coordinator owns them and writes a step's into the exchange
 * segment). Block b holds, layer after layer, the keys then the values of its positions,
 * (SEG_KV_BLOCK, kv_dim) floats each (@keys_only: the keys only - latent attention's cache, the
 * latent and the RoPE key of each position, which is both). */
#define SEG_KV_MAGIC 0x32564b53u /* "SKV2" */
#define SEG_KV_BLOCK 16 /* tokens per block: KN_KV_BLOCK of the kernels (worker/model.c checks) */
struct seg_kv {
    uint32_t magic;
    uint32_t n_blocks, n_layers, block_tokens, kv_dim;
    uint32_t keys_only; /* 1: a block holds no values (latent attention reads its keys' rows as
                         * values: seg_kv_values() is seg_kv_keys()); 0: keys then values */
    uint64_t data_off, bytes;
};
/* A block table entry no layer reads any more (seg_kv_dead_blocks): the block went back to the
 * pool and the worker refuses to be pointed at it. */
#define SEG_KV_NONE UINT32_MAX
/* Of a sequence whose next chunk starts at position @pos, the leading blocks no layer reads
 * again when every layer attends within @window positions (shlm_kv_window; 0: none): the query
 * at pos reads keys from pos - window + 1 on, later ones later still. */
static inline uint32_t seg_kv_dead_blocks(uint32_t window, uint64_t pos)
{
    return window && pos + 1 > window ? (uint32_t)((pos + 1 - window) / SEG_KV_BLOCK) : 0;
}
/* Whether a sequence writing positions [pa, pa + na) through table @ta and one writing
 * [pb, pb + nb) through @tb write a block in common (a step may not: both would write it at
 * once). na, nb >= 1. */
static inline bool seg_kv_writes_overlap(const uint32_t *ta, uint32_t pa, uint32_t na,
                                         const uint32_t *tb, uint32_t pb, uint32_t nb)
{
    for (uint32_t i = pa / SEG_KV_BLOCK; i <= (pa + na - 1) / SEG_KV_BLOCK; i++)
        for (uint32_t j = pb / SEG_KV_BLOCK; j <= (pb + nb - 1) / SEG_KV_BLOCK; j++)
            if (ta[i] == tb[j])
                return true;
    return false;
}

/* Bytes of one block (of keys only with @keys_only). */
static inline size_t seg_kv_block_bytes(uint32_t n_layers, uint32_t kv_dim, bool keys_only)
{
    return (size_t)n_layers * (keys_only ? 1 : 2) * SEG_KV_BLOCK * kv_dim * sizeof(float);
}
size_t seg_kv_bytes(uint32_t n_blocks, uint32_t n_layers, uint32_t kv_dim, bool keys_only);
void seg_kv_init(void *base, uint32_t n_blocks, uint32_t n_layers, uint32_t kv_dim, bool keys_only);
/* Checks a mapped KV segment against the dimensions the model needs. 0 or -EINVAL. */
int seg_kv_check(const void *base, size_t size, uint32_t n_layers, uint32_t kv_dim, bool keys_only);
/* Keys of block 0 at @layer: SEG_KV_BLOCK * kv_dim floats, in the worker's order (each KV head's
 * SEG_KV_BLOCK rows together); block b's are seg_kv_block_floats() * b floats further, the
 * values SEG_KV_BLOCK * kv_dim after the keys (keys_only: the keys themselves). */
static inline float *seg_kv_keys(void *base, uint32_t layer)
{
    const struct seg_kv *h = base;
    return (float *)((char *)base + h->data_off) +
           (size_t)layer * (h->keys_only ? 1 : 2) * SEG_KV_BLOCK * h->kv_dim;
}
static inline float *seg_kv_values(void *base, uint32_t layer)
{
    const struct seg_kv *h = base;
    return seg_kv_keys(base, layer) + (h->keys_only ? 0 : (size_t)SEG_KV_BLOCK * h->kv_dim);
}
static inline size_t seg_kv_block_floats(const void *base)
{
    const struct seg_kv *h = base;
    return seg_kv_block_bytes(h->n_layers, h->kv_dim, h->keys_only) / sizeof(float);
}

#endif
