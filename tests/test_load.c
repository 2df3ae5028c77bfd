/* SPDX-License-Identifier: MIT */
/* coordinator/load: the streaming load against the whole-matrix repack it replaced.
 *
 * Synthetic .shlm files with random tensor data (shapes of the real models: a 131072 x 2048
 * int4 tied embedding, 13312 x 2048 and 2048 x 6656 projections) are loaded into R = 1 and 3
 * ranks with read jobs of odd sizes (ragged last chunks, chunks across staging blocks), with
 * O_DIRECT and buffered reads; every tensor of every segment must equal, byte for byte, the
 * slice cut from the whole matrix and repacked whole. Then the bad inputs of a load: data changed
 * after the header was read, a file truncated or touched while loading, a full tmpfs - each a
 * clear error and no segment that parses as complete. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>

#include "load.h"
#include "plan.h"
#include "seg.h"
#include "shlm.h"
#include "testutil.h"

static char dir[4096];

static int setup(void **state)
{
    tu_mkdtemp(dir, sizeof(dir), "load");
    return 0;
}

static int teardown(void **state)
{
    tu_rmdir(dir);
    return 0;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static void fill_random(uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i += 8) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        memcpy(p + i, &rng, n - i < 8 ? n - i : 8);
    }
}

static struct shlm_config config(uint32_t dim, uint32_t hidden, uint32_t heads, uint32_t kv,
                                 uint32_t vocab, bool tied)
{
    struct shlm_config c = {.arch = SHLM_ARCH_LLAMA,
                            .dim = dim,
                            .hidden_dim = hidden,
                            .n_layers = 1,
                            .n_heads = heads,
                            .n_kv_heads = kv,
                            .head_dim = dim / heads,
                            .vocab_size = vocab,
                            .seq_len = 64,
                            .norm_eps = 1e-5f,
                            .rope_theta = 10000.0f,
                            .tied_embd = tied,
                            .qkv_bias = 1,
                            .head_gate = 1};
    return c;
}

/* Writes a .shlm of config @c with random data to @path and returns its image (malloc'd). */
static uint8_t *write_model(const char *path, const struct shlm_config *c, enum shlm_scheme s,
                            int group, int head_bits, size_t *len)
{
    struct shlm_tensor_spec *specs = calloc(SHLM_MAX_TENSORS, sizeof(*specs));
    struct shlm_tensor *table = calloc(SHLM_MAX_TENSORS, sizeof(*table));
    struct shlm_header h = {0};
    int n = shlm_expected_tensors(c, &(struct shlm_config_ext){0}, s, group, head_bits, NULL, specs,
                                  SHLM_MAX_TENSORS);
    assert_true(n > 0);
    shlm_layout(&h, table, specs, n, 100);
    h.cfg = *c;
    h.scheme = s;
    h.group = (uint32_t)group;
    h.head_bits = (uint32_t)head_bits;
    h.tok_kind = SHLM_TOK_BLOB;
    h.bos_id = 1;
    h.eos_id = 2;
    uint8_t *img = calloc(1, h.file_bytes);
    assert_non_null(img);
    fill_random(img + h.tok_offset, h.tok_bytes);
    for (int i = 0; i < n; i++) {
        fill_random(img + table[i].offset, table[i].bytes);
        table[i].checksum = shlm_hash(img + table[i].offset, table[i].bytes);
    }
    memcpy(img + h.table_offset, table, (size_t)n * sizeof(*table));
    shlm_seal(&h, table);
    memcpy(img, &h, sizeof(h));
    assert_int_equal(tu_write(path, img, h.file_bytes), 0);
    *len = h.file_bytes;
    free(specs);
    free(table);
    return img;
}

/* The canonical slice of tensor @name that rank @p holds, cut from the whole source matrix the
 * way the coordinator did before the streaming load (the reference). */
