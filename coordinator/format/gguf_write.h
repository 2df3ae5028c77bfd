/* SPDX-License-Identifier: MIT */
/* coordinator/format/gguf_write.h: the streaming GGUF writer (gguf_write.c), for `shardlm synth`
 * and the tests; the format is described in gguf.h. */
#ifndef SHARDLM_COORD_GGUF_WRITE_H
#define SHARDLM_COORD_GGUF_WRITE_H

#include "gguf.h"

/* Writer: metadata first, then tensor infos and data; used by `shardlm synth` and the tests.
 * Keys and tensor infos are buffered in memory; the first gguf_w_tensor_rows() (or the close,
 * without tensors) writes the header (version 3, general.alignment = u32 32 first), the
 * key/values and the infos to @path.tmp.<pid>, then the data streams, each tensor padded to 32
 * bytes. Misuse (a key or tensor declared twice or after the first rows, rows past a tensor's
 * end, missing rows at close) is an assertion; I/O and allocation failures are remembered and
 * returned by gguf_writer_close(). */
struct gguf_writer;
/* Creates the temporary file. Returns 0 or -errno with @e naming it. */
int gguf_writer_open(struct gguf_writer **w, const char *path, struct shardlm_err *e);
void gguf_w_u32(struct gguf_writer *w, const char *key, uint32_t v);
void gguf_w_f32(struct gguf_writer *w, const char *key, float v);
void gguf_w_bool(struct gguf_writer *w, const char *key, bool v);
void gguf_w_str(struct gguf_writer *w, const char *key, const char *v);
void gguf_w_arr_str(struct gguf_writer *w, const char *key, const char *const *v, uint64_t n);
void gguf_w_arr_f32(struct gguf_writer *w, const char *key, const float *v, uint64_t n);
void gguf_w_arr_i32(struct gguf_writer *w, const char *key, const int32_t *v, uint64_t n);
/* Declares a tensor of @type (GGML_F32, GGML_F16, or GGML_MXFP4 of @cols a multiple of 32) with
 * dims[0] = @cols, dims[1] = @rows (1-D
 * when rows == 0); its data comes later, in declaration order, through gguf_w_tensor_rows(). */
void gguf_w_tensor(struct gguf_writer *w, const char *name, enum gguf_ggml_type type,
                   uint64_t cols, uint64_t rows);
/* A 3-D tensor of @mats matrices of @rows x @cols (ggml's [cols, rows, mats]: a MoE layer's
 * experts), its data @mats * @rows rows (gguf_w_tensor_rows); @mats 1 is gguf_w_tensor(). */
void gguf_w_tensor3(struct gguf_writer *w, const char *name, enum gguf_ggml_type type,
                    uint64_t cols, uint64_t rows, uint64_t mats);
/* Appends @n_rows rows of the current tensor (float32, converted to its type: F16 rounds to
 * nearest even, MXFP4 as coord_rows_mxfp4_block); tensors are filled in declaration order, each
 * completely, and one call never runs past the current tensor's last row (a 1-D tensor is one row).
 */
void gguf_w_tensor_rows(struct gguf_writer *w, const float *rows, uint64_t n_rows);
/* Writes the file atomically (flush, fsync, rename over @path). Returns 0 or -errno with @e set
 * (the temporary file is then removed); frees @w either way. */
int gguf_writer_close(struct gguf_writer *w, struct shardlm_err *e);
/* Gives up: removes the temporary file and frees @w (after a failure elsewhere). */
void gguf_writer_abort(struct gguf_writer *w);

#endif
