/* SPDX-License-Identifier: MIT */
/* coordinator/tok/from_gguf.c: the tokenizer a GGUF file describes (tokenizer.ggml.*): model
 * "llama" (SentencePiece) or "gpt2" (byte-level BPE after llama.cpp's pre-tokenizer regexes). */
#include "tok_internal.h"

#include "gguf.h"

#include <ctype.h>
#include <stdio.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* the pre-tokenizers llama.cpp uses for other GGUF `tokenizer.ggml.pre` values than GPT-2's */
#define RE_GPT2_NOWS "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RE_LLAMA3                                                                                 \
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"    \
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN2                                                                                  \
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"    \
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

/* DeepSeek V3's three splits and gpt-oss's (GPT-4o's) regex, as their tokenizer.json has them
 * (PCRE2 takes them as they are; llama.cpp rewrites GPT-4o's for its own regex engine) */
#define RE_DSV3_DIGITS "\\p{N}{1,3}"
#define RE_DSV3_CJK "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
#define RE_DSV3                                                                                    \
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|"                                       \
    "[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|"                          \
    "\\s*[\r\n]+|\\s+(?!\\S)|\\s+"
#define RE_GPT4O                                                                                   \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*"                                  \
    "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"                                 \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+"                                  \
    "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"                                 \
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* Llama 3's and Qwen2's as their tokenizer.json has them (coord_tok_gguf_pre_name) */
#define RE_HF_LLAMA3                                                                               \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}|"                      \
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_HF_QWEN2                                                                                \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}|"                           \
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

struct pre_entry {
    const char *names; /* '|'-separated tokenizer.ggml.pre values */
    unsigned flags;
    const char *re[4];
};

/* llama.cpp llm_tokenizer_bpe's regexes for the pre-tokenizers it names */
static const struct pre_entry gguf_pres[] = {
    {"gpt-2|gpt2|mpt|olmo|jais|trillion|exaone4|granite-docling", 0, {TOK_RE_GPT2}},
    {"llama3|llama-v3|llama-bpe|falcon3|falcon-h1|pixtral|midm-2.0|lfm2",
     COORD_TOKF_IGNORE_MERGES,
     {RE_LLAMA3}},
    {"dbrx|smaug-bpe", 0, {RE_LLAMA3}},
    /* Qwen2's tokenizer.json puts the text in NFC (llama.cpp does not: here as Hugging Face) */
    {"qwen2|deepseek-r1-qwen", COORD_TOKF_NFC, {RE_QWEN2}},
    {"stablelm2|megrez|hunyuan", 0, {RE_QWEN2}},
    {"starcoder|refact|command-r|smollm|codeshell|exaone|minerva-7b", 0, {"\\p{N}", RE_GPT2_NOWS}},
    {"deepseek-v3", 0, {RE_DSV3_DIGITS, RE_DSV3_CJK, RE_DSV3}},
    {"gpt-4o|llama4", 0, {RE_GPT4O}},
    {"default", 0, {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2_NOWS, "\\p{N}+", "[0-9][0-9][0-9]"}},
};

/* The pre-tokenizers of Hugging Face tokenizer.json files (their Split regexes, in order) and
 * the tokenizer.ggml.pre name llama.cpp's converter gives each */
static const struct {
    const char *name;
    const char *re[4];
} hf_pres[] = {
    {"gpt2", {TOK_RE_GPT2}},  {"llama-bpe", {RE_HF_LLAMA3}},
    {"qwen2", {RE_HF_QWEN2}}, {"deepseek-v3", {RE_DSV3_DIGITS, RE_DSV3_CJK, RE_DSV3}},
    {"gpt-4o", {RE_GPT4O}},
};

const char *coord_tok_gguf_pre_name(const struct coord_tok *t)
{
    for (size_t i = 0; i < sizeof(hf_pres) / sizeof(hf_pres[0]); i++) {
        int n = 0;
        while (n < 4 && hf_pres[i].re[n])
            n++;
        bool same = n == t->n_patterns;
        for (int k = 0; same && k < n; k++)
            same = strcmp(t->patterns[k], hf_pres[i].re[k]) == 0;
        if (same)
            return hf_pres[i].name;
    }
    return NULL;
}

