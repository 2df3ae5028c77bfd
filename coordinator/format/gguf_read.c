/* SPDX-License-Identifier: MIT */
/* coordinator/format/gguf_read.c: the GGUF reader - a parser that trusts nothing in the image,
 * lookups of keys and tensors, typed getters, and tensor rows as float32.
 *
 * Every field is read through a cursor that is checked against the bytes left; every count is
 * checked against the smallest encoding its items could have before anything is allocated for
 * it, so the allocations stay within a few times the image size (key/values < 5x: a 56-byte
 * entry and an 8-byte index for >= 13 bytes each; tensor infos < 3x: 80 + 8 bytes for >= 32;
 * string array indexes 2x: 16 bytes for >= 8). Keys and tensor names are sorted once
 * (duplicates refused, lookups by binary search) and the tensors of the known types are sorted
 * by offset to refuse overlaps, so hostile counts cost n log n. */
#include "gguf.h"

#include "rows.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gguf_read.c reads the little-endian GGUF fields in place"
#endif

#define GGUF_DEFAULT_ALIGN 32
#define GGUF_MAX_ALIGN 65536
#define GGUF_MAX_DIMS 4
#define GGUF_KV_MIN 13 /* key length (8) + type (4) + the smallest value (1) */
#define GGUF_TI_MIN 32 /* name length (8) + n_dims (4) + one dim (8) + type (4) + offset (8) */

