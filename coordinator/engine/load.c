/* SPDX-License-Identifier: MIT */
/* coordinator/engine/load.c: the streaming load of a .shlm file into the weights segments. */
#include "load.h"

#include "fault.h"
#include "plan.h"
#include "tensors.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define DIRECT_ALIGN 4096u
#define PROGRESS_NS 3000000000ull /* a load that runs longer reports progress this often */
#define SAMPLE_NS 2000000ull      /* RssAnon sampling period of the load */

int coord_io_parse(const char *name, enum coord_io *out)
{
    static const char *const names[] = {"auto", "direct", "buffered"};
    for (int i = 0; i < 3; i++)
        if (!strcmp(name, names[i])) {
            *out = (enum coord_io)i;
            return 0;
        }
    return -EINVAL;
}

/* Reads exactly @n bytes at @off; -EIO for a file that ends first. */
static int pread_full(int fd, void *buf, size_t n, uint64_t off)
{
    for (size_t got = 0; got < n;) {
        ssize_t r = pread(fd, (uint8_t *)buf + got, n - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -errno;
        if (r == 0)
            return -EIO;
        got += (size_t)r;
    }
    return 0;
}

int coord_model_open(struct coord_model_file *f, const char *path, struct shardlm_err *e)
{
    memset(f, 0, sizeof(*f));
    f->fd = -1;
    snprintf(f->path, sizeof(f->path), "%s", path);
    struct shlm_header h;
    int rc, fd = coord_open_regular(path, &f->st, e);
    if (fd < 0)
        return fd;
    f->fd = fd;
    if (f->st.st_size < (off_t)sizeof(h) || pread_full(fd, &h, sizeof(h), 0))
        return shardlm_fail(e, -EINVAL, "%s: truncated: %lld bytes, shorter than the .shlm header",
                            path, (long long)f->st.st_size);
    if (memcmp(h.magic, SHLM_MAGIC, sizeof(SHLM_MAGIC)) != 0)
        return shardlm_fail(e, -EINVAL, "%s: not a .shlm file (convert it with `shardlm convert`)",
                            path);
    if (h.data_offset < sizeof(h) || h.data_offset > (uint64_t)f->st.st_size ||
        h.data_offset > COORD_HEAD_MAX)
        return shardlm_fail(e, -EINVAL,
                            "%s: header field data_offset %llu is outside the file "
                            "(%lld bytes) or past %u MiB",
                            path, (unsigned long long)h.data_offset, (long long)f->st.st_size,
                            COORD_HEAD_MAX >> 20);
    if (!(f->head = malloc(h.data_offset)))
        return shardlm_fail(e, -ENOMEM, "out of memory");
    if ((rc = pread_full(fd, f->head, h.data_offset, 0)))
        return shardlm_fail(e, rc, "%s: read: %s", path, strerror(-rc));
    struct shardlm_err err;
    if ((rc = shlm_parse_head(&f->img, f->head, h.data_offset, (size_t)f->st.st_size, path, &err)))
        return shardlm_fail(e, rc, "%s", err.msg);
    if (f->img.hdr->shard_count)
        return shardlm_fail(e, -EINVAL, "%s: a weights segment, not a model file", path);
    return 0;
}

void coord_model_close(struct coord_model_file *f)
{
    if (f->fd >= 0)
        close(f->fd);
    free(f->head);
    memset(f, 0, sizeof(*f));
    f->fd = -1;
}

int coord_shard_layout(const struct shlm_model *file, int n_ranks, int r, enum seg_experts experts,
                       struct shlm_header *h, struct shlm_tensor *table)
{
    const struct shlm_header *fh = file->hdr;
    struct seg_plan plan;
    int group = fh->scheme >= SHLM_SCHEME_W4A16 ? (int)fh->group : 0;
    if (seg_plan_place(&plan, &fh->cfg, &fh->cfgx, group, n_ranks, r, experts))
        return -EINVAL;
    struct shlm_tensor_spec *specs = calloc(SHLM_MAX_TENSORS, sizeof(*specs));
    if (!specs)
        return -ENOMEM;
    int n = shlm_expected_tensors(&fh->cfg, &fh->cfgx, (enum shlm_scheme)fh->scheme, (int)fh->group,
                                  (int)fh->head_bits, &plan, specs, SHLM_MAX_TENSORS);
    KN_ASSERT(n > 0); /* the file's header passed the same check */
    /* int4 matrices go to the workers in tiles: every kernel table runs them, faster */
    enum shlm_layout layout =
        fh->scheme >= SHLM_SCHEME_W4A16 ? SHLM_LAYOUT_TILES : SHLM_LAYOUT_CANONICAL;
    for (int i = 0; i < n; i++)
        specs[i].dtype = shlm_layout_dtype(specs[i].dtype, layout);
    *h = *fh;
    shlm_layout(h, table, specs, n, fh->tok_bytes);
    h->layout = layout;
    h->shard_rank = (uint32_t)r;
    h->shard_count = (uint32_t)n_ranks;
    h->experts_placement = (uint32_t)plan.experts;
    h->source_checksum = fh->checksum;
    free(specs);
    return n;
}

/* The part of a source tensor a rank holds: rows [r0, r1), their columns [c0, c1) behind @pad
 * zero columns; they become the rank's rows 0 .. r1 - r0. */
struct slice {
    int r0, r1, c0, c1, pad;
};

static struct slice shard_slice(const struct shlm_tensor *src, enum shlm_kind kind,
                                const struct shlm_tensor *dst, const struct shlm_config *c,
                                const struct shlm_config_ext *x, const struct seg_plan *p)
{
    struct slice s = {0, (int)src->rows, 0, (int)src->cols, 0};
    const struct shlm_kind_traits *k = &shlm_kinds[kind];
    int lo, hi, pad;
    switch (k->split) {
    case SHLM_SPLIT_NONE: /* replicated: embedding, norms */
        break;
    case SHLM_SPLIT_ROWS: /* our heads', KV heads', FFN units' or vocabulary rows */
        shlm_dim_part(c, x, p, k->rows, &lo, &hi, &pad);
        s.r0 = lo;
        s.r1 = lo + (int)dst->rows;
        break;
    case SHLM_SPLIT_COLS:        /* a vector's columns of our heads */
    case SHLM_SPLIT_COLS_PADDED: /* O's and down's input columns behind their pad */
        shlm_dim_part(c, x, p, k->cols, &lo, &hi, &pad);
        s = (struct slice){0, s.r1, lo, hi, k->split == SHLM_SPLIT_COLS_PADDED ? pad : 0};
        break;
    }
    KN_ASSERT(s.r1 - s.r0 == (int)dst->rows && (int)dst->cols == s.pad + s.c1 - s.c0);
    return s;
}

/* ---- reading ---- */

/* One read: bytes [off, off + len) of the file, wanted for the scales of tensor @t (@tail, at
 * @dst in its scales buffer) or for its code rows [r0, r1). */
struct job {
    int t;
    bool tail;
    int r0, r1;
    uint64_t off, len, dst;
};

/* How the file is read, chosen once for every lane. */
struct source {
    int fd;
    bool own_fd, direct, dontneed;
    uint64_t size;
    const char *how; /* for the stats: "O_DIRECT", "buffered, from the page cache", ... */
};

struct slot {
    uint8_t *buf;
    uint64_t aoff, alen, need, got; /* reading [aoff, aoff + alen); done at need bytes */
    bool done, busy;                /* busy: a read is queued or in flight */
};

/* One lane's queue of reads. */
struct reader {
    const struct source *src;
    bool uring;
    struct io_uring ring;
    uint8_t *mem;
    struct slot slots[COORD_LOAD_DEPTH];
};

/* The fraction of the file in the page cache, from up to 64 samples of 1 MiB. */
static double cached_fraction(int fd, uint64_t size)
{
    long page = sysconf(_SC_PAGESIZE);
    void *map = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED)
        return 0;
    unsigned char vec[256];
    uint64_t win = sizeof(vec) * (uint64_t)page, n = 0, in = 0;
    uint64_t step = size / 64 > win ? size / 64 / (uint64_t)page * (uint64_t)page : win;
    for (uint64_t off = 0; off < size; off += step) {
        uint64_t len = size - off < win ? size - off : win;
        if (mincore((uint8_t *)map + off, len, vec) < 0)
            break;
        for (uint64_t i = 0; i < (len + (uint64_t)page - 1) / (uint64_t)page; i++, n++)
            in += vec[i] & 1;
    }
    munmap(map, size);
    return n ? (double)in / (double)n : 0;
}

