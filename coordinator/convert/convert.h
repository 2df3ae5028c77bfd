/* coordinator/: `shardlm convert` - a checkpoint and its tokenizer into a .shlm file. */
#ifndef SHARDLM_COORD_CONVERT_H
#define SHARDLM_COORD_CONVERT_H

#include "shlm.h"
#include "util.h"

#include <stdbool.h>
#include <stdint.h>

struct coord_convert_opts {
    const char *checkpoint; /* llama2.c checkpoint, GGUF file or Hugging Face directory */
    const char *tokenizer;  /* needed by llama2.c checkpoints only */
    const char *out;
    enum shlm_scheme scheme;
    int group;     /* W4 group; 0 picks the scheme's default (w4a16: 64, w4a8: 128) */
    int head_bits; /* 8 (default) or 4 */
    uint32_t max_ctx; /* caps the context length (KV cache size); 0: the model's */
    bool quiet;
};

/* Writes opts->out atomically (a temporary file renamed at the end; nothing is left on error).
 * Returns 0 or -errno with @e set. */
int coord_convert(const struct coord_convert_opts *o, struct shardlm_err *e);

#endif
