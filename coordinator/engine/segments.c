/* SPDX-License-Identifier: MIT */
/* coordinator/engine/segments.c: the runtime directory, the weights, KV and exchange segments. */
#include "engine_internal.h"

#include "allreduce.h"
#include "plan.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <sys/stat.h>
#include <unistd.h>

int coord_rundir_path(struct coord_engine *g, const struct coord_engine_opts *o,
                      struct shardlm_err *e)
{
    int rc = seg_rundir_path(o->rundir, g->rundir, sizeof(g->rundir));
    if (rc == -EINVAL)
        return shardlm_fail(e, rc, "the runtime directory is an empty path");
    if (rc)
        return shardlm_fail(e, rc, "the runtime directory is a path of %zu bytes (at most %d)",
                            strlen(o->rundir), PATH_MAX - 1);
    return 0;
}

int coord_rundir_open(struct coord_engine *g, struct shardlm_err *e)
{
    g->made_rundir = access(g->rundir, F_OK) < 0;
    int rc = seg_rundir_make(g->rundir);
    if (rc)
        return shardlm_fail(e, rc, "runtime directory %s: %s", g->rundir,
                            rc == -EPERM ? "not a private directory owned by this user"
                                         : strerror(-rc));
    return 0;
}

int32_t *coord_exch_tokens(const struct coord_engine *g)
{
    return (int32_t *)((char *)g->exch.base + g->exch_layout.tokens_off);
}

uint32_t *coord_exch_blocks(const struct coord_engine *g)
{
    return (uint32_t *)((char *)g->exch.base + g->exch_layout.blocks_off);
}

float *coord_exch_logits(const struct coord_engine *g)
{
    return (float *)((char *)g->exch.base + g->exch_layout.logits_off);
}

void *coord_exch_ar(const struct coord_engine *g)
{
    return (char *)g->exch.base + g->exch_layout.ar_off;
}

int coord_group_fail(struct coord_engine *g, int rc)
{
    if (g->exch.base)
        seg_ar_abort(coord_exch_ar(g));
    return rc;
}

/* The name of rank @r's persistent weights segment: the model (its checksum, which covers every
 * tensor's), the layout and the shard plan (ranks, rank, node). */
static void persist_name(const struct coord_engine *g, int r, const struct shlm_header *h,
                         char *out, size_t len)
{
    seg_weights_name(out, len, h->source_checksum, h->layout, r, g->n_ranks,
                     g->layout.ranks[r].node, h->experts_placement);
}

/* Maps the persistent segment @path if it is complete and holds exactly @want's shard (with
 * @verify, its data also matches its tensors' checksums); else removes it when it exists (a load
 * killed half way, another layout, changed data) and returns -ENOENT.
 * A warm start trusts the header: its checksum, the model's checksum, the layout and the shard;
 * the data is what this process's load wrote and checksummed, unless --verify reads it again. */
static int map_persistent(const struct coord_engine *g, struct seg *s, const char *path,
                          const struct shlm_header *want, bool verify)
{
    struct shlm_model m;
    struct shardlm_err err;
    int rc = seg_map(s, path, want->file_bytes, false);
    if (rc == -ENOENT)
        return rc;
    bool ours = !rc && !(rc = shlm_parse(&m, s->base, s->size, path, &err)) &&
                m.hdr->source_checksum == want->source_checksum && m.hdr->layout == want->layout &&
                m.hdr->shard_rank == want->shard_rank && m.hdr->shard_count == want->shard_count &&
                m.hdr->experts_placement == want->experts_placement;
    if (ours && (!verify || !(rc = shlm_verify_data(&m, path, &err))))
        return 0;
    coord_logf(&g->log, COORD_LOG_WARN, "%s: %s; rebuilding it", path,
               (rc == -EINVAL || rc == -EIO) && s->base ? err.msg
                                                        : "not a complete segment of this shard");
    seg_free(s);
    unlink(path);
    return -ENOENT;
}

/* Publishes the weights segments the load built under their persistent names. */
static int publish_weights(struct coord_engine *g, const struct coord_load_dest *dest, int n,
                           const struct shlm_header *h, char (*name)[NAME_MAX + 1], bool verify,
                           struct shardlm_err *e)
{
    for (int i = 0; i < n; i++) {
        int r = dest[i].rank;
        char path[PATH_MAX + NAME_MAX + 2];
        snprintf(path, sizeof(path), "%s/%s", g->rundir, name[r]);
        int rc = seg_publish(&g->ranks[r].weights, path);
        if (rc == -EEXIST) { /* another coordinator published the same shard first: ours goes */
            seg_free(&g->ranks[r].weights);
            rc = map_persistent(g, &g->ranks[r].weights, path, &h[r], verify);
        }
        if (rc)
            return shardlm_fail(e, rc, "publish %s: %s", path, strerror(-rc));
    }
    return 0;
}

