/* coordinator/convert/convert.c: `shardlm convert` below the CLI - a model source (GGUF file,
 * Hugging Face folder, llama2.c checkpoint + tokenizer.bin) laid out, encoded in a scheme and
 * written as a .shlm file, whole or not at all. */
#include "convert.h"

#include "source.h"

#include "fault.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int pwrite_all(int fd, const void *buf, size_t n, uint64_t off)
{
    const uint8_t *p = buf;
    while (n) {
        ssize_t w = pwrite(fd, p, n, (off_t)off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return w < 0 ? -errno : -EIO;
        p += w;
        n -= (size_t)w;
        off += (uint64_t)w;
    }
    return 0;
}

/* Encodes f32 rows into the tensor's format. */
static void encode(const struct shlm_tensor_spec *s, const float *src, void *dst)
{
    const struct kn_type_traits *tt = &kn_type_traits[s->dtype];
    KN_ASSERT(tt->from_float); /* NULL for the device layouts: never in a file */
    tt->from_float(src, s->rows, s->cols, s->group, dst);
}

/* The W4 group of @o's scheme (the scheme's default for 0), checked with the head bits; 0 for
 * the schemes without groups. A group is a multiple of 32 up to KN_MAX_GROUP, as the .shlm
 * format takes it (shlm_expected_tensors). Returns 0 or -EINVAL with @e naming the option. */
static int convert_group(const struct coord_convert_opts *o, int *group, struct shardlm_err *e)
{
    *group = 0;
    if (o->scheme != SHLM_SCHEME_W4A16 && o->scheme != SHLM_SCHEME_W4A8)
        return 0;
    int g = o->group ? o->group : o->scheme == SHLM_SCHEME_W4A16 ? 64 : 128;
    if (g < 32 || g > KN_MAX_GROUP || g % 32)
        return shardlm_fail(e, -EINVAL, "--group %d: expected a multiple of 32 from 32 to %d", g,
                            KN_MAX_GROUP);
    if (o->head_bits != 8 && o->head_bits != 4)
        return shardlm_fail(e, -EINVAL, "--head-bits %d: expected 8 or 4", o->head_bits);
    *group = g;
    return 0;
}

/* The .shlm being written: its tensors (specs and table entries) and its header. */
struct convert_plan {
    struct shlm_tensor_spec *specs; /* (SHLM_MAX_TENSORS), n used */
    struct shlm_tensor *table;      /* (SHLM_MAX_TENSORS), n used */
    struct shlm_header *h;
    int n;
};

static void plan_free(struct convert_plan *p)
{
    free(p->specs);
    free(p->table);
    free(p->h);
}

/* Lays out the file for @src's config in @o's scheme: the tensors it needs, their offsets and
 * sizes, and the header fields (checksums excepted). Returns 0 or -errno with @e set; release
 * with plan_free() either way. */
static int plan_layout(struct convert_plan *p, const struct coord_source *src,
                       const struct coord_convert_opts *o, int group, struct shardlm_err *e)
{
    p->specs = calloc(SHLM_MAX_TENSORS, sizeof(*p->specs));
    p->table = calloc(SHLM_MAX_TENSORS, sizeof(*p->table));
    p->h = calloc(1, sizeof(*p->h));
    if (!p->specs || !p->table || !p->h)
        return shardlm_fail(e, -ENOMEM, "out of memory");
    p->n = shlm_expected_tensors(&src->cfg, o->scheme, group, o->head_bits, NULL, p->specs,
                                 SHLM_MAX_TENSORS);
    if (p->n < 0)
        return shardlm_fail(e, -EINVAL, "%s: too many layers for the tensor table", o->checkpoint);
    struct shlm_header *h = p->h;
    shlm_layout(h, p->table, p->specs, p->n, src->tok_len);
    h->cfg = src->cfg;
    h->scheme = o->scheme;
    h->group = (uint32_t)group;
    h->head_bits = group ? (uint32_t)o->head_bits : 0;
    h->tok_kind = src->tok_kind;
    h->bos_id = src->bos_id;
    h->eos_id = src->eos_id;
    return 0;
}

/* Reads tensor @t of @src as float32, encodes it as @spec says, checksums it and writes it at its
 * offset in @fd. Returns 0 or -errno with @e naming the tensor or the output. */
static int write_tensor(int fd, struct coord_source *src, const struct shlm_tensor_spec *spec,
                        struct shlm_tensor *t, const struct coord_convert_opts *o,
                        struct shardlm_err *e)
{
    float *f32 = malloc((size_t)t->rows * t->cols * sizeof(float));
    void *buf = malloc(t->bytes);
    int rc;
    if (!f32 || !buf) {
        rc = shardlm_fail(e, -ENOMEM, "out of memory for tensor %s", t->name);
        goto out_free;
    }
    rc = src->read(src, t->name, (int)t->rows, (int)t->cols, f32, e);
    if (rc == -ENOENT)
        shardlm_fail(e, rc, "%s: tensor %s is missing", o->checkpoint, t->name);
    if (rc)
        goto out_free;
    encode(spec, f32, buf);
    t->checksum = shlm_hash(buf, t->bytes);
    if ((rc = pwrite_all(fd, buf, t->bytes, t->offset)))
        shardlm_fail(e, rc, "%s: write failed: %s", o->out, strerror(-rc));
out_free:
    free(f32);
    free(buf);
    return rc;
}

/* Seals the header and writes it, the tensor table and the tokenizer, then syncs and closes @fd
 * (*@fd = -1 once it is closed, whether the sync or the close failed; a failed write leaves it
 * open for the caller). Returns 0 or -errno with @e naming @out. */
static int write_tail(int *fd, struct convert_plan *p, const struct coord_source *src,
                      const char *out, struct shardlm_err *e)
{
    struct shlm_header *h = p->h;
    int rc;
    h->tok_checksum = shlm_hash(src->tok, src->tok_len);
    shlm_seal(h, p->table);
    if ((rc = pwrite_all(*fd, h, sizeof(*h), 0)) ||
        (rc = pwrite_all(*fd, p->table, (size_t)p->n * sizeof(*p->table), h->table_offset)) ||
        (rc = pwrite_all(*fd, src->tok, src->tok_len, h->tok_offset)))
        return shardlm_fail(e, rc, "%s: write failed: %s", out, strerror(-rc));
    /* closed whatever fsync says: the caller removes the temporary, the descriptor is ours */
    rc = 0;
    if (shardlm_fault(SHARDLM_FAULT_FSYNC))
        rc = -EIO; /* as a failed write-back reports it */
    else if (fsync(*fd) < 0)
        rc = -errno;
    if (close(*fd) < 0 && !rc)
        rc = -errno;
    *fd = -1;
    if (rc)
        return shardlm_fail(e, rc, "%s: %s", out, strerror(-rc));
    return 0;
}

int coord_convert(const struct coord_convert_opts *o, struct coord_convert_info *info,
                  struct shardlm_err *e)
{
    struct coord_source src;
    struct convert_plan p = {0};
    int rc, group;
    const char *inputs[] = {o->checkpoint, o->tokenizer};
    if ((rc = convert_group(o, &group, e)) || (rc = coord_out_check(o->out, inputs, 2, e)))
        return rc;
    if ((rc = coord_source_open(&src, o->checkpoint, o->tokenizer, o->max_ctx, e)))
        return rc;
    struct shardlm_err cerr;
    if (shlm_config_check(&src.cfg, &cerr)) {
        rc = shardlm_fail(e, -EINVAL, "%s: %s", o->checkpoint, cerr.msg);
        goto out_src;
    }
    if ((rc = plan_layout(&p, &src, o, group, e)))
        goto out_free;
    if (o->progress)
        o->progress(o->progress_ctx, 0, p.n);
    char tmp[4200];
    int fd = coord_out_open(o->out, tmp, sizeof(tmp), e);
    if (fd < 0) {
        rc = fd;
        goto out_free;
    }
    if (ftruncate(fd, (off_t)p.h->file_bytes) < 0) {
        rc = shardlm_fail(e, -errno, "%s: %s", o->out, strerror(errno));
        goto out_unlink;
    }
    for (int i = 0; i < p.n; i++) {
        if ((rc = write_tensor(fd, &src, &p.specs[i], &p.table[i], o, e)))
            goto out_unlink;
        if (o->progress)
            o->progress(o->progress_ctx, i + 1, p.n);
    }
    if ((rc = write_tail(&fd, &p, &src, o->out, e)))
        goto out_unlink;
    if ((rc = coord_out_commit(tmp, o->out, e)))
        goto out_free;
    if (info)
        *info = (struct coord_convert_info){
            .group = group, .n_tensors = p.n, .file_bytes = p.h->file_bytes};
    rc = 0;
    goto out_free;
out_unlink:
    if (fd >= 0)
        close(fd);
    unlink(tmp);
out_free:
    plan_free(&p);
out_src:
    coord_source_close(&src);
    return rc;
}