static void slice_whole(const struct kn_mat *src, const char *name, const struct seg_plan *p,
                        int hd, int rows, void *dst)
{
    const char *part = strrchr(name, '.');
    part = part ? part + 1 : name;
    if (!strcmp(part, "attn_q"))
        kn_repack_rows(src, p->q0 * hd, p->q0 * hd + rows, dst);
    else if (!strcmp(part, "attn_k") || !strcmp(part, "attn_v"))
        kn_repack_rows(src, p->kv0 * hd, p->kv0 * hd + rows, dst);
    else if (!strcmp(part, "ffn_gate") || !strcmp(part, "ffn_up"))
        kn_repack_rows(src, p->f0, p->f0 + rows, dst);
    else if (!strcmp(part, "attn_o"))
        kn_repack_cols(src, p->q0 * hd, p->q1 * hd, p->o_pad, dst);
    else if (!strcmp(part, "ffn_down"))
        kn_repack_cols(src, p->f0, p->f1, p->down_pad, dst);
    else if (!strcmp(part, "attn_q_bias"))
        kn_repack_cols(src, p->q0 * hd, p->q1 * hd, 0, dst);
    else if (!strcmp(part, "attn_k_bias") || !strcmp(part, "attn_v_bias"))
        kn_repack_cols(src, p->kv0 * hd, p->kv1 * hd, 0, dst);
    else if (!strcmp(part, "attn_gate"))
        kn_repack_rows(src, p->q0, p->q0 + rows, dst);
    else if (!strcmp(part, "output"))
        kn_repack_rows(src, p->v0, p->v0 + rows, dst);
    else
        kn_repack_rows(src, 0, rows, dst);
}

/* Every tensor of rank @r's segment @seg equals the whole-matrix reference from @img. */
static void expect_segment(const uint8_t *img, size_t len, const struct seg *seg, int R, int r)
{
    struct shlm_model file, m;
    struct shardlm_err err;
    assert_int_equal(shlm_parse(&file, img, len, "file", &err), 0);
    if (shlm_parse(&m, seg->base, seg->size, "segment", &err))
        fail_msg("%s", err.msg);
    const struct shlm_header *h = m.hdr;
    assert_int_equal(h->shard_rank, r);
    assert_int_equal(h->shard_count, R);
    assert_true(h->source_checksum == file.hdr->checksum);
    assert_memory_equal(seg->base + h->tok_offset, img + file.hdr->tok_offset, h->tok_bytes);
    struct seg_plan p;
    assert_int_equal(seg_plan_make(&p, &h->cfg, &h->cfgx, (int)h->group, R, r), 0);
    for (uint32_t i = 0; i < h->n_tensors; i++) {
        const struct shlm_tensor *t = &m.tensors[i], *s = shlm_find(&file, t->name);
        assert_non_null(s);
        struct kn_mat src;
        shlm_view(&file, s, &src);
        enum kn_dtype canon = (enum kn_dtype)s->dtype;
        size_t cb = kn_mat_bytes(canon, (int)t->rows, (int)t->cols, (int)t->group);
        uint8_t *want = calloc(1, cb), *tiles = NULL;
        slice_whole(&src, t->name, &p, (int)h->cfg.head_dim, (int)t->rows, want);
        if (kn_is_tiled((enum kn_dtype)t->dtype)) {
            struct kn_mat v;
            kn_mat_view(&v, canon, (int)t->rows, (int)t->cols, (int)t->group, want);
            tiles = calloc(1, t->bytes);
            kn_repack_tiles(&v, 0, ((int)t->rows + KN_TILE_ROWS - 1) / KN_TILE_ROWS, tiles);
        } else {
            assert_int_equal(cb, t->bytes);
        }
        if (memcmp(seg->base + t->offset, tiles ? tiles : want, t->bytes))
            fail_msg("rank %d of %d: tensor %s (%ux%u) differs from the whole repack", r, R,
                     t->name, t->rows, t->cols);
        assert_true(t->checksum == shlm_hash(seg->base + t->offset, t->bytes));
        free(want);
        free(tiles);
    }
}

/* Bytes of rank @r's weights segment of @R for the opened file @f. */
static size_t shard_bytes(const struct coord_model_file *f, int R, int r)
{
    struct shlm_header h;
    struct shlm_tensor *table = calloc(SHLM_MAX_TENSORS, sizeof(*table));
    assert_true(coord_shard_layout(&f->img, R, r, SEG_EXPERTS_TP, &h, table) > 0);
    free(table);
    return h.file_bytes;
}

