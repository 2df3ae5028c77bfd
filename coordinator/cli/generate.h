/* SPDX-License-Identifier: MIT */
/* coordinator/cli/generate.h: `shardlm generate` and `shardlm eval` over the engine. */
#ifndef SHARDLM_COORD_GENERATE_H
#define SHARDLM_COORD_GENERATE_H

#include "engine.h"
#include "sampler.h"
#include "scheduler.h"
#include "util.h"

#include <stdbool.h>
#include <stdint.h>

#define GEN_MAX_STOPS 16

struct coord_generate_opts {
    struct coord_engine_opts engine; /* the model, layout, load, access, restarts, verbose */
    const char **prompts;            /* -p, in order, then -f FILE's lines */
    int n_prompts;
    const char *prompt_file;
    int n; /* new tokens per prompt */
    struct coord_sampling sampling;
    const char *stop[GEN_MAX_STOPS];
    int n_stop;
    bool json;
    const char *json_schema_path; /* --json-schema FILE, or NULL */
    const char *regex;            /* --regex RE, or NULL */
    const char *gbnf_path;        /* --grammar FILE, or NULL */
    struct coord_sched_opts sched;
};

/* Runs every prompt through the scheduler at once. One prompt: streams the prompt and its
 * continuation to stdout, flushed per token, then a newline. Several: each result in prompt
 * order as soon as it and those before it are done, "[i] prompt+continuation" and a newline
 * (i from 1). With json: one object per prompt and line, {"prompt", "text" (the continuation),
 * "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens"}. Seeded sampling
 * draws for prompt i from seed + i. Returns 0, -ECANCELED when the engine's cancel flag
 * stopped it (what was generated is printed), or -errno with @e set. */
int coord_generate(const struct coord_generate_opts *o, struct shardlm_err *e);

struct coord_eval_opts {
    struct coord_engine_opts engine;
    const char *ref_dir;
    const char *save_dir; /* also write this model's logits there as a reference (or NULL) */
    bool overwrite;       /* --save may replace files already in save_dir */
};

/* Feeds the reference token sequences of @ref_dir/greedy.tsv and compares the logits with the
 * reference ones: per prompt and overall KL divergence, top-1 agreement, perplexity and the 99th
 * percentile of the positions' KL divergences. The last line is
 * `overall kld=<mean> top1=<fraction> ppl=<value> kld_p99=<value>`. Returns 0 or -errno with @e
 * set. */
int coord_eval(const struct coord_eval_opts *o, struct shardlm_err *e);

#endif