/* Whether @s is one of the '|'-separated @names. */
static bool name_in(const char *names, struct gguf_str s)
{
    for (const char *p = names; *p;) {
        const char *q = strchr(p, '|');
        size_t n = q ? (size_t)(q - p) : strlen(p);
        if (s.len == n && memcmp(s.p, p, n) == 0)
            return true;
        p += n + (q ? 1 : 0);
    }
    return false;
}

/* *@id = the integer at @key (absent: *@id is left as it is), which must be one of the @n token
 * ids. llama.cpp warns and keeps its default for an id out of range; here the file is refused,
 * as a model that would stop at another token than its author's. Returns 0 or -EINVAL naming
 * the key, the value and the vocabulary's size. */
static int gguf_id(const struct gguf_file *g, const char *key, int n, int *id, const char *what,
                   struct shardlm_err *e)
{
    struct coord_val v;
    char label[512];
    uint32_t u;
    gguf_get_val(g, key, &v);
    if (v.kind == COORD_VAL_ABSENT)
        return 0;
    snprintf(label, sizeof(label), "%s: %s", what, key);
    if (v.kind == COORD_VAL_NUM && (v.num < 0 || v.num >= n))
        return shardlm_fail(e, -EINVAL, "%s is %.17g, outside the vocabulary of %d tokens", label,
                            v.num, n);
    if (coord_val_uint(&v, label, 0, (uint64_t)n - 1, &u, e))
        return -EINVAL;
    *id = (int)u;
    return 0;
}

/* Whether the GGUF type @ty is an integer. */
static bool is_int_type(enum gguf_type ty)
{
    return ty == GGUF_UINT8 || ty == GGUF_INT8 || ty == GGUF_UINT16 || ty == GGUF_INT16 ||
           ty == GGUF_UINT32 || ty == GGUF_INT32 || ty == GGUF_UINT64 || ty == GGUF_INT64;
}

/* What coord_tok_from_gguf() reads from the file, and the tok_src it builds from it. */
struct gg {
    const struct gguf_file *g;
    const char *what;
    struct shardlm_err *e;
    bool spm;                                 /* model "llama", else "gpt2" */
    struct gguf_str pre;                      /* tokenizer.ggml.pre ("gpt2") */
    const struct gguf_kv *tok, *sc, *ty, *mg; /* tokens; scores, token_type, merges or NULL */
    size_t n_merges;                          /* entries of mg */
    struct tok_src s;
    float *scores;  /* (s.n) */
    uint8_t *attrs; /* (s.n) */
};

/* Checks tokenizer.ggml.model and finds tokenizer.ggml.tokens. Returns 0 or -EINVAL. */
static int gg_model(struct gg *x)
{
    struct gguf_str model;
    if (gguf_get_str(x->g, "tokenizer.ggml.model", &model))
        return shardlm_fail(x->e, -EINVAL, "%s: tokenizer.ggml.model is missing or not a string",
                            x->what);
    x->spm = gguf_str_eq(model, "llama");
    if (!x->spm && !gguf_str_eq(model, "gpt2")) {
        char m[64];
        tok_show_piece(m, sizeof(m), model.p, model.len < 40 ? model.len : 40);
        return shardlm_fail(x->e, -EINVAL,
                            "%s: tokenizer.ggml.model is '%s', expected 'llama' "
                            "or 'gpt2'",
                            x->what, m);
    }
    x->tok = gguf_get_arr(x->g, "tokenizer.ggml.tokens", GGUF_STRING);
    if (!x->tok)
        return shardlm_fail(x->e, -EINVAL,
                            "%s: tokenizer.ggml.tokens is missing or not an array "
                            "of strings",
                            x->what);
    if (x->tok->v.arr.n == 0 || x->tok->v.arr.n > COORD_TOK_MAX_VOCAB)
        return shardlm_fail(x->e, -EINVAL,
                            "%s: tokenizer.ggml.tokens has %llu entries, expected "
                            "1..%d",
                            x->what, (unsigned long long)x->tok->v.arr.n, COORD_TOK_MAX_VOCAB);
    x->s.n = (int)x->tok->v.arr.n;
    return 0;
}