/* Opens the file @f for O_DIRECT reads: the descriptor, or -errno when the filesystem refuses
 * them (-ESTALE: the path names another file now). */
static int open_direct(const struct coord_model_file *f)
{
    int fd = open(f->path, O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    struct stat st;
    void *probe = NULL;
    int rc = posix_memalign(&probe, DIRECT_ALIGN, DIRECT_ALIGN) ? -ENOMEM : 0;
    ssize_t r = 0;
    while (!rc && (r = pread(fd, probe, DIRECT_ALIGN, 0)) < 0 && errno == EINTR)
        ;
    if (!rc && r < 0)
        rc = -errno;
    if (!rc && (fstat(fd, &st) < 0 || st.st_ino != f->st.st_ino || st.st_dev != f->st.st_dev))
        rc = -ESTALE;
    free(probe);
    if (rc) {
        close(fd);
        return rc;
    }
    return fd;
}

static int source_open(struct source *src, const struct coord_model_file *f, enum coord_io io,
                       struct shardlm_err *e)
{
    memset(src, 0, sizeof(*src));
    src->fd = f->fd;
    src->size = (uint64_t)f->st.st_size;
    const char *how = "buffered";
    if (io == COORD_IO_AUTO && cached_fraction(f->fd, src->size) >= 0.5) {
        how = "buffered, from the page cache";
    } else if (io != COORD_IO_BUFFERED) {
        int fd = open_direct(f);
        if (fd == -ESTALE)
            return shardlm_fail(e, -EIO, "%s: the file was replaced while loading", f->path);
        if (fd >= 0) {
            src->fd = fd;
            src->own_fd = src->direct = true;
            how = "O_DIRECT";
        } else {
            src->dontneed = true; /* do not leave the whole file in the page cache */
            how = "buffered (O_DIRECT refused), dropped behind the reads";
        }
    }
    src->how = how;
    return 0;
}

static void source_close(struct source *src)
{
    if (src->own_fd)
        close(src->fd);
    memset(src, 0, sizeof(*src));
}

static int reader_init(struct reader *rd, const struct source *src, uint64_t cap)
{
    memset(rd, 0, sizeof(*rd));
    rd->src = src;
    if (posix_memalign((void **)&rd->mem, DIRECT_ALIGN, COORD_LOAD_DEPTH * cap))
        return -ENOMEM;
    for (int i = 0; i < COORD_LOAD_DEPTH; i++)
        rd->slots[i].buf = rd->mem + (size_t)i * cap;
    rd->uring = io_uring_queue_init(COORD_LOAD_DEPTH, &rd->ring, 0) == 0;
    return 0;
}

static void reader_close(struct reader *rd)
{
    if (rd->uring) {
        /* reads still in flight after an error write into our buffers: let them land first
         * (and the queued ones be submitted, or they never complete) */
        io_uring_submit(&rd->ring);
        for (int i = 0; i < COORD_LOAD_DEPTH; i++)
            while (rd->slots[i].busy) {
                struct io_uring_cqe *cqe;
                if (io_uring_wait_cqe(&rd->ring, &cqe) < 0)
                    break;
                rd->slots[io_uring_cqe_get_data64(cqe)].busy = false;
                io_uring_cqe_seen(&rd->ring, cqe);
            }
        io_uring_queue_exit(&rd->ring);
    }
    free(rd->mem);
    memset(rd, 0, sizeof(*rd));
}

/* Submits the queued reads and, with @wait, waits for one to complete: io_uring_submit_and_wait
 * behind the SHARDLM_FAULT_URING site (a fault is -EAGAIN, the kernel's "no memory for the
 * request"; the reads stay queued). Returns >= 0 or -errno. */
static int reader_submit(struct reader *rd, unsigned wait)
{
    if (shardlm_fault(SHARDLM_FAULT_URING))
        return -EAGAIN;
    return io_uring_submit_and_wait(&rd->ring, wait);
}

/* Queues (or, without io_uring, does) the rest of slot @s's read. */
static int slot_read(struct reader *rd, int s)
{
    struct slot *sl = &rd->slots[s];
    if (!rd->uring) {
        while (sl->got < sl->need) {
            ssize_t r = pread(rd->src->fd, sl->buf + sl->got, sl->alen - sl->got,
                              (off_t)(sl->aoff + sl->got));
            if (r < 0 && errno == EINTR)
                continue;
            if (r < 0)
                return -errno;
            if (r == 0)
                break;
            sl->got += (uint64_t)r;
        }
        sl->done = true;
        return 0;
    }
    struct io_uring_sqe *sqe = io_uring_get_sqe(&rd->ring);
    KN_ASSERT(sqe); /* the ring has an entry per slot */
    io_uring_prep_read(sqe, rd->src->fd, sl->buf + sl->got, (unsigned)(sl->alen - sl->got),
                       sl->aoff + sl->got);
    io_uring_sqe_set_data64(sqe, (uint64_t)s);
    sl->busy = true;
    return 0;
}

/* Starts reading job @j into slot @s: whole aligned pages around it for O_DIRECT. */
static int slot_start(struct reader *rd, int s, const struct job *j)
{
    struct slot *sl = &rd->slots[s];
    uint64_t a = rd->src->direct ? DIRECT_ALIGN : 1;
    sl->aoff = j->off / a * a;
    sl->alen = (j->off + j->len + a - 1) / a * a - sl->aoff;
    sl->need = j->off + j->len - sl->aoff;
    sl->got = 0;
    sl->done = false;
    return slot_read(rd, s);
}

/* Waits until slot @s holds its job's bytes. -EIO when the file ended first. */
static int slot_wait(struct reader *rd, int s)
{
    while (rd->uring && !rd->slots[s].done) {
        struct io_uring_cqe *cqe;
        int rc = reader_submit(rd, 1);
        if (rc < 0 && rc != -EINTR)
            return rc;
        while (io_uring_peek_cqe(&rd->ring, &cqe) == 0) {
            int i = (int)io_uring_cqe_get_data64(cqe), res = cqe->res;
            io_uring_cqe_seen(&rd->ring, cqe);
            struct slot *sl = &rd->slots[i];
            sl->busy = false;
            if (res == -EINTR || res == -EAGAIN) {
                slot_read(rd, i);
                continue;
            }
            if (res < 0)
                return res;
            sl->got += (uint64_t)res;
            if (res == 0 || sl->got >= sl->need)
                sl->done = true;
            else
                slot_read(rd, i); /* a short read: the rest */
        }
    }
    return rd->slots[s].got >= rd->slots[s].need ? 0 : -EIO;
}

/* ---- writing ---- */

/* A rank being filled: its segment and layout. Each lane writes its own tensors' entries. */
struct rank_dest {
    const struct coord_load_dest *d;
    struct shlm_header h;
    struct shlm_tensor *table;
    struct seg_plan plan;
};

/* A lane's tile staging for one rank: canonical rows [row, row + COORD_LOAD_STEP) of the tiled
 * tensor in progress, @staged of them filled. */
struct stage {
    uint8_t *buf;
    int row, staged;
};

/* Repacks the staged rows of the rank's tiled tensor @t into its blocks. */
static void stage_flush(struct stage *sg, uint8_t *base, const struct shlm_tensor *t,
                        enum kn_dtype canon)
{
    if (!sg->staged)
        return;
    struct kn_mat v;
    kn_mat_view(&v, canon, COORD_LOAD_STEP, (int)t->cols, (int)t->group, sg->buf);
    v.rows = sg->staged;
    size_t bb = kn_tile_block_bytes((enum kn_dtype)t->dtype, (int)t->cols, (int)t->group);
    kn_repack_tiles(&v, 0, (sg->staged + KN_TILE_ROWS - 1) / KN_TILE_ROWS,
                    base + t->offset + (size_t)(sg->row / KN_TILE_ROWS) * bb);
    sg->row += sg->staged;
    sg->staged = 0;
}

/* Rows [k0, k1) of the source tensor (@c holds them) into the rank's tensor @t, whose part of
 * the source is @s. */
static void deliver(struct stage *sg, uint8_t *base, const struct shlm_tensor *t,
                    const struct slice *s, const struct kn_mat *c, int k0, int k1)
{
    int s0 = k0 > s->r0 ? k0 : s->r0, s1 = k1 < s->r1 ? k1 : s->r1;
    if (s0 >= s1)
        return;
    if (!kn_is_tiled((enum kn_dtype)t->dtype)) {
        kn_repack_slice(c, s0 - k0, s1 - k0, s->c0, s->c1, s->pad, base + t->offset, (int)t->rows,
                        s0 - s->r0);
        return;
    }
    while (s0 < s1) {
        int d = s0 - s->r0 - sg->row, n = COORD_LOAD_STEP - d;
        n = n < s1 - s0 ? n : s1 - s0;
        kn_repack_slice(c, s0 - k0, s0 - k0 + n, s->c0, s->c1, s->pad, sg->buf, COORD_LOAD_STEP, d);
        sg->staged = d + n;
        s0 += n;
        if (sg->staged == COORD_LOAD_STEP)
            stage_flush(sg, base, t, c->dtype);
    }
}

/* ---- the load: lanes (threads) take whole tensors in file order ---- */

#define MAX_LANES 4

struct load {
    struct coord_model_file *f;
    struct source src;
    const struct shlm_tensor *tensors; /* the file's table */
    int *order;                        /* source tensors by offset */
    enum shlm_kind *kind;              /* each source tensor's, resolved from its name once */
    int n_src, n_lanes;
    struct rank_dest *ranks;
    int n;
    int (*dst)[SHLM_MAX_TENSORS];      /* per rank: the index of each source tensor in its table */
    uint64_t cap, tail_max, stage_max; /* the largest read, scales region, staging area */
    int max_jobs;                      /* the most read jobs of one tensor */
    size_t chunk;                      /* bytes of codes per read job (coord_load_opts) */
    int next;                          /* the next tensor (atomic) */
    int failed;                        /* set by the first lane that fails (atomic) */
    uint64_t done;                     /* bytes consumed (atomic) */
    uint64_t t0, peak_anon;
    struct shardlm_err *e; /* written by the lane that fails first */
    const struct coord_log *log;        /* progress, from lane 0 (the caller's thread) */
    const volatile sig_atomic_t *cancel; /* the caller's: stop at the next tensor */
};
/* What a lane returns when it stops because another failed: that one's error is the load's. */
#define LANE_STOPPED 1

struct lane {
    struct load *L;
    int id;
    struct reader rd;
    uint8_t *tail;        /* the scales (and zero points) of the tensor in progress */
    struct stage *stages; /* (L->n) */
    struct job *jobs;     /* (L->max_jobs) those of the tensor in progress */
    struct shlm_hasher hash;
    uint64_t sampled; /* when lane 0 last sampled RssAnon */
    struct shardlm_err e;
};

static int by_offset(const void *a, const void *b, void *arg)
{
    const struct shlm_tensor *t = arg;
    uint64_t x = t[*(const int *)a].offset, y = t[*(const int *)b].offset;
    return x < y ? -1 : x > y;
}

/* Rows of tensor @t per read job: about @chunk bytes, whole tile blocks. */
static int job_rows(const struct shlm_tensor *t, size_t chunk)
{
    int step = (int)(chunk / kn_row_bytes((enum kn_dtype)t->dtype, (int)t->cols)) /
               KN_TILE_ROWS * KN_TILE_ROWS;
    return step < KN_TILE_ROWS ? KN_TILE_ROWS : step;
}

/* The read jobs of tensor @i: its scales region, then its code rows. */
static int plan_jobs(const struct shlm_tensor *t, int i, size_t chunk, struct job *jobs)
{
    enum kn_dtype dt = (enum kn_dtype)t->dtype;
    uint64_t codes = kn_codes_bytes(dt, (int)t->rows, (int)t->cols), tail = t->bytes - codes;
    uint64_t rb = kn_row_bytes(dt, (int)t->cols);
    int n = 0, step = job_rows(t, chunk);
    for (uint64_t o = 0; o < tail; o += chunk) {
        uint64_t len = tail - o < chunk ? tail - o : chunk;
        if (jobs)
            jobs[n] = (struct job){i, true, 0, 0, t->offset + codes + o, len, o};
        n++;
    }
    for (int r = 0; r < (int)t->rows; r += step) {
        int r1 = r + step < (int)t->rows ? r + step : (int)t->rows;
        uint64_t end = r1 == (int)t->rows ? codes : (uint64_t)r1 * rb; /* + the padding */
        if (jobs)
            jobs[n] = (struct job){
                i, false, r, r1, t->offset + (uint64_t)r * rb, end - (uint64_t)r * rb, 0};
        n++;
    }
    return n;
}

/* Consumes job @j whose bytes are at @data. */
static int consume(struct lane *ln, const struct job *j, const uint8_t *data)
{
    struct load *L = ln->L;
    const struct shlm_tensor *t = &L->tensors[j->t];
    enum kn_dtype dt = (enum kn_dtype)t->dtype;
    if (j->tail) {
        memcpy(ln->tail + j->dst, data, j->len);
        return 0;
    }
    shlm_hash_update(&ln->hash, data, j->len);
    int rows = (int)t->rows, cols = (int)t->cols, group = (int)t->group;
    struct kn_mat c;
    kn_mat_view_rows(&c, dt, rows, cols, group, j->r0, j->r1, data, ln->tail);
    for (int r = 0; r < L->n; r++) {
        struct rank_dest *rd = &L->ranks[r];
        if (L->dst[r][j->t] < 0) /* an expert another rank holds */
            continue;
        const struct shlm_tensor *d = &rd->table[L->dst[r][j->t]];
        struct slice s =
            shard_slice(t, L->kind[j->t], d, &L->f->img.hdr->cfg, &L->f->img.hdr->cfgx, &rd->plan);
        deliver(&ln->stages[r], rd->d->seg->base, d, &s, &c, j->r0, j->r1);
    }
    if (j->r1 < rows)
        return 0;
    /* the tensor's last rows: its checksum over the codes, then the scales */
    shlm_hash_update(&ln->hash, ln->tail, t->bytes - kn_codes_bytes(dt, rows, cols));
    if (shlm_hash_final(&ln->hash) != t->checksum)
        return shardlm_fail(&ln->e, -EIO,
                            "%s: tensor %s: checksum mismatch (the file is corrupt "
                            "or changed while loading)",
                            L->f->path, t->name);
    for (int r = 0; r < L->n; r++) {
        struct rank_dest *rd = &L->ranks[r];
        if (L->dst[r][j->t] < 0)
            continue;
        struct shlm_tensor *d = &rd->table[L->dst[r][j->t]];
        stage_flush(&ln->stages[r], rd->d->seg->base, d, dt);
        d->checksum = shlm_hash(rd->d->seg->base + d->offset, d->bytes);
    }
    return 0;
}

/* Lane 0, after each job: samples the coordinator's anonymous memory every SAMPLE_NS, and
 * reports progress every PROGRESS_NS. */
static void progress(struct lane *ln, uint64_t *last)
{
    struct load *L = ln->L;
    uint64_t now = shardlm_now_ns();
    if (now - ln->sampled >= SAMPLE_NS) {
        uint64_t a = coord_rss_anon(0);
        L->peak_anon = a > L->peak_anon ? a : L->peak_anon;
        ln->sampled = now;
    }
    if (now - *last < PROGRESS_NS)
        return;
    *last = now;
    uint64_t done = __atomic_load_n(&L->done, __ATOMIC_RELAXED);
    coord_logf(L->log, COORD_LOG_INFO, "loading %s: %.0f%% (%.2f GB/s)", L->f->path,
               100.0 * (double)done / (double)L->f->st.st_size,
               (double)done / (double)(now - L->t0));
}

/* Reads and repacks tensor @i. */
static int load_tensor(struct lane *ln, int i, uint64_t *last)
{
    struct load *L = ln->L;
    const struct shlm_tensor *t = &L->tensors[i];
    int rc = 0, n = plan_jobs(t, i, L->chunk, ln->jobs);
    KN_ASSERT(n <= L->max_jobs);
    shlm_hash_init(&ln->hash);
    for (int r = 0; r < L->n; r++) {
        if (L->dst[r][i] < 0) /* an expert another rank holds */
            continue;
        const struct shlm_tensor *d = &L->ranks[r].table[L->dst[r][i]];
        struct seg *sg = L->ranks[r].d->seg;
        if ((rc = seg_reserve(sg, d->offset, d->bytes)))
            return shardlm_fail(&ln->e, rc, "weights segment of rank %d (%zu bytes): %s",
                                L->ranks[r].d->rank, sg->size, strerror(-rc));
        /* map the pages this lane is about to write at once, not one fault at a time */
        madvise((uint8_t *)sg->base + d->offset, d->bytes, MADV_POPULATE_WRITE);
        ln->stages[r].row = ln->stages[r].staged = 0;
    }
    int next = 0;
    for (int j = 0; j < n; j++) {
        for (; next < n && next < j + COORD_LOAD_DEPTH && !rc; next++)
            rc = slot_start(&ln->rd, next % COORD_LOAD_DEPTH, &ln->jobs[next]);
        int sub = ln->rd.uring && !rc ? reader_submit(&ln->rd, 0) : 0;
        if (sub < 0 && sub != -EINTR) /* EINTR: they stay queued, slot_wait submits them */
            return shardlm_fail(&ln->e, sub, "%s: io_uring submission: %s", L->f->path,
                                strerror(-sub));
        const struct job *jb = &ln->jobs[j];
        struct slot *sl = &ln->rd.slots[j % COORD_LOAD_DEPTH];
        if (!rc)
            rc = slot_wait(&ln->rd, j % COORD_LOAD_DEPTH);
        if (rc == -EIO)
            return shardlm_fail(&ln->e, rc,
                                "%s: the file ends before byte %llu (truncated while "
                                "loading?)",
                                L->f->path, (unsigned long long)(jb->off + jb->len));
        if (rc)
            return shardlm_fail(&ln->e, rc, "%s: read at %llu: %s", L->f->path,
                                (unsigned long long)jb->off, strerror(-rc));
        if ((rc = consume(ln, jb, sl->buf + (jb->off - sl->aoff))))
            return rc;
        __atomic_fetch_add(&L->done, jb->len, __ATOMIC_RELAXED);
        if (L->src.dontneed)
            posix_fadvise(L->src.fd, (off_t)sl->aoff, (off_t)sl->alen, POSIX_FADV_DONTNEED);
        if (ln->id == 0)
            progress(ln, last);
        if (__atomic_load_n(&L->failed, __ATOMIC_RELAXED))
            return LANE_STOPPED; /* another lane failed: its error is the one to report */
    }
    return 0;
}

static void *lane_run(void *arg)
{
    struct lane *ln = arg;
    struct load *L = ln->L;
    uint64_t last = L->t0;
    int rc = 0;
    for (;;) {
        int k = __atomic_fetch_add(&L->next, 1, __ATOMIC_RELAXED);
        if (k >= L->n_src || __atomic_load_n(&L->failed, __ATOMIC_RELAXED))
            break;
        if (coord_cancelled(L->cancel)) { /* Ctrl-C during a long load: stop at the next tensor */
            rc = shardlm_fail(&ln->e, -ECANCELED, "cancelled");
            break;
        }
        if ((rc = load_tensor(ln, L->order[k], &last)))
            break;
    }
    int zero = 0;
    if (rc && rc != LANE_STOPPED &&
        __atomic_compare_exchange_n(&L->failed, &zero, rc, false, __ATOMIC_ACQ_REL,
                                    __ATOMIC_RELAXED))
        *L->e = ln->e;
    return NULL;
}

static int lane_init(struct lane *ln, struct load *L, int id)
{
    memset(ln, 0, sizeof(*ln));
    ln->L = L;
    ln->id = id;
    if (reader_init(&ln->rd, &L->src, L->cap) || !(ln->tail = malloc(L->tail_max + 1)) ||
        !(ln->jobs = calloc((size_t)L->max_jobs, sizeof(*ln->jobs))) ||
        !(ln->stages = calloc((size_t)L->n, sizeof(*ln->stages))))
        return -ENOMEM;
    for (int r = 0; r < L->n && L->stage_max; r++)
        if (!(ln->stages[r].buf = malloc(L->stage_max)))
            return -ENOMEM;
    return 0;
}

static void lane_free(struct lane *ln)
{
    reader_close(&ln->rd);
    for (int r = 0; ln->stages && r < ln->L->n; r++)
        free(ln->stages[r].buf);
    free(ln->stages);
    free(ln->jobs);
    free(ln->tail);
}

/* prepare()'s part for each rank: its layout and plan, the index of each file tensor in its
 * table (-1: an expert another rank holds, found through @ix, the file's name index), its
 * segment's head reserved. */
static int prepare_ranks(struct load *L, int n_ranks, const struct coord_load_dest *dest,
                         enum seg_experts experts, const int *ix, struct shardlm_err *e)
{
    const struct shlm_header *fh = L->f->img.hdr;
    int group = fh->scheme >= SHLM_SCHEME_W4A16 ? (int)fh->group : 0;
    for (int r = 0; r < L->n; r++) {
        struct rank_dest *rd = &L->ranks[r];
        rd->d = &dest[r];
        if (!(rd->table = calloc(SHLM_MAX_TENSORS, sizeof(*rd->table))))
            return shardlm_fail(e, -ENOMEM, "out of memory");
        int n = coord_shard_layout(&L->f->img, n_ranks, dest[r].rank, experts, &rd->h, rd->table);
        if (n == -ENOMEM)
            return shardlm_fail(e, n, "out of memory");
        if (n < 0 ||
            seg_plan_place(&rd->plan, &fh->cfg, &fh->cfgx, group, n_ranks, dest[r].rank, experts))
            return shardlm_fail(e, -EINVAL, "cannot split the model over %d ranks", n_ranks);
        /* every tensor but the experts other ranks hold */
        KN_ASSERT(rd->h.file_bytes == dest[r].seg->size && n <= L->n_src);
        for (int i = 0; i < L->n_src; i++)
            L->dst[r][i] = -1;
        int rc = seg_reserve(dest[r].seg, 0, rd->h.data_offset); /* header, table, tokenizer */
        if (rc)
            return shardlm_fail(e, rc, "weights segment of rank %d (%zu bytes): %s", dest[r].rank,
                                dest[r].seg->size, strerror(-rc));
        for (int i = 0; i < n; i++) {
            const struct shlm_tensor *t = shlm_find_in(&L->f->img, ix, rd->table[i].name);
            KN_ASSERT(t); /* the same names as the file's, which shlm_parse checked */
            L->dst[r][t - L->tensors] = i;
            if (kn_is_tiled((enum kn_dtype)rd->table[i].dtype)) {
                uint64_t b = kn_mat_bytes((enum kn_dtype)t->dtype, COORD_LOAD_STEP,
                                          (int)rd->table[i].cols, (int)t->group);
                L->stage_max = b > L->stage_max ? b : L->stage_max;
            }
        }
    }
    return 0;
}

/* The ranks' layouts, the order of the file's tensors, and the sizes the lanes need. */
static int prepare(struct load *L, int n_ranks, const struct coord_load_dest *dest,
                   enum seg_experts experts, struct shardlm_err *e)
{
    const struct shlm_header *fh = L->f->img.hdr;
    L->tensors = L->f->img.tensors;
    L->n_src = (int)fh->n_tensors;
    L->order = calloc((size_t)L->n_src, sizeof(*L->order));
    L->kind = calloc((size_t)L->n_src, sizeof(*L->kind));
    L->ranks = calloc((size_t)L->n, sizeof(*L->ranks));
    L->dst = calloc((size_t)L->n, sizeof(*L->dst));
    if (!L->order || !L->kind || !L->ranks || !L->dst)
        return shardlm_fail(e, -ENOMEM, "out of memory");
    for (int i = 0; i < L->n_src; i++) {
        uint32_t layer, expert;
        bool known = shlm_kind_parse(L->tensors[i].name, fh->cfg.n_layers, fh->cfgx.n_experts,
                                     &L->kind[i], &layer, &expert);
        KN_ASSERT(known); /* shlm_parse() checked every name against the config's tensors */
        L->order[i] = i;
    }
    qsort_r(L->order, (size_t)L->n_src, sizeof(int), by_offset, (void *)L->tensors);
    for (int i = 0; i < L->n_src; i++) {
        const struct shlm_tensor *t = &L->tensors[i];
        enum kn_dtype dt = (enum kn_dtype)t->dtype;
        uint64_t codes = kn_codes_bytes(dt, (int)t->rows, (int)t->cols);
        uint64_t tail = t->bytes - codes, rows = (uint64_t)job_rows(t, L->chunk);
        uint64_t job = rows * kn_row_bytes(dt, (int)t->cols) + 64; /* + the codes padding */
        job = job > L->chunk ? job : L->chunk;
        L->cap = job + 2 * DIRECT_ALIGN > L->cap ? job + 2 * DIRECT_ALIGN : L->cap;
        L->tail_max = tail > L->tail_max ? tail : L->tail_max;
        int jobs = plan_jobs(t, i, L->chunk, NULL);
        L->max_jobs = jobs > L->max_jobs ? jobs : L->max_jobs;
    }
    L->cap = (L->cap + DIRECT_ALIGN - 1) / DIRECT_ALIGN * DIRECT_ALIGN;
    int *ix = shlm_name_index(&L->f->img);
    if (!ix)
        return shardlm_fail(e, -ENOMEM, "out of memory");
    int rc = prepare_ranks(L, n_ranks, dest, experts, ix, e);
    free(ix);
    if (rc)
        return rc;
    cpu_set_t cpus;
    int n_cpus = sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
    L->n_lanes = n_cpus < MAX_LANES ? n_cpus : MAX_LANES;
    L->n_lanes = L->n_lanes < L->n_src ? L->n_lanes : L->n_src;
    return 0;
}

/* Header, table and tokenizer of each rank, the header last. */
static void seal(struct load *L)
{
    const struct shlm_header *fh = L->f->img.hdr;
    for (int r = 0; r < L->n; r++) {
        struct rank_dest *rd = &L->ranks[r];
        uint8_t *base = rd->d->seg->base;
        memcpy(base + rd->h.tok_offset, L->f->head + fh->tok_offset, fh->tok_bytes);
        memcpy(base + rd->h.table_offset, rd->table, rd->h.n_tensors * sizeof(*rd->table));
        shlm_seal(&rd->h, rd->table);
        __atomic_thread_fence(__ATOMIC_RELEASE);
        memcpy(base, &rd->h, sizeof(rd->h));
    }
}

int coord_load_shards(struct coord_model_file *f, int n_ranks, const struct coord_load_dest *dest,
                      int n, const struct coord_load_opts *o, const struct coord_log *log,
                      const volatile sig_atomic_t *cancel, struct coord_load_stats *st,
                      struct shardlm_err *e)
{
    struct load L = {.f = f,
                     .n = n,
                     .e = e,
                     .t0 = shardlm_now_ns(),
                     .log = log,
                     .cancel = cancel,
                     .chunk = o && o->chunk ? o->chunk : COORD_LOAD_CHUNK};
    struct lane lanes[MAX_LANES];
    pthread_t th[MAX_LANES];
    int rc, started = 0, ready = 0;
    memset(st, 0, sizeof(*st));
    L.src.fd = -1;
    if ((rc = prepare(&L, n_ranks, dest, o ? o->experts : SEG_EXPERTS_TP, e)) ||
        (rc = source_open(&L.src, f, o ? o->io : COORD_IO_AUTO, e)))
        goto out;
    for (; ready < L.n_lanes; ready++)
        if (lane_init(&lanes[ready], &L, ready)) {
            lane_free(&lanes[ready]);
            rc = shardlm_fail(e, -ENOMEM, "out of memory (%d load lanes)", L.n_lanes);
            goto out;
        }
    snprintf(st->io, sizeof(st->io), "%s %s",
             lanes[0].rd.uring ? "io_uring" : "pread (no io_uring)", L.src.how);
    L.peak_anon = coord_rss_anon(0);
    /* lane 0 is this thread */
    for (started = 1; started < L.n_lanes; started++)
        if (pthread_create(&th[started], NULL, lane_run, &lanes[started]))
            break;
    lane_run(&lanes[0]);
    for (int i = 1; i < started; i++)
        pthread_join(th[i], NULL);
    if ((rc = L.failed))
        goto out;
    struct stat now;
    if (fstat(f->fd, &now) < 0 || now.st_size != f->st.st_size ||
        now.st_mtim.tv_sec != f->st.st_mtim.tv_sec ||
        now.st_mtim.tv_nsec != f->st.st_mtim.tv_nsec) {
        rc = shardlm_fail(e, -EIO, "%s: the file changed while loading", f->path);
        goto out;
    }
    seal(&L);
    uint64_t a = coord_rss_anon(0);
    st->peak_anon = a > L.peak_anon ? a : L.peak_anon;
    st->bytes = L.done + f->img.hdr->data_offset;
    st->ns = shardlm_now_ns() - L.t0;
out:
    for (int i = 0; i < ready; i++)
        lane_free(&lanes[i]);
    source_close(&L.src);
    for (int r = 0; L.ranks && r < n; r++)
        free(L.ranks[r].table);
    free(L.ranks);
    free(L.dst);
    free(L.order);
    free(L.kind);
    return rc;
}
