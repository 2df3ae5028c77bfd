/* SPDX-License-Identifier: MIT */
/* coordinator/convert/synth_tok.c: a real tokenizer for a synthetic model (`shardlm synth
 * --tokenizer DIR`). tokenizer.json is built with coord_tok_from_hf_json() - what it cannot read
 * is refused there - and written back as llama.cpp's converter writes it: a byte-level BPE as
 * model "gpt2" with the tokenizer.ggml.pre name of its regexes, a SentencePiece-style BPE (U+2581
 * spaces, byte fallback: Gemma) as model "llama" whose scores follow the merge ranks; its
 * tokenizer_config.json gives BOS, EOS, add_bos_token and the chat template. */
#include "synth_tok.h"

#include "gguf_write.h"
#include "synth_internal.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* tokenizer.json and tokenizer_config.json: read whole, at most this (the bound of the Hugging
 * Face source's; a 256k vocabulary's tokenizer.json is ~35 MB) */
#define SYNTH_TOK_MAX_FILE (256u << 20)

/* The id of the token whose piece is @s (@n bytes), or -1 (a linear search: once per file). */
static int piece_id(const struct coord_tok *t, const char *s, size_t n)
{
    for (int i = 0; i < t->vocab_size; i++)
        if (t->vocab_len[i] == n && memcmp(t->vocab[i], s, n) == 0)
            return i;
    return -1;
}

/* A special token of tokenizer_config.json, @key: a string or an AddedToken object with a
 * "content"; *@id its id, -1 for null (Qwen3 has no BOS), left as it is when absent. Returns 0
 * or -EINVAL. */
static int config_token(const struct coord_tok *t, const json_t *cfg, const char *key, int *id,
                        const char *what, struct shardlm_err *e)
{
    const json_t *j = json_object_get(cfg, key);
    if (json_is_object(j))
        j = json_object_get(j, "content");
    if (!j)
        return 0;
    if (json_is_null(j)) {
        *id = -1;
        return 0;
    }
    if (!json_is_string(j))
        return shardlm_fail(e, -EINVAL, "%s: %s: expected a string or {\"content\": ...}", what,
                            key);
    int k = piece_id(t, json_string_value(j), json_string_length(j));
    if (k < 0)
        return shardlm_fail(e, -EINVAL, "%s: %s '%.64s' is no token of tokenizer.json", what, key,
                            json_string_value(j));
    *id = k;
    return 0;
}

/* tokenizer_config.json: BOS, EOS, add_bos_token, chat_template (a string). Returns 0 or
 * -errno. */
static int config_read(struct coord_synth_tok *st, const char *what, struct shardlm_err *e)
{
    json_error_t je;
    /* (model_max_length may be 1e30: past any integer) */
    json_t *cfg =
        json_loadb((const char *)st->config, st->config_len, JSON_DECODE_INT_AS_REAL, &je);
    int rc = 0;
    if (!json_is_object(cfg)) {
        rc = shardlm_fail(e, -EINVAL, "%s: expected a JSON object (line %d: %.80s)", what, je.line,
                          cfg ? "not an object" : je.text);
        goto out;
    }
    if ((rc = config_token(&st->tok, cfg, "bos_token", &st->bos, what, e)) ||
        (rc = config_token(&st->tok, cfg, "eos_token", &st->eos, what, e)))
        goto out;
    const json_t *ab = json_object_get(cfg, "add_bos_token");
    if (json_is_boolean(ab))
        st->add_bos = json_is_true(ab);
    const json_t *ct = json_object_get(cfg, "chat_template");
    if (json_is_string(ct)) {
        if (json_string_length(ct) > COORD_TOK_MAX_TEMPLATE ||
            strlen(json_string_value(ct)) != json_string_length(ct)) {
            rc = shardlm_fail(e, -EINVAL, "%s: chat_template: expected text of at most %u bytes",
                              what, COORD_TOK_MAX_TEMPLATE);
            goto out;
        }
        if (!(st->chat_template = strdup(json_string_value(ct))))
            rc = shardlm_fail(e, -ENOMEM, "out of memory");
    } else if (ct && !json_is_null(ct)) {
        rc = shardlm_fail(e, -EINVAL,
                          "%s: chat_template: expected a string (named templates "
                          "are not supported)",
                          what);
    }
out:
    json_decref(cfg);
    return rc;
}

