/* SPDX-License-Identifier: MIT */
/* coordinator/convert/synth.h: synthetic GGUF models for benchmarks and tests (`shardlm synth`,
 * whose options are cli/cmd_synth.c's). */
#ifndef SHARDLM_COORD_SYNTH_H
#define SHARDLM_COORD_SYNTH_H

#include "util.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A model shape: the architecture name GGUF stores and the sizes. */
struct coord_synth_shape {
    const char *name, *arch;
    uint32_t dim, layers, heads, head_dim, kv_heads, ffn, vocab, ctx;
    float theta;
    bool gelu, head_gate; /* GELU-tanh instead of SiLU; a per-head output gate */
};

/* The shapes coord_synth() makes, *@n of them (static). */
const struct coord_synth_shape *coord_synth_shapes(size_t *n);

/* Writes the model of shape @shape (a coord_synth_shapes() name) to @out atomically, its weights
 * drawn from @seed (0 picks a fixed one). @progress, when set, is called with (0, layers) before
 * the tensor data, then (l, layers) after layer l's; nothing is printed here. Returns 0 or -errno
 * with @e set (-EINVAL: an unknown shape). */
int coord_synth(const char *shape, const char *out, uint64_t seed,
                void (*progress)(void *ctx, int done, int total), void *ctx, struct shardlm_err *e);

struct coord_synth_tok;
/* coord_synth() with the real tokenizer @tok (synth_tok.h; NULL: the byte-level one made up
 * here), whose vocabulary sizes the embedding and output rows. */
int coord_synth_with_tok(const char *shape, const char *out, uint64_t seed,
                         const struct coord_synth_tok *tok,
                         void (*progress)(void *ctx, int done, int total), void *ctx,
                         struct shardlm_err *e);

#endif
