/* SPDX-License-Identifier: MIT */
/* Fuzz target for the safetensors header parser (coordinator/format/safetensors.c).
 *
 * Input: a safetensors image. When st_parse() accepts it, every tensor is looked up by name and
 * the first row of each is read as float32 (those of an unconverted dtype must be refused), so a
 * sanitizer sees any bound the parser let through that the data does not have. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* an exact-size copy so a read past the end is caught */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf)
        return 0;
    memcpy(buf, data, size);
    struct st_file f;
    struct shardlm_err e;
    if (st_parse(&f, buf, size, "fuzz", &e) == 0) {
        volatile float sink = 0;
        for (size_t i = 0; i < f.n_tensors; i++) {
            const struct st_tensor *t = &f.tensors[i];
            if (st_find(&f, t->name) != t)
                __builtin_trap();
            if (t->offset < f.data_offset || t->offset > size || t->bytes > size - t->offset)
                __builtin_trap();
            uint64_t cols = t->shape[t->n_dims - 1];
            float *row = malloc((size_t)cols * sizeof(float)); /* cols <= bytes <= size */
            if (!row)
                break;
            int rc = st_read_rows(&f, t, 0, 1, row, "fuzz", &e);
            if (rc != (st_dtype_readable(t->dtype) ? 0 : -EINVAL))
                __builtin_trap();
            if (rc == 0)
                for (uint64_t c = 0; c < cols; c++)
                    sink += row[c];
            if (st_read_rows(&f, t, 0, st_tensor_rows(t) + 1, row, "fuzz", &e) != -EINVAL)
                __builtin_trap();
            free(row);
        }
        (void)sink;
        st_close(&f);
    }
    free(buf);
    return 0;
}