int coord_synth_tok_load(struct coord_synth_tok *st, const char *dir, struct shardlm_err *e)
{
    char path[4200], cpath[4200];
    memset(st, 0, sizeof(*st));
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    snprintf(cpath, sizeof(cpath), "%s/tokenizer_config.json", dir);
    int rc = coord_check_folder(dir, e);
    if (rc || (rc = coord_read_file(path, SYNTH_TOK_MAX_FILE, &st->json, &st->json_len, e)))
        return rc;
    if ((rc = coord_tok_from_hf_json(&st->tok, st->json, st->json_len, path, e))) {
        free(st->json);
        st->json = NULL;
        return rc;
    }
    const struct coord_tok *t = &st->tok;
    st->vocab = (uint32_t)t->vocab_size;
    st->bos = t->bos_id;
    st->eos = t->eos_id;
    st->add_bos = t->flags & COORD_TOKF_ADD_BOS;
    for (int i = 0; i < t->vocab_size; i++)
        if (memchr(t->vocab[i], 0, t->vocab_len[i])) {
            rc = shardlm_fail(e, -EINVAL,
                              "%s: token %d holds a NUL byte, which GGUF cannot "
                              "carry",
                              path, i);
            goto out_free;
        }
    if (t->flags & COORD_TOKF_BYTE_LEVEL) {
        if (!(st->pre = coord_tok_gguf_pre_name(t))) {
            rc = shardlm_fail(e, -EINVAL,
                              "%s: pre_tokenizer: its Split regexes are none that a "
                              "GGUF names (those of qwen2, llama-bpe, deepseek-v3, gpt-4o, gpt2)",
                              path);
            goto out_free;
        }
    } else if (!(t->flags & COORD_TOKF_ESCAPE_WS) || !(t->flags & COORD_TOKF_BYTE_FALLBACK) ||
               t->n_patterns) {
        rc = shardlm_fail(e, -EINVAL,
                          "%s: expected a byte-level BPE or a SentencePiece-style one "
                          "(U+2581 spaces, byte_fallback, no pre-tokenizer splits)",
                          path);
        goto out_free;
    }
    rc = coord_read_file(cpath, SYNTH_TOK_MAX_FILE, &st->config, &st->config_len, e);
    if (rc == -ENOENT)
        return 0;
    if (rc || (rc = config_read(st, cpath, e)))
        goto out_free;
    return 0;
out_free:
    coord_synth_tok_free(st);
    return rc;
}

void coord_synth_tok_free(struct coord_synth_tok *st)
{
    if (st->json)
        coord_tok_free(&st->tok);
    free(st->json);
    free(st->config);
    free(st->chat_template);
    memset(st, 0, sizeof(*st));
}

int coord_synth_tok_gguf(struct gguf_writer *w, const struct coord_synth_tok *st)
{
    const struct coord_tok *t = &st->tok;
    int n = t->vocab_size, rc = -ENOMEM;
    bool spm = !(t->flags & COORD_TOKF_BYTE_LEVEL);
    char **tok = calloc((size_t)n, sizeof(char *));
    char **merges = calloc((size_t)t->n_merges + 1, sizeof(char *));
    int32_t *type = malloc((size_t)n * sizeof(int32_t));
    float *score = malloc((size_t)n * sizeof(float));
    if (!tok || !merges || !type || !score)
        goto out;
    for (int i = 0; i < n; i++) {
        int ty = t->attrs[i] & COORD_TOKA_TYPE;
        char hole[32];
        snprintf(hole, sizeof(hole), "[PAD%d]", i); /* an id no entry has: llama.cpp's name */
        if (!(tok[i] = strdup(ty == COORD_TOKT_UNUSED && !t->vocab_len[i] ? hole : t->vocab[i])))
            goto out;
        type[i] = ty;
        score[i] = -1e9f; /* no merge makes it */
    }
    /* SentencePiece merges the pair whose piece scores best: the rank of the merge that makes
     * it, as Hugging Face's BPE merges by rank */
    for (int r = t->n_merges - 1; r >= 0; r--)
        score[t->merges[3 * r + 2]] = -(float)r;
    for (int r = 0; r < t->n_merges && !spm; r++) {
        const char *a = t->vocab[t->merges[3 * r]], *b = t->vocab[t->merges[3 * r + 1]];
        size_t la = strlen(a), lb = strlen(b);
        if (!(merges[r] = malloc(la + lb + 2)))
            goto out;
        memcpy(merges[r], a, la);
        merges[r][la] = ' ';
        memcpy(merges[r] + la + 1, b, lb + 1);
    }
    gguf_w_str(w, "tokenizer.ggml.model", spm ? "llama" : "gpt2");
    if (!spm)
        gguf_w_str(w, "tokenizer.ggml.pre", st->pre);
    gguf_w_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)tok, (uint64_t)n);
    if (spm)
        gguf_w_arr_f32(w, "tokenizer.ggml.scores", score, (uint64_t)n);
    gguf_w_arr_i32(w, "tokenizer.ggml.token_type", type, (uint64_t)n);
    if (!spm)
        gguf_w_arr_str(w, "tokenizer.ggml.merges", (const char *const *)merges,
                       (uint64_t)t->n_merges);
    if (st->bos >= 0)
        gguf_w_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)st->bos);
    if (st->eos >= 0)
        gguf_w_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)st->eos);
    if (spm && t->unk_id >= 0)
        gguf_w_u32(w, "tokenizer.ggml.unknown_token_id", (uint32_t)t->unk_id);
    gguf_w_bool(w, "tokenizer.ggml.add_bos_token", st->add_bos);
    gguf_w_bool(w, "tokenizer.ggml.add_eos_token", false);
    if (spm)
        gguf_w_bool(w, "tokenizer.ggml.add_space_prefix", t->flags & COORD_TOKF_SPACE_PREFIX);
    if (st->chat_template)
        gguf_w_str(w, "tokenizer.chat_template", st->chat_template);
    rc = 0;
out:
    for (int i = 0; tok && i < n; i++)
        free(tok[i]);
    for (int r = 0; merges && r < t->n_merges; r++)
        free(merges[r]);
    free(tok);
    free(merges);
    free(type);
    free(score);
    return rc;
}

int coord_synth_tok_hf(const struct coord_synth_tok *st, const char *dir, struct shardlm_err *e)
{
    int rc = synth_write_text(dir, "tokenizer.json", (const char *)st->json, st->json_len, e);
    if (!rc && st->config)
        rc = synth_write_text(dir, "tokenizer_config.json", (const char *)st->config,
                              st->config_len, e);
    return rc;
}
