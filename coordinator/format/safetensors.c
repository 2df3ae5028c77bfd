/* SPDX-License-Identifier: MIT */
/* coordinator/format/safetensors.c: the safetensors reader that trusts nothing, and the file sets
 * of a model directory. */
#include "safetensors.h"

#include "rows.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors data is little-endian");

#define ST_INDEX_MAX (64u << 20) /* model.safetensors.index.json bytes */
#define ST_NAME_MAX 1024         /* tensor name bytes */

static const struct {
    const char *name;
    size_t size;
} dtypes[ST_DTYPE_COUNT] = {
    [ST_F32] = {"F32", 4},   [ST_F16] = {"F16", 2},         [ST_BF16] = {"BF16", 2},
    [ST_F64] = {"F64", 8},   [ST_I64] = {"I64", 8},         [ST_I32] = {"I32", 4},
    [ST_I16] = {"I16", 2},   [ST_I8] = {"I8", 1},           [ST_U64] = {"U64", 8},
    [ST_U32] = {"U32", 4},   [ST_U16] = {"U16", 2},         [ST_U8] = {"U8", 1},
    [ST_BOOL] = {"BOOL", 1}, [ST_F8_E4M3] = {"F8_E4M3", 1}, [ST_F8_E5M2] = {"F8_E5M2", 1},
};

const char *st_dtype_name(enum st_dtype t)
{
    return (unsigned)t < ST_DTYPE_COUNT ? dtypes[t].name : "?";
}

size_t st_dtype_size(enum st_dtype t)
{
    return (unsigned)t < ST_DTYPE_COUNT ? dtypes[t].size : 0;
}

bool st_dtype_readable(enum st_dtype t)
{
    return t == ST_F32 || t == ST_F16 || t == ST_BF16;
}

void st_close(struct st_file *f)
{
    free(f->tensors);
    free(f->names);
    if (f->map)
        munmap(f->map, f->size);
    memset(f, 0, sizeof(*f));
}

static int cmp_tensor_name(const void *a, const void *b)
{
    return strcmp(((const struct st_tensor *)a)->name, ((const struct st_tensor *)b)->name);
}

