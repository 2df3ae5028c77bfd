/* coordinator/cli/generate.h: `shardlm generate` and `shardlm eval` over the engine. */
#ifndef SHARDLM_COORD_GENERATE_H
#define SHARDLM_COORD_GENERATE_H

#include "engine.h"
#include "util.h"

#include <stdbool.h>
#include <stdint.h>

struct coord_generate_opts {
    struct coord_engine_opts engine; /* the model, layout, load, access, restarts, verbose */
    const char *prompt;
    int n;       /* new tokens */
    float temp;  /* 0: greedy */
    float top_p;
    uint64_t seed;
};

/* Streams the prompt and the continuation to stdout, flushed per token, then a newline.
 * Returns 0, -ECANCELED when the engine's cancel flag stopped it (what was generated is
 * printed), or -errno with @e set. */
int coord_generate(const struct coord_generate_opts *o, struct shardlm_err *e);

struct coord_eval_opts {
    struct coord_engine_opts engine;
    const char *ref_dir;
    const char *save_dir; /* also write this model's logits there as a reference (or NULL) */
    bool overwrite;       /* --save may replace files already in save_dir */
};

/* Feeds the reference token sequences of @ref_dir/greedy.tsv and compares the logits with the
 * reference ones: per prompt and overall KL divergence, top-1 agreement and perplexity. The last
 * line is `overall kld=<mean> top1=<fraction> ppl=<value>`. Returns 0 or -errno with @e set. */
int coord_eval(const struct coord_eval_opts *o, struct shardlm_err *e);

#endif
