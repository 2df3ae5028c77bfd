/* SPDX-License-Identifier: MIT */
/* coordinator/format/gguf_write.c: the streaming GGUF writer (`shardlm synth`, the tests) -
 * metadata and tensor infos buffered, then the data streamed through one buffer into a
 * temporary file renamed over the output at the end. */
#include "gguf_write.h"

#include "kn.h"
#include "rows.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gguf_write.c writes the little-endian GGUF fields in place"
#endif

#define GGUF_W_ALIGN 32
#define GGUF_W_BUF (1 << 16)

static uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

struct gguf_wtensor {
    char *name;
    enum gguf_ggml_type type;
    uint64_t cols, rows; /* rows 0: 1-D; all @mats matrices' rows in a 3-D one */
    uint64_t mats;       /* 1: 1-D or 2-D; else a 3-D [mats][rows / mats][cols] */
    uint64_t offset;     /* relative to the data section */
    uint64_t done;       /* rows written */
};

struct gguf_writer {
    char *path, *tmp;
    int fd;
    int err;        /* first failure (-errno); later calls do nothing */
    const char *op; /* what failed */
    uint8_t *meta;  /* encoded key/values */
    size_t meta_n, meta_cap;
    uint64_t n_kv;
    char **keys; /* (n_kv) for the duplicate check */
    struct gguf_wtensor *t;
    uint64_t n_t, cap_t, cur;
    uint64_t data_end; /* relative end of the last declared tensor */
    bool started;      /* header written: no more keys or tensors */
    uint8_t *out;      /* (GGUF_W_BUF) stream buffer */
    size_t out_n;
    uint64_t pos; /* bytes emitted into the file */
};

static void w_fail(struct gguf_writer *w, int err, const char *op)
{
    if (!w->err) {
        w->err = err;
        w->op = op;
    }
}

static void w_flush(struct gguf_writer *w)
{
    size_t done = 0;
    while (!w->err && done < w->out_n) {
        ssize_t r = write(w->fd, w->out + done, w->out_n - done);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            w_fail(w, r < 0 ? -errno : -EIO, "write");
        else
            done += (size_t)r;
    }
    w->out_n = 0;
}

static void w_put(struct gguf_writer *w, const void *p, size_t n)
{
    const uint8_t *b = p;
    w->pos += n;
    while (n && !w->err) {
        size_t take = GGUF_W_BUF - w->out_n < n ? GGUF_W_BUF - w->out_n : n;
        memcpy(w->out + w->out_n, b, take);
        w->out_n += take;
        b += take;
        n -= take;
        if (w->out_n == GGUF_W_BUF)
            w_flush(w);
    }
}

static void w_pad(struct gguf_writer *w, uint64_t align)
{
    static const uint8_t zeros[GGUF_W_ALIGN];
    KN_ASSERT(align <= GGUF_W_ALIGN);
    uint64_t n = align_up(w->pos, align) - w->pos;
    w_put(w, zeros, (size_t)n);
}

/* Appends to the metadata buffer. */
static void meta_put(struct gguf_writer *w, const void *p, size_t n)
{
    if (w->err || n == 0)
        return;
    if (w->meta_n + n > w->meta_cap) {
        size_t cap = w->meta_cap ? w->meta_cap : 4096;
        while (cap < w->meta_n + n)
            cap *= 2;
        uint8_t *m = realloc(w->meta, cap);
        if (!m) {
            w_fail(w, -ENOMEM, "buffering the metadata");
            return;
        }
        w->meta = m;
        w->meta_cap = cap;
    }
    memcpy(w->meta + w->meta_n, p, n);
    w->meta_n += n;
}

static void meta_u32(struct gguf_writer *w, uint32_t v) { meta_put(w, &v, 4); }
static void meta_u64(struct gguf_writer *w, uint64_t v) { meta_put(w, &v, 8); }
static void meta_str(struct gguf_writer *w, const char *s)
{
    uint64_t n = strlen(s);
    meta_u64(w, n);
    meta_put(w, s, n);
}

/* Starts key/value @key of @type: the key, checked unique, and the type. */
static bool meta_key(struct gguf_writer *w, const char *key, enum gguf_type type)
{
    KN_ASSERT(!w->started); /* metadata comes before the first tensor rows */
    KN_ASSERT(strcmp(key, "general.alignment") != 0); /* the writer sets it */
    if (w->err)
        return false;
    for (uint64_t i = 0; i < w->n_kv; i++)
        KN_ASSERT(strcmp(w->keys[i], key) != 0); /* each key once */
    char **k = realloc(w->keys, (w->n_kv + 1) * sizeof(*k));
    char *dup = strdup(key);
    if (k)
        w->keys = k;
    if (!k || !dup) {
        free(dup);
        w_fail(w, -ENOMEM, "buffering the metadata");
        return false;
    }
    w->keys[w->n_kv++] = dup;
    meta_str(w, key);
    meta_u32(w, type);
    return true;
}

