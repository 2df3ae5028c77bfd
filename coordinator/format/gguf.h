/* SPDX-License-Identifier: MIT */
/* coordinator/format/gguf.h: GGUF files - the format and its hostile-input-safe reader
 * (gguf_read.c: metadata, tensor infos, dequantized rows); the writer is gguf_write.h's.
 *
 * GGUF (little-endian): magic "GGUF", u32 version (2 or 3), u64 n_tensors, u64 n_kv; n_kv
 * key/values (gguf string key = u64 length + bytes, u32 type, value); n_tensors infos (name,
 * u32 n_dims, u64 dims[n_dims] (dims[0] = the contiguous row length), u32 ggml type, u64 offset
 * relative to the data section); the data section starts at the next multiple of
 * general.alignment (u32, a power of two 1..65536; default 32) after the infos.
 *
 * Tensor types this reader dequantizes: F32, F16, BF16, and ggml's blocks of 32 elements along
 * dims[0]: Q8_0 = fp16 scale + 32 int8 (34 bytes), value = scale * q; Q4_0 = fp16 scale + 16
 * bytes (18 bytes), byte j holding element j in its low nibble and element j + 16 in its high
 * one, value = scale * (nibble - 8); MXFP4 = E8M0 exponent + 16 bytes of E2M1 nibbles (17
 * bytes: gpt-oss's experts) (rows.h converts them).
 */
#ifndef SHARDLM_COORD_GGUF_H
#define SHARDLM_COORD_GGUF_H

#include "model_keys.h"
#include "util.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum gguf_type {
    GGUF_UINT8 = 0, GGUF_INT8 = 1, GGUF_UINT16 = 2, GGUF_INT16 = 3, GGUF_UINT32 = 4,
    GGUF_INT32 = 5, GGUF_FLOAT32 = 6, GGUF_BOOL = 7, GGUF_STRING = 8, GGUF_ARRAY = 9,
    GGUF_UINT64 = 10, GGUF_INT64 = 11, GGUF_FLOAT64 = 12,
};

/* ggml tensor types this reader dequantizes */
enum gguf_ggml_type {
    GGML_F32 = 0,
    GGML_F16 = 1,
    GGML_Q4_0 = 2,
    GGML_Q8_0 = 8,
    GGML_BF16 = 30,
    GGML_MXFP4 = 39,
};

struct gguf_str {
    const char *p; /* into the file image, NOT NUL-terminated */
    uint64_t len;
};

struct gguf_kv {
    struct gguf_str key;
    enum gguf_type type;
    union {
        uint64_t u;   /* unsigned integers and bool */
        int64_t i;    /* signed integers */
        double f;     /* floats */
        struct gguf_str s;
        struct {
            enum gguf_type type; /* element type (never GGUF_ARRAY: nested arrays are refused) */
            uint64_t n;
            const uint8_t *data;    /* raw elements in the image */
            struct gguf_str *strs;  /* (n) for arrays of strings, indexed at parse time */
        } arr;
    } v;
};

struct gguf_tensor {
    struct gguf_str name;
    uint32_t n_dims;          /* 1..4 */
    uint64_t dims[4];         /* dims[0]: elements per row; each >= 1 (1 past n_dims) */
    enum gguf_ggml_type type; /* any value; unsupported ones fail at read time */
    uint64_t offset;          /* absolute, in the image; a multiple of the alignment past
                               * data_offset */
    uint64_t bytes;           /* within the image; 0 for an unsupported type */
};

struct gguf_file {
    const uint8_t *base;
    size_t size;
    void *map; /* when opened from a path */
    uint32_t version;
    uint64_t n_kv, n_tensors, alignment;
    uint64_t data_offset;        /* may lie past the end of a file without tensors */
    struct gguf_kv *kv;          /* (n_kv) in file order */
    struct gguf_tensor *tensors; /* (n_tensors) in file order */
    /* private to gguf_read.c: lookups by binary search, the name used in errors */
    const struct gguf_kv **kv_by_key;          /* (n_kv) sorted by key */
    const struct gguf_tensor **tensor_by_name; /* (n_tensors) sorted by name */
    char *what;
};

/* Maps @path read-only and parses it. Returns 0 or -errno (-EPROTO: not GGUF, -EINVAL: a bad
 * field) with @e naming the file and the field. Release with gguf_close(). */
int gguf_open(struct gguf_file *g, const char *path, struct shardlm_err *e);
/* Parses an image in memory (@what names it in errors); it must outlive @g. Checks every length,
 * count and offset against the image (no allocation larger than a few times the image), refuses
 * nested arrays, unknown value types, bools other than 0/1, versions other than 2 and 3,
 * duplicate keys and tensor names, and checks tensor alignment, and bounds and overlap for the
 * types it knows (whose dims[0] must be a multiple of their block). Returns 0 or -errno as
 * gguf_open() (-ENOMEM too; @g is zeroed on failure); release with gguf_close(). */
int gguf_parse(struct gguf_file *g, const uint8_t *buf, size_t size, const char *what,
               struct shardlm_err *e);
/* Frees what gguf_parse() allocated and unmaps what gguf_open() mapped; @g is zeroed. */
void gguf_close(struct gguf_file *g);

/* The key/value named @key, or NULL (binary search). */
const struct gguf_kv *gguf_find(const struct gguf_file *g, const char *key);
/* Typed getters: 0, -ENOENT when absent, -EINVAL when of another type or out of range.
 * Integers of any integer type are accepted when they fit (bools are not integers); f32 takes
 * f32 and f64 values (finite ones within float range). */
int gguf_get_u32(const struct gguf_file *g, const char *key, uint32_t *out);
int gguf_get_f32(const struct gguf_file *g, const char *key, float *out);
int gguf_get_bool(const struct gguf_file *g, const char *key, bool *out);
int gguf_get_str(const struct gguf_file *g, const char *key, struct gguf_str *out);
/* The value of @key as a setting (model_keys.h): ABSENT, NUM for every numeric type (exactly),
 * BOOL, STR, or OTHER for an array; ->type names the GGUF type ("u32", "f64", "string"). */
void gguf_get_val(const struct gguf_file *g, const char *key, struct coord_val *out);
/* An array of @type (for GGUF_STRING, use kv->v.arr.strs). */
const struct gguf_kv *gguf_get_arr(const struct gguf_file *g, const char *key,
                                   enum gguf_type type);
/* Element @i of a numeric array as a double (any numeric element type, bool as 0/1); NAN for
 * an array of strings or @i out of range. */
double gguf_arr_num(const struct gguf_kv *kv, uint64_t i);
bool gguf_str_eq(struct gguf_str s, const char *c);

/* The tensor named @name, or NULL (binary search). */
const struct gguf_tensor *gguf_tensor(const struct gguf_file *g, const char *name);
/* Dequantizes rows [r0, r1) of @t (a row = dims[0] elements; rows = product of dims[1..]) into
 * @out ((r1 - r0) * dims[0] floats). Returns 0 or -EINVAL (unsupported type, rows out of range)
 * with @e set. */
int gguf_read_rows(const struct gguf_file *g, const struct gguf_tensor *t, uint64_t r0,
                   uint64_t r1, float *out, struct shardlm_err *e);
/* Rows of @t: the product of dims[1..n_dims) (1 for a 1-D tensor). */
uint64_t gguf_tensor_rows(const struct gguf_tensor *t);

#endif
