/* SPDX-License-Identifier: MIT */
/* coordinator/convert/source.h: model sources for `shardlm convert` - a llama2.c checkpoint, a
 * GGUF file or a Hugging Face directory - behind one interface: the config, the tokenizer to
 * store, and each tensor (in .shlm naming) as float32 rows. */
#ifndef SHARDLM_COORD_SOURCE_H
#define SHARDLM_COORD_SOURCE_H

#include "shlm.h"
#include "tensors.h"
#include "util.h"

#include <stddef.h>
#include <stdint.h>

struct coord_source {
    struct shlm_config cfg;
    struct shlm_config_ext cfgx; /* what newer architectures add; zero where they add nothing */
    const char *path;
    /* tokenizer to store in the .shlm: kind (enum shlm_tok_kind) and bytes (owned) */
    uint32_t tok_kind;
    uint8_t *tok;
    size_t tok_len;
    uint32_t bos_id, eos_id;
    /* Reads the tensor of @kind of @layer (0 for a global kind) and @expert (0 for a kind not
     * an expert's) of @rows x @cols into @out as float32, row-major (out, in). Returns 0,
     * -ENOENT when the source has no such tensor (a kind its config lacks, a layer past
     * n_layers, an expert past n_experts), or -errno with @e naming the file and tensor (shape
     * mismatch included). */
    int (*read)(struct coord_source *s, enum shlm_kind kind, uint32_t layer, uint32_t expert,
                int rows, int cols, float *out, struct shardlm_err *e);
    void (*close)(struct coord_source *s);
    void *impl;
};

/* Opens @path by its content (coord_format_sniff()): a directory (Hugging Face: config.json,
 * *.safetensors, tokenizer.json), a GGUF file, or a llama2.c checkpoint (which needs @tokenizer,
 * a tokenizer.bin; the others take one only when they lack their own); a .shlm file is refused.
 * @max_ctx > 0 caps the context length stored in the config. Returns 0 or -errno with @e set.
 * Release with coord_source_close(). */
int coord_source_open(struct coord_source *s, const char *path, const char *tokenizer,
                      uint32_t max_ctx, struct shardlm_err *e);
void coord_source_close(struct coord_source *s);

/* The largest weight magnitude convert takes: 65504, the largest finite fp16. The int4 schemes
 * keep group scales in fp16 (a group much past it cannot be stored); checkpoints trained in 16
 * bits hold weights orders of magnitude below it; and with RMSNorm's outputs of RMS 1 (at most
 * sqrt(65536) = 256 a value), a product over at most 2^20 columns of such weights stays below
 * 65504^2 * 256 * 2^20 = 1.2e21, far inside float32, where a norm of 3e38 overflows at once. */
#define COORD_SOURCE_MAX_WEIGHT 65504.0f

/* Refuses tensor @name of @path (@rows x @cols floats at @w, as a source read it) when a value
 * is NaN or infinite or beyond +-COORD_SOURCE_MAX_WEIGHT: -EINVAL naming the first such
 * element's index, row and column. */
int coord_source_check_finite(const float *w, int rows, int cols, const char *path,
                              const char *name, struct shardlm_err *e);

/* coord_source_check_finite(), then the value constraint of @kind's row in the tensor table
 * (shlm_kind_value_ok(): RoPE factors > 0): -EINVAL naming the first element that breaks it.
 * Every source's read() calls it on what it read. */
int coord_source_check_kind(enum shlm_kind kind, const float *w, int rows, int cols,
                            const char *path, const char *name, struct shardlm_err *e);

/* Latent attention's kv_b_proj (ik_llama.cpp's attn_kv_b): of each of @c's heads, the nope rows of
 * W_UK then the v_head_dim rows of W_UV, over kv_lora_rank columns: the rows of @kind
 * (SHLM_KIND_ATTN_K_B: head h's W_UK transposed, (kv_lora_rank, nope) a head; _V_B: its W_UV,
 * (v_head_dim, kv_lora_rank)) into @out. The rows of kv_b_proj: coord_kv_b_rows(). */
void coord_kv_b_split(const struct shlm_config *c, const struct shlm_config_ext *x,
                      enum shlm_kind kind, const float *kvb, float *out);
static inline int coord_kv_b_rows(const struct shlm_config *c, const struct shlm_config_ext *x)
{
    return (int)(c->n_heads * (c->head_dim - x->rope_dim + shlm_v_dim(c, x)));
}

/* The per-format openers coord_source_open() dispatches to. */
int coord_source_llama2c(struct coord_source *s, const char *path, const char *tokenizer,
                         struct shardlm_err *e);
int coord_source_gguf(struct coord_source *s, const char *path, const char *tokenizer,
                      struct shardlm_err *e);
int coord_source_hf(struct coord_source *s, const char *dir, const char *tokenizer,
                    struct shardlm_err *e);

#endif