/* Bytes of one scalar of each value type (0: string or array). */
static const uint8_t val_size[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
static const char *const val_name[] = {"u8",  "i8",    "u16", "i16", "u32", "i32", "f32",
                                       "bool", "string", "array", "u64", "i64", "f64"};
#define GGUF_N_TYPES (sizeof(val_size) / sizeof(val_size[0]))

/* The row type of ggml tensor type @type, false for one this reader does not know. */
static bool ggml_rows_type(uint32_t type, enum coord_rows_type *out)
{
    switch (type) {
    case GGML_F32: *out = COORD_ROWS_F32; return true;
    case GGML_F16: *out = COORD_ROWS_F16; return true;
    case GGML_BF16: *out = COORD_ROWS_BF16; return true;
    case GGML_Q8_0: *out = COORD_ROWS_Q8_0; return true;
    case GGML_Q4_0: *out = COORD_ROWS_Q4_0; return true;
    case GGML_MXFP4:
        *out = COORD_ROWS_MXFP4;
        return true;
    default: return false;
    }
}

/* Block size (elements), bytes per block and name of the tensor types this reader knows. */
static bool ggml_traits(uint32_t type, uint64_t *blk, uint64_t *blk_bytes, const char **name)
{
    enum coord_rows_type rt;
    if (!ggml_rows_type(type, &rt))
        return false;
    *blk = coord_rows_traits[rt].blk;
    *blk_bytes = coord_rows_traits[rt].blk_bytes;
    if (name)
        *name = coord_rows_traits[rt].name;
    return true;
}

static uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

/* Writes @s into @buf (80 bytes) for a one-line message: escaped (coord_escape()), cut with
 * "..." where the buffer runs out. */
static const char *show(struct gguf_str s, char *buf) { return coord_escape(buf, 80, s.p, s.len); }

struct cur {
    const uint8_t *b;
    size_t size, pos;
    const char *what;
    struct shardlm_err *e;
};

static size_t left(const struct cur *c) { return c->size - c->pos; }

static bool rd(struct cur *c, void *out, size_t n)
{
    if (left(c) < n)
        return false;
    memcpy(out, c->b + c->pos, n);
    c->pos += n;
    return true;
}

static bool rd_u32(struct cur *c, uint32_t *v) { return rd(c, v, 4); }
static bool rd_u64(struct cur *c, uint64_t *v) { return rd(c, v, 8); }

enum { STR_OK = 0, STR_CUT_LEN, STR_TOO_LONG };

/* A gguf string: u64 length then the bytes. On STR_TOO_LONG, *@len holds the length read. */
static int rd_str(struct cur *c, struct gguf_str *s, uint64_t *len)
{
    if (!rd_u64(c, len))
        return STR_CUT_LEN;
    if (*len > left(c))
        return STR_TOO_LONG;
    s->p = (const char *)c->b + c->pos;
    s->len = *len;
    c->pos += *len;
    return STR_OK;
}

static int bad(struct cur *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int bad(struct cur *c, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return shardlm_fail(c->e, -EINVAL, "%s: %s", c->what, msg);
}

static int str_cmp(struct gguf_str a, struct gguf_str b)
{
    uint64_t n = a.len < b.len ? a.len : b.len;
    int r = n ? memcmp(a.p, b.p, n) : 0;
    if (r)
        return r;
    return a.len < b.len ? -1 : a.len > b.len;
}

static int kv_ptr_cmp(const void *a, const void *b)
{
    return str_cmp((*(const struct gguf_kv *const *)a)->key,
                   (*(const struct gguf_kv *const *)b)->key);
}

static int tensor_ptr_cmp(const void *a, const void *b)
{
    return str_cmp((*(const struct gguf_tensor *const *)a)->name,
                   (*(const struct gguf_tensor *const *)b)->name);
}

static int tensor_off_cmp(const void *a, const void *b)
{
    const struct gguf_tensor *x = *(const struct gguf_tensor *const *)a;
    const struct gguf_tensor *y = *(const struct gguf_tensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* A string value of kv @kv: its length, then its bytes in place. */
static int parse_string(struct cur *c, struct gguf_kv *kv)
{
    char kn[80];
    uint64_t len;
    int r = rd_str(c, &kv->v.s, &len);
    if (r == STR_CUT_LEN)
        return bad(c, "kv %s: truncated at byte %zu in the string length", show(kv->key, kn),
                   c->pos);
    if (r == STR_TOO_LONG)
        return bad(c, "kv %s: string length %llu exceeds the %zu bytes left", show(kv->key, kn),
                   (unsigned long long)len, left(c));
    return 0;
}

/* A scalar value of kv @kv of value type @type (neither string nor array), widened into kv->v;
 * a bool must be 0 or 1. */
static int parse_scalar(struct cur *c, struct gguf_kv *kv, uint32_t type)
{
    char kn[80];
    uint8_t raw[8] = {0};
    if (!rd(c, raw, val_size[type]))
        return bad(c, "kv %s: truncated at byte %zu in the %s value", show(kv->key, kn), c->pos,
                   val_name[type]);
    switch (type) {
    case GGUF_UINT8: kv->v.u = raw[0]; break;
    case GGUF_INT8: kv->v.i = (int8_t)raw[0]; break;
    case GGUF_UINT16: { uint16_t v; memcpy(&v, raw, 2); kv->v.u = v; break; }
    case GGUF_INT16: { int16_t v; memcpy(&v, raw, 2); kv->v.i = v; break; }
    case GGUF_UINT32: { uint32_t v; memcpy(&v, raw, 4); kv->v.u = v; break; }
    case GGUF_INT32: { int32_t v; memcpy(&v, raw, 4); kv->v.i = v; break; }
    case GGUF_FLOAT32: { float v; memcpy(&v, raw, 4); kv->v.f = v; break; }
    case GGUF_BOOL:
        if (raw[0] > 1)
            return bad(c, "kv %s: bool value is %u, expected 0 or 1", show(kv->key, kn), raw[0]);
        kv->v.u = raw[0];
        break;
    case GGUF_UINT64: memcpy(&kv->v.u, raw, 8); break;
    case GGUF_INT64: memcpy(&kv->v.i, raw, 8); break;
    case GGUF_FLOAT64: memcpy(&kv->v.f, raw, 8); break;
    }
    return 0;
}

/* The @n strings of array kv @kv, indexed in kv->v.arr.strs (n <= left / 8: at most 2x the
 * bytes left). */
static int parse_array_strings(struct cur *c, struct gguf_kv *kv, uint64_t n)
{
    char kn[80];
    if (n == 0)
        return 0;
    kv->v.arr.strs = malloc(n * sizeof(struct gguf_str));
    if (!kv->v.arr.strs)
        return shardlm_fail(c->e, -ENOMEM, "%s: kv %s: out of memory for %llu strings", c->what,
                            show(kv->key, kn), (unsigned long long)n);
    for (uint64_t i = 0; i < n; i++) {
        uint64_t len;
        int r = rd_str(c, &kv->v.arr.strs[i], &len);
        if (r == STR_CUT_LEN)
            return bad(c, "kv %s: truncated at byte %zu in the length of string %llu of %llu",
                       show(kv->key, kn), c->pos, (unsigned long long)i, (unsigned long long)n);
        if (r == STR_TOO_LONG)
            return bad(c, "kv %s: string %llu of %llu: length %llu exceeds the %zu bytes left",
                       show(kv->key, kn), (unsigned long long)i, (unsigned long long)n,
                       (unsigned long long)len, left(c));
    }
    return 0;
}

/* An array value of kv @kv: element type, u64 count (checked against the smallest encoding of
 * its elements before anything is allocated), then the elements, left in place. */
static int parse_array(struct cur *c, struct gguf_kv *kv)
{
    char kn[80];
    uint32_t et;
    uint64_t n;
    if (!rd_u32(c, &et) || !rd_u64(c, &n))
        return bad(c, "kv %s: truncated at byte %zu in the array header", show(kv->key, kn),
                   c->pos);
    if (et == GGUF_ARRAY)
        return bad(c, "kv %s: nested arrays (array of array) are not supported", show(kv->key, kn));
    if (et >= GGUF_N_TYPES)
        return bad(c, "kv %s: unknown array element type %u (expected 0..12)", show(kv->key, kn),
                   et);
    uint64_t esize = et == GGUF_STRING ? 8 : val_size[et]; /* a string is at least its length */
    if (n > left(c) / esize)
        return bad(c, "kv %s: array count %llu of %s needs at least %llu bytes per element, the "
                   "%zu bytes left hold at most %llu", show(kv->key, kn), (unsigned long long)n,
                   val_name[et], (unsigned long long)esize, left(c),
                   (unsigned long long)(left(c) / esize));
    kv->v.arr.type = (enum gguf_type)et;
    kv->v.arr.n = n;
    kv->v.arr.data = c->b + c->pos;
    if (et == GGUF_STRING)
        return parse_array_strings(c, kv, n);
    if (et == GGUF_BOOL)
        for (uint64_t i = 0; i < n; i++)
            if (c->b[c->pos + i] > 1)
                return bad(c, "kv %s: bool element %llu is %u, expected 0 or 1",
                           show(kv->key, kn), (unsigned long long)i, c->b[c->pos + i]);
    c->pos += n * esize;
    return 0;
}

/* The value of kv @kv (its key already read): its type, then a string, a scalar or an array. */
static int parse_value(struct cur *c, struct gguf_kv *kv)
{
    char kn[80];
    uint32_t type;
    if (!rd_u32(c, &type))
        return bad(c, "kv %s: truncated at byte %zu in the value type", show(kv->key, kn), c->pos);
    if (type >= GGUF_N_TYPES)
        return bad(c, "kv %s: unknown value type %u (expected 0..12)", show(kv->key, kn), type);
    kv->type = (enum gguf_type)type;
    if (type == GGUF_STRING)
        return parse_string(c, kv);
    if (type == GGUF_ARRAY)
        return parse_array(c, kv);
    return parse_scalar(c, kv, type);
}

static int parse_kvs(struct cur *c, struct gguf_file *g)
{
    for (uint64_t i = 0; i < g->n_kv; i++) {
        struct gguf_kv *kv = &g->kv[i];
        uint64_t len;
        int r = rd_str(c, &kv->key, &len);
        if (r == STR_CUT_LEN)
            return bad(c, "kv %llu: truncated at byte %zu in the key length", (unsigned long long)i,
                       c->pos);
        if (r == STR_TOO_LONG)
            return bad(c, "kv %llu: key length %llu exceeds the %zu bytes left",
                       (unsigned long long)i, (unsigned long long)len, left(c));
        r = parse_value(c, kv);
        if (r)
            return r;
    }
    if (g->n_kv == 0)
        return 0;
    g->kv_by_key = malloc(g->n_kv * sizeof(*g->kv_by_key));
    if (!g->kv_by_key)
        return shardlm_fail(c->e, -ENOMEM, "%s: out of memory for %llu keys", c->what,
                            (unsigned long long)g->n_kv);
    for (uint64_t i = 0; i < g->n_kv; i++)
        g->kv_by_key[i] = &g->kv[i];
    qsort(g->kv_by_key, g->n_kv, sizeof(*g->kv_by_key), kv_ptr_cmp);
    for (uint64_t i = 1; i < g->n_kv; i++)
        if (str_cmp(g->kv_by_key[i - 1]->key, g->kv_by_key[i]->key) == 0) {
            char kn[80];
            return bad(c, "kv %s appears twice", show(g->kv_by_key[i]->key, kn));
        }
    return 0;
}

static int parse_alignment(struct cur *c, struct gguf_file *g)
{
    g->alignment = GGUF_DEFAULT_ALIGN;
    const struct gguf_kv *kv = gguf_find(g, "general.alignment");
    if (!kv)
        return 0;
    if (kv->type != GGUF_UINT32)
        return bad(c, "kv general.alignment: type %s, expected u32",
                   (unsigned)kv->type < GGUF_N_TYPES ? val_name[kv->type] : "?");
    if (kv->v.u == 0 || kv->v.u > GGUF_MAX_ALIGN || (kv->v.u & (kv->v.u - 1)))
        return bad(c, "kv general.alignment: %llu is not a power of two in 1..%d",
                   (unsigned long long)kv->v.u, GGUF_MAX_ALIGN);
    g->alignment = kv->v.u;
    return 0;
}

/* Tensor info @i: name, dims, type and the offset relative to the data section. */
static int parse_info(struct cur *c, struct gguf_tensor *t, uint64_t i)
{
    char tn[80];
    uint64_t len;
    int r = rd_str(c, &t->name, &len);
    if (r == STR_CUT_LEN)
        return bad(c, "tensor info %llu: truncated at byte %zu in the name length",
                   (unsigned long long)i, c->pos);
    if (r == STR_TOO_LONG)
        return bad(c, "tensor info %llu: name length %llu exceeds the %zu bytes left",
                   (unsigned long long)i, (unsigned long long)len, left(c));
    if (!rd_u32(c, &t->n_dims))
        return bad(c, "tensor %s: truncated at byte %zu in n_dims", show(t->name, tn), c->pos);
    if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS)
        return bad(c, "tensor %s: n_dims is %u, expected 1..%d", show(t->name, tn), t->n_dims,
                   GGUF_MAX_DIMS);
    uint64_t nel = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        if (!rd_u64(c, &t->dims[d]))
            return bad(c, "tensor %s: truncated at byte %zu in dims[%u]", show(t->name, tn),
                       c->pos, d);
        if (t->dims[d] == 0)
            return bad(c, "tensor %s: dims[%u] is 0, expected >= 1", show(t->name, tn), d);
        if (__builtin_mul_overflow(nel, t->dims[d], &nel))
            return bad(c, "tensor %s: dims overflow a 64-bit element count at dims[%u] = %llu",
                       show(t->name, tn), d, (unsigned long long)t->dims[d]);
    }
    for (uint32_t d = t->n_dims; d < GGUF_MAX_DIMS; d++)
        t->dims[d] = 1;
    uint32_t type;
    if (!rd_u32(c, &type) || !rd_u64(c, &t->offset))
        return bad(c, "tensor %s: truncated at byte %zu in the type or offset", show(t->name, tn),
                   c->pos);
    t->type = (enum gguf_ggml_type)type;
    return 0;
}

/* Sorts the tensor names into g->tensor_by_name for lookups, refusing a name seen twice. */
static int index_tensor_names(struct cur *c, struct gguf_file *g)
{
    char tn[80];
    g->tensor_by_name = malloc(g->n_tensors * sizeof(*g->tensor_by_name));
    if (!g->tensor_by_name)
        return shardlm_fail(c->e, -ENOMEM, "%s: out of memory for %llu tensors", c->what,
                            (unsigned long long)g->n_tensors);
    for (uint64_t i = 0; i < g->n_tensors; i++)
        g->tensor_by_name[i] = &g->tensors[i];
    qsort(g->tensor_by_name, g->n_tensors, sizeof(*g->tensor_by_name), tensor_ptr_cmp);
    for (uint64_t i = 1; i < g->n_tensors; i++)
        if (str_cmp(g->tensor_by_name[i - 1]->name, g->tensor_by_name[i]->name) == 0)
            return bad(c, "tensor %s appears twice", show(g->tensor_by_name[i]->name, tn));
    return 0;
}

/* Makes tensor @t's offset absolute: aligned, inside the @room bytes of the data section, and
 * for a known type its bytes inside it too (t->bytes, 0 for an unknown type). */
static int place_tensor(struct cur *c, const struct gguf_file *g, struct gguf_tensor *t,
                        uint64_t room)
{
    char tn[80];
    uint64_t rel = t->offset, blk, blk_bytes, nel = 1;
    const char *tyname;
    if (rel % g->alignment)
        return bad(c, "tensor %s: offset %llu is not a multiple of the alignment %llu",
                   show(t->name, tn), (unsigned long long)rel, (unsigned long long)g->alignment);
    if (rel > room)
        return bad(c, "tensor %s: offset %llu is past the end of the data section "
                   "(%llu bytes)", show(t->name, tn), (unsigned long long)rel,
                   (unsigned long long)room);
    t->offset = g->data_offset + rel;
    t->bytes = 0;
    if (!ggml_traits(t->type, &blk, &blk_bytes, &tyname))
        return 0; /* unknown type: kept, refused by gguf_read_rows() */
    for (uint32_t d = 0; d < t->n_dims; d++)
        nel *= t->dims[d]; /* cannot overflow: checked by parse_info */
    if (t->dims[0] % blk)
        return bad(c, "tensor %s: type %s needs dims[0] a multiple of %llu, got %llu",
                   show(t->name, tn), tyname, (unsigned long long)blk,
                   (unsigned long long)t->dims[0]);
    if (nel / blk > UINT64_MAX / blk_bytes || nel / blk * blk_bytes > room - rel)
        return bad(c, "tensor %s: offset %llu + %s data of %llu elements is past the end of "
                   "the file (%llu bytes of data)", show(t->name, tn), (unsigned long long)rel,
                   tyname, (unsigned long long)nel, (unsigned long long)room);
    t->bytes = nel / blk * blk_bytes;
    return 0;
}

/* Refuses two of the @n_known tensors with bytes (known types) that overlap, sorted by offset. */
static int check_overlaps(struct cur *c, const struct gguf_file *g, uint64_t n_known)
{
    char tn[80], tn2[80];
    if (n_known < 2)
        return 0;
    const struct gguf_tensor **by_off = malloc(n_known * sizeof(*by_off));
    if (!by_off)
        return shardlm_fail(c->e, -ENOMEM, "%s: out of memory for %llu tensors", c->what,
                            (unsigned long long)n_known);
    uint64_t k = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (g->tensors[i].bytes)
            by_off[k++] = &g->tensors[i];
    qsort(by_off, n_known, sizeof(*by_off), tensor_off_cmp);
    int rc = 0;
    for (uint64_t i = 1; i < n_known && !rc; i++)
        if (by_off[i - 1]->offset + by_off[i - 1]->bytes > by_off[i]->offset)
            rc = bad(c, "tensors %s and %s overlap (bytes %llu..%llu and %llu..%llu)",
                     show(by_off[i - 1]->name, tn), show(by_off[i]->name, tn2),
                     (unsigned long long)by_off[i - 1]->offset,
                     (unsigned long long)(by_off[i - 1]->offset + by_off[i - 1]->bytes),
                     (unsigned long long)by_off[i]->offset,
                     (unsigned long long)(by_off[i]->offset + by_off[i]->bytes));
    free(by_off);
    return rc;
}

/* Places the tensors in the image: aligned offsets, bytes of the known types inside it, no two
 * names alike, no two known tensors overlapping. */
static int place_tensors(struct cur *c, struct gguf_file *g)
{
    if (g->n_tensors == 0)
        return 0;
    int rc = index_tensor_names(c, g);
    if (rc)
        return rc;
    if (g->data_offset > g->size)
        return bad(c, "the data section would start at byte %llu, past the end of the file "
                   "(%zu bytes), but there are %llu tensors", (unsigned long long)g->data_offset,
                   g->size, (unsigned long long)g->n_tensors);
    uint64_t room = g->size - g->data_offset, n_known = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        if ((rc = place_tensor(c, g, &g->tensors[i], room)))
            return rc;
        n_known += g->tensors[i].bytes != 0;
    }
    return check_overlaps(c, g, n_known);
}

/* Frees what gguf_parse allocated (not the mapping). */
static void free_parsed(struct gguf_file *g)
{
    if (g->kv)
        for (uint64_t i = 0; i < g->n_kv; i++)
            if (g->kv[i].type == GGUF_ARRAY)
                free(g->kv[i].v.arr.strs);
    free(g->kv);
    free(g->tensors);
    free(g->kv_by_key);
    free(g->tensor_by_name);
    free(g->what);
}

int gguf_parse(struct gguf_file *g, const uint8_t *buf, size_t size, const char *what,
               struct shardlm_err *e)
{
    struct cur c = {.b = buf, .size = size, .pos = 0, .what = what, .e = e};
    uint32_t version;
    uint64_t n_tensors, n_kv;
    int rc;

    memset(g, 0, sizeof(*g));
    if (size < 4 || memcmp(buf, "GGUF", 4) != 0)
        return shardlm_fail(e, -EPROTO, "%s: not a GGUF file (magic is not \"GGUF\")", what);
    c.pos = 4;
    if (!rd_u32(&c, &version))
        return bad(&c, "truncated at byte %zu in header field version", c.pos);
    if (version != 2 && version != 3)
        return bad(&c, "header field version is %u, expected 2 or 3", version);
    if (!rd_u64(&c, &n_tensors))
        return bad(&c, "truncated at byte %zu in header field n_tensors", c.pos);
    if (!rd_u64(&c, &n_kv))
        return bad(&c, "truncated at byte %zu in header field n_kv", c.pos);
    if (n_kv > left(&c) / GGUF_KV_MIN)
        return bad(&c, "header field n_kv is %llu, but the %zu bytes left hold at most %zu "
                   "key/values", (unsigned long long)n_kv, left(&c), left(&c) / GGUF_KV_MIN);
    size_t after_kv = left(&c) - (size_t)n_kv * GGUF_KV_MIN;
    if (n_tensors > after_kv / GGUF_TI_MIN)
        return bad(&c, "header field n_tensors is %llu, but the %zu bytes left after %llu "
                   "key/values hold at most %zu tensor infos", (unsigned long long)n_tensors,
                   after_kv, (unsigned long long)n_kv, after_kv / GGUF_TI_MIN);
    g->base = buf;
    g->size = size;
    g->version = version;
    g->n_kv = n_kv;
    g->n_tensors = n_tensors;
    g->kv = calloc(n_kv ? n_kv : 1, sizeof(*g->kv));
    g->tensors = calloc(n_tensors ? n_tensors : 1, sizeof(*g->tensors));
    g->what = strdup(what);
    if (!g->kv || !g->tensors || !g->what) {
        rc = shardlm_fail(e, -ENOMEM, "%s: out of memory for %llu key/values and %llu tensors",
                          what, (unsigned long long)n_kv, (unsigned long long)n_tensors);
        goto out_free;
    }
    rc = parse_kvs(&c, g);
    if (rc)
        goto out_free;
    rc = parse_alignment(&c, g);
    if (rc)
        goto out_free;
    for (uint64_t i = 0; i < n_tensors; i++) {
        rc = parse_info(&c, &g->tensors[i], i);
        if (rc)
            goto out_free;
    }
    g->data_offset = align_up(c.pos, g->alignment); /* pos < 2^63, alignment <= 2^16 */
    rc = place_tensors(&c, g);
    if (rc)
        goto out_free;
    return 0;

out_free:
    free_parsed(g);
    memset(g, 0, sizeof(*g));
    return rc;
}

int gguf_open(struct gguf_file *g, const char *path, struct shardlm_err *e)
{
    memset(g, 0, sizeof(*g));
    void *map;
    size_t size;
    int rc = coord_map_file(path, &map, &size, e);
    if (rc)
        return rc;
    static const uint8_t empty[1];
    rc = gguf_parse(g, map ? map : empty, size, path, e);
    if (rc) {
        if (map)
            munmap(map, size);
        return rc;
    }
    g->map = map;
    return 0;
}

void gguf_close(struct gguf_file *g)
{
    free_parsed(g);
    if (g->map)
        munmap(g->map, g->size);
    memset(g, 0, sizeof(*g));
}

/* Compares the gguf string @s with the C string @c (as str_cmp does). */
static int str_cmp_c(struct gguf_str s, const char *c)
{
    struct gguf_str b = {.p = c, .len = strlen(c)};
    return str_cmp(s, b);
}

const struct gguf_kv *gguf_find(const struct gguf_file *g, const char *key)
{
    uint64_t lo = 0, hi = g->n_kv;
    if (!g->kv_by_key)
        return NULL;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        int r = str_cmp_c(g->kv_by_key[mid]->key, key);
        if (r == 0)
            return g->kv_by_key[mid];
        if (r < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

static bool is_unsigned(enum gguf_type t)
{
    return t == GGUF_UINT8 || t == GGUF_UINT16 || t == GGUF_UINT32 || t == GGUF_UINT64;
}

static bool is_signed(enum gguf_type t)
{
    return t == GGUF_INT8 || t == GGUF_INT16 || t == GGUF_INT32 || t == GGUF_INT64;
}

int gguf_get_u32(const struct gguf_file *g, const char *key, uint32_t *out)
{
    const struct gguf_kv *kv = gguf_find(g, key);
    if (!kv)
        return -ENOENT;
    if (is_unsigned(kv->type) && kv->v.u <= UINT32_MAX)
        *out = (uint32_t)kv->v.u;
    else if (is_signed(kv->type) && kv->v.i >= 0 && kv->v.i <= (int64_t)UINT32_MAX)
        *out = (uint32_t)kv->v.i;
    else
        return -EINVAL;
    return 0;
}

int gguf_get_f32(const struct gguf_file *g, const char *key, float *out)
{
    const struct gguf_kv *kv = gguf_find(g, key);
    if (!kv)
        return -ENOENT;
    if (kv->type != GGUF_FLOAT32 && kv->type != GGUF_FLOAT64)
        return -EINVAL;
    if (isfinite(kv->v.f) && fabs(kv->v.f) > FLT_MAX)
        return -EINVAL;
    *out = (float)kv->v.f;
    return 0;
}

int gguf_get_bool(const struct gguf_file *g, const char *key, bool *out)
{
    const struct gguf_kv *kv = gguf_find(g, key);
    if (!kv)
        return -ENOENT;
    if (kv->type != GGUF_BOOL)
        return -EINVAL;
    *out = kv->v.u != 0;
    return 0;
}

int gguf_get_str(const struct gguf_file *g, const char *key, struct gguf_str *out)
{
    const struct gguf_kv *kv = gguf_find(g, key);
    if (!kv)
        return -ENOENT;
    if (kv->type != GGUF_STRING)
        return -EINVAL;
    *out = kv->v.s;
    return 0;
}

void gguf_get_val(const struct gguf_file *g, const char *key, struct coord_val *out)
{
    const struct gguf_kv *kv = gguf_find(g, key);
    memset(out, 0, sizeof(*out));
    out->kind = COORD_VAL_ABSENT;
    if (!kv)
        return;
    out->type = (unsigned)kv->type < GGUF_N_TYPES ? val_name[kv->type] : "unknown";
    if (is_unsigned(kv->type)) {
        out->kind = COORD_VAL_NUM;
        out->num = (double)kv->v.u;
    } else if (is_signed(kv->type)) {
        out->kind = COORD_VAL_NUM;
        out->num = (double)kv->v.i;
    } else if (kv->type == GGUF_FLOAT32 || kv->type == GGUF_FLOAT64) {
        out->kind = COORD_VAL_NUM;
        out->num = kv->v.f;
    } else if (kv->type == GGUF_BOOL) {
        out->kind = COORD_VAL_BOOL;
        out->b = kv->v.u != 0;
    } else if (kv->type == GGUF_STRING) {
        out->kind = COORD_VAL_STR;
        out->str = kv->v.s.p;
        out->len = kv->v.s.len;
    } else {
        out->kind = COORD_VAL_OTHER;
    }
}

const struct gguf_kv *gguf_get_arr(const struct gguf_file *g, const char *key,
                                   enum gguf_type type)
{
    const struct gguf_kv *kv = gguf_find(g, key);
    if (!kv || kv->type != GGUF_ARRAY || kv->v.arr.type != type)
        return NULL;
    return kv;
}

double gguf_arr_num(const struct gguf_kv *kv, uint64_t i)
{
    if (kv->type != GGUF_ARRAY || i >= kv->v.arr.n)
        return NAN;
    enum gguf_type t = kv->v.arr.type;
    if ((unsigned)t >= GGUF_N_TYPES || t == GGUF_STRING || t == GGUF_ARRAY)
        return NAN;
    const uint8_t *p = kv->v.arr.data + i * val_size[t];
    switch (t) {
    case GGUF_UINT8: return p[0];
    case GGUF_BOOL: return p[0];
    case GGUF_INT8: return (int8_t)p[0];
    case GGUF_UINT16: { uint16_t v; memcpy(&v, p, 2); return v; }
    case GGUF_INT16: { int16_t v; memcpy(&v, p, 2); return v; }
    case GGUF_UINT32: { uint32_t v; memcpy(&v, p, 4); return v; }
    case GGUF_INT32: { int32_t v; memcpy(&v, p, 4); return v; }
    case GGUF_FLOAT32: { float v; memcpy(&v, p, 4); return v; }
    case GGUF_UINT64: { uint64_t v; memcpy(&v, p, 8); return (double)v; }
    case GGUF_INT64: { int64_t v; memcpy(&v, p, 8); return (double)v; }
    case GGUF_FLOAT64: { double v; memcpy(&v, p, 8); return v; }
    default: return NAN;
    }
}

bool gguf_str_eq(struct gguf_str s, const char *c)
{
    size_t n = strlen(c);
    return s.len == n && (n == 0 || memcmp(s.p, c, n) == 0);
}

const struct gguf_tensor *gguf_tensor(const struct gguf_file *g, const char *name)
{
    uint64_t lo = 0, hi = g->n_tensors;
    if (!g->tensor_by_name)
        return NULL;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        int r = str_cmp_c(g->tensor_by_name[mid]->name, name);
        if (r == 0)
            return g->tensor_by_name[mid];
        if (r < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

uint64_t gguf_tensor_rows(const struct gguf_tensor *t)
{
    uint64_t r = 1;
    for (uint32_t d = 1; d < t->n_dims && d < GGUF_MAX_DIMS; d++)
        r *= t->dims[d];
    return r;
}

int gguf_read_rows(const struct gguf_file *g, const struct gguf_tensor *t, uint64_t r0,
                   uint64_t r1, float *out, struct shardlm_err *e)
{
    char tn[80];
    const char *what = g->what ? g->what : "gguf";
    uint64_t rows = gguf_tensor_rows(t), cols = t->dims[0];
    enum coord_rows_type rt;
    if (!ggml_rows_type(t->type, &rt) || !t->bytes)
        return shardlm_fail(e, -EINVAL,
                            "%s: tensor %s: ggml type %u is not supported (F32, F16, "
                            "BF16, Q8_0, Q4_0 and MXFP4 are)",
                            what, show(t->name, tn), (unsigned)t->type);
    if (r0 > r1 || r1 > rows)
        return shardlm_fail(e, -EINVAL, "%s: tensor %s: rows %llu..%llu are outside its %llu rows",
                            what, show(t->name, tn), (unsigned long long)r0, (unsigned long long)r1,
                            (unsigned long long)rows);
    /* rows are contiguous and whole blocks (dims[0] % blk == 0): one run of blocks */
    const struct coord_rows_traits *tr = &coord_rows_traits[rt];
    const uint8_t *p = g->base + t->offset + r0 * (cols / tr->blk) * tr->blk_bytes;
    coord_rows_to_f32(rt, p, (r1 - r0) * cols, out);
    return 0;
}