/* Finds the arrays beside the tokens: scores and token_type (optional, as long as the tokens at
 * least), and for "gpt2" merges and pre (absent: "default"). Returns 0 or -EINVAL. */
static int gg_arrays(struct gg *x)
{
    int n = x->s.n;
    x->sc = gguf_find(x->g, "tokenizer.ggml.scores");
    if (x->sc && (x->sc->type != GGUF_ARRAY || x->sc->v.arr.type == GGUF_STRING ||
                  x->sc->v.arr.n < (uint64_t)n))
        return shardlm_fail(x->e, -EINVAL,
                            "%s: tokenizer.ggml.scores is not an array of %d "
                            "numbers",
                            x->what, n);
    x->ty = gguf_find(x->g, "tokenizer.ggml.token_type");
    if (x->ty && (x->ty->type != GGUF_ARRAY || !is_int_type(x->ty->v.arr.type) ||
                  x->ty->v.arr.n < (uint64_t)n))
        return shardlm_fail(x->e, -EINVAL,
                            "%s: tokenizer.ggml.token_type is not an array of %d "
                            "integers",
                            x->what, n);
    if (x->spm)
        return 0;
    x->mg = gguf_get_arr(x->g, "tokenizer.ggml.merges", GGUF_STRING);
    if (!x->mg)
        return shardlm_fail(x->e, -EINVAL,
                            "%s: tokenizer.ggml.merges is missing or not an "
                            "array of strings",
                            x->what);
    if (x->mg->v.arr.n > TOK_MAX_MERGES)
        return shardlm_fail(x->e, -EINVAL,
                            "%s: tokenizer.ggml.merges has %llu entries, "
                            "expected at most %d",
                            x->what, (unsigned long long)x->mg->v.arr.n, TOK_MAX_MERGES);
    x->n_merges = (size_t)x->mg->v.arr.n;
    int rc = gguf_get_str(x->g, "tokenizer.ggml.pre", &x->pre);
    if (rc == -EINVAL)
        return shardlm_fail(x->e, -EINVAL, "%s: tokenizer.ggml.pre is not a string", x->what);
    if (rc)
        x->pre = (struct gguf_str){"default", 7};
    return 0;
}

/* The arrays of x->s. Returns 0 or -ENOMEM. */
static int gg_alloc(struct gg *x)
{
    size_t n = (size_t)x->s.n, nm = x->n_merges ? x->n_merges : 1;
    x->s.p = malloc(n * sizeof(char *));
    x->s.plen = malloc(n * sizeof(uint32_t));
    x->scores = calloc(n, sizeof(float));
    x->attrs = malloc(n);
    x->s.ma = malloc(nm * sizeof(char *));
    x->s.mb = malloc(nm * sizeof(char *));
    x->s.mal = malloc(nm * sizeof(uint32_t));
    x->s.mbl = malloc(nm * sizeof(uint32_t));
    if (!x->s.p || !x->s.plen || !x->scores || !x->attrs || !x->s.ma || !x->s.mb || !x->s.mal ||
        !x->s.mbl)
        return shardlm_fail(x->e, -ENOMEM, "%s: out of memory", x->what);
    return 0;
}

/* Each token's piece (borrowed from the file), score and type. Returns 0 or -EINVAL. */
static int gg_pieces(struct gg *x)
{
    for (int i = 0; i < x->s.n; i++) {
        struct gguf_str p = x->tok->v.arr.strs[i];
        if (p.len > COORD_TOK_MAX_PIECE)
            return shardlm_fail(x->e, -EINVAL,
                                "%s: tokenizer.ggml.tokens[%d] is %llu bytes, "
                                "expected at most %d",
                                x->what, i, (unsigned long long)p.len, COORD_TOK_MAX_PIECE);
        x->s.p[i] = p.p;
        x->s.plen[i] = (uint32_t)p.len;
        if (x->sc) {
            double v = gguf_arr_num(x->sc, (uint64_t)i);
            x->scores[i] = v == v ? (float)v : 0.0f;
        }
        x->attrs[i] = COORD_TOKT_NORMAL;
        if (x->ty) {
            double v = gguf_arr_num(x->ty, (uint64_t)i);
            /* llama.cpp: an unknown type is "undefined" */
            x->attrs[i] = v >= 0 && v <= COORD_TOKT_BYTE ? (uint8_t)v : COORD_TOKT_UNDEFINED;
        }
    }
    return 0;
}

