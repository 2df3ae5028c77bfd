/* SPDX-License-Identifier: MIT */
/* Fuzz target for the Hugging Face config.json parser (coordinator/format/hf_config.c).
 *
 * Input: config.json text. What coord_hf_config_parse() accepts must be a config the rest of
 * shardlm takes as it is: shlm_config_check() and shlm_config_ext_check() pass, and the token
 * ids are inside the vocabulary. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hf_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *buf = malloc(size ? size : 1);
    if (!buf)
        return 0;
    memcpy(buf, data, size);
    struct coord_hf_config hc;
    struct shardlm_err e;
    if (coord_hf_config_parse(&hc, buf, size, "fuzz", &e) == 0) {
        struct shardlm_err err;
        if (shlm_config_check(&hc.cfg, &err) != 0)
            __builtin_trap();
        if (hc.bos_id >= (int64_t)hc.cfg.vocab_size || hc.eos_id >= (int64_t)hc.cfg.vocab_size ||
            hc.bos_id < -1 || hc.eos_id < -1)
            __builtin_trap();
        if (shlm_config_ext_check(&hc.cfg, &hc.cfgx, &err) != 0)
            __builtin_trap();
        /* NeoX halves but in DeepSeek's (rope_interleave: interleaved pairs by default) */
        if ((!hc.arch->mla && hc.cfg.rope_neox != 1) || hc.cfg.rope_neox > 1 ||
            hc.cfg.qkv_bias != hc.arch->qkv_bias)
            __builtin_trap();
    } else if (!memchr(e.msg, 0, sizeof(e.msg)) || strncmp(e.msg, "fuzz", 4) != 0) {
        __builtin_trap(); /* every refusal names the input */
    }
    free(buf);
    return 0;
}