/* Loads @path into @R memfd segments as @o says; returns the load's result, @e its error. */
static int load(const char *path, int R, const struct coord_load_opts *o, struct seg *segs,
                struct shardlm_err *e)
{
    struct coord_model_file f;
    struct coord_load_dest dest[8];
    struct coord_load_stats st;
    int rc = coord_model_open(&f, path, e);
    for (int r = 0; !rc && r < R; r++) {
        assert_int_equal(
            seg_create_on(&segs[r], "test-load", shard_bytes(&f, R, r), -1, SEG_ANON | SEG_LAZY),
            0);
        dest[r] = (struct coord_load_dest){r, &segs[r]};
    }
    if (!rc)
        rc = coord_load_shards(&f, R, dest, R, o, NULL, NULL, &st, e);
    if (!rc)
        assert_true(st.bytes > f.img.hdr->data_offset && st.bytes <= (uint64_t)f.st.st_size);
    coord_model_close(&f);
    return rc;
}

static void check_model(const char *name, const struct shlm_config *c, enum shlm_scheme s,
                        int group, int head_bits, size_t chunk)
{
    char path[4200];
    size_t len;
    tu_path(path, sizeof(path), "%s/%s.shlm", dir, name);
    uint8_t *img = write_model(path, c, s, group, head_bits, &len);
    static const enum coord_io ios[] = {COORD_IO_DIRECT, COORD_IO_BUFFERED};
    for (int k = 0; k < 2; k++)
        for (int R = 1; R <= 3; R += 2) {
            struct seg segs[3] = {0};
            struct shardlm_err e;
            int rc =
                load(path, R, &(struct coord_load_opts){.io = ios[k], .chunk = chunk}, segs, &e);
            if (rc)
                fail_msg("%s: %s", name, e.msg);
            for (int r = 0; r < R; r++) {
                expect_segment(img, len, &segs[r], R, r);
                seg_free(&segs[r]);
            }
        }
    unlink(path);
    free(img);
}

/* Under ThreadSanitizer (SHARDLM_TSAN) these two take 160 s and add no interleaving of the lanes
 * that the ragged one does not run. */
#ifndef SHARDLM_TSAN
/* A 131072 x 2048 int4 tied embedding (the LM head of each rank a range of its tiles), 2048 x
 * 6656 down projections; jobs of 300 KiB: 288 rows of the embedding, the last one ragged. */
static void test_chunked_equals_whole_big_head(void **state)
{
    struct shlm_config c = config(2048, 6656, 16, 4, 131072, true);
    check_model("head", &c, SHLM_SCHEME_W4A8, 128, 4, 300 << 10);
}

/* 13312 x 2048 projections, an int8 untied head split by rows, W4A16 (zero points), jobs of
 * 100 KiB + 1. */
static void test_chunked_equals_whole_wide_ffn(void **state)
{
    struct shlm_config c = config(2048, 13312, 16, 2, 4096, false);
    check_model("ffn", &c, SHLM_SCHEME_W4A16, 64, 8, (100 << 10) + 1);
}
#endif

/* Heads of 8 (ranks start mid block), odd sizes everywhere, tiny jobs (16 rows). */
static void test_chunked_equals_whole_ragged(void **state)
{
    struct shlm_config c = config(96, 200, 12, 3, 1000, true);
    check_model("ragged", &c, SHLM_SCHEME_W4A8, 32, 8, 64);
}

/* A segment after a failed load must not parse as a complete one. */
static void expect_incomplete(struct seg *s)
{
    struct shlm_model m;
    struct shardlm_err err;
    assert_true(shlm_parse(&m, s->base, s->size, "seg", &err) != 0);
    seg_free(s);
}

