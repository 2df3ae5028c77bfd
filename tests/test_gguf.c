/* SPDX-License-Identifier: MIT */
/* coordinator/format/gguf_{read,write}.c: the real vocabulary-only GGUF files of the test data;
 * the writer read back; Q8_0 / Q4_0 / BF16 / F16 dequantization against values worked out by
 * hand; every truncation and a list of corrupted fields refused with a one-line message naming
 * the field.
 *
 * The same small images seed the fuzz corpus:
 *   test_gguf --write-corpus tests/fuzz/corpus/gguf
 * writes them (valid ones and corrupted variants; names carry no .gguf suffix). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <sys/resource.h>

#include "gguf.h"
#include "gguf_write.h"
#include "kn.h"
#include "source.h"
#include "synth.h"
#include "testutil.h"

static char dir[4096];

static int setup(void **state)
{
    tu_mkdtemp(dir, sizeof(dir), "gguf");
    return 0;
}

static int teardown(void **state)
{
    tu_rmdir(dir);
    return 0;
}

/* ---- a small image builder ----------------------------------------------------------------- */

struct img {
    uint8_t *b;
    size_t n, cap;
    uint64_t n_kv; /* key/values put so far, patched into the header by img_finish_kv() */
};

static size_t put(struct img *m, const void *p, size_t n)
{
    if (m->n + n > m->cap) {
        m->cap = (m->n + n) * 2 + 256;
        m->b = realloc(m->b, m->cap);
        assert_non_null(m->b);
    }
    size_t at = m->n;
    if (n)
        memcpy(m->b + at, p, n);
    m->n += n;
    return at;
}

static size_t put_u8(struct img *m, uint8_t v) { return put(m, &v, 1); }
static size_t put_u16(struct img *m, uint16_t v) { return put(m, &v, 2); }
static size_t put_u32(struct img *m, uint32_t v) { return put(m, &v, 4); }
static size_t put_u64(struct img *m, uint64_t v) { return put(m, &v, 8); }
static size_t put_f32(struct img *m, float v) { return put(m, &v, 4); }
static size_t put_f64(struct img *m, double v) { return put(m, &v, 8); }
/* Returns the position of the length field. */
static size_t put_str(struct img *m, const char *s)
{
    size_t at = put_u64(m, strlen(s));
    put(m, s, strlen(s));
    return at;
}

static void patch_u32(struct img *m, size_t at, uint32_t v) { memcpy(m->b + at, &v, 4); }
static void patch_u64(struct img *m, size_t at, uint64_t v) { memcpy(m->b + at, &v, 8); }
static uint64_t peek_u64(const struct img *m, size_t at)
{
    uint64_t v;
    memcpy(&v, m->b + at, 8);
    return v;
}

static void img_header(struct img *m, uint32_t version, uint64_t n_tensors)
{
    m->n = 0;
    m->n_kv = 0;
    put(m, "GGUF", 4);
    put_u32(m, version);
    put_u64(m, n_tensors);
    put_u64(m, 0); /* n_kv, patched */
}

static void img_finish_kv(struct img *m) { patch_u64(m, 16, m->n_kv); }

/* Key and type; returns the position of the type field. */
static size_t kv_key(struct img *m, const char *key, uint32_t type)
{
    m->n_kv++;
    put_str(m, key);
    return put_u32(m, type);
}

struct tdesc {
    const char *name;
    uint32_t type, n_dims;
    uint64_t dims[4];
    const void *data;
    size_t bytes;
};

/* Positions of the fields of tensor info i, to corrupt them. */
struct tpos {
    size_t name, n_dims, dims, type, offset;
};

/* Tensor infos, padding to @align, then the data, each tensor at the next multiple of @align;
 * nothing after the last one (so every truncation cuts data). */
static void img_tensors(struct img *m, const struct tdesc *t, int n, uint64_t align,
                        struct tpos *pos)
{
    uint64_t off[16], end = 0;
    assert_true(n <= 16);
    for (int i = 0; i < n; i++) {
        off[i] = (end + align - 1) / align * align;
        end = off[i] + t[i].bytes;
    }
    for (int i = 0; i < n; i++) {
        struct tpos p;
        p.name = put_str(m, t[i].name);
        p.n_dims = put_u32(m, t[i].n_dims);
        p.dims = m->n;
        for (uint32_t d = 0; d < t[i].n_dims; d++)
            put_u64(m, t[i].dims[d]);
        p.type = put_u32(m, t[i].type);
        p.offset = put_u64(m, off[i]);
        if (pos)
            pos[i] = p;
    }
    size_t base = (m->n + align - 1) / align * align;
    static const uint8_t zero[65536];
    put(m, zero, base - m->n);
    for (int i = 0; i < n; i++) {
        put(m, zero, base + off[i] - m->n);
        put(m, t[i].data, t[i].bytes);
    }
}

/* ---- the small image: a few keys of each shape and one tensor of each supported type -------- */

#define SMALL_NT 5

struct small {
    struct img m;
    size_t key0_len, arch_len, align_type, align_val, a_type, b_key, c_val, arr_etype, arr_n,
        arr_str1;
    struct tpos t[SMALL_NT];
};

static float small_f32(int i) { return (float)i * 0.5f - 3.0f; }
static float small_f16(int i) { return (float)(i - 4) * 0.25f; }
/* Q8_0 w.2: 2 rows of one block, scales 0.5 and 0.25 */
static int8_t small_q8(int r, int j) { return (int8_t)(r ? 3 * j - 50 : j - 16); }
static float small_q8_val(int r, int j) { return (r ? 0.25f : 0.5f) * (float)small_q8(r, j); }
/* Q4_0 w.3: 1 row of two blocks, scales 2 and 1; block 0 byte j = (15 - j) << 4 | j, block 1
 * byte j = j << 4 | (15 - j) */
static float small_q4_val(int k)
{
    int b = k / 32, j = k % 32;
    int nib = b == 0 ? (j < 16 ? j : 15 - (j - 16)) : (j < 16 ? 15 - j : j - 16);
    return (b == 0 ? 2.0f : 1.0f) * (float)(nib - 8);
}
/* BF16 w.4: 3 x 2 */
static const float small_bf16[6] = {1.5f, -2.0f, 0.0f, 3.140625f, -0.0078125f, 256.0f};

/* Builds the small image: version @version, general.alignment = @align (0: no key, default 32). */
static void small_build(struct small *s, uint32_t version, uint32_t align)
{
    struct img *m = &s->m;
    img_header(m, version, SMALL_NT);
    s->key0_len = m->n;
    kv_key(m, "general.architecture", GGUF_STRING);
    s->arch_len = put_str(m, "llama");
    if (align) {
        s->align_type = kv_key(m, "general.alignment", GGUF_UINT32);
        s->align_val = put_u32(m, align);
    }
    s->a_type = kv_key(m, "t.a", GGUF_UINT32);
    put_u32(m, 7);
    s->b_key = m->n + 8;
    kv_key(m, "t.b", GGUF_FLOAT32);
    put_f32(m, 0.5f);
    kv_key(m, "t.c", GGUF_BOOL);
    s->c_val = put_u8(m, 1);
    kv_key(m, "t.arr", GGUF_ARRAY);
    s->arr_etype = put_u32(m, GGUF_STRING);
    s->arr_n = put_u64(m, 3);
    put_str(m, "x");
    s->arr_str1 = put_str(m, "yz");
    put_str(m, "");
    kv_key(m, "t.f", GGUF_ARRAY);
    put_u32(m, GGUF_FLOAT32);
    put_u64(m, 3);
    put_f32(m, 1.0f);
    put_f32(m, -2.0f);
    put_f32(m, 0.25f);
    img_finish_kv(m);

    static float f32[16];
    static uint16_t f16[8], bf16[6];
    static uint8_t q8[2 * 34], q4[2 * 18];
    for (int i = 0; i < 16; i++)
        f32[i] = small_f32(i);
    for (int i = 0; i < 8; i++)
        f16[i] = kn_f32_to_f16(small_f16(i));
    for (int r = 0; r < 2; r++) {
        uint16_t d = r ? 0x3400 : 0x3800; /* 0.25, 0.5 */
        memcpy(q8 + 34 * r, &d, 2);
        for (int j = 0; j < 32; j++)
            q8[34 * r + 2 + j] = (uint8_t)small_q8(r, j);
    }
    for (int b = 0; b < 2; b++) {
        uint16_t d = b ? 0x3c00 : 0x4000; /* 1, 2 */
        memcpy(q4 + 18 * b, &d, 2);
        for (int j = 0; j < 16; j++)
            q4[18 * b + 2 + j] = (uint8_t)(b ? (j << 4) | (15 - j) : ((15 - j) << 4) | j);
    }
    for (int i = 0; i < 6; i++)
        bf16[i] = kn_f32_to_bf16(small_bf16[i]);
    const struct tdesc t[SMALL_NT] = {
        {"w.0", GGML_F32, 2, {8, 2}, f32, sizeof(f32)},
        {"w.1", GGML_F16, 1, {8}, f16, sizeof(f16)},
        {"w.2", GGML_Q8_0, 2, {32, 2}, q8, sizeof(q8)},
        {"w.3", GGML_Q4_0, 2, {64, 1}, q4, sizeof(q4)},
        {"w.4", GGML_BF16, 2, {3, 2}, bf16, sizeof(bf16)},
    };
    img_tensors(m, t, SMALL_NT, align ? align : 32, s->t);
}

/* Parses an exact-size heap copy (so ASan sees any read past the end). */
static int parse_copy(struct gguf_file *g, uint8_t **copy, const uint8_t *b, size_t n,
                      struct shardlm_err *e)
{
    *copy = malloc(n ? n : 1);
    assert_non_null(*copy);
    if (n)
        memcpy(*copy, b, n);
    e->msg[0] = 0;
    return gguf_parse(g, *copy, n, "img", e);
}

static void assert_one_line_error(int rc, const struct shardlm_err *e)
{
    assert_true(rc < 0);
    assert_true(strlen(e->msg) > 0);
    assert_null(strchr(e->msg, '\n'));
}

/* ---- corrupted variants -------------------------------------------------------------------- */

struct corrupt {
    const char *name;
    void (*apply)(struct small *s);
    int rc;
    const char *want1, *want2; /* both must appear in the message */
};

