/* SPDX-License-Identifier: MIT */
/* coordinator/format/llama2c.h: reader of llama2.c checkpoints (the legacy float32 format of
 * run.c). Header: 7 int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size,
 * seq_len); a negative vocab_size means the classifier is stored separately at the end, else it
 * is shared with the token embedding. Then float32 weights, every matrix (out, in) row-major. */
#ifndef SHARDLM_COORD_LLAMA2C_H
#define SHARDLM_COORD_LLAMA2C_H

#include "shlm.h"
#include "tensors.h"
#include "util.h"

#include <stddef.h>

struct coord_llama2c {
    struct shlm_config cfg;
    const float *base; /* the mapping, after the header */
    size_t map_bytes;
    void *map;
    /* weights, pointers into the mapping */
    const float *embd, *rms_att, *wq, *wk, *wv, *wo, *rms_ffn, *w1, *w2, *w3, *rms_final, *wcls;
};

/* Maps and checks @path: header fields in range and the file size equal to what they imply.
 * Returns 0 or -errno with @e set. Release with coord_llama2c_close(). */
int coord_llama2c_open(struct coord_llama2c *ck, const char *path, struct shardlm_err *e);
void coord_llama2c_close(struct coord_llama2c *ck);
/* The f32 data of the tensor of @kind of @layer (0 for a global kind), or NULL where a llama2.c
 * checkpoint has none. */
const float *coord_llama2c_tensor(const struct coord_llama2c *ck, enum shlm_kind kind,
                                  uint32_t layer);

#endif