/* Open (header read), then change the file, then load: each change is caught. */
static void test_changed_while_loading(void **state)
{
    char path[4200];
    size_t len;
    struct shlm_config c = config(256, 512, 4, 2, 512, true);
    tu_path(path, sizeof(path), "%s/small.shlm", dir);
    uint8_t *img = write_model(path, &c, SHLM_SCHEME_W4A8, 128, 8, &len);
    struct shlm_model file;
    struct shardlm_err err;
    assert_int_equal(shlm_parse(&file, img, len, "x", &err), 0);
    const struct shlm_tensor *last = &file.tensors[file.hdr->n_tensors - 1];
    for (int change = 0; change < 3; change++) {
        assert_int_equal(tu_write(path, img, len), 0);
        struct coord_model_file f;
        struct shardlm_err e;
        struct seg s = {0};
        assert_int_equal(coord_model_open(&f, path, &e), 0);
        assert_int_equal(seg_create_on(&s, "t", shard_bytes(&f, 1, 0), -1, SEG_ANON | SEG_LAZY), 0);
        int fd = open(path, O_WRONLY);
        assert_true(fd >= 0);
        const char *want;
        if (change == 0) { /* a data byte: the tensor's checksum */
            uint8_t b = img[last->offset + 5] ^ 1;
            assert_int_equal(pwrite(fd, &b, 1, (off_t)last->offset + 5), 1);
            want = "checksum mismatch";
        } else if (change == 1) { /* cut short */
            assert_int_equal(ftruncate(fd, (off_t)(last->offset + 100)), 0);
            want = "ends before byte";
        } else { /* rewritten with the same bytes: still not the file that was opened */
            struct timespec ts[2] = {{0, UTIME_OMIT}, {12345, 0}};
            assert_int_equal(futimens(fd, ts), 0);
            want = "changed while loading";
        }
        close(fd);
        struct coord_load_dest d = {0, &s};
        struct coord_load_stats st;
        int rc = coord_load_shards(&f, 1, &d, 1, &(struct coord_load_opts){.io = COORD_IO_BUFFERED},
                                   NULL, NULL, &st, &e);
        assert_int_equal(rc, -EIO);
        if (!strstr(e.msg, want))
            fail_msg("change %d: '%s', wanted '%s'", change, e.msg, want);
        expect_incomplete(&s);
        coord_model_close(&f);
    }
    free(img);
}

/* A tmpfs too small for the segment: -ENOSPC from the load, never SIGBUS. */
static void test_full_tmpfs(void **state)
{
    char mnt[4200], path[4200], seg_path[4300];
    size_t len;
    tu_path(mnt, sizeof(mnt), "%s/small", dir);
    assert_int_equal(mkdir(mnt, 0700), 0);
    if (mount("tmpfs", mnt, "tmpfs", MS_NOSUID | MS_NODEV, "size=2m,mode=0700") < 0) {
        print_message("test_full_tmpfs: cannot mount a 2 MiB tmpfs (%s); run as root with "
                      "CAP_SYS_ADMIN to check -ENOSPC here (test_e2e checks it with "
                      "SHARDLM_SHM_LIMIT)\n",
                      strerror(errno));
        skip();
    }
    struct shlm_config c = config(512, 1024, 4, 2, 2048, true); /* about 4 MiB of shard */
    tu_path(path, sizeof(path), "%s/small.shlm", dir);
    free(write_model(path, &c, SHLM_SCHEME_W4A8, 128, 8, &len));
    struct coord_model_file f;
    struct shardlm_err e;
    struct seg s = {0};
    assert_int_equal(coord_model_open(&f, path, &e), 0);
    tu_path(seg_path, sizeof(seg_path), "%s/w", mnt);
    int created = seg_create_on(&s, seg_path, shard_bytes(&f, 1, 0), -1, SEG_LAZY);
    int rc = created ? created
                     : coord_load_shards(&f, 1, &(struct coord_load_dest){0, &s}, 1, NULL, NULL,
                                         NULL, &(struct coord_load_stats){0}, &e);
    if (!created)
        seg_free(&s); /* unlinks it */
    coord_model_close(&f);
    int left = tu_count_files(mnt);
    assert_int_equal(umount2(mnt, MNT_DETACH), 0);
    assert_int_equal(created, 0);
    assert_int_equal(rc, -ENOSPC);
    assert_non_null(strstr(e.msg, "No space left"));
    assert_int_equal(left, 0);
}

/* The caller's cancel flag stops a load (at its next tensor) with -ECANCELED; a load that is
 * not cancelled goes on reading the same file to the end. */