static void c_magic(struct small *s) { s->m.b[0] = 'X'; }
static void c_version1(struct small *s) { patch_u32(&s->m, 4, 1); }
static void c_version4(struct small *s) { patch_u32(&s->m, 4, 4); }
static void c_huge_n_kv(struct small *s) { patch_u64(&s->m, 16, 1ull << 60); }
static void c_huge_n_tensors(struct small *s) { patch_u64(&s->m, 8, 1ull << 59); }
static void c_huge_key_len(struct small *s) { patch_u64(&s->m, s->key0_len, 1ull << 62); }
static void c_huge_str_len(struct small *s) { patch_u64(&s->m, s->arch_len, UINT64_MAX); }
static void c_huge_arr_n(struct small *s) { patch_u64(&s->m, s->arr_n, 1ull << 61); }
static void c_huge_arr_str(struct small *s) { patch_u64(&s->m, s->arr_str1, 1ull << 40); }
static void c_unknown_type(struct small *s) { patch_u32(&s->m, s->a_type, 13); }
static void c_unknown_etype(struct small *s) { patch_u32(&s->m, s->arr_etype, 0x80000000u); }
static void c_nested(struct small *s) { patch_u32(&s->m, s->arr_etype, GGUF_ARRAY); }
static void c_bool2(struct small *s) { s->m.b[s->c_val] = 2; }
static void c_dup_key(struct small *s) { s->m.b[s->b_key + 2] = 'a'; }
static void c_align3(struct small *s) { patch_u32(&s->m, s->align_val, 3); }
static void c_align0(struct small *s) { patch_u32(&s->m, s->align_val, 0); }
static void c_align_big(struct small *s) { patch_u32(&s->m, s->align_val, 1u << 17); }
static void c_align_type(struct small *s) { patch_u32(&s->m, s->align_type, GGUF_INT32); }
static void c_ndims5(struct small *s) { patch_u32(&s->m, s->t[0].n_dims, 5); }
static void c_ndims0(struct small *s) { patch_u32(&s->m, s->t[0].n_dims, 0); }
static void c_dim0(struct small *s) { patch_u64(&s->m, s->t[0].dims + 8, 0); }
static void c_dims_overflow(struct small *s)
{
    patch_u64(&s->m, s->t[0].dims, 1ull << 33);
    patch_u64(&s->m, s->t[0].dims + 8, 1ull << 33);
}
static void c_dup_tensor(struct small *s) { s->m.b[s->t[1].name + 8 + 2] = '0'; }
static void c_misaligned(struct small *s)
{
    patch_u64(&s->m, s->t[1].offset, peek_u64(&s->m, s->t[1].offset) + 1);
}
static void c_past_end(struct small *s)
{
    patch_u64(&s->m, s->t[3].offset, peek_u64(&s->m, s->t[3].offset) + (1u << 20));
}
static void c_data_past_end(struct small *s) { patch_u64(&s->m, s->t[0].dims + 8, 1000); }
static void c_overlap(struct small *s)
{
    patch_u64(&s->m, s->t[1].offset, peek_u64(&s->m, s->t[0].offset));
}
static void c_q8_cols(struct small *s)
{
    patch_u64(&s->m, s->t[2].dims, 16);
    patch_u64(&s->m, s->t[2].dims + 8, 4);
}
static void c_q4_1d_cols(struct small *s)
{
    patch_u64(&s->m, s->t[3].dims, 2);
    patch_u64(&s->m, s->t[3].dims + 8, 32);
}

static const struct corrupt corruptions[] = {
    {"bad-magic", c_magic, -EPROTO, "magic", "GGUF"},
    {"version-1", c_version1, -EINVAL, "version", "is 1"},
    {"version-4", c_version4, -EINVAL, "version", "is 4"},
    {"huge-n-kv", c_huge_n_kv, -EINVAL, "n_kv", "1152921504606846976"},
    {"huge-n-tensors", c_huge_n_tensors, -EINVAL, "n_tensors", "576460752303423488"},
    {"huge-key-length", c_huge_key_len, -EINVAL, "kv 0", "key length"},
    {"huge-string-length", c_huge_str_len, -EINVAL, "general.architecture", "string length"},
    {"huge-array-count", c_huge_arr_n, -EINVAL, "t.arr", "array count"},
    {"huge-array-string-length", c_huge_arr_str, -EINVAL, "t.arr", "string 1 of 3"},
    {"unknown-kv-type", c_unknown_type, -EINVAL, "t.a", "type 13"},
    {"unknown-array-type", c_unknown_etype, -EINVAL, "t.arr", "element type 2147483648"},
    {"nested-array", c_nested, -EINVAL, "t.arr", "nested"},
    {"bool-2", c_bool2, -EINVAL, "t.c", "bool"},
    {"duplicate-key", c_dup_key, -EINVAL, "kv t.a", "twice"},
    {"alignment-3", c_align3, -EINVAL, "general.alignment", "3 is not a power of two"},
    {"alignment-0", c_align0, -EINVAL, "general.alignment", "0 is not"},
    {"alignment-131072", c_align_big, -EINVAL, "general.alignment", "131072"},
    {"alignment-i32", c_align_type, -EINVAL, "general.alignment", "u32"},
    {"n-dims-5", c_ndims5, -EINVAL, "tensor w.0", "n_dims is 5"},
    {"n-dims-0", c_ndims0, -EINVAL, "tensor w.0", "n_dims is 0"},
    {"dim-zero", c_dim0, -EINVAL, "tensor w.0", "dims[1] is 0"},
    {"dims-overflow", c_dims_overflow, -EINVAL, "tensor w.0", "overflow"},
    {"duplicate-tensor", c_dup_tensor, -EINVAL, "tensor w.0", "twice"},
    {"misaligned-offset", c_misaligned, -EINVAL, "tensor w.1", "not a multiple of the alignment"},
    {"tensor-past-end", c_past_end, -EINVAL, "tensor w.3", "past the end"},
    {"tensor-data-past-end", c_data_past_end, -EINVAL, "tensor w.0", "past the end"},
    {"overlapping-tensors", c_overlap, -EINVAL, "overlap", "w.1"},
    {"q8-cols-16", c_q8_cols, -EINVAL, "tensor w.2", "multiple of 32"},
    {"q4-cols-2", c_q4_1d_cols, -EINVAL, "tensor w.3", "multiple of 32"},
};
#define N_CORRUPT (sizeof(corruptions) / sizeof(corruptions[0]))

/* ---- tests --------------------------------------------------------------------------------- */

static void test_small_valid(void **state)
{
    static const uint32_t aligns[] = {0, 1, 32, 64, 4096};
    for (size_t a = 0; a < sizeof(aligns) / sizeof(aligns[0]); a++) {
        struct small s = {0};
        small_build(&s, a == 1 ? 2 : 3, aligns[a]);
        struct gguf_file g;
        struct shardlm_err e;
        uint8_t *copy;
        int rc = parse_copy(&g, &copy, s.m.b, s.m.n, &e);
        if (rc)
            fprintf(stderr, "%s\n", e.msg);
        assert_int_equal(rc, 0);
        assert_int_equal(g.version, a == 1 ? 2 : 3);
        assert_int_equal(g.alignment, aligns[a] ? aligns[a] : 32);
        assert_int_equal(g.data_offset % g.alignment, 0);
        assert_int_equal(g.n_kv, aligns[a] ? 7 : 6);
        assert_int_equal(g.n_tensors, SMALL_NT);
        uint32_t u;
        float f;
        bool bo;
        struct gguf_str str;
        assert_int_equal(gguf_get_str(&g, "general.architecture", &str), 0);
        assert_true(gguf_str_eq(str, "llama"));
        assert_int_equal(gguf_get_u32(&g, "t.a", &u), 0);
        assert_int_equal(u, 7);
        assert_int_equal(gguf_get_f32(&g, "t.b", &f), 0);
        assert_true(f == 0.5f);
        assert_int_equal(gguf_get_bool(&g, "t.c", &bo), 0);
        assert_true(bo);
        const struct gguf_kv *arr = gguf_get_arr(&g, "t.arr", GGUF_STRING);
        assert_non_null(arr);
        assert_int_equal(arr->v.arr.n, 3);
        assert_true(gguf_str_eq(arr->v.arr.strs[0], "x"));
        assert_true(gguf_str_eq(arr->v.arr.strs[1], "yz"));
        assert_true(gguf_str_eq(arr->v.arr.strs[2], ""));
        const struct gguf_kv *fa = gguf_get_arr(&g, "t.f", GGUF_FLOAT32);
        assert_non_null(fa);
        assert_true(gguf_arr_num(fa, 0) == 1.0 && gguf_arr_num(fa, 1) == -2.0 &&
                    gguf_arr_num(fa, 2) == 0.25);
        assert_true(isnan(gguf_arr_num(fa, 3)));
        assert_true(isnan(gguf_arr_num(arr, 0)));
        for (int i = 0; i < SMALL_NT; i++) {
            char name[16];
            snprintf(name, sizeof(name), "w.%d", i);
            const struct gguf_tensor *t = gguf_tensor(&g, name);
            assert_non_null(t);
            assert_ptr_equal(t, &g.tensors[i]);
            assert_int_equal((t->offset - g.data_offset) % g.alignment, 0);
            assert_true(t->offset + t->bytes <= g.size);
        }
        assert_int_equal(g.tensors[SMALL_NT - 1].offset + g.tensors[SMALL_NT - 1].bytes, s.m.n);
        assert_null(gguf_tensor(&g, "w.5"));
        assert_null(gguf_find(&g, "t"));
        assert_null(gguf_find(&g, "t.arrr"));
        gguf_close(&g);
        free(copy);
        free(s.m.b);
    }
}