int gguf_writer_open(struct gguf_writer **out, const char *path, struct shardlm_err *e)
{
    struct gguf_writer *w = calloc(1, sizeof(*w));
    if (!w)
        return shardlm_fail(e, -ENOMEM, "%s: out of memory", path);
    size_t n = strlen(path) + 32;
    w->path = strdup(path);
    w->tmp = malloc(n);
    w->out = malloc(GGUF_W_BUF);
    w->fd = -1;
    int rc;
    if (!w->path || !w->tmp || !w->out) {
        rc = shardlm_fail(e, -ENOMEM, "%s: out of memory", path);
        goto out_free;
    }
    if ((rc = coord_out_check(path, NULL, 0, e)))
        goto out_free;
    w->fd = coord_out_open(path, w->tmp, n, e);
    if (w->fd < 0) {
        rc = w->fd;
        goto out_free;
    }
    *out = w;
    return 0;

out_free:
    free(w->out);
    free(w->tmp);
    free(w->path);
    free(w);
    return rc;
}

void gguf_w_u32(struct gguf_writer *w, const char *key, uint32_t v)
{
    if (meta_key(w, key, GGUF_UINT32))
        meta_u32(w, v);
}

void gguf_w_f32(struct gguf_writer *w, const char *key, float v)
{
    if (meta_key(w, key, GGUF_FLOAT32))
        meta_put(w, &v, 4);
}

void gguf_w_bool(struct gguf_writer *w, const char *key, bool v)
{
    uint8_t b = v;
    if (meta_key(w, key, GGUF_BOOL))
        meta_put(w, &b, 1);
}

void gguf_w_str(struct gguf_writer *w, const char *key, const char *v)
{
    if (meta_key(w, key, GGUF_STRING))
        meta_str(w, v);
}

static bool meta_arr(struct gguf_writer *w, const char *key, enum gguf_type et, uint64_t n)
{
    if (!meta_key(w, key, GGUF_ARRAY))
        return false;
    meta_u32(w, et);
    meta_u64(w, n);
    return true;
}

void gguf_w_arr_str(struct gguf_writer *w, const char *key, const char *const *v, uint64_t n)
{
    if (meta_arr(w, key, GGUF_STRING, n))
        for (uint64_t i = 0; i < n; i++)
            meta_str(w, v[i]);
}

void gguf_w_arr_f32(struct gguf_writer *w, const char *key, const float *v, uint64_t n)
{
    if (meta_arr(w, key, GGUF_FLOAT32, n))
        meta_put(w, v, n * 4);
}

void gguf_w_arr_i32(struct gguf_writer *w, const char *key, const int32_t *v, uint64_t n)
{
    if (meta_arr(w, key, GGUF_INT32, n))
        meta_put(w, v, n * 4);
}

void gguf_w_tensor(struct gguf_writer *w, const char *name, enum gguf_ggml_type type,
                   uint64_t cols, uint64_t rows)
{
    gguf_w_tensor3(w, name, type, cols, rows, 1);
}

void gguf_w_tensor3(struct gguf_writer *w, const char *name, enum gguf_ggml_type type,
                    uint64_t cols, uint64_t rows, uint64_t mats)
{
    KN_ASSERT(mats >= 1 && (mats == 1 || rows >= 1) && rows <= UINT64_MAX / mats);
    KN_ASSERT(!w->started); /* every tensor is declared before the first rows */
    KN_ASSERT(type == GGML_F32 || type == GGML_F16 || type == GGML_MXFP4);
    KN_ASSERT(cols >= 1 && (type != GGML_MXFP4 || cols % 32 == 0));
    if (w->err)
        return;
    for (uint64_t i = 0; i < w->n_t; i++)
        KN_ASSERT(strcmp(w->t[i].name, name) != 0); /* each name once */
    if (w->n_t == w->cap_t) {
        uint64_t cap = w->cap_t ? w->cap_t * 2 : 16;
        struct gguf_wtensor *t = realloc(w->t, cap * sizeof(*t));
        if (!t) {
            w_fail(w, -ENOMEM, "buffering the tensor infos");
            return;
        }
        w->t = t;
        w->cap_t = cap;
    }
    struct gguf_wtensor *t = &w->t[w->n_t];
    t->name = strdup(name);
    if (!t->name) {
        w_fail(w, -ENOMEM, "buffering the tensor infos");
        return;
    }
    uint64_t esize = type == GGML_F32 ? 4 : 2, nel;
    KN_ASSERT(!__builtin_mul_overflow(cols, rows ? rows * mats : 1, &nel) && nel <= UINT64_MAX / 8);
    uint64_t bytes = type == GGML_MXFP4 ? nel / 32 * 17 : nel * esize;
    t->type = type;
    t->cols = cols;
    t->rows = rows * mats;
    t->mats = mats;
    t->offset = align_up(w->data_end, GGUF_W_ALIGN);
    t->done = 0;
    w->data_end = t->offset + bytes;
    w->n_t++;
}