static void test_cancelled(void **state)
{
    char path[4200];
    size_t len;
    struct shlm_config c = config(256, 512, 4, 2, 512, false);
    tu_path(path, sizeof(path), "%s/cancel.shlm", dir);
    free(write_model(path, &c, SHLM_SCHEME_W4A8, 128, 8, &len));
    for (int set = 1; set >= 0; set--) {
        volatile sig_atomic_t cancel = set;
        struct coord_model_file f;
        struct shardlm_err e = {{0}};
        struct seg s = {0};
        assert_int_equal(coord_model_open(&f, path, &e), 0);
        assert_int_equal(
            seg_create_on(&s, "test-load", shard_bytes(&f, 1, 0), -1, SEG_ANON | SEG_LAZY), 0);
        int rc = coord_load_shards(&f, 1, &(struct coord_load_dest){0, &s}, 1,
                                   &(struct coord_load_opts){.io = COORD_IO_BUFFERED}, NULL,
                                   &cancel, &(struct coord_load_stats){0}, &e);
        seg_free(&s);
        coord_model_close(&f);
        assert_int_equal(rc, set ? -ECANCELED : 0);
        if (set)
            assert_string_equal(e.msg, "cancelled");
    }
}

/* Runs `shardlm inspect @path` and checks that each tensor of the image @img (@len bytes) is
 * listed under the name of its dtype (the names in kn.h's order, restated here). */
static void expect_inspect_names(const char *path, const void *img, size_t len)
{
    static const char *const names[KN_DT_COUNT] = {"f32",  "bf16",  "q8",     "w4a16",
                                                   "w4a8", "w4a8t", "w4a16t", "q6"};
    struct shlm_model m;
    struct shardlm_err err;
    assert_int_equal(shlm_parse(&m, img, len, path, &err), 0);
    struct tu_run *r = malloc(sizeof(*r));
    assert_non_null(r);
    char *argv[] = {(char *)tu_bin(), "inspect", (char *)path, NULL};
    tu_run_cmd(r, argv, NULL, 60, NULL, NULL);
    if (r->status)
        fail_msg("inspect %s: exit %d: %s", path, r->status, r->err);
    for (uint32_t i = 0; i < m.hdr->n_tensors; i++) {
        const struct shlm_tensor *t = &m.tensors[i];
        char want[128];
        snprintf(want, sizeof(want), "\n  %-24s %-5s %6u x ", t->name, names[t->dtype], t->rows);
        if (!strstr(r->out, want))
            fail_msg("inspect %s: no line '%s' for tensor %s in:\n%s", path, want + 1, t->name,
                     r->out);
    }
    free(r);
}

/* `shardlm inspect` names the dtype of every tensor, of a .shlm file of each scheme and of a
 * weights segment made from it (the tile layouts: inspect once indexed five names with them). */
static void test_inspect_dtype_names(void **state)
{
    static const struct {
        enum shlm_scheme s;
        int group, head_bits;
    } cases[] = {{SHLM_SCHEME_F32, 0, 8},
                 {SHLM_SCHEME_BF16, 0, 8},
                 {SHLM_SCHEME_W4A16, 64, 8},
                 {SHLM_SCHEME_W4A8, 32, 4},
                 {SHLM_SCHEME_W4A8, 128, 6}};
    struct shlm_config c = config(64, 172, 4, 2, 256, false);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char path[4200], seg_file[4200];
        size_t len;
        tu_path(path, sizeof(path), "%s/names%zu.shlm", dir, i);
        tu_path(seg_file, sizeof(seg_file), "%s/names%zu.segment", dir, i);
        uint8_t *img = write_model(path, &c, cases[i].s, cases[i].group, cases[i].head_bits, &len);
        expect_inspect_names(path, img, len);
        struct seg seg = {0};
        struct shardlm_err e;
        if (load(path, 1, &(struct coord_load_opts){.io = COORD_IO_BUFFERED}, &seg, &e))
            fail_msg("%s: %s", path, e.msg);
        size_t bytes = ((const struct shlm_header *)seg.base)->file_bytes;
        assert_int_equal(tu_write(seg_file, seg.base, bytes), 0);
        expect_inspect_names(seg_file, seg.base, bytes);
        seg_free(&seg);
        unlink(path);
        unlink(seg_file);
        free(img);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
#ifndef SHARDLM_TSAN
        cmocka_unit_test(test_chunked_equals_whole_big_head),
        cmocka_unit_test(test_chunked_equals_whole_wide_ffn),
#endif
        cmocka_unit_test(test_chunked_equals_whole_ragged),
        cmocka_unit_test(test_changed_while_loading),
        cmocka_unit_test(test_full_tmpfs),
        cmocka_unit_test(test_cancelled),
        cmocka_unit_test(test_inspect_dtype_names),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