static int cmp_tensor_offset(const void *a, const void *b)
{
    const struct st_tensor *x = *(const struct st_tensor *const *)a;
    const struct st_tensor *y = *(const struct st_tensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* A JSON integer in [lo, hi], or false. */
static bool json_uint(const json_t *v, uint64_t hi, uint64_t *out)
{
    if (!json_is_integer(v))
        return false;
    json_int_t i = json_integer_value(v);
    if (i < 0 || (uint64_t)i > hi)
        return false;
    *out = (uint64_t)i;
    return true;
}

/* Checks one tensor entry @v called @name against the data region of @data_len bytes and fills
 * @t (name excepted). */
static int parse_tensor(struct st_tensor *t, const char *name, const json_t *v, uint64_t data_off,
                        uint64_t data_len, const char *what, struct shardlm_err *e)
{
    if (!json_is_object(v))
        return shardlm_fail(e, -EINVAL,
                            "%s: tensor %.200s: expected an object with dtype, shape "
                            "and data_offsets",
                            what, name);
    const json_t *dt = json_object_get(v, "dtype");
    if (!json_is_string(dt))
        return shardlm_fail(e, -EINVAL, "%s: tensor %.200s: field dtype: expected a string", what,
                            name);
    const char *ds = json_string_value(dt);
    int d = 0;
    while (d < ST_DTYPE_COUNT && strcmp(ds, dtypes[d].name) != 0)
        d++;
    if (d == ST_DTYPE_COUNT) {
        char shown[100];
        return shardlm_fail(e, -EINVAL,
                            "%s: tensor %.200s: field dtype: unknown dtype \"%s\" "
                            "(expected F32, F16, BF16 or another safetensors type)",
                            what, name, coord_escape(shown, sizeof(shown), ds, strlen(ds)));
    }
    t->dtype = (enum st_dtype)d;

    const json_t *sh = json_object_get(v, "shape");
    size_t nd = json_is_array(sh) ? json_array_size(sh) : 0;
    if (nd < 1 || nd > ST_MAX_DIMS)
        return shardlm_fail(e, -EINVAL,
                            "%s: tensor %.200s: field shape: expected an array of 1..%d dims", what,
                            name, ST_MAX_DIMS);
    uint64_t n = 1;
    t->n_dims = (int)nd;
    for (size_t i = 0; i < nd; i++) {
        uint64_t dim;
        if (!json_uint(json_array_get(sh, i), UINT64_MAX, &dim) || dim < 1)
            return shardlm_fail(e, -EINVAL,
                                "%s: tensor %.200s: field shape[%zu]: expected an "
                                "integer >= 1",
                                what, name, i);
        if (__builtin_mul_overflow(n, dim, &n))
            return shardlm_fail(e, -EINVAL,
                                "%s: tensor %.200s: field shape: element count "
                                "overflows",
                                what, name);
        t->shape[i] = dim;
    }
    if (__builtin_mul_overflow(n, (uint64_t)dtypes[d].size, &t->bytes))
        return shardlm_fail(e, -EINVAL, "%s: tensor %.200s: field shape: byte count overflows",
                            what, name);

    const json_t *off = json_object_get(v, "data_offsets");
    uint64_t b, end;
    if (!json_is_array(off) || json_array_size(off) != 2 ||
        !json_uint(json_array_get(off, 0), UINT64_MAX, &b) ||
        !json_uint(json_array_get(off, 1), UINT64_MAX, &end) || end < b)
        return shardlm_fail(e, -EINVAL,
                            "%s: tensor %.200s: field data_offsets: expected [begin, "
                            "end], integers with 0 <= begin <= end",
                            what, name);
    if (end > data_len)
        return shardlm_fail(e, -EINVAL,
                            "%s: tensor %.200s: field data_offsets: end %llu is past "
                            "the %llu data bytes of the file (truncated?)",
                            what, name, (unsigned long long)end, (unsigned long long)data_len);
    if (end - b != t->bytes)
        return shardlm_fail(e, -EINVAL,
                            "%s: tensor %.200s: field data_offsets: [%llu, %llu] is "
                            "%llu bytes, the shape and dtype %s need %llu",
                            what, name, (unsigned long long)b, (unsigned long long)end,
                            (unsigned long long)(end - b), dtypes[d].name,
                            (unsigned long long)t->bytes);
    t->offset = data_off + b;
    return 0;
}

static int parse_header(struct st_file *f, json_t *root, const char *what, struct shardlm_err *e)
{
    uint64_t data_len = f->size - f->data_offset;
    if (!json_is_object(root))
        return shardlm_fail(e, -EINVAL, "%s: header: expected a JSON object", what);
    size_t n = 0, name_bytes = 0;
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (strcmp(key, "__metadata__") == 0) {
            if (!json_is_object(v))
                return shardlm_fail(e, -EINVAL, "%s: field __metadata__: expected an object", what);
            continue;
        }
        size_t len = strlen(key);
        if (len == 0 || len > ST_NAME_MAX)
            return shardlm_fail(e, -EINVAL, "%s: tensor name of %zu bytes: expected 1..%d", what,
                                len, ST_NAME_MAX);
        for (size_t i = 0; i < len; i++)
            if ((unsigned char)key[i] < 0x20 || key[i] == 0x7f)
                return shardlm_fail(e, -EINVAL,
                                    "%s: tensor name \"%.*s...\" contains a control "
                                    "character",
                                    what, (int)i, key);
        n++;
        name_bytes += len + 1;
    }
    if (n == 0)
        return shardlm_fail(e, -EINVAL, "%s: header lists no tensors", what);
    f->tensors = calloc(n, sizeof(*f->tensors));
    f->names = malloc(name_bytes);
    struct st_tensor **by_off = calloc(n, sizeof(*by_off));
    int rc = 0;
    if (!f->tensors || !f->names || !by_off) {
        rc = shardlm_fail(e, -ENOMEM, "%s: out of memory for %zu tensors", what, n);
        goto out_free;
    }
    char *p = f->names;
    json_object_foreach(root, key, v) {
        if (strcmp(key, "__metadata__") == 0)
            continue;
        struct st_tensor *t = &f->tensors[f->n_tensors];
        rc = parse_tensor(t, key, v, f->data_offset, data_len, what, e);
        if (rc)
            goto out_free;
        size_t len = strlen(key) + 1;
        memcpy(p, key, len);
        t->name = p;
        p += len;
        by_off[f->n_tensors++] = t;
    }
    /* tensors must not overlap: sorted by offset, each ends before the next begins */
    qsort(by_off, n, sizeof(*by_off), cmp_tensor_offset);
    for (size_t i = 1; i < n; i++)
        if (by_off[i - 1]->offset + by_off[i - 1]->bytes > by_off[i]->offset) {
            rc = shardlm_fail(e, -EINVAL,
                              "%s: tensors %.200s and %.200s overlap (field "
                              "data_offsets)",
                              what, by_off[i - 1]->name, by_off[i]->name);
            goto out_free;
        }
    free(by_off);
    by_off = NULL;
    qsort(f->tensors, n, sizeof(*f->tensors), cmp_tensor_name);
    for (size_t i = 1; i < n; i++) /* JSON_REJECT_DUPLICATES already refuses them */
        if (strcmp(f->tensors[i - 1].name, f->tensors[i].name) == 0) {
            rc = shardlm_fail(e, -EINVAL, "%s: tensor %.200s appears twice", what,
                              f->tensors[i].name);
            goto out_free;
        }
    return 0;
out_free:
    free(by_off);
    return rc;
}

int st_parse(struct st_file *f, const uint8_t *buf, size_t size, const char *what,
             struct shardlm_err *e)
{
    memset(f, 0, sizeof(*f));
    if (size < 8)
        return shardlm_fail(e, -EINVAL,
                            "%s: truncated: %zu bytes, shorter than the 8-byte header "
                            "length",
                            what, size);
    uint64_t n;
    memcpy(&n, buf, 8);
    if (n > ST_HEADER_MAX)
        return shardlm_fail(e, -EINVAL, "%s: header length is %llu bytes, more than the %u allowed",
                            what, (unsigned long long)n, ST_HEADER_MAX);
    if (n > size - 8)
        return shardlm_fail(e, -EINVAL,
                            "%s: header length %llu runs past the end of the file "
                            "(%zu bytes; truncated?)",
                            what, (unsigned long long)n, size);
    f->base = buf;
    f->size = size;
    f->data_offset = 8 + n;
    json_error_t jerr;
    json_t *root = json_loadb((const char *)buf + 8, (size_t)n, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return shardlm_fail(e, -EINVAL, "%s: header JSON, line %d column %d: %s", what, jerr.line,
                            jerr.column, jerr.text);
    int rc = parse_header(f, root, what, e);
    json_decref(root);
    if (rc)
        st_close(f);
    return rc;
}

int st_open(struct st_file *f, const char *path, struct shardlm_err *e)
{
    memset(f, 0, sizeof(*f));
    void *map;
    size_t size;
    int rc = coord_map_file(path, &map, &size, e);
    if (rc)
        return rc;
    if (size < 8) {
        if (map)
            munmap(map, size);
        return shardlm_fail(e, -EINVAL,
                            "%s: truncated: %zu bytes, shorter than the 8-byte header "
                            "length",
                            path, size);
    }
    rc = st_parse(f, map, size, path, e);
    if (rc) {
        munmap(map, size);
        return rc;
    }
    f->map = map;
    return 0;
}

const struct st_tensor *st_find(const struct st_file *f, const char *name)
{
    struct st_tensor key = {.name = (char *)name};
    if (!f->n_tensors)
        return NULL;
    return bsearch(&key, f->tensors, f->n_tensors, sizeof(key), cmp_tensor_name);
}

uint64_t st_tensor_rows(const struct st_tensor *t)
{
    uint64_t r = 1;
    for (int i = 0; i + 1 < t->n_dims; i++)
        r *= t->shape[i]; /* bounded by the element count checked at parse time */
    return r;
}

int st_read_rows(const struct st_file *f, const struct st_tensor *t, uint64_t r0, uint64_t r1,
                 float *out, const char *what, struct shardlm_err *e)
{
    if (!st_dtype_readable(t->dtype))
        return shardlm_fail(e, -EINVAL,
                            "%s: tensor %.200s: dtype %s is not supported (expected "
                            "F32, F16 or BF16)",
                            what, t->name, st_dtype_name(t->dtype));
    uint64_t rows = st_tensor_rows(t), cols = t->shape[t->n_dims - 1];
    if (r0 > r1 || r1 > rows)
        return shardlm_fail(e, -EINVAL, "%s: tensor %.200s: rows %llu..%llu outside its %llu rows",
                            what, t->name, (unsigned long long)r0, (unsigned long long)r1,
                            (unsigned long long)rows);
    size_t es = st_dtype_size(t->dtype);
    enum coord_rows_type rt = t->dtype == ST_F32   ? COORD_ROWS_F32
                              : t->dtype == ST_F16 ? COORD_ROWS_F16
                                                   : COORD_ROWS_BF16;
    coord_rows_to_f32(rt, f->base + t->offset + r0 * cols * es, (r1 - r0) * cols, out);
    return 0;
}

/* ---- sets of files ---- */

void st_set_close(struct st_set *s)
{
    for (int i = 0; i < s->n_files; i++) {
        st_close(&s->files[i]);
        if (s->paths)
            free(s->paths[i]);
    }
    free(s->files);
    free(s->paths);
    free(s->refs);
    memset(s, 0, sizeof(*s));
}

static int cmp_ref(const void *a, const void *b)
{
    return strcmp(((const struct st_ref *)a)->name, ((const struct st_ref *)b)->name);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

const struct st_tensor *st_set_find(const struct st_set *s, const char *name, int *file)
{
    struct st_ref key = {.name = name};
    if (!s->n_refs)
        return NULL;
    const struct st_ref *r = bsearch(&key, s->refs, s->n_refs, sizeof(key), cmp_ref);
    if (!r)
        return NULL;
    if (file)
        *file = r->file;
    return &s->files[r->file].tensors[r->tensor];
}

/* A shard's file name: a plain name in the model directory. */
static bool plain_name(const char *n)
{
    size_t len = strlen(n);
    if (len == 0 || len > 255 || strchr(n, '/') || strstr(n, ".."))
        return false;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)n[i] < 0x20 || n[i] == 0x7f || n[i] == '\\')
            return false;
    return true;
}

/* Fills s->paths with @dir/name for the @n distinct names of @names (sorted) and opens them. */
static int open_files(struct st_set *s, const char *dir, const char *const *names, int n,
                      struct shardlm_err *e)
{
    s->files = calloc((size_t)n, sizeof(*s->files));
    s->paths = calloc((size_t)n, sizeof(*s->paths));
    if (!s->files || !s->paths)
        return shardlm_fail(e, -ENOMEM, "%s: out of memory", dir);
    s->n_files = n; /* st_set_close() copes with the ones not opened yet */
    for (int i = 0; i < n; i++) {
        size_t len = strlen(dir) + strlen(names[i]) + 2;
        s->paths[i] = malloc(len);
        if (!s->paths[i])
            return shardlm_fail(e, -ENOMEM, "%s: out of memory", dir);
        snprintf(s->paths[i], len, "%s/%s", dir, names[i]);
        int rc = st_open(&s->files[i], s->paths[i], e);
        if (rc)
            return rc;
    }
    return 0;
}

/* Indexes every tensor of every file by name; a name in two files is an error. */
static int index_refs(struct st_set *s, struct shardlm_err *e)
{
    size_t n = 0;
    for (int i = 0; i < s->n_files; i++)
        n += s->files[i].n_tensors;
    s->refs = calloc(n, sizeof(*s->refs));
    if (!s->refs)
        return shardlm_fail(e, -ENOMEM, "out of memory for %zu tensors", n);
    for (int i = 0; i < s->n_files; i++)
        for (size_t j = 0; j < s->files[i].n_tensors; j++) {
            struct st_ref *r = &s->refs[s->n_refs++];
            r->name = s->files[i].tensors[j].name;
            r->file = i;
            r->tensor = (uint32_t)j;
        }
    qsort(s->refs, s->n_refs, sizeof(*s->refs), cmp_ref);
    for (size_t i = 1; i < s->n_refs; i++)
        if (strcmp(s->refs[i - 1].name, s->refs[i].name) == 0)
            return shardlm_fail(e, -EINVAL, "tensor %.200s is in both %s and %s", s->refs[i].name,
                                s->paths[s->refs[i - 1].file], s->paths[s->refs[i].file]);
    return 0;
}

static int open_index(struct st_set *s, const char *dir, const char *ipath, struct shardlm_err *e)
{
    uint8_t *buf;
    size_t len;
    int rc = coord_read_file(ipath, ST_INDEX_MAX, &buf, &len, e);
    if (rc)
        return rc;
    json_error_t jerr;
    json_t *root = json_loadb((const char *)buf, len, JSON_REJECT_DUPLICATES, &jerr);
    free(buf);
    if (!root)
        return shardlm_fail(e, -EINVAL, "%s: line %d column %d: %s", ipath, jerr.line, jerr.column,
                            jerr.text);
    const char **names = NULL;
    const json_t *wm = json_is_object(root) ? json_object_get(root, "weight_map") : NULL;
    size_t n = json_is_object(wm) ? json_object_size(wm) : 0;
    if (n == 0) {
        rc = shardlm_fail(e, -EINVAL,
                          "%s: field weight_map: expected a non-empty object of "
                          "\"tensor\": \"file\"",
                          ipath);
        goto out_decref;
    }
    names = calloc(n, sizeof(*names));
    if (!names) {
        rc = shardlm_fail(e, -ENOMEM, "%s: out of memory", ipath);
        goto out_decref;
    }
    const char *key;
    json_t *v;
    size_t k = 0;
    json_object_foreach((json_t *)wm, key, v) {
        if (!json_is_string(v) || !plain_name(json_string_value(v))) {
            rc = shardlm_fail(e, -EINVAL,
                              "%s: field weight_map.%.200s: expected a plain file name "
                              "in the model directory (no '/' or '..')",
                              ipath, key);
            goto out_free;
        }
        names[k++] = json_string_value(v);
    }
    qsort(names, n, sizeof(*names), cmp_str);
    int files = 0;
    for (size_t i = 0; i < n; i++)
        if (i == 0 || strcmp(names[i], names[files - 1]) != 0)
            names[files++] = names[i];
    if (files > ST_MAX_FILES) {
        rc = shardlm_fail(e, -EINVAL, "%s: field weight_map names %d files, more than %d", ipath,
                          files, ST_MAX_FILES);
        goto out_free;
    }
    rc = open_files(s, dir, names, files, e);
    if (rc)
        goto out_free;
    rc = index_refs(s, e);
    if (rc)
        goto out_free;
    /* each entry is where the index says */
    json_object_foreach((json_t *)wm, key, v) {
        int f = -1;
        const char *want = json_string_value(v);
        const struct st_tensor *t = st_set_find(s, key, &f);
        const char **at = bsearch(&want, names, (size_t)files, sizeof(*names), cmp_str);
        if (!t || !at || f != (int)(at - names)) {
            rc = shardlm_fail(e, -EINVAL, "%s: field weight_map.%.200s: tensor is not in %s%s%s",
                              ipath, key, want, t ? ", it is in " : "", t ? s->paths[f] : "");
            goto out_free;
        }
    }
out_free:
    free(names);
out_decref:
    json_decref(root);
    return rc;
}

int st_set_open(struct st_set *s, const char *dir, struct shardlm_err *e)
{
    memset(s, 0, sizeof(*s));
    size_t len = strlen(dir) + 64;
    char *p = malloc(len);
    if (!p)
        return shardlm_fail(e, -ENOMEM, "%s: out of memory", dir);
    int rc;
    snprintf(p, len, "%s/model.safetensors.index.json", dir);
    if (access(p, F_OK) == 0) {
        rc = open_index(s, dir, p, e);
    } else {
        snprintf(p, len, "%s/model.safetensors", dir);
        if (access(p, F_OK) != 0) {
            rc = shardlm_fail(e, -ENOENT,
                              "%s: no model.safetensors or "
                              "model.safetensors.index.json",
                              dir);
        } else {
            static const char *const one[] = {"model.safetensors"};
            rc = open_files(s, dir, one, 1, e);
            if (!rc)
                rc = index_refs(s, e);
        }
    }
    free(p);
    if (rc)
        st_set_close(s);
    return rc;
}