static void test_dequant(void **state)
{
    struct small s = {0};
    small_build(&s, 3, 64);
    struct gguf_file g;
    struct shardlm_err e;
    uint8_t *copy;
    assert_int_equal(parse_copy(&g, &copy, s.m.b, s.m.n, &e), 0);
    float out[64];

    const struct gguf_tensor *t = gguf_tensor(&g, "w.0"); /* F32 8 x 2 */
    assert_int_equal(gguf_tensor_rows(t), 2);
    assert_int_equal(t->bytes, 64);
    assert_int_equal(gguf_read_rows(&g, t, 0, 2, out, &e), 0);
    for (int i = 0; i < 16; i++)
        assert_true(out[i] == small_f32(i));
    assert_int_equal(gguf_read_rows(&g, t, 1, 2, out, &e), 0);
    assert_true(out[0] == 1.0f && out[7] == 4.5f);

    t = gguf_tensor(&g, "w.1"); /* F16 8, 1-D */
    assert_int_equal(gguf_tensor_rows(t), 1);
    assert_int_equal(gguf_read_rows(&g, t, 0, 1, out, &e), 0);
    for (int i = 0; i < 8; i++)
        assert_true(out[i] == (float)(i - 4) * 0.25f);

    t = gguf_tensor(&g, "w.2"); /* Q8_0 32 x 2 */
    assert_int_equal(t->bytes, 68);
    assert_int_equal(gguf_read_rows(&g, t, 0, 2, out, &e), 0);
    assert_true(out[0] == -8.0f);  /* 0.5 * (0 - 16) */
    assert_true(out[31] == 7.5f);  /* 0.5 * 15 */
    assert_true(out[32] == -12.5f); /* 0.25 * -50 */
    assert_true(out[63] == 10.75f); /* 0.25 * 43 */
    for (int r = 0; r < 2; r++)
        for (int j = 0; j < 32; j++)
            assert_true(out[32 * r + j] == small_q8_val(r, j));
    assert_int_equal(gguf_read_rows(&g, t, 1, 2, out, &e), 0);
    assert_true(out[0] == -12.5f && out[1] == -11.75f);

    t = gguf_tensor(&g, "w.3"); /* Q4_0 64 x 1 */
    assert_int_equal(t->bytes, 36);
    assert_int_equal(gguf_read_rows(&g, t, 0, 1, out, &e), 0);
    /* block 0, scale 2: byte 0 = 0xf0 -> element 0 = 2 * (0 - 8), element 16 = 2 * (15 - 8) */
    assert_true(out[0] == -16.0f && out[16] == 14.0f);
    assert_true(out[15] == 14.0f && out[31] == -16.0f); /* byte 15 = 0x0f */
    /* block 1, scale 1: byte 0 = 0x0f -> element 32 = 7, element 48 = -8 */
    assert_true(out[32] == 7.0f && out[48] == -8.0f);
    for (int k = 0; k < 64; k++)
        assert_true(out[k] == small_q4_val(k));

    t = gguf_tensor(&g, "w.4"); /* BF16 3 x 2 */
    assert_int_equal(gguf_read_rows(&g, t, 0, 2, out, &e), 0);
    for (int i = 0; i < 6; i++)
        assert_true(out[i] == small_bf16[i]);
    assert_int_equal(gguf_read_rows(&g, t, 1, 2, out, &e), 0);
    assert_true(out[0] == 3.140625f && out[2] == 256.0f);

    /* rows out of range */
    assert_int_equal(gguf_read_rows(&g, t, 1, 3, out, &e), -EINVAL);
    assert_non_null(strstr(e.msg, "w.4"));
    assert_int_equal(gguf_read_rows(&g, t, 2, 1, out, &e), -EINVAL);
    assert_int_equal(gguf_read_rows(&g, t, 2, 2, out, &e), 0);
    gguf_close(&g);
    free(copy);

    /* an unknown type (12 = Q4_K) is kept and refused at read time */
    patch_u32(&s.m, s.t[3].type, 12);
    assert_int_equal(parse_copy(&g, &copy, s.m.b, s.m.n, &e), 0);
    t = gguf_tensor(&g, "w.3");
    assert_int_equal(t->bytes, 0);
    assert_int_equal(gguf_read_rows(&g, t, 0, 1, out, &e), -EINVAL);
    assert_non_null(strstr(e.msg, "w.3"));
    assert_non_null(strstr(e.msg, "type 12"));
    gguf_close(&g);
    free(copy);
    free(s.m.b);
}

/* Every scalar and array kind, and the getters' conversions. */
static void test_every_kind(void **state)
{
    struct img m = {0};
    img_header(&m, 3, 0);
    kv_key(&m, "u8", GGUF_UINT8), put_u8(&m, 200);
    kv_key(&m, "i8", GGUF_INT8), put_u8(&m, (uint8_t)-5);
    kv_key(&m, "u16", GGUF_UINT16), put_u16(&m, 60000);
    kv_key(&m, "i16", GGUF_INT16), put_u16(&m, (uint16_t)-300);
    kv_key(&m, "i16p", GGUF_INT16), put_u16(&m, 300);
    kv_key(&m, "u32", GGUF_UINT32), put_u32(&m, 4000000000u);
    kv_key(&m, "i32", GGUF_INT32), put_u32(&m, (uint32_t)-7);
    kv_key(&m, "f32", GGUF_FLOAT32), put_f32(&m, -1.25f);
    kv_key(&m, "bool", GGUF_BOOL), put_u8(&m, 0);
    kv_key(&m, "str", GGUF_STRING), put_str(&m, "v");
    kv_key(&m, "u64", GGUF_UINT64), put_u64(&m, 1ull << 40);
    kv_key(&m, "u64s", GGUF_UINT64), put_u64(&m, 123);
    kv_key(&m, "i64", GGUF_INT64), put_u64(&m, (uint64_t)-1);
    kv_key(&m, "i64p", GGUF_INT64), put_u64(&m, 99);
    kv_key(&m, "f64", GGUF_FLOAT64), put_f64(&m, 2.5);
    kv_key(&m, "f64big", GGUF_FLOAT64), put_f64(&m, 1e300);
    kv_key(&m, "a.u8", GGUF_ARRAY), put_u32(&m, GGUF_UINT8), put_u64(&m, 2);
    put_u8(&m, 1), put_u8(&m, 255);
    kv_key(&m, "a.i16", GGUF_ARRAY), put_u32(&m, GGUF_INT16), put_u64(&m, 1);
    put_u16(&m, (uint16_t)-2);
    kv_key(&m, "a.u64", GGUF_ARRAY), put_u32(&m, GGUF_UINT64), put_u64(&m, 1);
    put_u64(&m, 1ull << 50);
    kv_key(&m, "a.f64", GGUF_ARRAY), put_u32(&m, GGUF_FLOAT64), put_u64(&m, 1);
    put_f64(&m, -0.125);
    kv_key(&m, "a.bool", GGUF_ARRAY), put_u32(&m, GGUF_BOOL), put_u64(&m, 2);
    put_u8(&m, 1), put_u8(&m, 0);
    kv_key(&m, "a.i64", GGUF_ARRAY), put_u32(&m, GGUF_INT64), put_u64(&m, 1);
    put_u64(&m, (uint64_t)-9);
    kv_key(&m, "a.empty", GGUF_ARRAY), put_u32(&m, GGUF_STRING), put_u64(&m, 0);
    kv_key(&m, "", GGUF_UINT8), put_u8(&m, 1); /* an empty key is a key */
    img_finish_kv(&m);

    struct gguf_file g;
    struct shardlm_err e;
    uint8_t *copy;
    int rc = parse_copy(&g, &copy, m.b, m.n, &e);
    if (rc)
        fprintf(stderr, "%s\n", e.msg);
    assert_int_equal(rc, 0);
    assert_int_equal(g.n_tensors, 0);
    uint32_t u;
    float f;
    bool b;
    struct gguf_str s;
    assert_int_equal(gguf_get_u32(&g, "u8", &u), 0), assert_int_equal(u, 200);
    assert_int_equal(gguf_get_u32(&g, "i8", &u), -EINVAL);
    assert_int_equal(gguf_get_u32(&g, "u16", &u), 0), assert_int_equal(u, 60000);
    assert_int_equal(gguf_get_u32(&g, "i16", &u), -EINVAL);
    assert_int_equal(gguf_get_u32(&g, "i16p", &u), 0), assert_int_equal(u, 300);
    assert_int_equal(gguf_get_u32(&g, "u32", &u), 0), assert_int_equal(u, 4000000000u);
    assert_int_equal(gguf_get_u32(&g, "i32", &u), -EINVAL);
    assert_int_equal(gguf_get_u32(&g, "u64", &u), -EINVAL);
    assert_int_equal(gguf_get_u32(&g, "u64s", &u), 0), assert_int_equal(u, 123);
    assert_int_equal(gguf_get_u32(&g, "i64", &u), -EINVAL);
    assert_int_equal(gguf_get_u32(&g, "i64p", &u), 0), assert_int_equal(u, 99);
    assert_int_equal(gguf_get_u32(&g, "f32", &u), -EINVAL);
    assert_int_equal(gguf_get_u32(&g, "bool", &u), -EINVAL);
    assert_int_equal(gguf_get_u32(&g, "missing", &u), -ENOENT);
    assert_int_equal(gguf_get_u32(&g, "", &u), 0), assert_int_equal(u, 1);
    assert_int_equal(g.kv[6].type, GGUF_INT32), assert_int_equal(g.kv[6].v.i, -7);
    assert_int_equal(g.kv[12].v.i, -1);
    assert_int_equal(gguf_get_f32(&g, "f32", &f), 0), assert_true(f == -1.25f);
    assert_int_equal(gguf_get_f32(&g, "f64", &f), 0), assert_true(f == 2.5f);
    assert_int_equal(gguf_get_f32(&g, "f64big", &f), -EINVAL);
    assert_int_equal(gguf_get_f32(&g, "u32", &f), -EINVAL);
    assert_int_equal(gguf_get_f32(&g, "nope", &f), -ENOENT);
    assert_int_equal(gguf_get_bool(&g, "bool", &b), 0), assert_false(b);
    assert_int_equal(gguf_get_bool(&g, "u8", &b), -EINVAL);
    assert_int_equal(gguf_get_str(&g, "str", &s), 0), assert_true(gguf_str_eq(s, "v"));
    assert_false(gguf_str_eq(s, "vv"));
    assert_false(gguf_str_eq(s, ""));
    assert_int_equal(gguf_get_str(&g, "u8", &s), -EINVAL);
    assert_null(gguf_get_arr(&g, "u8", GGUF_UINT8));
    assert_null(gguf_get_arr(&g, "a.u8", GGUF_INT8));
    const struct gguf_kv *a = gguf_get_arr(&g, "a.u8", GGUF_UINT8);
    assert_non_null(a);
    assert_true(gguf_arr_num(a, 0) == 1 && gguf_arr_num(a, 1) == 255);
    assert_true(gguf_arr_num(gguf_get_arr(&g, "a.i16", GGUF_INT16), 0) == -2);
    assert_true(gguf_arr_num(gguf_get_arr(&g, "a.u64", GGUF_UINT64), 0) == 0x1p50);
    assert_true(gguf_arr_num(gguf_get_arr(&g, "a.f64", GGUF_FLOAT64), 0) == -0.125);
    a = gguf_get_arr(&g, "a.bool", GGUF_BOOL);
    assert_true(gguf_arr_num(a, 0) == 1 && gguf_arr_num(a, 1) == 0);
    assert_true(gguf_arr_num(gguf_get_arr(&g, "a.i64", GGUF_INT64), 0) == -9);
    a = gguf_get_arr(&g, "a.empty", GGUF_STRING);
    assert_non_null(a);
    assert_int_equal(a->v.arr.n, 0);
    assert_null(gguf_tensor(&g, "x"));
    gguf_close(&g);
    free(copy);
    free(m.b);
}

static void test_truncations(void **state)
{
    struct small s = {0};
    small_build(&s, 3, 32);
    for (size_t n = 0; n < s.m.n; n++) {
        struct gguf_file g;
        struct shardlm_err e;
        uint8_t *copy;
        int rc = parse_copy(&g, &copy, s.m.b, n, &e);
        if (rc == 0)
            fprintf(stderr, "a %zu-byte head of the %zu-byte image parsed\n", n, s.m.n);
        assert_one_line_error(rc, &e);
        assert_int_equal(rc, n < 4 ? -EPROTO : -EINVAL);
        assert_non_null(strstr(e.msg, "img: "));
        free(copy);
    }
    free(s.m.b);
}

static void test_corruptions(void **state)
{
    for (size_t i = 0; i < N_CORRUPT; i++) {
        const struct corrupt *c = &corruptions[i];
        struct small s = {0};
        small_build(&s, 3, 32);
        c->apply(&s);
        struct gguf_file g;
        struct shardlm_err e;
        uint8_t *copy;
        int rc = parse_copy(&g, &copy, s.m.b, s.m.n, &e);
        if (rc != c->rc || !strstr(e.msg, c->want1) || !strstr(e.msg, c->want2))
            fprintf(stderr, "%s: rc %d, message: %s\n", c->name, rc, e.msg);
        assert_int_equal(rc, c->rc);
        assert_one_line_error(rc, &e);
        assert_non_null(strstr(e.msg, c->want1));
        assert_non_null(strstr(e.msg, c->want2));
        /* the struct is left empty: closing it again is harmless */
        assert_null(g.kv);
        gguf_close(&g);
        free(copy);
        free(s.m.b);
    }
}