/* The bool @key into *@v, left as it is when absent; a key of another type is refused (a flag
 * defaulted silently would tokenize otherwise than the model was trained). Returns 0 or -EINVAL. */
static int gguf_flag(struct gg *x, const char *key, bool *v)
{
    if (gguf_get_bool(x->g, key, v) == -EINVAL) {
        struct coord_val val;
        gguf_get_val(x->g, key, &val);
        return shardlm_fail(x->e, -EINVAL, "%s: %s is of type %s, expected a bool", x->what, key,
                            val.type);
    }
    return 0;
}

/* The tokenizer.ggml.add_* flags, absent: llama.cpp's defaults for the model, @space for
 * add_space_prefix and @bos for add_bos_token (add_eos_token: false). Returns 0 or -EINVAL. */
static int gg_add_flags(struct gg *x, bool space, bool bos)
{
    bool eos = false;
    int rc;
    if ((rc = gguf_flag(x, "tokenizer.ggml.add_space_prefix", &space)) ||
        (rc = gguf_flag(x, "tokenizer.ggml.add_bos_token", &bos)) ||
        (rc = gguf_flag(x, "tokenizer.ggml.add_eos_token", &eos)))
        return rc;
    x->s.flags |= (space ? COORD_TOKF_SPACE_PREFIX : 0) | (bos ? COORD_TOKF_ADD_BOS : 0) |
                  (eos ? COORD_TOKF_ADD_EOS : 0);
    return 0;
}

/* "llama": SentencePiece, its default special ids and flags (llama.cpp's). Returns 0 or
 * -EINVAL. */
static int gg_spm(struct gg *x)
{
    int n = x->s.n;
    x->s.type = COORD_TOK_SPM;
    x->s.flags = COORD_TOKF_ESCAPE_WS | COORD_TOKF_BYTE_FALLBACK;
    x->s.bos = 1 < n ? 1 : -1;
    x->s.eos = 2 < n ? 2 : -1;
    x->s.unk = 0;
    return gg_add_flags(x, true, true);
}

/* The merges "a b", split at the first space after the first byte (llama.cpp). Returns 0 or
 * -EINVAL. */
static int gg_merges(struct gg *x)
{
    for (size_t i = 0; i < x->n_merges; i++) {
        struct gguf_str m = x->mg->v.arr.strs[i];
        const char *sp = m.len > 1 ? memchr(m.p + 1, ' ', m.len - 1) : NULL;
        if (!sp || m.len > 2 * (uint64_t)COORD_TOK_MAX_PIECE)
            return shardlm_fail(x->e, -EINVAL,
                                "%s: tokenizer.ggml.merges[%zu] is not two "
                                "pieces separated by a space",
                                x->what, i);
        x->s.ma[i] = m.p;
        x->s.mal[i] = (uint32_t)(sp - m.p);
        x->s.mb[i] = sp + 1;
        x->s.mbl[i] = (uint32_t)(m.len - x->s.mal[i] - 1);
    }
    x->s.n_merges = (int)x->n_merges;
    return 0;
}

/* "gpt2": byte-level BPE, the regexes of its pre-tokenizer, its flags and merges. Returns 0 or
 * -EINVAL. */
static int gg_bpe(struct gg *x)
{
    x->s.type = COORD_TOK_BPE;
    x->s.flags = COORD_TOKF_BYTE_LEVEL;
    const struct pre_entry *pe = NULL;
    for (size_t i = 0; i < sizeof(gguf_pres) / sizeof(gguf_pres[0]) && !pe; i++)
        if (name_in(gguf_pres[i].names, x->pre))
            pe = &gguf_pres[i];
    if (!pe) {
        char m[64];
        tok_show_piece(m, sizeof(m), x->pre.p, x->pre.len < 40 ? x->pre.len : 40);
        return shardlm_fail(x->e, -EINVAL,
                            "%s: tokenizer.ggml.pre '%s' is not a pre-tokenizer "
                            "this build knows",
                            x->what, m);
    }
    x->s.flags |= pe->flags;
    for (int i = 0; i < 4 && pe->re[i]; i++) {
        x->s.pat[i] = pe->re[i];
        x->s.patlen[i] = strlen(pe->re[i]);
        x->s.n_patterns = i + 1;
    }
    int rc = gg_add_flags(x, false, false);
    return rc ? rc : gg_merges(x);
}

