/* SPDX-License-Identifier: MIT */
/* coordinator/format/hf_config.h: a Hugging Face model's config.json - the architecture, sizes
 * and options of the checkpoints of the architecture table (Llama, Qwen2, Qwen3, Gemma 1/2/3,
 * Phi-3, Granite, SmolLM3, Mistral) as a .shlm config. */
#ifndef SHARDLM_COORD_HF_CONFIG_H
#define SHARDLM_COORD_HF_CONFIG_H

#include "shlm.h"
#include "tensors.h"
#include "util.h"

#include <stddef.h>
#include <stdint.h>

struct coord_hf_config {
    struct shlm_config cfg; /* checked with shlm_config_check(); cfg.family: the architecture */
    const struct shlm_arch_traits *arch; /* its row of the architecture table (tensors.h) */
    int64_t bos_id, eos_id; /* -1 where config.json has none */
    /* checked with shlm_config_ext_check(): Gemma 2/3's window, pattern, local RoPE base,
     * soft-caps and query scale; Phi-3's and Mistral's window; Granite's multipliers, layers
     * without RoPE, YaRN's and LongRoPE's attention factor */
    struct shlm_config_ext cfgx;
    /* LongRoPE (cfg.rope_scaling SHLM_ROPE_LONGROPE): rope_scaling.short_factor and long_factor,
     * head_dim / 2 each: the tensors SHLM_KIND_ROPE_FACTORS_SHORT/LONG */
    float rope_short[512], rope_long[512];
};

/* Parses config.json text @json of @len bytes (@what names it in errors): the architecture
 * (a supported Hugging Face class of shm/tensors.h's table), sizes, norm epsilon, RoPE (theta,
 * llama3, YaRN or LongRoPE scaling), activation, tied embeddings, token ids, the newer
 * architectures' fields (cfgx): Granite's multipliers, SmolLM3's layers without RoPE, the window
 * (every layer: Phi-3, Mistral; Gemma 2/3's layers, local RoPE base, soft-caps and query scale).
 * Returns 0 or -EINVAL with @e naming
 * @what and the field. */
int coord_hf_config_parse(struct coord_hf_config *hc, const char *json, size_t len,
                          const char *what, struct shardlm_err *e);

#endif
