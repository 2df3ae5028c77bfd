/* SPDX-License-Identifier: MIT */
/* coordinator/format/hf_config.h: a Hugging Face model's config.json - the architecture, sizes
 * and options of the checkpoints of the architecture table (Llama, Qwen2, Gemma 1, Qwen3) as a
 * .shlm config. */
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
    struct shlm_config_ext cfgx;         /* checked with shlm_config_ext_check() */
    int64_t bos_id, eos_id; /* -1 where config.json has none */
};

/* Parses config.json text @json of @len bytes (@what names it in errors): the architecture
 * (a supported Hugging Face class of shm/tensors.h's table), sizes, norm epsilon, RoPE (theta,
 * llama3 scaling), activation, tied embeddings, token ids; Gemma 2/3's window, its layers, local
 * RoPE base, soft-caps and query scale. Returns 0 or -EINVAL with @e naming
 * @what and the field. */
int coord_hf_config_parse(struct coord_hf_config *hc, const char *json, size_t len,
                          const char *what, struct shardlm_err *e);

#endif