/* With --verbose: the page size each weights segment got (SEG_HUGE asks for 2 MiB pages; the
 * tmpfs decides). The figure costs a walk of the segment's page tables, so only then. */
static void log_pages(struct coord_engine *g, bool anon)
{
    if (!coord_log_on(&g->log, COORD_LOG_DEBUG))
        return;
    for (int r = 0; r < g->n_ranks; r++) {
        struct seg *w = &g->ranks[r].weights;
        long long huge = seg_huge_bytes(w);
        double mib = (double)w->size / (1 << 20);
        if (huge > 0)
            coord_logf(&g->log, COORD_LOG_DEBUG,
                       "weights segment of rank %d: %.1f of %.1f MiB in 2 MiB pages", r,
                       (double)huge / (1 << 20), mib);
        else if (w->size < (2u << 20))
            coord_logf(&g->log, COORD_LOG_DEBUG,
                       "weights segment of rank %d: %.1f MiB in 4 KiB pages (less than one 2 MiB "
                       "page)",
                       r, mib);
        else
            coord_logf(&g->log, COORD_LOG_DEBUG,
                       "weights segment of rank %d: %.1f MiB in 4 KiB pages (%s gives no 2 MiB "
                       "pages: %s)",
                       r, mib, anon ? "shared memory" : g->rundir,
                       anon ? "/sys/kernel/mm/transparent_hugepage/shmem_enabled is never or deny"
                            : "a tmpfs mounted without huge=within_size, always or advise");
    }
}

/* The weights segment of every rank: a complete persistent one is mapped as it is; the others
 * are created (under a temporary name, or as memfds with no_persist), filled by one streaming
 * pass over the file, and published under their persistent names. */
static int make_weights(struct coord_engine *g, const struct coord_engine_opts *o,
                        struct shardlm_err *e)
{
    int n = 0, rc = 0, R = g->n_ranks;
    uint64_t t0 = shardlm_now_ns();
    struct coord_load_dest *dest = calloc((size_t)R, sizeof(*dest));
    struct shlm_tensor *table = calloc(SHLM_MAX_TENSORS, sizeof(*table));
    struct shlm_header *h = calloc((size_t)R, sizeof(*h));
    char(*name)[NAME_MAX + 1] = calloc((size_t)R, sizeof(*name));
    if (!dest || !table || !h || !name) {
        rc = shardlm_fail(e, -ENOMEM, "out of memory");
        goto out;
    }
    for (int r = 0; r < R; r++) {
        struct coord_rank *cr = &g->ranks[r];
        char path[PATH_MAX + NAME_MAX + 2];
        int n_tensors = coord_shard_layout(&g->img, R, r, o->load.experts, &h[r], table);
        if (n_tensors < 0) {
            rc = n_tensors == -ENOMEM
                     ? shardlm_fail(e, n_tensors, "out of memory")
                     : shardlm_fail(e, n_tensors, "cannot split the model over %d ranks", R);
            goto out;
        }
        int node = g->layout.ranks[r].node;
        if (o->load.no_persist) {
            snprintf(path, sizeof(path), "shardlm-weights-r%d", r);
            rc = seg_create_in(&cr->weights, &g->shm_budget, path, h[r].file_bytes, node,
                               SEG_ANON | SEG_LAZY | SEG_HUGE);
        } else {
            persist_name(g, r, &h[r], name[r], sizeof(name[r]));
            snprintf(path, sizeof(path), "%s/%s", g->rundir, name[r]);
            if (map_persistent(g, &cr->weights, path, &h[r], o->load.verify) == 0) {
                g->stats.reused++;
                continue;
            }
            seg_path(path, sizeof(path), g->rundir, getpid(), name[r]);
            rc = seg_create_in(&cr->weights, &g->shm_budget, path, h[r].file_bytes, node,
                               SEG_LAZY | SEG_HUGE);
        }
        if (rc) {
            shardlm_fail(e, rc, "weights segment of rank %d (%llu bytes) in %s: %s", r,
                         (unsigned long long)h[r].file_bytes,
                         o->load.no_persist ? "a memfd" : g->rundir, strerror(-rc));
            goto out;
        }
        dest[n++] = (struct coord_load_dest){r, &cr->weights};
    }
    if (n && (rc = coord_load_shards(&g->file, R, dest, n, &o->load, &g->log, g->cancel,
                                     &g->stats.load, e)))
        goto out;
    g->stats.load.ns = shardlm_now_ns() - t0; /* with the segments' allocation */
    g->stats.peak_anon = g->stats.load.peak_anon;
    g->stats.built = n;
    if (!o->load.no_persist)
        rc = publish_weights(g, dest, n, h, name, o->load.verify, e);
    if (!rc)
        log_pages(g, o->load.no_persist);
out:
    free(dest);
    free(table);
    free(h);
    free(name);
    return rc;
}