/* The special ids the file sets (each inside the vocabulary), and a BOS/EOS it adds must have
 * one. Returns 0 or -EINVAL. */
static int gg_specials(struct gg *x)
{
    static const char *const keys[] = {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                                       "tokenizer.ggml.unknown_token_id"};
    int *ids[] = {&x->s.bos, &x->s.eos, &x->s.unk};
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
        if (gguf_id(x->g, keys[i], x->s.n, ids[i], x->what, x->e))
            return -EINVAL;
    if ((x->s.flags & COORD_TOKF_ADD_BOS) && x->s.bos < 0)
        return shardlm_fail(x->e, -EINVAL,
                            "%s: tokenizer.ggml.add_bos_token is true, but "
                            "tokenizer.ggml.bos_token_id is not set",
                            x->what);
    if ((x->s.flags & COORD_TOKF_ADD_EOS) && x->s.eos < 0)
        return shardlm_fail(x->e, -EINVAL,
                            "%s: tokenizer.ggml.add_eos_token is true, but "
                            "tokenizer.ggml.eos_token_id is not set",
                            x->what);
    return 0;
}

/* llama.cpp: Phi-3's special tokens (and "</s>", but not "<unk>", "<s>", "<|endoftext|>") eat
 * the whitespace after them; a model is Phi-3 by its general.name. */
static void gg_phi3(struct gg *x)
{
    struct gguf_str name;
    if (gguf_get_str(x->g, "general.name", &name) != 0 || name.len >= 256)
        return;
    char low[256];
    for (size_t i = 0; i < name.len; i++)
        low[i] = (char)tolower((unsigned char)name.p[i]);
    low[name.len] = 0;
    if (strlen(low) != name.len || !(strstr(low, "phi-3") || strstr(low, "phi3")))
        return;
    for (int i = 0; i < x->s.n; i++) {
        int k = x->attrs[i] & COORD_TOKA_TYPE;
        bool sp = k == COORD_TOKT_CONTROL || k == COORD_TOKT_USER_DEFINED ||
                  k == COORD_TOKT_UNKNOWN;
        const char *p = x->s.p[i];
        size_t l = x->s.plen[i];
        if ((sp || (l == 4 && !memcmp(p, "</s>", 4))) && !(l == 5 && !memcmp(p, "<unk>", 5)) &&
            !(l == 3 && !memcmp(p, "<s>", 3)) && !(l == 13 && !memcmp(p, "<|endoftext|>", 13)))
            x->attrs[i] |= COORD_TOKA_RSTRIP;
    }
}

int coord_tok_from_gguf(struct coord_tok *t, const struct gguf_file *g, const char *what,
                        struct shardlm_err *e)
{
    memset(t, 0, sizeof(*t));
    struct gg x = {.g = g, .what = what, .e = e, .pre = {"", 0},
                   .s = {.bos = -1, .eos = -1, .unk = -1, .strict_merges = false}};
    int rc;
    if ((rc = gg_model(&x)) || (rc = gg_arrays(&x)))
        return rc;
    if ((rc = gg_alloc(&x)) || (rc = gg_pieces(&x)))
        goto out;
    if ((rc = x.spm ? gg_spm(&x) : gg_bpe(&x)))
        goto out;
    if ((rc = gg_specials(&x)))
        goto out;
    gg_phi3(&x);
    x.s.scores = x.scores;
    x.s.attrs = x.attrs;
    if ((rc = tok_finish(t, &x.s, what, e)))
        goto out;
    struct gguf_str tmpl;
    if (gguf_get_str(g, "tokenizer.chat_template", &tmpl) == 0 &&
        (rc = coord_tok_set_chat_template(t, tmpl.p, tmpl.len, what, e)))
        coord_tok_free(t);
out:
    free(x.s.p);
    free(x.s.plen);
    free(x.scores);
    free(x.attrs);
    free(x.s.ma);
    free(x.s.mb);
    free(x.s.mal);
    free(x.s.mbl);
    return rc;
}
