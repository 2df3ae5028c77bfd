/* SPDX-License-Identifier: MIT */
/* coordinator/format/model_keys.h: the settings of a model file, read alike from GGUF metadata and
 * Hugging Face config.json - a value of any numeric type read exactly or refused, and one table of
 * the settings that change the computation and that the runtime does not have, each refused by
 * name and value unless it holds its neutral value. */
#ifndef SHARDLM_COORD_MODEL_KEYS_H
#define SHARDLM_COORD_MODEL_KEYS_H

#include "shlm.h"
#include "util.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum coord_val_kind {
    COORD_VAL_ABSENT, /* no such key, or JSON null */
    COORD_VAL_NUM,    /* a number, held exactly in .num (a GGUF u64/i64 beyond 2^53 rounds, but
                       * stays beyond every range a setting allows) */
    COORD_VAL_BOOL,
    COORD_VAL_STR,
    COORD_VAL_OTHER, /* an array or an object */
};

/* One setting's value as a format read it. */
struct coord_val {
    enum coord_val_kind kind;
    double num;
    bool b;
    const char *str; /* COORD_VAL_STR: @len bytes, not NUL-terminated */
    size_t len;
    const char *type; /* the format's name for the type, for messages ("u32", "string", "array") */
};

/* @v as an integer in [@lo, @hi] into *@out: any number with an integral value. @label names the
 * setting ("t.gguf: metadata llama.block_count"). Returns 0, -ENOENT when absent (message
 * "<label> is missing"), or -EINVAL naming the type or the value and the range. */
int coord_val_uint(const struct coord_val *v, const char *label, uint64_t lo, uint64_t hi,
                   uint32_t *out, struct shardlm_err *e);
/* @v as a finite number in the open interval (@lo, @hi) into *@out, which is a float: returns as
 * coord_val_uint(). */
int coord_val_real(const struct coord_val *v, const char *label, double lo, double hi, float *out,
                   struct shardlm_err *e);

/* When a setting the runtime lacks is harmless (its neutral value). */
enum coord_key_neutral {
    COORD_KEY_ZERO,        /* 0 or false */
    COORD_KEY_ZERO_OR_ONE, /* a multiplier: 1, or 0 (GGUF's "not set") */
    COORD_KEY_FALSE,       /* false or 0 */
    COORD_KEY_TRUE,        /* true or 1 */
    COORD_KEY_HEAD_DIM,    /* equal to the head size */
    COORD_KEY_ATTN_SCALE,  /* 0, or 1 / sqrt(head size): the usual attention scale */
    COORD_KEY_WINDOW,      /* 0, or a window at least the context length */
    COORD_KEY_NONE_STR,    /* the string "none" */
    COORD_KEY_NEVER,       /* no value is neutral: the key's presence changes the model */
};

struct coord_key {
    const char *gguf; /* after "<arch>.", NULL where GGUF has no such key */
    const char *hf;   /* the config.json field, NULL where config.json has none */
    enum coord_key_neutral neutral;
    const char *what; /* the feature, for "... is not supported" */
};

/* The settings of the supported families' GGUF metadata and config.json that change the
 * computation and are not implemented. */
extern const struct coord_key coord_unsupported_keys[];
extern const size_t coord_n_unsupported_keys;

/* Whether the importer of config.json (@hf) or of GGUF reads key @k into config @c itself, for
 * what the row of @c's family says it has (a window: Phi-3, Mistral, Gemma 2/3; a window pattern:
 * Gemma 2/3's soft-caps and query scalar; Granite's multipliers) or its RoPE scaling as read so far
 * (YaRN's and LongRoPE's GGUF keys): then it is not refused. */
bool coord_key_read_by(const struct coord_key *k, bool hf, const struct shlm_config *c);

/* YaRN's context: @c's seq_len raised to rope_orig_ctx x rope_factor where that is longer (a
 * Qwen2.5 config with max_position_embeddings 32768 and YaRN factor 4 over 32768 original
 * positions runs 131072 positions, as vLLM reads it), at most seq_len's bound (2^20). */
void coord_yarn_context(struct shlm_config *c);

/* Refuses @v of key @k unless it is absent or neutral for config @c (head_dim, seq_len read).
 * @label names the setting as coord_val_uint()'s. Returns 0 or -EINVAL with the label, the
 * value and the feature ("... attention.sliding_window is 4096: sliding-window attention is not
 * supported"), or the type where the key takes another one. */
int coord_key_check(const struct coord_key *k, const struct coord_val *v, const char *label,
                    const struct shlm_config *c, struct shardlm_err *e);

#endif
