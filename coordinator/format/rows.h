/* SPDX-License-Identifier: MIT */
/* coordinator/format/rows.h: the element types model files store rows in (F32, F16, BF16 and
 * ggml's Q8_0, Q4_0 and MXFP4 blocks) - their block shapes and their conversion to float32, one
 * implementation for the GGUF and safetensors readers.
 *
 * Q8_0 and Q4_0 are blocks of 32 elements along a row (ggml-common.h block_q8_0, block_q4_0):
 * Q8_0 = fp16 scale + 32 int8 (34 bytes), value = scale * q; Q4_0 = fp16 scale + 16 bytes (18
 * bytes), byte j holding element j in its low nibble and element j + 16 in its high one,
 * value = scale * (nibble - 8); MXFP4 (OCP microscaling FP4, gpt-oss's experts) = E8M0 exponent
 * e + 16 bytes (17 bytes), nibbles placed as Q4_0's, each an E2M1 number: value =
 * 2^(e - 128) * {0, 1, 2, 3, 4, 6, 8, 12}[nibble & 7], negative where nibble & 8 (ggml's
 * kvalues_mxfp4 with its half scale). All fields little-endian. */
#ifndef SHARDLM_COORD_ROWS_H
#define SHARDLM_COORD_ROWS_H

#include <stdint.h>

enum coord_rows_type {
    COORD_ROWS_F32,
    COORD_ROWS_F16,
    COORD_ROWS_BF16,
    COORD_ROWS_Q8_0,
    COORD_ROWS_Q4_0,
    COORD_ROWS_MXFP4,
    COORD_ROWS_COUNT
};

struct coord_rows_traits {
    const char *name;   /* "F32", "F16", "BF16", "Q8_0", "Q4_0", "MXFP4" */
    uint32_t blk;       /* elements per block (1 for the plain types) */
    uint32_t blk_bytes; /* bytes per block */
};

/* (COORD_ROWS_COUNT) indexed by enum coord_rows_type */
extern const struct coord_rows_traits coord_rows_traits[COORD_ROWS_COUNT];

/* Converts the @n elements at @src (stored as @type; @n a multiple of its block, @src holding
 * n / blk whole blocks, any alignment) into @out as float32. */
void coord_rows_to_f32(enum coord_rows_type type, const uint8_t *src, uint64_t n, float *out);

/* The MXFP4 block (17 bytes at @blk) nearest to the 32 finite values @x: the exponent the
 * smallest whose scale puts their largest magnitude within 12 (within 1..254), each value
 * rounded to the nearest of its grid (ties away from zero). Values already of one block's grid
 * give that block's values back (coord_rows_to_f32), so a model drawn on the grid is stored
 * exactly as MXFP4 or as F16 / F32. */
void coord_rows_mxfp4_block(const float *x, uint8_t *blk);

#endif