/* Values for the writer test: ragged magnitudes, f16 overflow and underflow included. */
static float wval(uint64_t i, uint32_t salt)
{
    uint32_t x = (uint32_t)(i * 2654435761u) ^ (salt * 40503u);
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    x ^= x >> 15;
    float v = ((float)(x % 20001u) - 10000.0f) / 997.0f;
    switch (i % 11) {
    case 3: return v * 1e4f; /* past 65504 sometimes: inf in f16 */
    case 7: return v * 1e-7f; /* f16 subnormals and zero */
    default: return v;
    }
}

struct wt {
    const char *name;
    enum gguf_ggml_type type;
    uint64_t cols, rows; /* rows 0: 1-D */
    uint64_t chunk;      /* rows per gguf_w_tensor_rows call */
};

static const struct wt wtensors[] = {
    {"t.vec", GGML_F32, 7, 0, 1},
    {"t.mat16", GGML_F16, 13, 5, 2},
    {"t.mat32", GGML_F32, 33, 3, 1},
    {"t.one", GGML_F16, 1, 0, 1},
    {"t.wide", GGML_F32, 100, 200, 64},  /* 80 KB: more than the 64 KiB stream buffer */
    {"t.wide16", GGML_F16, 1500, 3, 3}, /* more than the 1024-element conversion chunk */
};
#define N_WT (sizeof(wtensors) / sizeof(wtensors[0]))

static const char *const wstrs[] = {"a", "", "ccc", "h\xc3\xa9llo w\xc3\xb6rld", NULL};
static const float wf32s[] = {1.0f, -0.5f, 3.25e10f, FLT_MIN, -0.0f};
static const int32_t wi32s[] = {-1, 0, INT32_MAX, INT32_MIN};

static void write_file(const char *path, bool tensors)
{
    struct gguf_writer *w;
    struct shardlm_err e;
    assert_int_equal(gguf_writer_open(&w, path, &e), 0);
    gguf_w_str(w, "general.architecture", "test");
    gguf_w_u32(w, "rt.u32", 4000000000u);
    gguf_w_f32(w, "rt.f32", -1.5e-3f);
    gguf_w_bool(w, "rt.true", true);
    gguf_w_bool(w, "rt.false", false);
    gguf_w_str(w, "rt.empty", "");
    gguf_w_arr_str(w, "rt.strs", wstrs, 4);
    gguf_w_arr_str(w, "rt.nostrs", wstrs, 0);
    gguf_w_arr_f32(w, "rt.f32s", wf32s, 5);
    gguf_w_arr_i32(w, "rt.i32s", wi32s, 4);
    char long_str[301];
    memset(long_str, 'q', 300);
    long_str[300] = 0;
    gguf_w_str(w, "rt.long", long_str);
    if (tensors) {
        for (size_t i = 0; i < N_WT; i++)
            gguf_w_tensor(w, wtensors[i].name, wtensors[i].type, wtensors[i].cols,
                          wtensors[i].rows);
        for (size_t i = 0; i < N_WT; i++) {
            const struct wt *t = &wtensors[i];
            uint64_t rows = t->rows ? t->rows : 1;
            for (uint64_t r = 0; r < rows; r += t->chunk) {
                uint64_t n = rows - r < t->chunk ? rows - r : t->chunk;
                float *buf = malloc(n * t->cols * sizeof(float));
                for (uint64_t k = 0; k < n * t->cols; k++)
                    buf[k] = wval(r * t->cols + k, (uint32_t)i);
                gguf_w_tensor_rows(w, buf, n);
                free(buf);
            }
        }
    }
    int rc = gguf_writer_close(w, &e);
    if (rc)
        fprintf(stderr, "%s\n", e.msg);
    assert_int_equal(rc, 0);
}

static void check_written(const char *path, bool tensors)
{
    struct gguf_file g;
    struct shardlm_err e;
    int rc = gguf_open(&g, path, &e);
    if (rc)
        fprintf(stderr, "%s\n", e.msg);
    assert_int_equal(rc, 0);
    assert_int_equal(g.version, 3);
    assert_int_equal(g.alignment, 32);
    assert_int_equal(g.n_kv, 12);
    assert_int_equal(g.kv[0].type, GGUF_UINT32); /* general.alignment first */
    assert_true(gguf_str_eq(g.kv[0].key, "general.alignment"));
    assert_int_equal(g.kv[0].v.u, 32);
    uint32_t u;
    float f;
    bool b;
    struct gguf_str s;
    assert_int_equal(gguf_get_str(&g, "general.architecture", &s), 0);
    assert_true(gguf_str_eq(s, "test"));
    assert_int_equal(gguf_get_u32(&g, "rt.u32", &u), 0), assert_int_equal(u, 4000000000u);
    assert_int_equal(gguf_get_f32(&g, "rt.f32", &f), 0), assert_true(f == -1.5e-3f);
    assert_int_equal(gguf_get_bool(&g, "rt.true", &b), 0), assert_true(b);
    assert_int_equal(gguf_get_bool(&g, "rt.false", &b), 0), assert_false(b);
    assert_int_equal(gguf_get_str(&g, "rt.empty", &s), 0), assert_int_equal(s.len, 0);
    assert_int_equal(gguf_get_str(&g, "rt.long", &s), 0), assert_int_equal(s.len, 300);
    const struct gguf_kv *a = gguf_get_arr(&g, "rt.strs", GGUF_STRING);
    assert_non_null(a);
    assert_int_equal(a->v.arr.n, 4);
    for (int i = 0; i < 4; i++)
        assert_true(gguf_str_eq(a->v.arr.strs[i], wstrs[i]));
    a = gguf_get_arr(&g, "rt.nostrs", GGUF_STRING);
    assert_non_null(a);
    assert_int_equal(a->v.arr.n, 0);
    a = gguf_get_arr(&g, "rt.f32s", GGUF_FLOAT32);
    assert_non_null(a);
    assert_int_equal(a->v.arr.n, 5);
    for (int i = 0; i < 5; i++)
        assert_true(gguf_arr_num(a, (uint64_t)i) == (double)wf32s[i]);
    assert_true(signbit(gguf_arr_num(a, 4)));
    a = gguf_get_arr(&g, "rt.i32s", GGUF_INT32);
    assert_non_null(a);
    for (int i = 0; i < 4; i++)
        assert_true(gguf_arr_num(a, (uint64_t)i) == (double)wi32s[i]);

    assert_int_equal(g.n_tensors, tensors ? N_WT : 0);
    assert_int_equal(g.data_offset % 32, 0);
    for (size_t i = 0; tensors && i < N_WT; i++) {
        const struct wt *w = &wtensors[i];
        const struct gguf_tensor *t = gguf_tensor(&g, w->name);
        assert_non_null(t);
        assert_int_equal(t->type, w->type);
        assert_int_equal(t->n_dims, w->rows ? 2 : 1);
        assert_int_equal(t->dims[0], w->cols);
        uint64_t rows = w->rows ? w->rows : 1;
        assert_int_equal(gguf_tensor_rows(t), rows);
        assert_int_equal(t->offset % 32, 0);
        float *out = malloc(rows * w->cols * sizeof(float));
        assert_int_equal(gguf_read_rows(&g, t, 0, rows, out, &e), 0);
        for (uint64_t k = 0; k < rows * w->cols; k++) {
            float x = wval(k, (uint32_t)i);
            float want = w->type == GGML_F32 ? x : kn_f16_to_f32(kn_f32_to_f16(x));
            if (!(out[k] == want))
                fprintf(stderr, "%s[%llu]: %g, expected %g\n", w->name, (unsigned long long)k,
                        out[k], want);
            assert_true(out[k] == want);
        }
        free(out);
        if (i == N_WT - 1) /* the last tensor is padded too */
            assert_int_equal(g.size, (t->offset + t->bytes + 31) / 32 * 32);
    }
    if (!tensors)
        assert_int_equal(g.size, g.data_offset);
    gguf_close(&g);
}

static void test_writer_roundtrip(void **state)
{
    char path[4300];
    tu_path(path, sizeof(path), "%s/rt.gguf", dir);
    write_file(path, true);
    assert_int_equal(tu_count_files(dir), 1); /* no temporary left */
    check_written(path, true);
    /* overwrite it atomically, metadata only */
    write_file(path, false);
    assert_int_equal(tu_count_files(dir), 1);
    check_written(path, false);
    unlink(path);
}

static void test_writer_errors(void **state)
{
    struct gguf_writer *w;
    struct shardlm_err e;
    char path[4300];
    tu_path(path, sizeof(path), "%s/no/such/dir/x.gguf", dir);
    assert_int_equal(gguf_writer_open(&w, path, &e), -ENOENT);
    /* the message names the output, not the temporary file it would have been written to */
    assert_non_null(strstr(e.msg, "no/such/dir/x.gguf"));
    assert_null(strstr(e.msg, ".tmp."));

    /* abort leaves nothing behind */
    tu_path(path, sizeof(path), "%s/abort.gguf", dir);
    assert_int_equal(gguf_writer_open(&w, path, &e), 0);
    gguf_w_u32(w, "k", 1);
    gguf_w_tensor(w, "t", GGML_F32, 4, 0);
    assert_int_equal(tu_count_files(dir), 1);
    gguf_writer_abort(w);
    assert_int_equal(tu_count_files(dir), 0);

    /* an I/O error (the file size limit: EFBIG) fails the close and removes the temporary */
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {.rlim_cur = 8192, .rlim_max = 8192};
        if (setrlimit(RLIMIT_FSIZE, &rl) < 0)
            _exit(2);
        tu_path(path, sizeof(path), "%s/big.gguf", dir);
        if (gguf_writer_open(&w, path, &e) < 0)
            _exit(3);
        gguf_w_tensor(w, "big", GGML_F32, 1024, 64);
        float row[1024] = {0};
        for (int r = 0; r < 64; r++)
            gguf_w_tensor_rows(w, row, 1);
        int rc = gguf_writer_close(w, &e);
        if (rc != -EFBIG || !strstr(e.msg, "big.gguf:") || strstr(e.msg, ".tmp.") ||
            !strstr(e.msg, "write")) {
            fprintf(stderr, "close: %d %s\n", rc, e.msg);
            _exit(4);
        }
        _exit(access(path, F_OK) == 0 ? 5 : 0);
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    assert_int_equal(tu_count_files(dir), 0);
}

