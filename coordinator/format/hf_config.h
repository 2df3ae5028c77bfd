/* SPDX-License-Identifier: MIT */
/* coordinator/format/hf_config.h: a Hugging Face model's config.json - the architecture, sizes
 * and options of Llama, Qwen2 and Gemma (1) checkpoints as a .shlm config. */
#ifndef SHARDLM_COORD_HF_CONFIG_H
#define SHARDLM_COORD_HF_CONFIG_H

#include "shlm.h"
#include "util.h"

#include <stddef.h>
#include <stdint.h>

enum coord_hf_family { COORD_HF_LLAMA, COORD_HF_QWEN2, COORD_HF_GEMMA };

struct coord_hf_config {
    struct shlm_config cfg; /* checked with shlm_config_check() */
    enum coord_hf_family family;
    int64_t bos_id, eos_id; /* -1 where config.json has none */
};

/* Parses config.json text @json of @len bytes (@what names it in errors): the architecture
 * (LlamaForCausalLM, Qwen2ForCausalLM, GemmaForCausalLM), sizes, norm epsilon, RoPE (theta,
 * llama3 scaling), activation, tied embeddings, token ids. Returns 0 or -EINVAL with @e naming
 * @what and the field. */
int coord_hf_config_parse(struct coord_hf_config *hc, const char *json, size_t len,
                          const char *what, struct shardlm_err *e);

#endif