/* Header, key/values (general.alignment first), tensor infos, padding to the data section. */
static void write_head(struct gguf_writer *w)
{
    uint32_t version = 3, align = GGUF_W_ALIGN;
    uint64_t n_kv = w->n_kv + 1;
    w->started = true;
    w_put(w, "GGUF", 4);
    w_put(w, &version, 4);
    w_put(w, &w->n_t, 8);
    w_put(w, &n_kv, 8);
    static const char akey[] = "general.alignment";
    uint64_t alen = sizeof(akey) - 1;
    uint32_t atype = GGUF_UINT32;
    w_put(w, &alen, 8);
    w_put(w, akey, alen);
    w_put(w, &atype, 4);
    w_put(w, &align, 4);
    w_put(w, w->meta, w->meta_n);
    for (uint64_t i = 0; i < w->n_t; i++) {
        const struct gguf_wtensor *t = &w->t[i];
        uint64_t len = strlen(t->name);
        uint32_t n_dims = t->mats > 1 ? 3 : t->rows ? 2 : 1, type = t->type;
        uint64_t rows = t->rows / t->mats;
        w_put(w, &len, 8);
        w_put(w, t->name, len);
        w_put(w, &n_dims, 4);
        w_put(w, &t->cols, 8);
        if (t->rows)
            w_put(w, &rows, 8);
        if (t->mats > 1)
            w_put(w, &t->mats, 8);
        w_put(w, &type, 4);
        w_put(w, &t->offset, 8);
    }
    w_pad(w, GGUF_W_ALIGN);
}

void gguf_w_tensor_rows(struct gguf_writer *w, const float *rows, uint64_t n_rows)
{
    if (!w->started)
        write_head(w);
    if (w->err)
        return;
    KN_ASSERT(w->cur < w->n_t); /* every tensor is already complete */
    struct gguf_wtensor *t = &w->t[w->cur];
    uint64_t total = t->rows ? t->rows : 1;
    KN_ASSERT(n_rows <= total - t->done); /* rows of one tensor per call */
    uint64_t n = n_rows * t->cols;
    if (t->type == GGML_F32) {
        w_put(w, rows, n * 4);
    } else if (t->type == GGML_MXFP4) { /* rows are whole blocks (cols % 32 == 0) */
        uint8_t blk[17];
        for (uint64_t i = 0; i < n && !w->err; i += 32) {
            coord_rows_mxfp4_block(rows + i, blk);
            w_put(w, blk, sizeof(blk));
        }
    } else {
        uint16_t h[1024];
        for (uint64_t i = 0; i < n && !w->err; i += 1024) {
            uint64_t k = n - i < 1024 ? n - i : 1024;
            for (uint64_t j = 0; j < k; j++)
                h[j] = kn_f32_to_f16(rows[i + j]);
            w_put(w, h, k * 2);
        }
    }
    t->done += n_rows;
    if (t->done == total) {
        w_pad(w, GGUF_W_ALIGN);
        w->cur++;
    }
}

static void writer_free(struct gguf_writer *w)
{
    for (uint64_t i = 0; i < w->n_kv; i++)
        free(w->keys[i]);
    free(w->keys);
    for (uint64_t i = 0; i < w->n_t; i++)
        free(w->t[i].name);
    free(w->t);
    free(w->meta);
    free(w->out);
    free(w->tmp);
    free(w->path);
    free(w);
}

void gguf_writer_abort(struct gguf_writer *w)
{
    if (w->fd >= 0)
        close(w->fd);
    unlink(w->tmp);
    writer_free(w);
}

int gguf_writer_close(struct gguf_writer *w, struct shardlm_err *e)
{
    if (!w->err) {
        if (!w->started)
            write_head(w);
        KN_ASSERT(w->cur == w->n_t); /* every tensor got all its rows */
        w_flush(w);
    }
    if (!w->err && fsync(w->fd) < 0)
        w_fail(w, -errno, "fsync");
    if (close(w->fd) < 0)
        w_fail(w, -errno, "close");
    w->fd = -1;
    int rc = w->err;
    if (rc) {
        unlink(w->tmp);
        shardlm_fail(e, rc, "%s: %s failed: %s", w->path, w->op, strerror(-rc));
    } else {
        rc = coord_out_commit(w->tmp, w->path, e);
    }
    writer_free(w);
    return rc;
}