static void test_open_errors(void **state)
{
    struct gguf_file g;
    struct shardlm_err e;
    char path[4300];
    tu_path(path, sizeof(path), "%s/missing.gguf", dir);
    assert_int_equal(gguf_open(&g, path, &e), -ENOENT);
    assert_non_null(strstr(e.msg, "missing.gguf"));
    assert_int_equal(gguf_open(&g, dir, &e), -EINVAL);
    tu_path(path, sizeof(path), "%s/empty.gguf", dir);
    assert_int_equal(tu_write(path, "", 0), 0);
    assert_int_equal(gguf_open(&g, path, &e), -EPROTO);
    assert_non_null(strstr(e.msg, "empty.gguf"));
    /* a bad field read through gguf_open names the path */
    struct small s = {0};
    small_build(&s, 3, 32);
    c_dup_tensor(&s);
    tu_path(path, sizeof(path), "%s/dup.gguf", dir);
    assert_int_equal(tu_write(path, s.m.b, s.m.n), 0);
    assert_int_equal(gguf_open(&g, path, &e), -EINVAL);
    assert_non_null(strstr(e.msg, "dup.gguf: tensor w.0 appears twice"));
    free(s.m.b);
}

/* ---- the vocabulary files of the test data ------------------------------------------------- */

/* Opens tests/data/tokenizers/@name (a failure when it is missing). */
static void open_vocab(struct gguf_file *g, const char *name)
{
    char path[4300];
    struct shardlm_err e;
    tu_path(path, sizeof(path), "%s/tokenizers/%s", tu_data(), name);
    int rc = gguf_open(g, path, &e);
    if (rc)
        fprintf(stderr, "%s\n", e.msg);
    assert_int_equal(rc, 0);
    assert_int_equal(g->version, 3);
    assert_int_equal(g->n_tensors, 0);
}

/* Checks a string array of @n entries whose first ones are @first. */
static void check_strs(const struct gguf_file *g, const char *key, uint64_t n,
                       const char *const *first)
{
    const struct gguf_kv *a = gguf_get_arr(g, key, GGUF_STRING);
    assert_non_null(a);
    assert_int_equal(a->v.arr.n, n);
    for (int i = 0; first[i]; i++)
        assert_true(gguf_str_eq(a->v.arr.strs[i], first[i]));
}

static void test_vocab_llama_spm(void **state)
{
    struct gguf_file g;
    open_vocab(&g, "ggml-vocab-llama-spm.gguf");
    struct gguf_str s;
    uint32_t u;
    float f;
    bool b;
    assert_int_equal(g.n_kv, 22);
    assert_int_equal(gguf_get_str(&g, "tokenizer.ggml.model", &s), 0);
    assert_true(gguf_str_eq(s, "llama"));
    static const char *const first[] = {"<unk>", "<s>", "</s>", NULL};
    check_strs(&g, "tokenizer.ggml.tokens", 32000, first);
    const struct gguf_kv *sc = gguf_get_arr(&g, "tokenizer.ggml.scores", GGUF_FLOAT32);
    assert_non_null(sc);
    assert_int_equal(sc->v.arr.n, 32000);
    assert_true(gguf_arr_num(sc, 0) == 0.0);
    const struct gguf_kv *tt = gguf_get_arr(&g, "tokenizer.ggml.token_type", GGUF_INT32);
    assert_non_null(tt);
    assert_int_equal(tt->v.arr.n, 32000);
    assert_true(gguf_arr_num(tt, 0) == 2 && gguf_arr_num(tt, 1) == 3);
    assert_int_equal(gguf_get_u32(&g, "tokenizer.ggml.bos_token_id", &u), 0), assert_int_equal(u, 1);
    assert_int_equal(gguf_get_u32(&g, "tokenizer.ggml.eos_token_id", &u), 0), assert_int_equal(u, 2);
    assert_int_equal(gguf_get_u32(&g, "llama.vocab_size", &u), 0), assert_int_equal(u, 32000);
    assert_int_equal(gguf_get_bool(&g, "tokenizer.ggml.add_bos_token", &b), 0), assert_true(b);
    assert_int_equal(gguf_get_f32(&g, "llama.attention.layer_norm_rms_epsilon", &f), 0);
    assert_true(f == 1e-5f);
    assert_null(gguf_get_arr(&g, "tokenizer.ggml.merges", GGUF_STRING));
    gguf_close(&g);
}

static void test_vocab_gpt2(void **state)
{
    struct gguf_file g;
    open_vocab(&g, "ggml-vocab-gpt-2.gguf");
    struct gguf_str s;
    uint32_t u;
    assert_int_equal(g.n_kv, 16);
    assert_int_equal(gguf_get_str(&g, "tokenizer.ggml.model", &s), 0);
    assert_true(gguf_str_eq(s, "gpt2"));
    assert_int_equal(gguf_get_str(&g, "tokenizer.ggml.pre", &s), 0);
    assert_true(gguf_str_eq(s, "gpt-2"));
    static const char *const first[] = {"!", "\"", "#", NULL};
    check_strs(&g, "tokenizer.ggml.tokens", 50257, first);
    static const char *const merges[] = {"\xc4\xa0 t", "\xc4\xa0 a", "h e", NULL};
    check_strs(&g, "tokenizer.ggml.merges", 50000, merges);
    assert_null(gguf_get_arr(&g, "tokenizer.ggml.scores", GGUF_FLOAT32));
    assert_int_equal(gguf_get_u32(&g, "tokenizer.ggml.eos_token_id", &u), 0);
    assert_int_equal(u, 50256);
    const struct gguf_kv *tok = gguf_get_arr(&g, "tokenizer.ggml.tokens", GGUF_STRING);
    assert_true(gguf_str_eq(tok->v.arr.strs[50256], "<|endoftext|>"));
    gguf_close(&g);
}

static void test_vocab_phi3(void **state)
{
    struct gguf_file g;
    open_vocab(&g, "ggml-vocab-phi-3.gguf");
    struct gguf_str s;
    uint32_t u;
    assert_int_equal(g.n_kv, 26);
    assert_int_equal(gguf_get_str(&g, "tokenizer.ggml.model", &s), 0);
    assert_true(gguf_str_eq(s, "llama"));
    static const char *const first[] = {"<unk>", "<s>", "</s>", NULL};
    check_strs(&g, "tokenizer.ggml.tokens", 32064, first);
    const struct gguf_kv *sc = gguf_get_arr(&g, "tokenizer.ggml.scores", GGUF_FLOAT32);
    assert_non_null(sc);
    assert_int_equal(sc->v.arr.n, 32064);
    assert_int_equal(gguf_get_u32(&g, "tokenizer.ggml.eos_token_id", &u), 0);
    assert_int_equal(u, 32000);
    assert_int_equal(gguf_get_str(&g, "tokenizer.chat_template", &s), 0);
    assert_true(s.len > 0);
    assert_int_equal(gguf_get_str(&g, "general.architecture", &s), 0);
    assert_true(gguf_str_eq(s, "phi3"));
    gguf_close(&g);
}

/* ---- the fuzz corpus ----------------------------------------------------------------------- */

typedef void corpus_fn(const char *name, const uint8_t *b, size_t n, bool valid, void *arg);

/* Produces every seed: the small image in a few shapes, the writer's output, heads, and each
 * corruption. */
static void corpus_each(corpus_fn *fn, void *arg)
{
    struct small s = {0};
    small_build(&s, 3, 32);
    fn("valid-align32", s.m.b, s.m.n, true, arg);
    fn("head-24", s.m.b, 24, false, arg);
    fn("head-100", s.m.b, 100, false, arg);
    fn("head-cut-last-tensor", s.m.b, s.m.n - 1, false, arg);
    fn("empty", s.m.b, 0, false, arg);
    small_build(&s, 2, 0);
    fn("valid-v2-default-align", s.m.b, s.m.n, true, arg);
    small_build(&s, 3, 64);
    fn("valid-align64", s.m.b, s.m.n, true, arg);
    small_build(&s, 3, 1);
    fn("valid-align1", s.m.b, s.m.n, true, arg);
    small_build(&s, 3, 32);
    patch_u32(&s.m, s.t[3].type, 12);
    fn("valid-unknown-tensor-type", s.m.b, s.m.n, true, arg);
    for (size_t i = 0; i < N_CORRUPT; i++) {
        small_build(&s, 3, 32);
        corruptions[i].apply(&s);
        fn(corruptions[i].name, s.m.b, s.m.n, false, arg);
    }
    free(s.m.b);

    char d[4096], path[4200];
    tu_mkdtemp(d, sizeof(d), "gguf-corpus");
    tu_path(path, sizeof(path), "%s/w.gguf", d);
    struct gguf_writer *w;
    struct shardlm_err e;
    assert_int_equal(gguf_writer_open(&w, path, &e), 0);
    gguf_w_str(w, "general.architecture", "llama");
    gguf_w_u32(w, "llama.block_count", 1);
    gguf_w_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    gguf_w_bool(w, "tokenizer.ggml.add_bos_token", true);
    static const char *const toks[] = {"<unk>", "<s>", "</s>", " a", "b"};
    static const float scores[] = {0, 0, 0, -1, -2};
    static const int32_t types[] = {2, 3, 3, 1, 1};
    gguf_w_arr_str(w, "tokenizer.ggml.tokens", toks, 5);
    gguf_w_arr_f32(w, "tokenizer.ggml.scores", scores, 5);
    gguf_w_arr_i32(w, "tokenizer.ggml.token_type", types, 5);
    gguf_w_tensor(w, "token_embd.weight", GGML_F16, 8, 5);
    gguf_w_tensor(w, "output_norm.weight", GGML_F32, 8, 0);
    float rows[40];
    for (int i = 0; i < 40; i++)
        rows[i] = (float)i / 8.0f - 2.0f;
    gguf_w_tensor_rows(w, rows, 5);
    gguf_w_tensor_rows(w, rows, 1);
    assert_int_equal(gguf_writer_close(w, &e), 0);
    size_t n = 0;
    char *b = tu_slurp(path, &n);
    assert_non_null(b);
    fn("valid-writer", (const uint8_t *)b, n, true, arg);
    free(b);
    tu_rmdir(d);
}

static void corpus_check(const char *name, const uint8_t *b, size_t n, bool valid, void *arg)
{
    struct gguf_file g;
    struct shardlm_err e;
    uint8_t *copy;
    int rc = parse_copy(&g, &copy, b, n, &e);
    if ((rc == 0) != valid)
        fprintf(stderr, "corpus %s: rc %d %s\n", name, rc, rc ? e.msg : "");
    assert_int_equal(rc == 0, valid);
    assert_true(n < 64 * 1024);
    gguf_close(&g);
    free(copy);
}

static void test_corpus(void **state) { corpus_each(corpus_check, NULL); }

/* ---- the model source: settings read exactly or refused, weights finite -------------------- */

/* `shardlm synth --shape tiny` in the test folder, read whole (*@len bytes). */
static uint8_t *tiny_image(size_t *len)
{
    char path[4300];
    struct shardlm_err e;
    tu_path(path, sizeof(path), "%s/tiny.gguf", dir);
    if (coord_synth("tiny", path, 0, NULL, NULL, &e))
        fail_msg("synth: %s", e.msg);
    uint8_t *b = (uint8_t *)tu_slurp(path, len);
    assert_non_null(b);
    return b;
}