/* Creates a run segment (KV, exchange): a file "<pid>.<what>" in the runtime directory, or with
 * @anon a memfd. */
static int run_segment(struct coord_engine *g, bool anon, struct seg *s, const char *what,
                       size_t size, int node, unsigned flags, struct shardlm_err *e)
{
    char path[PATH_MAX];
    if (anon)
        snprintf(path, sizeof(path), "shardlm-%s", what);
    else
        seg_path(path, sizeof(path), g->rundir, getpid(), what);
    int rc = seg_create_in(s, &g->shm_budget, path, size, node, flags | (anon ? SEG_ANON : 0));
    if (rc)
        return shardlm_fail(e, rc, "%s segment (%zu bytes) in %s: %s", what, size,
                            anon ? "a memfd" : g->rundir, strerror(-rc));
    return 0;
}

/* Bytes of one KV block over all ranks. */
static uint64_t kv_block_bytes(const struct coord_engine *g)
{
    const struct shlm_config *c = &g->img.hdr->cfg;
    int group = g->img.hdr->scheme >= SHLM_SCHEME_W4A16 ? (int)g->img.hdr->group : 0;
    uint64_t sum = 0;
    for (int r = 0; r < g->n_ranks; r++) {
        struct seg_plan p;
        /* the weights segments were made with this plan */
        KN_ASSERT(!seg_plan_place(&p, c, &g->img.hdr->cfgx, group, g->n_ranks, r, g->experts));
        sum += seg_kv_block_bytes(c->n_layers, (uint32_t)p.kv_dim, p.kv_keys_only);
    }
    return sum;
}

/* Bytes the kernel says are available (MemAvailable), or UINT64_MAX when it does not say. */
static uint64_t mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "re");
    unsigned long long kb = 0;
    char line[256];
    bool found = false;
    while (f && fgets(line, sizeof(line), f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
            found = true;
            break;
        }
    if (f)
        fclose(f);
    return found ? (uint64_t)kb * 1024 : UINT64_MAX;
}

/* Bytes the KV cache may take: the memory available (MemAvailable), and in the runtime directory
 * the room its filesystem has left unless the segments are memfds; *@what names the smaller. */
static uint64_t kv_room(const struct coord_engine *g, const char **what)
{
    uint64_t room = mem_available();
    struct statvfs vfs;
    *what = "the memory available (MemAvailable)";
    if (!g->anon_segments && statvfs(g->rundir, &vfs) == 0 &&
        (uint64_t)vfs.f_bavail * vfs.f_frsize < room) {
        room = (uint64_t)vfs.f_bavail * vfs.f_frsize;
        *what = "the room left in the runtime directory";
    }
    return room;
}

/* The KV cache's blocks into g->kv_blocks, from the options (engine.h). Never more than 7/8 of
 * the memory available holds (a pool of 2^27 blocks for a 512-token context cost the coordinator
 * 1.6 GB of block bookkeeping), nor, without a prefix cache, than max_seqs whole contexts
 * (blocks past them no sequence can use; with the cache they keep prefixes); a request past
 * either is capped, and the log says so in one line. Returns 0, or -ENOMEM when not one block
 * fits. */
