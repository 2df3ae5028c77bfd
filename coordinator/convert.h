/* coordinator/: `shardlm convert` - a checkpoint and its tokenizer into a .shlm file. */
#ifndef SHARDLM_COORD_CONVERT_H
#define SHARDLM_COORD_CONVERT_H

#include "shlm.h"
#include "util.h"

#include <stdbool.h>

struct coord_convert_opts {
    const char *checkpoint, *tokenizer, *out;
    enum shlm_scheme scheme;
    int group;     /* W4 group; 0 picks the scheme's default (w4a16: 64, w4a8: 128) */
    int head_bits; /* 8 (default) or 4 */
    bool quiet;
};

/* Writes opts->out atomically (a temporary file renamed at the end; nothing is left on error).
 * Returns 0 or -errno with @e set. */
int coord_convert(const struct coord_convert_opts *o, struct coord_err *e);

#endif