/* Offset of the end of tensor info @t in image @base. */
static size_t info_end(const uint8_t *base, const struct gguf_tensor *t)
{
    return (size_t)((const uint8_t *)t->name.p - base) + t->name.len + 4 + 8 * t->n_dims + 12;
}

/* Writes @dir/edited.gguf: image @b (@n bytes) without key @drop (NULL: none), with the
 * key/values of @add (built with kv_key and put_*: its n_kv counts them) after the others, and
 * float @val at element @idx of F32 tensor @tensor (NULL: none). Returns the path (static). */
static const char *edited(const uint8_t *b, size_t n, const char *drop, const struct img *add,
                          const char *tensor, size_t idx, float val)
{
    static char path[4300];
    struct gguf_file g;
    struct shardlm_err e;
    assert_int_equal(gguf_parse(&g, b, n, "tiny", &e), 0);
    size_t infos = (size_t)((const uint8_t *)g.tensors[0].name.p - b) - 8;
    size_t infos_end = info_end(b, &g.tensors[g.n_tensors - 1]);
    struct img m = {0};
    img_header(&m, 3, g.n_tensors);
    m.n_kv = g.n_kv + (add ? add->n_kv : 0);
    for (uint64_t i = 0; i < g.n_kv; i++) {
        size_t at = (size_t)((const uint8_t *)g.kv[i].key.p - b) - 8;
        size_t end = i + 1 < g.n_kv ? (size_t)((const uint8_t *)g.kv[i + 1].key.p - b) - 8 : infos;
        if (drop && gguf_str_eq(g.kv[i].key, drop))
            m.n_kv--;
        else
            put(&m, b + at, end - at);
    }
    img_finish_kv(&m);
    if (add)
        put(&m, add->b, add->n);
    put(&m, b + infos, infos_end - infos);
    while (m.n % 32)
        put_u8(&m, 0);
    size_t data = m.n;
    put(&m, b + g.data_offset, n - g.data_offset);
    if (tensor) {
        const struct gguf_tensor *t = gguf_tensor(&g, tensor);
        assert_non_null(t);
        assert_int_equal(t->type, GGML_F32);
        memcpy(m.b + data + (t->offset - g.data_offset) + 4 * idx, &val, 4);
    }
    gguf_close(&g);
    tu_path(path, sizeof(path), "%s/edited.gguf", dir);
    assert_int_equal(tu_write(path, m.b, m.n), 0);
    free(m.b);
    return path;
}

/* Opens @path as convert does: 0 with *@s open, or the error with @e set (one line). */
static int open_source(const char *path, struct coord_source *s, struct shardlm_err *e)
{
    e->msg[0] = 0;
    int rc = coord_source_open(s, path, NULL, 0, e);
    if (rc)
        assert_one_line_error(rc, e);
    return rc;
}

/* @b with key @key replaced by one of type @type, whose value @put writes; the source must
 * open (NULL needles: *@cfg gets its config) or fail with every needle in its message. */
typedef void kv_put_fn(struct img *m);
static struct shlm_config_ext last_cfgx; /* the extension of the last source expect_kv opened */
static void expect_kv(const uint8_t *b, size_t n, const char *drop, const char *key,
                      uint32_t type, kv_put_fn *putv, struct shlm_config *cfg, ...)
{
    struct img add = {0};
    if (key) {
        kv_key(&add, key, type);
        putv(&add);
    }
    const char *path = edited(b, n, drop, key ? &add : NULL, NULL, 0, 0);
    free(add.b);
    struct coord_source s;
    struct shardlm_err e;
    int rc = open_source(path, &s, &e);
    va_list ap;
    va_start(ap, cfg);
    const char *needle = va_arg(ap, const char *);
    if (!needle) {
        if (rc)
            fail_msg("%s (%s): %s", key, drop, e.msg);
        *cfg = s.cfg;
        last_cfgx = s.cfgx;
        coord_source_close(&s);
    } else {
        if (rc != -EINVAL)
            fail_msg("%s: rc %d, expected -EINVAL", key, rc);
        for (; needle; needle = va_arg(ap, const char *))
            if (!strstr(e.msg, needle))
                fail_msg("%s: message '%s' lacks '%s'", key, e.msg, needle);
    }
    va_end(ap);
}

static void v_u32_500k(struct img *m) { put_u32(m, 500000); }
static void v_f64_500k(struct img *m) { put_f64(m, 500000.0); }
static void v_u8_2(struct img *m) { put_u8(m, 2); }
static void v_f32_2(struct img *m) { put_f32(m, 2.0f); }
static void v_f32_2_5(struct img *m) { put_f32(m, 2.5f); }
static void v_f32_4(struct img *m) { put_f32(m, 4.0f); }
static void v_f32_1(struct img *m) { put_f32(m, 1.0f); }
static void v_f32_0(struct img *m) { put_f32(m, 0.0f); }
static void v_f32_30(struct img *m) { put_f32(m, 30.0f); }
static void v_f32_neg(struct img *m) { put_f32(m, -30.0f); }
static void v_u32_0(struct img *m) { put_u32(m, 0); }
static void v_u32_46(struct img *m) { put_u32(m, 46); }
static void v_u32_62(struct img *m) { put_u32(m, 62); }
static void v_f64_eps(struct img *m) { put_f64(m, 1e-6); }
static void v_i64_neg(struct img *m) { put_u64(m, (uint64_t)-2); }
static void v_u32_128(struct img *m) { put_u32(m, 128); }
static void v_u32_512(struct img *m) { put_u32(m, 512); }
static void v_u32_4096(struct img *m) { put_u32(m, 4096); }
static void v_u32_100000(struct img *m) { put_u32(m, 100000); }
static void v_i32_neg1(struct img *m) { put_u32(m, (uint32_t)-1); }
static void v_u32_7(struct img *m) { put_u32(m, 7); }
static void v_u32_8(struct img *m) { put_u32(m, 8); }
static void v_bool_1(struct img *m) { put_u8(m, 1); }
static void v_str_500k(struct img *m) { put_str(m, "500000"); }
static void v_str_yarn(struct img *m) { put_str(m, "yarn"); }
static void v_str_linear(struct img *m) { put_str(m, "linear"); }
static void v_str_none(struct img *m) { put_str(m, "none"); }
static void v_str_eps(struct img *m) { put_str(m, "1e-6"); }
static void v_str_esc(struct img *m) { put_str(m, "\x1b[2J\n"); }
static void v_str_qwen3moe(struct img *m) { put_str(m, "qwen3moe"); }
static void v_str_qwen9(struct img *m) { put_str(m, "qwen9"); }
static void v_str_utf8(struct img *m) { put_str(m, "caf\xc3\xa9\xff\xc3(\xe2\x80\xae\\"); }
static void v_arr_u32(struct img *m)
{
    put_u32(m, GGUF_UINT32);
    put_u64(m, 2);
    put_u32(m, 4);
    put_u32(m, 4);
}
static void v_str_long(struct img *m)
{
    static char big[100001];
    memset(big, 'a', sizeof(big) - 1);
    put_str(m, big);
}

/* Every setting the architecture uses is read in any numeric type that holds it exactly, or
 * refused naming the key and the type or value; every setting that changes the computation and
 * is not implemented is refused with its name and value unless neutral. */
static void test_source_settings(void **state)
{
    size_t n;
    uint8_t *b = tiny_image(&n);
    struct shlm_config c;
    const char *theta = "llama.rope.freq_base", *eps = "llama.attention.layer_norm_rms_epsilon";
    expect_kv(b, n, NULL, NULL, 0, NULL, &c, NULL);
    assert_true(c.rope_theta == 10000.0f);
    /* numbers of any type */
    expect_kv(b, n, theta, theta, GGUF_UINT32, v_u32_500k, &c, NULL);
    assert_true(c.rope_theta == 500000.0f);
    expect_kv(b, n, theta, theta, GGUF_FLOAT64, v_f64_500k, &c, NULL);
    assert_true(c.rope_theta == 500000.0f);
    expect_kv(b, n, eps, eps, GGUF_FLOAT64, v_f64_eps, &c, NULL);
    assert_true(c.norm_eps == 1e-6f);
    expect_kv(b, n, "llama.block_count", "llama.block_count", GGUF_UINT8, v_u8_2, &c, NULL);
    assert_int_equal(c.n_layers, 2);
    expect_kv(b, n, "llama.block_count", "llama.block_count", GGUF_FLOAT32, v_f32_2, &c, NULL);
    assert_int_equal(c.n_layers, 2);
    /* wrong types and values */
    expect_kv(b, n, theta, theta, GGUF_STRING, v_str_500k, &c, theta, "string", NULL);
    expect_kv(b, n, eps, eps, GGUF_STRING, v_str_eps, &c, eps, "string", NULL);
    expect_kv(b, n, "llama.block_count", "llama.block_count", GGUF_FLOAT32, v_f32_2_5, &c,
              "llama.block_count", "2.5", "integer", NULL);
    expect_kv(b, n, "llama.block_count", "llama.block_count", GGUF_INT64, v_i64_neg, &c,
              "llama.block_count", "-2", NULL);
    expect_kv(b, n, "llama.block_count", "llama.block_count", GGUF_BOOL, v_bool_1, &c,
              "llama.block_count", "bool", NULL);
    expect_kv(b, n, "llama.attention.head_count", "llama.attention.head_count", GGUF_ARRAY,
              v_arr_u32, &c, "llama.attention.head_count", "array", NULL);
    expect_kv(b, n, "llama.embedding_length", NULL, 0, NULL, &c, "llama.embedding_length",
              "missing", NULL);
    free(b);
}

/* Gemma 2/3's keys read into the extension (window, soft-caps; the pattern and the local RoPE
 * base from the architecture's row), out-of-range values refused by name; Gemma 3's linear RoPE
 * scaling (its 4B..27B models) refused by name, not run plain. */
