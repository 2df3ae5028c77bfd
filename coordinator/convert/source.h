/* coordinator/convert/source.h: model sources for `shardlm convert` - a llama2.c checkpoint, a
 * GGUF file or a Hugging Face directory - behind one interface: the config, the tokenizer to
 * store, and each tensor (in .shlm naming) as float32 rows. */
#ifndef SHARDLM_COORD_SOURCE_H
#define SHARDLM_COORD_SOURCE_H

#include "shlm.h"
#include "util.h"

#include <stddef.h>
#include <stdint.h>

struct coord_source {
    struct shlm_config cfg;
    const char *path;
    /* tokenizer to store in the .shlm: kind (enum shlm_tok_kind) and bytes (owned) */
    uint32_t tok_kind;
    uint8_t *tok;
    size_t tok_len;
    uint32_t bos_id, eos_id;
    /* Reads tensor @name (.shlm naming: "tok_embd", "blk.3.attn_q", "blk.0.attn_q_bias", ...) of
     * @rows x @cols into @out as float32, row-major (out, in). Returns 0, -ENOENT when the
     * source has no such tensor, or -errno with @e naming the file and tensor (shape mismatch
     * included). */
    int (*read)(struct coord_source *s, const char *name, int rows, int cols, float *out,
                struct shardlm_err *e);
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

/* The per-format openers coord_source_open() dispatches to. */
int coord_source_llama2c(struct coord_source *s, const char *path, const char *tokenizer,
                         struct shardlm_err *e);
int coord_source_gguf(struct coord_source *s, const char *path, const char *tokenizer,
                      struct shardlm_err *e);
int coord_source_hf(struct coord_source *s, const char *dir, const char *tokenizer,
                    struct shardlm_err *e);

#endif