static int kv_size(struct coord_engine *g, const struct coord_engine_opts *o, struct shardlm_err *e)
{
    uint64_t bb = kv_block_bytes(g), n;
    uint64_t whole = (uint64_t)g->max_seqs * coord_kv_blocks_for(g->img.hdr->cfg.seq_len);
    const char *what;
    uint64_t room = kv_room(g, &what);
    char asked[64] = ""; /* the option a capped request came from */
    if (o->kv_blocks) {
        n = o->kv_blocks;
        snprintf(asked, sizeof(asked), "--kv-tokens %llu",
                 (unsigned long long)o->kv_blocks * COORD_KV_BLOCK);
    } else if (o->kv_mem) {
        n = o->kv_mem / bb;
        if (!n)
            return shardlm_fail(e, -EINVAL, "--kv-mem %llu bytes: one KV block takes %llu",
                                (unsigned long long)o->kv_mem, (unsigned long long)bb);
        snprintf(asked, sizeof(asked), "--kv-mem %llu", (unsigned long long)o->kv_mem);
    } else {
        n = whole;
        if (o->kv_fit) { /* the default: half the memory, the rest for everything else */
            uint64_t fit = room / 2 / bb;
            n = fit < n ? fit : n;
            n = n ? n : 1;
        }
    }
    if (room / bb == 0)
        return shardlm_fail(e, -ENOMEM,
                            "the KV cache: one block takes %llu bytes, more than %s (%llu "
                            "bytes)",
                            (unsigned long long)bb, what, (unsigned long long)room);
    if (*asked && n > whole && o->kv_no_prefixes) {
        coord_logf(&g->log, COORD_LOG_WARN,
                   "%s: capped at %llu positions (%llu blocks): %u sequence%s (--max-seqs) of a "
                   "context of %u %s all the model can use without a prefix cache",
                   asked, (unsigned long long)whole * COORD_KV_BLOCK, (unsigned long long)whole,
                   g->max_seqs, g->max_seqs > 1 ? "s" : "", g->img.hdr->cfg.seq_len,
                   g->max_seqs > 1 ? "are" : "is");
        n = whole;
    }
    /* an eighth of the room kept for everything else: the pool is reserved as it is used, and
     * with the prefix cache it does fill up in time */
    uint64_t most = (room - room / 8) / bb;
    if (*asked && n > most) {
        coord_logf(&g->log, COORD_LOG_WARN,
                   "%s: capped at %llu positions (%llu blocks, %.1f MiB): 7/8 of %s holds no more",
                   asked, (unsigned long long)most * COORD_KV_BLOCK, (unsigned long long)most,
                   (double)(most * bb) / 1048576.0, what);
        n = most ? most : 1;
    }
    g->kv_blocks = n > UINT32_MAX / 2 ? UINT32_MAX / 2 : (uint32_t)n;
    coord_logf(&g->log, COORD_LOG_DEBUG,
               "kv cache: %u blocks of %d positions (%llu tokens), %.1f MiB over %d ranks",
               g->kv_blocks, COORD_KV_BLOCK, (unsigned long long)g->kv_blocks * COORD_KV_BLOCK,
               (double)g->kv_blocks * (double)bb / 1048576.0, g->n_ranks);
    return 0;
}

/* Every rank's KV segment, a pool of g->kv_blocks blocks, its header kept in kv_layout. */
static int make_kv(struct coord_engine *g, struct shardlm_err *e)
{
    const struct shlm_config *c = &g->img.hdr->cfg;
    int group = g->img.hdr->scheme >= SHLM_SCHEME_W4A16 ? (int)g->img.hdr->group : 0, rc;
    char what[32];
    for (int r = 0; r < g->n_ranks; r++) {
        struct coord_rank *cr = &g->ranks[r];
        struct seg_plan p;
        KN_ASSERT(!seg_plan_place(&p, c, &g->img.hdr->cfgx, group, g->n_ranks, r, g->experts));
        uint32_t kvd = (uint32_t)p.kv_dim;
        size_t kv_bytes = seg_kv_bytes(g->kv_blocks, c->n_layers, kvd, p.kv_keys_only);
        snprintf(what, sizeof(what), SEG_RUN_KV_FMT, r);
        /* blocks are reserved as steps first use them (coord_reserve_kv): a large pool costs
         * memory only when it is used */
        if ((rc = run_segment(g, g->anon_segments, &cr->kv, what, kv_bytes, g->layout.ranks[r].node,
                              SEG_LAZY, e)))
            return rc;
        if ((rc = seg_reserve(&cr->kv, 0, 64)))
            return shardlm_fail(e, rc, "KV segment of rank %d: %s", r, strerror(-rc));
        seg_kv_init(cr->kv.base, g->kv_blocks, c->n_layers, kvd, p.kv_keys_only);
        cr->kv_layout = *(const struct seg_kv *)cr->kv.base; /* no worker runs yet */
    }
    if (!(g->kv_reserved = calloc(g->kv_blocks, 1)))
        return shardlm_fail(e, -ENOMEM, "out of memory");
    return 0;
}

