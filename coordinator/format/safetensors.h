/* SPDX-License-Identifier: MIT */
/* coordinator/format/safetensors.h: safetensors files - a hostile-input-safe reader (header,
 * tensor bounds, rows as float32) and the sets of files a Hugging Face directory holds
 * (model.safetensors, or shards listed by model.safetensors.index.json).
 *
 * safetensors (little-endian): u64 N, then N bytes of JSON
 *   {"name": {"dtype": "F32", "shape": [rows, cols], "data_offsets": [begin, end]}, ...,
 *    "__metadata__": {"format": "pt"}}
 * then the data; offsets are relative to the end of the header (8 + N), row-major.
 */
#ifndef SHARDLM_COORD_SAFETENSORS_H
#define SHARDLM_COORD_SAFETENSORS_H

#include "util.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ST_HEADER_MAX (100u << 20) /* JSON header bytes; real ones are a few hundred KB */
#define ST_MAX_DIMS 4
#define ST_MAX_FILES 4096 /* shards of one model */

/* Element types of the format. Every one is bounds-checked; st_read_rows() converts F32, F16
 * and BF16 only and refuses the others by name. */
enum st_dtype {
    ST_F32, ST_F16, ST_BF16, ST_F64, ST_I64, ST_I32, ST_I16, ST_I8, ST_U64, ST_U32, ST_U16,
    ST_U8, ST_BOOL, ST_F8_E4M3, ST_F8_E5M2, ST_DTYPE_COUNT
};

struct st_tensor {
    char *name; /* NUL-terminated, owned by the file's st_file */
    enum st_dtype dtype;
    int n_dims;                   /* 1..ST_MAX_DIMS */
    uint64_t shape[ST_MAX_DIMS]; /* shape[n_dims - 1] is the row length */
    uint64_t offset;              /* absolute, in the image */
    uint64_t bytes;               /* product(shape) * st_dtype_size(dtype) */
};

struct st_file {
    const uint8_t *base;
    size_t size;
    void *map; /* when opened from a path (mmap, PROT_READ) */
    uint64_t data_offset;           /* 8 + N */
    struct st_tensor *tensors;      /* (n_tensors), sorted by name */
    size_t n_tensors;
    char *names;                    /* backing store of the tensor names */
};

const char *st_dtype_name(enum st_dtype t);
size_t st_dtype_size(enum st_dtype t);
/* Whether st_read_rows() converts @t (F32, F16, BF16). */
bool st_dtype_readable(enum st_dtype t);

/* Parses the image @buf of @size bytes (@what names it in errors; it must outlive @f): header
 * length against the file and ST_HEADER_MAX, the JSON (no duplicate names), every field's type,
 * dtype, shape (1..4 dims, each >= 1, no overflow), data_offsets against the shape and the data
 * region, and that no two tensors overlap. Returns 0 or -EINVAL with @e naming @what, the tensor
 * and the field (-ENOMEM when out of memory). Release with st_close(). */
int st_parse(struct st_file *f, const uint8_t *buf, size_t size, const char *what,
             struct shardlm_err *e);
/* Maps @path read-only and parses it. Returns 0 or -errno with @e set. */
int st_open(struct st_file *f, const char *path, struct shardlm_err *e);
void st_close(struct st_file *f);

/* The tensor called @name, or NULL. */
const struct st_tensor *st_find(const struct st_file *f, const char *name);
/* Rows of @t: the product of every dim but the last. */
uint64_t st_tensor_rows(const struct st_tensor *t);
/* Converts rows [r0, r1) of @t into @out as float32 (r1 - r0 rows of shape[n_dims-1] floats).
 * Returns 0, or -EINVAL (a dtype that is not F32/F16/BF16, rows out of range) with @e naming
 * @what and the tensor. */
int st_read_rows(const struct st_file *f, const struct st_tensor *t, uint64_t r0, uint64_t r1,
                 float *out, const char *what, struct shardlm_err *e);

/* The safetensors of a model directory. */
struct st_set {
    int n_files;
    struct st_file *files; /* (n_files) */
    char **paths;          /* (n_files) full paths, for errors */
    struct st_ref {
        const char *name; /* into files[file].tensors[tensor].name */
        int file;
        uint32_t tensor;
    } *refs;               /* (n_refs) every tensor of every file, sorted by name */
    size_t n_refs;
};

/* Opens @dir/model.safetensors.index.json ({"weight_map": {"tensor": "file", ...}}) and every
 * file it names (plain names: no '/', no ".."), or else @dir/model.safetensors. Checks that each
 * weight_map entry is in the file it names and that no tensor is in two files. Returns 0 or
 * -errno with @e naming the file and the field. Release with st_set_close(). */
int st_set_open(struct st_set *s, const char *dir, struct shardlm_err *e);
void st_set_close(struct st_set *s);
/* The tensor called @name and (in *@file, its index) the file that holds it, or NULL. */
const struct st_tensor *st_set_find(const struct st_set *s, const char *name, int *file);

#endif