static void test_source_gemma(void **state)
{
    char path[4300];
    struct shardlm_err e;
    size_t n = 0;
    struct shlm_config c;
    tu_path(path, sizeof(path), "%s/g2.gguf", dir);
    assert_int_equal(coord_synth("tiny-gemma2", path, 0, NULL, NULL, &e), 0);
    uint8_t *b = (uint8_t *)tu_slurp(path, &n);
    assert_non_null(b);
    expect_kv(b, n, NULL, NULL, 0, NULL, &c, NULL);
    assert_int_equal(c.family, SHLM_FAMILY_GEMMA2);
    assert_int_equal(c.flags, SHLM_CF_POST_NORMS);
    assert_int_equal(last_cfgx.window, 32);
    assert_int_equal(last_cfgx.window_pattern, 2);
    assert_true(last_cfgx.attn_softcap == 1.0f && last_cfgx.final_softcap == 30.0f);
    assert_true(last_cfgx.query_scale == 0.0f && last_cfgx.rope_theta_local == 0.0f);
    const char *sw = "gemma2.attention.sliding_window", *ac = "gemma2.attn_logit_softcapping";
    expect_kv(b, n, sw, NULL, 0, NULL, &c, NULL); /* ik_llama.cpp's default */
    assert_int_equal(last_cfgx.window, 4096);
    expect_kv(b, n, sw, sw, GGUF_STRING, v_str_yarn, &c, sw, "string", NULL);
    expect_kv(b, n, sw, sw, GGUF_UINT32, v_u32_0, &c, sw, "is 0", NULL);
    expect_kv(b, n, ac, ac, GGUF_FLOAT32, v_f32_neg, &c, ac, "-30", NULL);
    expect_kv(b, n, ac, NULL, 0, NULL, &c, NULL);
    assert_true(last_cfgx.attn_softcap == 0.0f && last_cfgx.final_softcap == 30.0f);
    /* ik_llama.cpp's 27B (46 layers): scores by (dim / heads)^-1/2 = 16^-1/2, not head_dim's */
    const char *bc = "gemma2.block_count";
    expect_kv(b, n, bc, bc, GGUF_UINT32, v_u32_46, &c, NULL);
    assert_true(last_cfgx.query_scale == 0.25f);
    expect_kv(b, n, bc, bc, GGUF_UINT32, v_u32_62, &c, NULL); /* Gemma 3's 27B count */
    assert_true(last_cfgx.query_scale == 0.0f);
    free(b);
    tu_path(path, sizeof(path), "%s/g3.gguf", dir);
    assert_int_equal(coord_synth("tiny-gemma3", path, 0, NULL, NULL, &e), 0);
    b = (uint8_t *)tu_slurp(path, &n);
    assert_non_null(b);
    expect_kv(b, n, NULL, NULL, 0, NULL, &c, NULL);
    assert_int_equal(c.flags, SHLM_CF_POST_NORMS | SHLM_CF_QK_NORM);
    assert_true(c.rope_theta == 1e6f);
    assert_int_equal(last_cfgx.window, 48);
    assert_int_equal(last_cfgx.window_pattern, 6);
    assert_true(last_cfgx.rope_theta_local == 10000.0f && last_cfgx.attn_softcap == 0.0f);
    /* linear scaling (the 4B..27B models: factor 8): read; without its factor refused */
    expect_kv(b, n, NULL, "gemma3.rope.scaling.type", GGUF_STRING, v_str_linear, &c,
              "gemma3.rope.scaling.factor is missing", "linear", NULL);
    struct img lin = {0};
    kv_key(&lin, "gemma3.rope.scaling.type", GGUF_STRING);
    put_str(&lin, "linear");
    kv_key(&lin, "gemma3.rope.scaling.factor", GGUF_FLOAT32);
    put_f32(&lin, 8.0f);
    struct coord_source s;
    assert_int_equal(open_source(edited(b, n, NULL, &lin, NULL, 0, 0), &s, &e), 0);
    assert_int_equal(s.cfg.rope_scaling, SHLM_ROPE_LINEAR);
    assert_true(s.cfg.rope_factor == 8.0f);
    assert_int_equal(s.cfg.seq_len, 4096);
    coord_source_close(&s);
    free(lin.b);
    expect_kv(b, n, NULL, "gemma3.rope.scaling.factor", GGUF_FLOAT32, v_f32_4, &c,
              "gemma3.rope.scaling.factor", "4", NULL);
    const char *bc3 = "gemma3.block_count";
    expect_kv(b, n, bc3, bc3, GGUF_UINT32, v_u32_62, &c, NULL);
    assert_true(last_cfgx.query_scale == 0.25f);
    free(b);
}

static void v_u32_32(struct img *m) { put_u32(m, 32); }
static void v_u32_40(struct img *m) { put_u32(m, 40); }
static void v_u32_24(struct img *m) { put_u32(m, 24); }

/* Phi-3's window: the file's attention.sliding_window; where it has none, ik_llama.cpp's
 * default by size (the architecture row's): 2047 for the 4k models (32 or 40 layers, context
 * 4096), none at other sizes. */
static void test_source_phi3_window(void **state)
{
    char path[4300];
    struct shardlm_err e;
    size_t n = 0, n2 = 0;
    struct shlm_config c;
    tu_path(path, sizeof(path), "%s/p3.gguf", dir);
    assert_int_equal(coord_synth("tiny-phi3", path, 0, NULL, NULL, &e), 0);
    uint8_t *b = (uint8_t *)tu_slurp(path, &n);
    assert_non_null(b);
    const char *sw = "phi3.attention.sliding_window", *bc = "phi3.block_count",
               *ctx = "phi3.context_length";
    expect_kv(b, n, NULL, NULL, 0, NULL, &c, NULL);
    assert_int_equal(last_cfgx.window, 64);
    expect_kv(b, n, bc, bc, GGUF_UINT32, v_u32_32, &c, NULL); /* the file's window stays */
    assert_int_equal(last_cfgx.window, 64);
    expect_kv(b, n, sw, NULL, 0, NULL, &c, NULL); /* 4 layers: none */
    assert_int_equal(last_cfgx.window, 0);
    /* the same file without the key */
    uint8_t *b2 = (uint8_t *)tu_slurp(edited(b, n, sw, NULL, NULL, 0, 0), &n2);
    assert_non_null(b2);
    expect_kv(b2, n2, bc, bc, GGUF_UINT32, v_u32_32, &c, NULL);
    assert_int_equal(last_cfgx.window, 2047);
    expect_kv(b2, n2, bc, bc, GGUF_UINT32, v_u32_40, &c, NULL);
    assert_int_equal(last_cfgx.window, 2047);
    expect_kv(b2, n2, bc, bc, GGUF_UINT32, v_u32_24, &c, NULL);
    assert_int_equal(last_cfgx.window, 0);
    free(b2);
    /* 32 layers at another context: none */
    b2 = (uint8_t *)tu_slurp(edited(b, n, sw, NULL, NULL, 0, 0), &n2);
    struct img add = {0};
    kv_key(&add, bc, GGUF_UINT32);
    put_u32(&add, 32);
    uint8_t *b3 = (uint8_t *)tu_slurp(edited(b2, n2, bc, &add, NULL, 0, 0), &n2);
    free(add.b);
    assert_non_null(b3);
    expect_kv(b3, n2, NULL, NULL, 0, NULL, &c, NULL);
    assert_int_equal(last_cfgx.window, 2047);
    expect_kv(b3, n2, ctx, ctx, GGUF_UINT32, v_u32_100000, &c, NULL);
    assert_int_equal(last_cfgx.window, 0);
    free(b3);
    free(b2);
    free(b);
}

/* Every kind whose row in the tensor table constrains its values (RoPE factors > 0) is refused
 * where a GGUF element breaks it (0, negative), naming the tensor and the element; a kind
 * without a constraint reads 0. The synthetic shapes hold every such kind. */
static void test_source_values(void **state)
{
    static const char *const shapes[] = {"tiny-phi3", "tiny-llama31"};
    static const float bad[] = {0.0f, -1.0f};
    uint8_t *img[2];
    size_t len[2];
    char path[4300], name[64];
    struct shardlm_err e;
    struct coord_source s;
    float row[64];
    for (int i = 0; i < 2; i++) {
        tu_path(path, sizeof(path), "%s/values%d.gguf", dir, i);
        assert_int_equal(coord_synth(shapes[i], path, 0, NULL, NULL, &e), 0);
        img[i] = (uint8_t *)tu_slurp(path, &len[i]);
        assert_non_null(img[i]);
    }
    int checked = 0;
    for (int k = 0; k < SHLM_KIND_COUNT; k++) {
        if (shlm_kinds[k].value == SHLM_VALUE_ANY)
            continue;
        shlm_kind_gguf_name(NULL, (enum shlm_kind)k, 0, name, sizeof(name));
        int at = -1;
        for (int i = 0; i < 2 && at < 0; i++) {
            struct gguf_file g;
            assert_int_equal(gguf_parse(&g, img[i], len[i], "values", &e), 0);
            if (gguf_tensor(&g, name))
                at = i;
            gguf_close(&g);
        }
        if (at < 0)
            fail_msg("no synthetic shape holds %s", name);
        int cols = 8; /* head_dim 16's frequencies */
        assert_int_equal(open_source(edited(img[at], len[at], NULL, NULL, NULL, 0, 0), &s, &e), 0);
        assert_int_equal(s.read(&s, (enum shlm_kind)k, 0, 0, 1, cols, row, &e), 0);
        coord_source_close(&s);
        for (size_t v = 0; v < sizeof(bad) / sizeof(bad[0]); v++) {
            assert_int_equal(
                open_source(edited(img[at], len[at], NULL, NULL, name, 3, bad[v]), &s, &e), 0);
            e.msg[0] = 0;
            assert_int_equal(s.read(&s, (enum shlm_kind)k, 0, 0, 1, cols, row, &e), -EINVAL);
            assert_one_line_error(-EINVAL, &e);
            if (!strstr(e.msg, name) || !strstr(e.msg, "element 3") ||
                !strstr(e.msg, "expected > 0"))
                fail_msg("%s = %g: %s", name, (double)bad[v], e.msg);
            coord_source_close(&s);
        }
        checked++;
    }
    assert_int_equal(checked, 3); /* rope_freqs, rope_factors_short, rope_factors_long */
    /* no constraint: a norm of 0 reads */
    assert_int_equal(
        open_source(edited(img[0], len[0], NULL, NULL, "output_norm.weight", 3, 0.0f), &s, &e), 0);
    assert_int_equal(s.read(&s, SHLM_KIND_OUTPUT_NORM, 0, 0, 1, 64, row, &e), 0);
    assert_true(row[3] == 0.0f);
    coord_source_close(&s);
    free(img[0]);
    free(img[1]);
}

/* rope.scaling.type "yarn" with its factor (and @extra_key of @type, @putv: NULL for none): the
 * source's config and extension into *@s, or the error. */
static int open_yarn(const uint8_t *b, size_t n, const char *extra_key, uint32_t type,
                     kv_put_fn *putv, struct coord_source *s, struct shardlm_err *e)
{
    struct img add = {0};
    kv_key(&add, "llama.rope.scaling.type", GGUF_STRING);
    put_str(&add, "yarn");
    kv_key(&add, "llama.rope.scaling.factor", GGUF_FLOAT32);
    put_f32(&add, 4.0f);
    if (extra_key) {
        kv_key(&add, extra_key, type);
        putv(&add);
    }
    const char *path = edited(b, n, NULL, &add, NULL, 0, 0);
    free(add.b);
    return open_source(path, s, e);
}

/* A GGUF with YaRN scaling (Qwen2.5's, as llama.cpp writes it): factor, the original context
 * (the file's when absent), the betas (32, 1), the attention factor; DeepSeek's keys refused. */
