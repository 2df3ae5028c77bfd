/* SPDX-License-Identifier: MIT */
/* Fuzz target for the GGUF reader (coordinator/format/gguf_read.c): the bytes are a whole image.
 *
 * A refused image must leave a one-line message and an empty struct. When gguf_parse() accepts,
 * everything it promised is used: every typed getter over every key (a key without a NUL byte
 * must be found again, duplicates being refused), the first and last element of every array
 * (and the bytes of its first and last strings), and for every tensor of a supported type its
 * first and last rows are dequantized; the parser promised they lie inside the image. Seeds:
 * corpus/gguf/, written by `test_gguf --write-corpus tests/fuzz/corpus/gguf`. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"

static volatile uint64_t sink;

static void touch(struct gguf_str s)
{
    uint64_t h = s.len;
    for (uint64_t i = 0; i < s.len; i++)
        h = h * 31 + (unsigned char)s.p[i];
    sink += h;
}

static void use_kv(const struct gguf_file *g, const struct gguf_kv *kv)
{
    touch(kv->key);
    char *key = malloc(kv->key.len + 1);
    if (!key)
        return;
    memcpy(key, kv->key.p, kv->key.len);
    key[kv->key.len] = 0;
    if (strlen(key) == kv->key.len && gguf_find(g, key) != kv)
        __builtin_trap();
    uint32_t u;
    float f;
    bool b;
    struct gguf_str s;
    if (gguf_get_u32(g, key, &u) == 0)
        sink += u;
    if (gguf_get_f32(g, key, &f) == 0)
        sink += (uint64_t)(f == f);
    if (gguf_get_bool(g, key, &b) == 0)
        sink += b;
    if (gguf_get_str(g, key, &s) == 0)
        touch(s);
    for (int t = GGUF_UINT8; t <= GGUF_FLOAT64; t++) {
        const struct gguf_kv *a = gguf_get_arr(g, key, (enum gguf_type)t);
        if (!a || a->v.arr.n == 0)
            continue;
        if (t == GGUF_STRING) {
            touch(a->v.arr.strs[0]);
            touch(a->v.arr.strs[a->v.arr.n - 1]);
        } else {
            double x = gguf_arr_num(a, 0) + gguf_arr_num(a, a->v.arr.n - 1);
            sink += (uint64_t)(x == x);
        }
    }
    free(key);
}

static void use_tensor(const struct gguf_file *g, const struct gguf_tensor *t)
{
    struct shardlm_err e;
    touch(t->name);
    uint64_t rows = gguf_tensor_rows(t), cols = t->dims[0];
    if (!t->bytes) {
        if (gguf_read_rows(g, t, 0, 1, NULL, &e) != -EINVAL) /* unsupported type */
            __builtin_trap();
        return;
    }
    if (t->offset < g->data_offset || t->offset > g->size || t->bytes > g->size - t->offset)
        __builtin_trap();
    /* a row costs at least 18 bytes per 32 elements in the image: cols floats fit in ~8x */
    float *row = malloc(cols * sizeof(float));
    if (!row)
        return;
    if (gguf_read_rows(g, t, 0, 1, row, &e) || gguf_read_rows(g, t, rows - 1, rows, row, &e))
        __builtin_trap();
    sink += (uint64_t)(row[0] == row[0]);
    free(row);
    if (gguf_read_rows(g, t, rows, rows + 1, NULL, &e) != -EINVAL)
        __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* an exact-size copy, so ASan sees any read past the end */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf)
        return 0;
    memcpy(buf, data, size);
    struct gguf_file g;
    struct shardlm_err e;
    e.msg[0] = 0;
    if (gguf_parse(&g, buf, size, "fuzz", &e) == 0) {
        for (uint64_t i = 0; i < g.n_kv; i++)
            use_kv(&g, &g.kv[i]);
        for (uint64_t i = 0; i < g.n_tensors; i++) {
            char *name = malloc(g.tensors[i].name.len + 1);
            if (name) {
                memcpy(name, g.tensors[i].name.p, g.tensors[i].name.len);
                name[g.tensors[i].name.len] = 0;
                if (strlen(name) == g.tensors[i].name.len &&
                    gguf_tensor(&g, name) != &g.tensors[i])
                    __builtin_trap();
                free(name);
            }
            use_tensor(&g, &g.tensors[i]);
        }
        gguf_close(&g);
    } else if (!e.msg[0] || strchr(e.msg, '\n') || g.kv || g.tensors) {
        __builtin_trap();
    }
    free(buf);
    return 0;
}
