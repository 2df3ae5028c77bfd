/* SPDX-License-Identifier: MIT */
/* coordinator/convert/synth_tok.h: a real tokenizer for a synthetic model (`shardlm synth
 * --tokenizer DIR`): a Hugging Face tokenizer.json and tokenizer_config.json, written into the
 * model's GGUF as tokenizer.ggml.* keys or copied into its Hugging Face folder. */
#ifndef SHARDLM_COORD_SYNTH_TOK_H
#define SHARDLM_COORD_SYNTH_TOK_H

#include "tokenizer.h"
#include "util.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct coord_synth_tok {
    uint8_t *json, *config; /* tokenizer.json, tokenizer_config.json (NULL: absent) */
    size_t json_len, config_len;
    struct coord_tok tok; /* built from tokenizer.json */
    const char *pre;      /* tokenizer.ggml.pre of a byte-level one; NULL: SentencePiece */
    int bos, eos;         /* config's bos_token / eos_token ids, else the tokenizer's (-1) */
    bool add_bos;         /* config's add_bos_token, else the post-processor's BOS */
    char *chat_template;  /* config's (NUL-terminated), or NULL */
    uint32_t vocab;       /* the model's vocabulary: every id of tokenizer.json */
};

/* Reads @dir/tokenizer.json (required) and @dir/tokenizer_config.json (optional) and checks that
 * they build a tokenizer that a GGUF can carry. Returns 0 or -errno with @e naming the file and
 * the field. Release with coord_synth_tok_free(). */
int coord_synth_tok_load(struct coord_synth_tok *st, const char *dir, struct shardlm_err *e);
void coord_synth_tok_free(struct coord_synth_tok *st);

struct gguf_writer;
/* Writes @st's tokenizer.ggml.* keys (model "gpt2" with its pre name, or "llama" with scores
 * by merge rank; tokens, token types, merges, BOS/EOS, add_bos/add_space_prefix) and
 * tokenizer.chat_template into @w. Returns 0 or -ENOMEM. */
int coord_synth_tok_gguf(struct gguf_writer *w, const struct coord_synth_tok *st);

/* Writes tokenizer.json and tokenizer_config.json (where there was one) of @st into folder @dir,
 * byte for byte. Returns 0 or -errno with @e naming the file. */
int coord_synth_tok_hf(const struct coord_synth_tok *st, const char *dir, struct shardlm_err *e);

#endif