/* The exchange segment: the tokens of a context, as many logits rows as LOGITS_BUDGET allows,
 * the all-reduce area; its header kept in exch_layout. */
static int make_exchange(struct coord_engine *g, struct shardlm_err *e)
{
    const struct shlm_config *c = &g->img.hdr->cfg;
    uint32_t rows = LOGITS_BUDGET / (c->vocab_size * 4u), n = (uint32_t)g->n_ranks;
    rows = rows < 1 ? 1 : rows > c->seq_len ? c->seq_len : rows;
    struct seg_exchange *x = &g->exch_layout;
    /* a step's tokens fill at most a context; every sequence's table names at most a context */
    struct seg_exchange_dims d = {
        c->seq_len, c->vocab_size, rows, n, c->dim, g->max_seqs * coord_kv_blocks_for(c->seq_len)};
    seg_exchange_layout(&d, x);
    size_t x_bytes = seg_exchange_bytes(&d);
    /* the logits rows are reserved as steps need them (coord_reserve_logits) */
    int rc = run_segment(g, g->anon_segments, &g->exch, SEG_RUN_EXCHANGE, x_bytes, -1, SEG_LAZY, e);
    if (rc)
        return rc;
    if ((rc = seg_reserve(&g->exch, 0, x->logits_off)) ||
        (rc = seg_reserve(&g->exch, x->ar_off, x->bytes - x->ar_off)))
        return shardlm_fail(e, rc, "exchange segment (%zu bytes): %s", x_bytes, strerror(-rc));
    seg_exchange_init(g->exch.base, &d);
    if (!(g->tables = malloc((size_t)d.max_blocks * sizeof(uint32_t))))
        return shardlm_fail(e, -ENOMEM, "out of memory");
    return 0;
}

int coord_segments_make(struct coord_engine *g, const struct coord_engine_opts *o,
                        struct shardlm_err *e)
{
    g->anon_segments = o->load.no_persist;
    g->experts = o->load.experts;
    const struct shlm_config *c = &g->img.hdr->cfg;
    g->max_seqs = o->max_seqs ? o->max_seqs : 1;
    if (g->max_seqs > c->seq_len)
        return shardlm_fail(e, -EINVAL, "%u sequences per step: at most the context, %u",
                            g->max_seqs, c->seq_len);
    int rc = make_weights(g, o, e);
    if (rc || (rc = kv_size(g, o, e)))
        return rc;
    return (rc = make_kv(g, e)) ? rc : make_exchange(g, e);
}

void coord_segments_free(struct coord_engine *g)
{
    for (int r = 0; g->ranks && r < g->n_ranks; r++) {
        seg_free(&g->ranks[r].weights);
        seg_free(&g->ranks[r].kv);
    }
    seg_free(&g->exch);
    free(g->kv_reserved);
    g->kv_reserved = NULL;
    free(g->tables);
    g->tables = NULL;
}

/* Reserves the memory of block @b on every rank, once: a full tmpfs is an error here, not
 * SIGBUS in a worker. */
int coord_reserve_kv(struct coord_engine *g, uint32_t b, struct shardlm_err *e)
{
    if (g->kv_reserved[b])
        return 0;
    for (int r = 0; r < g->n_ranks; r++) {
        const struct seg_kv *h = &g->ranks[r].kv_layout;
        size_t bytes = seg_kv_block_bytes(h->n_layers, h->kv_dim, h->keys_only);
        int rc = seg_reserve(&g->ranks[r].kv, h->data_off + b * bytes, bytes);
        if (rc)
            return shardlm_fail(e, rc, "KV cache of rank %d: no memory for block %u in %s: %s", r,
                                b, g->anon_segments ? "a memfd" : g->rundir, strerror(-rc));
    }
    g->kv_reserved[b] = 1;
    return 0;
}

int coord_reserve_logits(struct coord_engine *g, uint32_t rows, struct shardlm_err *e)
{
    const struct seg_exchange *x = &g->exch_layout;
    if (rows <= g->logits_reserved)
        return 0;
    size_t row = (size_t)x->vocab * sizeof(float);
    int rc = seg_reserve(&g->exch, x->logits_off + g->logits_reserved * row,
                         (rows - g->logits_reserved) * row);
    if (rc)
        return shardlm_fail(e, rc, "exchange segment: no memory for %u rows of logits in %s: %s",
                            rows, g->anon_segments ? "a memfd" : g->rundir, strerror(-rc));
    g->logits_reserved = rows;
    return 0;
}
