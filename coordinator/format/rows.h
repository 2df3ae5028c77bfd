/* SPDX-License-Identifier: MIT */
/* coordinator/format/rows.h: the element types model files store rows in (F32, F16, BF16 and
 * ggml's Q8_0 and Q4_0 blocks) - their block shapes and their conversion to float32, one
 * implementation for the GGUF and safetensors readers.
 *
 * Q8_0 and Q4_0 are blocks of 32 elements along a row (ggml-common.h block_q8_0, block_q4_0):
 * Q8_0 = fp16 scale + 32 int8 (34 bytes), value = scale * q; Q4_0 = fp16 scale + 16 bytes (18
 * bytes), byte j holding element j in its low nibble and element j + 16 in its high one,
 * value = scale * (nibble - 8). All fields little-endian. */
#ifndef SHARDLM_COORD_ROWS_H
#define SHARDLM_COORD_ROWS_H

#include <stdint.h>

enum coord_rows_type {
    COORD_ROWS_F32,
    COORD_ROWS_F16,
    COORD_ROWS_BF16,
    COORD_ROWS_Q8_0,
    COORD_ROWS_Q4_0,
    COORD_ROWS_COUNT
};

struct coord_rows_traits {
    const char *name;   /* "F32", "F16", "BF16", "Q8_0", "Q4_0" */
    uint32_t blk;       /* elements per block (1 for the plain types) */
    uint32_t blk_bytes; /* bytes per block */
};

/* (COORD_ROWS_COUNT) indexed by enum coord_rows_type */
extern const struct coord_rows_traits coord_rows_traits[COORD_ROWS_COUNT];

/* Converts the @n elements at @src (stored as @type; @n a multiple of its block, @src holding
 * n / blk whole blocks, any alignment) into @out as float32. */
void coord_rows_to_f32(enum coord_rows_type type, const uint8_t *src, uint64_t n, float *out);

#endif
