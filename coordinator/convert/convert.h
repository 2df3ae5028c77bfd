/* coordinator/convert/convert.h: `shardlm convert` below the CLI - a GGUF file, a Hugging Face
 * folder or a llama2.c checkpoint (+ tokenizer.bin) into a .shlm file. */
#ifndef SHARDLM_COORD_CONVERT_H
#define SHARDLM_COORD_CONVERT_H

#include "shlm.h"
#include "util.h"

#include <stdint.h>

struct coord_convert_opts {
    const char *checkpoint; /* llama2.c checkpoint, GGUF file or Hugging Face directory */
    const char *tokenizer;  /* needed by llama2.c checkpoints only */
    const char *out;
    enum shlm_scheme scheme;
    int group;        /* W4 group; 0 picks the scheme's default (w4a16: 64, w4a8: 128) */
    int head_bits;    /* 8 (default) or 4 */
    uint32_t max_ctx; /* caps the context length (KV cache size); 0: the model's */
    /* Progress, when set: (0, n) once the file's n tensors are laid out, before the first is
     * written, then (i, n) after the i-th. coord_convert() prints nothing itself. */
    void (*progress)(void *ctx, int done, int total);
    void *progress_ctx;
};

/* What coord_convert() wrote. */
struct coord_convert_info {
    int group; /* W4 group used (0 for f32 and bf16) */
    int n_tensors;
    uint64_t file_bytes;
};

/* Writes opts->out atomically (a temporary file renamed at the end; nothing is left on error),
 * and fills @info (may be NULL) on success. Returns 0 or -errno with @e set. */
int coord_convert(const struct coord_convert_opts *o, struct coord_convert_info *info,
                  struct shardlm_err *e);

#endif
