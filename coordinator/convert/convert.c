/* coordinator/: convert a llama2.c checkpoint + tokenizer.bin into a .shlm file. */
#include "convert.h"

#include "source.h"

#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <stdio.h>
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

int coord_convert(const struct coord_convert_opts *o, struct shardlm_err *e)
{
    struct coord_source src;
    int rc, group = o->group;
    if (o->scheme == SHLM_SCHEME_W4A16 || o->scheme == SHLM_SCHEME_W4A8) {
        if (!group)
            group = o->scheme == SHLM_SCHEME_W4A16 ? 64 : 128;
        if (group < 32 || group > KN_MAX_GROUP || group % 32)
            return shardlm_fail(e, -EINVAL, "--group %d: expected 32, 64, 128 or 256", group);
        if (o->head_bits != 8 && o->head_bits != 4)
            return shardlm_fail(e, -EINVAL, "--head-bits %d: expected 8 or 4", o->head_bits);
    } else {
        group = 0;
    }
    const char *inputs[] = {o->checkpoint, o->tokenizer};
    if ((rc = coord_out_check(o->out, inputs, 2, e)))
        return rc;
    if ((rc = coord_source_open(&src, o->checkpoint, o->tokenizer, o->max_ctx, e)))
        return rc;
    char cerr[160];
    if (shlm_config_check(&src.cfg, cerr, sizeof(cerr))) {
        rc = shardlm_fail(e, -EINVAL, "%s: %s", o->checkpoint, cerr);
        goto out_src;
    }
    struct shlm_tensor_spec *specs = calloc(SHLM_MAX_TENSORS, sizeof(*specs));
    struct shlm_tensor *table = calloc(SHLM_MAX_TENSORS, sizeof(*table));
    struct shlm_header *h = calloc(1, sizeof(*h));
    if (!specs || !table || !h) {
        rc = shardlm_fail(e, -ENOMEM, "out of memory");
        goto out_free;
    }
    int n = shlm_expected_tensors(&src.cfg, o->scheme, group, o->head_bits, NULL, specs,
                                  SHLM_MAX_TENSORS);
    if (n < 0) {
        rc = shardlm_fail(e, -EINVAL, "%s: too many layers for the tensor table", o->checkpoint);
        goto out_free;
    }
    shlm_layout(h, table, specs, n, src.tok_len);
    h->cfg = src.cfg;
    h->scheme = o->scheme;
    h->group = (uint32_t)group;
    h->head_bits = group ? (uint32_t)o->head_bits : 0;
    h->tok_kind = src.tok_kind;
    h->bos_id = src.bos_id;
    h->eos_id = src.eos_id;

    bool progress = isatty(2);
    uint64_t t0 = shardlm_now_ns(), last_ns = t0;
    char tmp[4200];
    int fd = coord_out_open(o->out, tmp, sizeof(tmp), e);
    if (fd < 0) {
        rc = fd;
        goto out_free;
    }
    if (ftruncate(fd, (off_t)h->file_bytes) < 0) {
        rc = shardlm_fail(e, -errno, "%s: %s", o->out, strerror(errno));
        goto out_unlink;
    }
    for (int i = 0; i < n; i++) {
        struct shlm_tensor *t = &table[i];
        float *f32 = malloc((size_t)t->rows * t->cols * sizeof(float));
        void *buf = malloc(t->bytes);
        if (!f32 || !buf) {
            free(f32);
            free(buf);
            rc = shardlm_fail(e, -ENOMEM, "out of memory for tensor %s", t->name);
            goto out_unlink;
        }
        rc = src.read(&src, t->name, (int)t->rows, (int)t->cols, f32, e);
        if (rc == -ENOENT)
            shardlm_fail(e, rc, "%s: tensor %s is missing", o->checkpoint, t->name);
        if (!rc) {
            encode(&specs[i], f32, buf);
            t->checksum = shlm_hash(buf, t->bytes);
            if ((rc = pwrite_all(fd, buf, t->bytes, t->offset)))
                shardlm_fail(e, rc, "%s: write failed: %s", o->out, strerror(-rc));
        }
        free(f32);
        free(buf);
        if (rc)
            goto out_unlink;
        /* a counter on terminals; in logs a line every few seconds of a long conversion */
        if (!o->quiet && progress) {
            fprintf(stderr, "\rshardlm convert: %d/%d tensors", i + 1, n);
        } else if (!o->quiet && shardlm_now_ns() - last_ns > 5000000000ull) {
            last_ns = shardlm_now_ns();
            fprintf(stderr, "shardlm convert: %d/%d tensors, %.0f s\n", i + 1, n,
                    (double)(last_ns - t0) / 1e9);
        }
    }
    h->tok_checksum = shlm_hash(src.tok, src.tok_len);
    shlm_seal(h, table);
    if ((rc = pwrite_all(fd, h, sizeof(*h), 0)) ||
        (rc = pwrite_all(fd, table, (size_t)n * sizeof(*table), h->table_offset)) ||
        (rc = pwrite_all(fd, src.tok, src.tok_len, h->tok_offset))) {
        shardlm_fail(e, rc, "%s: write failed: %s", o->out, strerror(-rc));
        goto out_unlink;
    }
    if (fsync(fd) < 0 || close(fd) < 0) {
        fd = -1;
        rc = shardlm_fail(e, -errno, "%s: %s", o->out, strerror(errno));
        goto out_unlink;
    }
    fd = -1;
    if ((rc = coord_out_commit(tmp, o->out, e)))
        goto out_free;
    if (!o->quiet) {
        char g[32] = "";
        if (group)
            snprintf(g, sizeof(g), " group %d head int%d", group, o->head_bits);
        fprintf(stderr, "%sshardlm convert: wrote %s: %s%s, %d tensors, %llu bytes, %.1f s\n",
                progress ? "\r" : "", o->out, shlm_scheme_name(o->scheme), g, n,
                (unsigned long long)h->file_bytes, (double)(shardlm_now_ns() - t0) / 1e9);
    }
    rc = 0;
    goto out_free;
out_unlink:
    if (fd >= 0)
        close(fd);
    unlink(tmp);
out_free:
    free(specs);
    free(table);
    free(h);
out_src:
    coord_source_close(&src);
    return rc;
}