static void test_source_yarn(void **state)
{
    size_t n;
    uint8_t *b = tiny_image(&n);
    struct coord_source s;
    struct shardlm_err e;
    assert_int_equal(open_yarn(b, n, NULL, 0, NULL, &s, &e), 0);
    assert_int_equal(s.cfg.rope_scaling, SHLM_ROPE_YARN);
    assert_true(s.cfg.rope_factor == 4.0f);
    /* the original context is the file's (tiny's 512); the context factor times it */
    assert_int_equal(s.cfg.rope_orig_ctx, 512);
    assert_int_equal(s.cfg.seq_len, 2048);
    assert_true(s.cfgx.yarn_beta_fast == 32.0f && s.cfgx.yarn_beta_slow == 1.0f);
    assert_true(s.cfgx.rope_attn_factor == 0.0f);
    coord_source_close(&s);
    assert_int_equal(open_yarn(b, n, "llama.rope.scaling.original_context_length", GGUF_UINT32,
                               v_u32_128, &s, &e),
                     0);
    assert_int_equal(s.cfg.rope_orig_ctx, 128);
    assert_int_equal(s.cfg.seq_len, 512); /* 4 x 128: the file's */
    coord_source_close(&s);
    assert_int_equal(
        open_yarn(b, n, "llama.rope.scaling.attn_factor", GGUF_FLOAT32, v_f32_4, &s, &e), 0);
    assert_true(s.cfgx.rope_attn_factor == 4.0f);
    coord_source_close(&s);
    /* a window as long as the file's context is neutral, though YaRN raises the context past it
     * (it was refused as sliding-window attention once the raise came before the check) */
    assert_int_equal(
        open_yarn(b, n, "llama.attention.sliding_window", GGUF_UINT32, v_u32_512, &s, &e), 0);
    assert_int_equal(s.cfg.seq_len, 2048);
    coord_source_close(&s);
    assert_int_equal(
        open_yarn(b, n, "llama.rope.scaling.yarn_ext_factor", GGUF_FLOAT32, v_f32_1, &s, &e),
        -EINVAL);
    assert_non_null(strstr(e.msg, "llama.rope.scaling.yarn_ext_factor is set: not supported"));
    free(b);
}

/* What the runtime lacks, refused by name and value; neutral values pass. */
static void test_source_unsupported(void **state)
{
    size_t n;
    uint8_t *b = tiny_image(&n);
    struct shlm_config c;
    /* YaRN is read (below); without its factor it is refused naming the factor */
    expect_kv(b, n, NULL, "llama.rope.scaling.type", GGUF_STRING, v_str_yarn, &c,
              "llama.rope.scaling.factor", "expected 1..1024", NULL);
    expect_kv(b, n, NULL, "llama.rope.scaling.type", GGUF_STRING, v_str_linear, &c,
              "llama.rope.scaling.factor is missing", "linear", NULL);
    expect_kv(b, n, NULL, "llama.rope.scaling.type", GGUF_STRING, v_str_none, &c, NULL);
    expect_kv(b, n, NULL, "llama.rope.scaling.factor", GGUF_FLOAT32, v_f32_4, &c,
              "llama.rope.scaling.factor", "4", NULL);
    expect_kv(b, n, NULL, "llama.rope.scaling.factor", GGUF_FLOAT32, v_f32_1, &c, NULL);
    expect_kv(b, n, NULL, "llama.attention.sliding_window", GGUF_UINT32, v_u32_128, &c,
              "llama.attention.sliding_window", "128", "sliding-window", NULL);
    expect_kv(b, n, NULL, "llama.attention.sliding_window", GGUF_UINT32, v_u32_4096, &c, NULL);
    expect_kv(b, n, NULL, "llama.final_logit_softcapping", GGUF_FLOAT32, v_f32_30, &c,
              "llama.final_logit_softcapping", "30", NULL);
    expect_kv(b, n, NULL, "llama.attn_logit_softcapping", GGUF_FLOAT32, v_f32_30, &c,
              "llama.attn_logit_softcapping", "30", NULL);
    expect_kv(b, n, NULL, "llama.attention.sliding_window", GGUF_STRING, v_str_yarn, &c,
              "llama.attention.sliding_window", "string", NULL);
    expect_kv(b, n, "llama.rope.dimension_count", "llama.rope.dimension_count", GGUF_UINT32,
              v_u32_8, &c, "llama.rope.dimension_count", "8", "partial rotary", NULL);
    /* a llama with experts is Mixtral: it needs its experts per token */
    expect_kv(b, n, NULL, "llama.expert_count", GGUF_UINT32, v_u32_8, &c, "llama.expert_used_count",
              "missing", NULL);
    expect_kv(b, n, NULL, "llama.residual_scale", GGUF_FLOAT32, v_f32_4, &c,
              "llama.residual_scale", NULL);
    expect_kv(b, n, NULL, "llama.attention.max_alibi_bias", GGUF_FLOAT32, v_f32_4, &c,
              "llama.attention.max_alibi_bias", "ALiBi", NULL);
    expect_kv(b, n, NULL, "llama.attention.max_alibi_bias", GGUF_FLOAT32, v_f32_0, &c, NULL);
    /* tokenizer flags: a bool, or refused (a flag defaulted silently tokenizes otherwise) */
    const char *add_bos = "tokenizer.ggml.add_bos_token";
    expect_kv(b, n, add_bos, add_bos, GGUF_UINT8, v_u8_2, &c, add_bos, "u8", "expected a bool",
              NULL);
    expect_kv(b, n, NULL, "tokenizer.ggml.add_eos_token", GGUF_STRING, v_str_yarn, &c,
              "tokenizer.ggml.add_eos_token", "string", NULL);
    expect_kv(b, n, NULL, "tokenizer.ggml.add_eos_token", GGUF_BOOL, v_bool_1, &c, NULL);
    free(b);
}

/* general.architecture: what is wrong with it, and the file's bytes escaped. */
static void test_source_arch(void **state)
{
    size_t n;
    uint8_t *b = tiny_image(&n);
    struct shlm_config c;
    const char *arch = "general.architecture";
    expect_kv(b, n, arch, arch, GGUF_UINT32, v_u32_7, &c, arch, "type u32", NULL);
    expect_kv(b, n, arch, arch, GGUF_STRING, v_str_long, &c, arch, "100000 bytes", NULL);
    expect_kv(b, n, arch, NULL, 0, NULL, &c, arch, "missing", NULL);
    expect_kv(b, n, arch, arch, GGUF_STRING, v_str_esc, &c, arch, "\"\\x1b[2J\\n\"", NULL);
    /* a known architecture reads its own keys (qwen3moe.*: the llama file has none); an
     * unknown name says the list */
    expect_kv(b, n, arch, arch, GGUF_STRING, v_str_qwen3moe, &c, "qwen3moe.", "missing", NULL);
    expect_kv(b, n, arch, arch, GGUF_STRING, v_str_qwen9, &c, arch, "\"qwen9\"",
              "(llama, qwen2, gemma, spark, qwen3, gemma2, gemma3, phi3, granite, smollm3, "
              "qwen3moe, gpt-oss, deepseek2)",
              NULL);
    /* well-formed UTF-8 kept; a stray byte, a cut sequence, a bidi override and \ escaped */
    expect_kv(b, n, arch, arch, GGUF_STRING, v_str_utf8, &c, arch,
              "\"caf\xc3\xa9\\xff\\xc3(\\xe2\\x80\\xae\\\\\"", NULL);
    free(b);
}

/* Special token ids inside the vocabulary, or refused with its size. */
static void test_source_token_ids(void **state)
{
    size_t n;
    uint8_t *b = tiny_image(&n);
    struct shlm_config c;
    const char *eos = "tokenizer.ggml.eos_token_id", *bos = "tokenizer.ggml.bos_token_id";
    expect_kv(b, n, eos, eos, GGUF_UINT32, v_u32_100000, &c, eos, "100000", "512 tokens", NULL);
    expect_kv(b, n, eos, eos, GGUF_INT32, v_i32_neg1, &c, eos, "-1", "512 tokens", NULL);
    expect_kv(b, n, bos, bos, GGUF_UINT32, v_u32_100000, &c, bos, "100000", "512 tokens", NULL);
    free(b);
}

/* Non-finite and overflowing weights are refused where they are read, naming the tensor and
 * the first bad element. */
static void test_source_weights(void **state)
{
    size_t n;
    uint8_t *b = tiny_image(&n);
    static const float bad[] = {NAN, INFINITY, -3e38f, 70000.0f};
    static const char *const shown[] = {"nan", "inf", "-3e+38", "70000"};
    float row[64];
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        const char *path = edited(b, n, NULL, NULL, "output_norm.weight", 5, bad[i]);
        struct coord_source s;
        struct shardlm_err e;
        assert_int_equal(open_source(path, &s, &e), 0);
        e.msg[0] = 0;
        assert_int_equal(s.read(&s, SHLM_KIND_OUTPUT_NORM, 0, 0, 1, 64, row, &e), -EINVAL);
        assert_one_line_error(-EINVAL, &e);
        if (!strstr(e.msg, "output_norm.weight") || !strstr(e.msg, "element 5") ||
            !strstr(e.msg, shown[i]))
            fail_msg("%s: %s", shown[i], e.msg);
        assert_int_equal(s.read(&s, SHLM_KIND_ATTN_NORM, 0, 0, 1, 64, row, &e), 0);
        coord_source_close(&s);
    }
    /* the largest allowed magnitude passes */
    const char *path = edited(b, n, NULL, NULL, "output_norm.weight", 5, -65504.0f);
    struct coord_source s;
    struct shardlm_err e;
    assert_int_equal(open_source(path, &s, &e), 0);
    assert_int_equal(s.read(&s, SHLM_KIND_OUTPUT_NORM, 0, 0, 1, 64, row, &e), 0);
    assert_true(row[5] == -65504.0f);
    coord_source_close(&s);
    free(b);
}

static void corpus_write(const char *name, const uint8_t *b, size_t n, bool valid, void *arg)
{
    char path[4300];
    tu_path(path, sizeof(path), "%s/%s", (const char *)arg, name);
    if (tu_write(path, b, n) != 0) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(1);
    }
    printf("%s %zu %s\n", name, n, valid ? "valid" : "invalid");
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--write-corpus") == 0) {
        corpus_each(corpus_write, argv[2]);
        return 0;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_small_valid),        cmocka_unit_test(test_dequant),
        cmocka_unit_test(test_every_kind),         cmocka_unit_test(test_truncations),
        cmocka_unit_test(test_corruptions),        cmocka_unit_test(test_writer_roundtrip),
        cmocka_unit_test(test_writer_errors),      cmocka_unit_test(test_open_errors),
        cmocka_unit_test(test_vocab_llama_spm),    cmocka_unit_test(test_vocab_gpt2),
        cmocka_unit_test(test_vocab_phi3),         cmocka_unit_test(test_corpus),
        cmocka_unit_test(test_source_settings),    cmocka_unit_test(test_source_unsupported),
        cmocka_unit_test(test_source_yarn),        cmocka_unit_test(test_source_gemma),
        cmocka_unit_test(test_source_phi3_window), cmocka_unit_test(test_source_values),
        cmocka_unit_test(test_source_arch),        cmocka_unit_test(test_source_token_ids),
        cmocka_unit_test(test_source_weights),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
