/* SPDX-License-Identifier: MIT */
/* coordinator/tok/from_hf_json.c: the tokenizer of a Hugging Face tokenizer.json: model BPE,
 * byte-level or SentencePiece-style (normalizers, pre-tokenizers), added tokens, and the special
 * ids of its post-processor. */
#include "tok_internal.h"

#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* HF Metaspace(split = true): every U+2581 starts a new pre-token */
#define RE_METASPACE "\\x{2581}?[^\\x{2581}]+|\\x{2581}"

/* What coord_tok_from_hf_json() gathers from the JSON, and the tok_src it builds from it. */
struct hf {
    struct tok_src s;
    const char *what;
    struct shardlm_err *e;
    bool byte_level, metaspace_split;
    int prefix; /* -1 unset, 0 none, 1 always, 2 first */
    char *own[COORD_TOK_MAX_PATTERNS]; /* regexes built here */
    uint8_t *attrs;                    /* (cap) */
    int cap;                           /* room for ids: twice the entries */
    size_t n_merges;
    const char *unk; /* model.unk_token (unk_n bytes), or NULL */
    size_t unk_n;
};

/* -EINVAL: @field is not what was @expected. */
static int hf_bad(struct hf *h, const char *field, const char *expected)
{
    return shardlm_fail(h->e, -EINVAL, "%s: %s: expected %s", h->what, field, expected);
}

/* The bytes of JSON string @j (*@n of them, NULs allowed), or NULL when it is not one. */
static const char *jstr(const json_t *j, size_t *n)
{
    if (!json_is_string(j))
        return NULL;
    *n = json_string_length(j);
    return json_string_value(j);
}

/* Whether @j is the string @c. */
static bool jstr_is(const json_t *j, const char *c)
{
    size_t n;
    const char *s = jstr(j, &n);
    return s && n == strlen(c) && memcmp(s, c, n) == 0;
}

/* An optional boolean member: 0 (absent or null: @dflt), or -EINVAL. */
static int jbool(struct hf *h, const json_t *o, const char *key, const char *field, bool *out,
                 bool dflt)
{
    const json_t *j = json_object_get(o, key);
    *out = dflt; /* also on an error, which callers never read past */
    if (!j || json_is_null(j))
        return 0;
    if (!json_is_boolean(j)) {
        char f[96];
        snprintf(f, sizeof(f), "%s.%s", field, key);
        return hf_bad(h, f, "true or false");
    }
    *out = json_is_true(j);
    return 0;
}

/* Adds pre-tokenizer regex @re (@n bytes; freed with @h when @own). Returns 0 or -EINVAL. */
static int hf_add_pattern(struct hf *h, const char *re, size_t n, bool own)
{
    if (h->s.n_patterns == COORD_TOK_MAX_PATTERNS) {
        if (own)
            free((char *)re);
        return shardlm_fail(h->e, -EINVAL, "%s: pre_tokenizer: more than %d splitting steps",
                            h->what, COORD_TOK_MAX_PATTERNS);
    }
    int i = h->s.n_patterns++;
    h->s.pat[i] = re;
    h->s.patlen[i] = n;
    if (own)
        h->own[i] = (char *)re;
    return 0;
}

/* A literal string as a regex (\x{...} escapes for everything but ASCII alphanumerics). */
static int hf_literal(struct hf *h, const char *s, size_t n)
{
    if (n == 0 || n > TOK_MAX_PATTERN / 12)
        return hf_bad(h, "pre_tokenizer Split pattern String", "1..341 bytes");
    char *re = malloc(n * 12 + 1);
    if (!re)
        return shardlm_fail(h->e, -ENOMEM, "%s: out of memory", h->what);
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t l = tok_get_utf8(s + i, n - i, &cp);
        if (!l) {
            free(re);
            return hf_bad(h, "pre_tokenizer Split pattern String", "UTF-8 text");
        }
        if (cp < 0x80 && isalnum((int)cp))
            re[o++] = (char)cp;
        else
            o += (size_t)sprintf(re + o, "\\x{%x}", (unsigned)cp);
        i += l;
    }
    re[o] = 0;
    return hf_add_pattern(h, re, o, true);
}

/* -EINVAL: the "type" @ty of a @part (pre_tokenizer, normalizer) is none of @known. */
static int hf_unsupported(struct hf *h, const char *part, const json_t *ty, const char *known)
{
    size_t n;
    const char *name = jstr(ty, &n);
    char m[48];
    tok_show_piece(m, sizeof(m), name ? name : "?", name ? (n < 32 ? n : 32) : 1);
    return shardlm_fail(h->e, -EINVAL, "%s: %s type '%s' is not supported (%s)", h->what, part, m,
                        known);
}

/* Each member of the array @p[@key] (@field in errors) through @step, one level deeper. */
static int hf_sequence(struct hf *h, const json_t *p, const char *key, const char *field,
                       int depth, int (*step)(struct hf *, const json_t *, int))
{
    const json_t *seq = json_object_get(p, key);
    int rc;
    if (!json_is_array(seq))
        return hf_bad(h, field, "an array");
    for (size_t i = 0; i < json_array_size(seq); i++)
        if ((rc = step(h, json_array_get(seq, i), depth + 1)))
            return rc;
    return 0;
}

/* pre_tokenizer ByteLevel: GPT-2 bytes, its regex unless use_regex is false. */
static int hf_pre_byte_level(struct hf *h, const json_t *p)
{
    int rc;
    bool b;
    h->byte_level = true;
    if ((rc = jbool(h, p, "add_prefix_space", "pre_tokenizer", &b, true)))
        return rc;
    if (b)
        h->prefix = 1;
    if ((rc = jbool(h, p, "use_regex", "pre_tokenizer", &b, true)))
        return rc;
    return b ? hf_add_pattern(h, TOK_RE_GPT2, strlen(TOK_RE_GPT2), false) : 0;
}

/* pre_tokenizer Metaspace: ' ' is U+2581, a prefix by prepend_scheme (or add_prefix_space),
 * and with split every U+2581 starts a pre-token (the regex is added last: hf_flags()). */
static int hf_pre_metaspace(struct hf *h, const json_t *p)
{
    int rc;
    bool b;
    size_t n;
    const char *r = jstr(json_object_get(p, "replacement"), &n);
    if (!r || n != 3 || memcmp(r, TOK_ESC_WS, 3) != 0)
        return hf_bad(h, "pre_tokenizer Metaspace replacement", "\"\\u2581\"");
    h->s.flags |= COORD_TOKF_ESCAPE_WS;
    const json_t *ps = json_object_get(p, "prepend_scheme");
    if (jstr_is(ps, "always"))
        h->prefix = 1;
    else if (jstr_is(ps, "first"))
        h->prefix = 2;
    else if (jstr_is(ps, "never"))
        h->prefix = 0;
    else if (ps && !json_is_null(ps))
        return hf_bad(h, "pre_tokenizer Metaspace prepend_scheme", "always, first or never");
    else {
        if ((rc = jbool(h, p, "add_prefix_space", "pre_tokenizer", &b, true)))
            return rc;
        h->prefix = b ? 1 : 0;
    }
    if ((rc = jbool(h, p, "split", "pre_tokenizer", &b, true)))
        return rc;
    if (b)
        h->metaspace_split = true;
    return 0;
}

/* pre_tokenizer Split: an Isolated split by a regex or a literal string. */
static int hf_pre_split(struct hf *h, const json_t *p)
{
    const json_t *pat = json_object_get(p, "pattern");
    const json_t *beh = json_object_get(p, "behavior");
    int rc;
    bool b;
    if ((rc = jbool(h, p, "invert", "pre_tokenizer Split", &b, false)))
        return rc;
    if (b)
        return hf_bad(h, "pre_tokenizer Split invert", "false");
    /* Gemma: a split on ' ' after the normalizer made every ' ' a U+2581 splits nothing */
    if ((h->s.flags & COORD_TOKF_ESCAPE_WS) && json_is_object(pat) &&
        jstr_is(json_object_get(pat, "String"), " "))
        return 0;
    if (!jstr_is(beh, "Isolated"))
        return hf_bad(h, "pre_tokenizer Split behavior", "\"Isolated\"");
    size_t n;
    const char *re;
    if (json_is_object(pat) && (re = jstr(json_object_get(pat, "Regex"), &n)))
        return hf_add_pattern(h, re, n, false);
    if (json_is_object(pat) && (re = jstr(json_object_get(pat, "String"), &n)))
        return hf_literal(h, re, n);
    return hf_bad(h, "pre_tokenizer Split pattern", "{\"Regex\": ...} or {\"String\": ...}");
}

/* The pre_tokenizer @p (null: none), @depth levels into Sequences. Returns 0 or -EINVAL. */
static int hf_pre(struct hf *h, const json_t *p, int depth)
{
    if (!p || json_is_null(p))
        return 0;
    if (!json_is_object(p) || depth > 4)
        return hf_bad(h, "pre_tokenizer", "an object");
    const json_t *ty = json_object_get(p, "type");
    if (jstr_is(ty, "Sequence"))
        return hf_sequence(h, p, "pretokenizers", "pre_tokenizer.pretokenizers", depth, hf_pre);
    if (jstr_is(ty, "ByteLevel"))
        return hf_pre_byte_level(h, p);
    if (jstr_is(ty, "Metaspace"))
        return hf_pre_metaspace(h, p);
    if (jstr_is(ty, "Split"))
        return hf_pre_split(h, p);
    if (jstr_is(ty, "Digits")) {
        int rc;
        bool b;
        if ((rc = jbool(h, p, "individual_digits", "pre_tokenizer Digits", &b, false)))
            return rc;
        const char *re = b ? "\\p{N}" : "\\p{N}+";
        return hf_add_pattern(h, re, strlen(re), false);
    }
    return hf_unsupported(h, "pre_tokenizer", ty, "ByteLevel, Metaspace, Split, Digits, Sequence");
}

/* The normalizer @p (null: none), @depth levels into Sequences. Returns 0 or -EINVAL. */
static int hf_norm(struct hf *h, const json_t *p, int depth)
{
    if (!p || json_is_null(p))
        return 0;
    if (!json_is_object(p) || depth > 4)
        return hf_bad(h, "normalizer", "an object");
    const json_t *ty = json_object_get(p, "type");
    if (jstr_is(ty, "Sequence"))
        return hf_sequence(h, p, "normalizers", "normalizer.normalizers", depth, hf_norm);
    if (jstr_is(ty, "Prepend")) {
        if (!jstr_is(json_object_get(p, "prepend"), TOK_ESC_WS))
            return hf_bad(h, "normalizer Prepend prepend", "\"\\u2581\"");
        h->prefix = 1;
        return 0;
    }
    if (jstr_is(ty, "Replace")) {
        const json_t *pat = json_object_get(p, "pattern");
        if (!json_is_object(pat) || !jstr_is(json_object_get(pat, "String"), " ") ||
            !jstr_is(json_object_get(p, "content"), TOK_ESC_WS))
            return hf_bad(h, "normalizer Replace", "' ' replaced by \"\\u2581\"");
        h->s.flags |= COORD_TOKF_ESCAPE_WS;
        return 0;
    }
    if (jstr_is(ty, "NFC")) { /* (llama.cpp does not apply it; Hugging Face does) */
        h->s.flags |= COORD_TOKF_NFC;
        return 0;
    }
    return hf_unsupported(h, "normalizer", ty, "Prepend and Replace of \"\\u2581\", NFC, Sequence");
}

/* BOS/EOS from a TemplateProcessing "single" template: special tokens before and after $A. */
static void hf_template(struct coord_tok *t, const json_t *pp, int depth, int *bos, int *eos,
                        unsigned *flags)
{
    if (!json_is_object(pp) || depth > 4)
        return;
    const json_t *ty = json_object_get(pp, "type");
    if (jstr_is(ty, "Sequence")) {
        const json_t *seq = json_object_get(pp, "processors");
        for (size_t i = 0; i < json_array_size(seq); i++)
            hf_template(t, json_array_get(seq, i), depth + 1, bos, eos, flags);
        return;
    }
    if (!jstr_is(ty, "TemplateProcessing"))
        return;
    const json_t *single = json_object_get(pp, "single");
    bool seen_a = false;
    for (size_t i = 0; i < json_array_size(single); i++) {
        const json_t *it = json_array_get(single, i);
        if (json_object_get(it, "Sequence")) {
            seen_a = true;
            continue;
        }
        size_t n;
        const char *s = jstr(json_object_get(json_object_get(it, "SpecialToken"), "id"), &n);
        int id = s ? tok_lookup_n(t, s, n) : -1;
        if (id < 0)
            continue;
        if (!seen_a) {
            *bos = id;
            *flags |= COORD_TOKF_ADD_BOS;
        } else {
            *eos = id;
            *flags |= COORD_TOKF_ADD_EOS;
        }
    }
}

/* The id of the first of @names (NULL-terminated) that is a piece, or -1. */
static int first_of(const struct coord_tok *t, const char *const *names)
{
    for (; *names; names++) {
        int id = tok_lookup(t, *names);
        if (id >= 0)
            return id;
    }
    return -1;
}

/* The BPE model: its vocab and merges (*@vocab, *@merges), unk_token and the flags it sets;
 * what this build cannot do (other models, dropout, affixes) refused. Returns 0 or -EINVAL. */
static int hf_json_model(struct hf *h, const json_t *root, const json_t **vocab,
                         const json_t **merges)
{
    const json_t *model = json_object_get(root, "model");
    int rc;
    bool b;
    if (!json_is_object(model))
        return hf_bad(h, "model", "an object");
    h->unk = jstr(json_object_get(model, "unk_token"), &h->unk_n);
    const json_t *ty = json_object_get(model, "type");
    if (ty && !jstr_is(ty, "BPE"))
        return hf_bad(h, "model.type", "\"BPE\" (WordPiece, Unigram and WordLevel are not "
                      "supported)");
    *vocab = json_object_get(model, "vocab");
    if (!json_is_object(*vocab))
        return hf_bad(h, "model.vocab", "an object of piece: id");
    *merges = json_object_get(model, "merges");
    if (!json_is_array(*merges))
        return hf_bad(h, "model.merges", "an array");
    const json_t *d = json_object_get(model, "dropout");
    if (d && !json_is_null(d) && (!json_is_number(d) || json_number_value(d) != 0.0))
        return hf_bad(h, "model.dropout", "null (BPE dropout is not supported)");
    const char *aff[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        const json_t *j = json_object_get(model, aff[i]);
        size_t n;
        if (j && !json_is_null(j) && (!jstr(j, &n) || n != 0)) {
            char f[64];
            snprintf(f, sizeof(f), "model.%s", aff[i]);
            return hf_bad(h, f, "null or \"\"");
        }
    }
    if ((rc = jbool(h, model, "byte_fallback", "model", &b, false)))
        return rc;
    if (b)
        h->s.flags |= COORD_TOKF_BYTE_FALLBACK;
    if ((rc = jbool(h, model, "ignore_merges", "model", &b, false)))
        return rc;
    if (b)
        h->s.flags |= COORD_TOKF_IGNORE_MERGES;
    return 0;
}

/* Places piece @p (@n bytes) at @id in @h->s, checking for conflicts. */
static int hf_place(struct hf *h, const char *p, size_t n, json_int_t id, const char *field)
{
    int cap = h->cap;
    if (id < 0 || id >= cap) {
        char f[160];
        snprintf(f, sizeof(f), "%s id %lld", field, (long long)id);
        return shardlm_fail(h->e, -EINVAL,
                            "%s: %s: expected 0..%d (ids must stay within twice "
                            "the number of tokens)",
                            h->what, f, cap - 1);
    }
    if (n > COORD_TOK_MAX_PIECE)
        return hf_bad(h, field, "pieces of at most 65536 bytes");
    int i = (int)id;
    if (h->s.p[i]) {
        if (h->s.plen[i] == n && memcmp(h->s.p[i], p, n) == 0)
            return 0;
        char a[48], b[48];
        tok_show_piece(a, sizeof(a), h->s.p[i], h->s.plen[i]);
        tok_show_piece(b, sizeof(b), p, n);
        return shardlm_fail(h->e, -EINVAL, "%s: %s: id %d is both '%s' and '%s'", h->what, field, i,
                            a, b);
    }
    h->s.p[i] = p;
    h->s.plen[i] = (uint32_t)n;
    if (i >= h->s.n)
        h->s.n = i + 1;
    return 0;
}

/* Checks added_tokens and sizes the arrays of h->s: ids dense from 0, holes allowed up to the
 * number of entries again. Returns 0 or -errno. */
static int hf_alloc(struct hf *h, const json_t *vocab, const json_t *merges, const json_t *added)
{
    if (added && !json_is_null(added) && !json_is_array(added))
        return hf_bad(h, "added_tokens", "an array");
    size_t entries = json_object_size(vocab) + json_array_size(added);
    if (entries == 0 || entries > COORD_TOK_MAX_VOCAB / 2)
        return shardlm_fail(h->e, -EINVAL, "%s: %zu tokens, expected 1..%d", h->what, entries,
                            COORD_TOK_MAX_VOCAB / 2);
    h->cap = (int)(2 * entries);
    h->s.p = calloc((size_t)h->cap, sizeof(char *));
    h->s.plen = calloc((size_t)h->cap, sizeof(uint32_t));
    h->attrs = calloc((size_t)h->cap, 1);
    h->n_merges = json_array_size(merges);
    if (h->n_merges > TOK_MAX_MERGES)
        return hf_bad(h, "model.merges", "at most 16777216 merges");
    size_t nm = h->n_merges ? h->n_merges : 1;
    h->s.ma = malloc(nm * sizeof(char *));
    h->s.mb = malloc(nm * sizeof(char *));
    h->s.mal = malloc(nm * sizeof(uint32_t));
    h->s.mbl = malloc(nm * sizeof(uint32_t));
    if (!h->s.p || !h->s.plen || !h->attrs || !h->s.ma || !h->s.mb || !h->s.mal || !h->s.mbl)
        return shardlm_fail(h->e, -ENOMEM, "%s: out of memory", h->what);
    return 0;
}

/* Whether piece @p (@n bytes) is model.unk_token. */
static bool hf_is_unk(const struct hf *h, const char *p, size_t n)
{
    return h->unk && h->unk_n == n && memcmp(h->unk, p, n) == 0;
}

/* model.vocab, piece: id, each piece typed unknown, byte ("<0xNN>" with byte_fallback) or
 * normal. Returns 0 or -EINVAL. */
static int hf_vocab(struct hf *h, const json_t *vocab)
{
    const char *key;
    size_t key_len;
    const json_t *val;
    int rc;
    json_object_keylen_foreach((json_t *)vocab, key, key_len, val)
    {
        if (!json_is_integer(val))
            return hf_bad(h, "model.vocab", "integer ids");
        if ((rc = hf_place(h, key, key_len, json_integer_value(val), "model.vocab")))
            return rc;
    }
    for (int i = 0; i < h->cap; i++) {
        unsigned b;
        if (!h->s.p[i])
            continue;
        if (hf_is_unk(h, h->s.p[i], h->s.plen[i]))
            h->attrs[i] = COORD_TOKT_UNKNOWN;
        else if ((h->s.flags & COORD_TOKF_BYTE_FALLBACK) &&
                 tok_byte_piece(h->s.p[i], h->s.plen[i], &b))
            h->attrs[i] = COORD_TOKT_BYTE;
        else
            h->attrs[i] = COORD_TOKT_NORMAL;
    }
    return 0;
}

/* added_tokens: special ones control tokens, the others user-defined, with their lstrip and
 * rstrip; then the ids no entry has become unused holes. Returns 0 or -EINVAL. */
static int hf_added(struct hf *h, const json_t *added)
{
    int rc;
    for (size_t i = 0; i < json_array_size(added); i++) {
        const json_t *a = json_array_get(added, i);
        const json_t *id = json_object_get(a, "id");
        size_t n = 0;
        const char *c = jstr(json_object_get(a, "content"), &n);
        bool special, ls, rs;
        if (!json_is_object(a) || !json_is_integer(id) || !c || n == 0)
            return hf_bad(h, "added_tokens", "objects with an integer id and a non-empty content");
        if ((rc = jbool(h, a, "special", "added_tokens", &special, false)) ||
            (rc = jbool(h, a, "lstrip", "added_tokens", &ls, false)) ||
            (rc = jbool(h, a, "rstrip", "added_tokens", &rs, false)) ||
            (rc = hf_place(h, c, n, json_integer_value(id), "added_tokens")))
            return rc;
        int k = (int)json_integer_value(id);
        h->attrs[k] = (uint8_t)((hf_is_unk(h, c, n) ? COORD_TOKT_UNKNOWN
                                 : special ? COORD_TOKT_CONTROL : COORD_TOKT_USER_DEFINED) |
                                (ls ? COORD_TOKA_LSTRIP : 0) | (rs ? COORD_TOKA_RSTRIP : 0));
    }
    for (int i = 0; i < h->s.n; i++)
        if (!h->s.p[i]) { /* a hole: never produced, never looked up */
            h->s.p[i] = "";
            h->attrs[i] = COORD_TOKT_UNUSED;
        }
    return 0;
}

/* model.merges: "a b" strings (split at the first space after the first byte) or ["a", "b"]
 * pairs. Returns 0 or -EINVAL. */
static int hf_merges(struct hf *h, const json_t *merges)
{
    for (size_t i = 0; i < h->n_merges; i++) {
        const json_t *m = json_array_get(merges, i);
        size_t n, n2;
        const char *a = jstr(m, &n), *b;
        if (a) {
            const char *sp = n > 1 ? memchr(a + 1, ' ', n - 1) : NULL;
            if (!sp || !sp[1])
                return hf_bad(h, "model.merges", "\"a b\" strings or [\"a\", \"b\"] pairs");
            b = sp + 1;
            n2 = n - (size_t)(b - a);
            n = (size_t)(sp - a);
        } else if (!(json_is_array(m) && json_array_size(m) == 2 &&
                     (a = jstr(json_array_get(m, 0), &n)) &&
                     (b = jstr(json_array_get(m, 1), &n2)))) {
            return hf_bad(h, "model.merges", "\"a b\" strings or [\"a\", \"b\"] pairs");
        }
        if (n > COORD_TOK_MAX_PIECE || n2 > COORD_TOK_MAX_PIECE)
            return hf_bad(h, "model.merges", "pieces of at most 65536 bytes");
        h->s.ma[i] = a;
        h->s.mal[i] = (uint32_t)n;
        h->s.mb[i] = b;
        h->s.mbl[i] = (uint32_t)n2;
    }
    h->s.n_merges = (int)h->n_merges;
    return 0;
}

/* The flags the pre-tokenizers and normalizers set, once all are read: byte-level, the
 * Metaspace split (after the other regexes), the space prefix. Returns 0 or -EINVAL. */
static int hf_flags(struct hf *h)
{
    int rc;
    if (h->byte_level)
        h->s.flags |= COORD_TOKF_BYTE_LEVEL;
    if (h->metaspace_split && (rc = hf_add_pattern(h, RE_METASPACE, strlen(RE_METASPACE), false)))
        return rc;
    if (h->prefix >= 1)
        h->s.flags |= COORD_TOKF_SPACE_PREFIX | (h->prefix == 2 ? COORD_TOKF_PREFIX_FIRST : 0);
    return 0;
}

/* The special ids of the built @t: the post-processor's template, else the usual names. */
static void hf_specials(struct coord_tok *t, const json_t *root, const struct hf *h)
{
    static const char *const bos_names[] = {"<s>", "<|begin_of_text|>", "<bos>", "<|endoftext|>",
                                            NULL};
    static const char *const eos_names[] = {"</s>", "<|end_of_text|>", "<|endoftext|>", "<eos>",
                                            "<|im_end|>", NULL};
    int bos = -1, eos = -1;
    unsigned fl = 0;
    hf_template(t, json_object_get(root, "post_processor"), 0, &bos, &eos, &fl);
    t->bos_id = bos >= 0 ? bos : first_of(t, bos_names);
    t->eos_id = eos >= 0 ? eos : first_of(t, eos_names);
    t->unk_id = h->unk ? tok_lookup_n(t, h->unk, h->unk_n) : -1;
    t->flags |= fl;
}

/* Parses @json (@len bytes) into *@root. Returns 0 or -EINVAL with @e set. */
static int hf_parse(const uint8_t *json, size_t len, const char *what, struct shardlm_err *e,
                    json_t **root)
{
    json_error_t jerr;
    *root = json_loadb((const char *)json, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &jerr);
    if (*root)
        return 0;
    char msg[200]; /* jansson quotes the input: keep the error on one line */
    tok_show_piece(msg, sizeof(msg), jerr.text, strnlen(jerr.text, sizeof(jerr.text)));
    return shardlm_fail(e, -EINVAL, "%s: not JSON: %s at line %d", what, msg, jerr.line);
}

int coord_tok_from_hf_json(struct coord_tok *t, const uint8_t *json, size_t len, const char *what,
                           struct shardlm_err *e)
{
    memset(t, 0, sizeof(*t));
    json_t *root;
    int rc = hf_parse(json, len, what, e, &root);
    if (rc)
        return rc;
    struct hf h = {.what = what, .e = e, .prefix = -1};
    h.s.type = COORD_TOK_BPE;
    h.s.bos = h.s.eos = h.s.unk = -1;
    h.s.strict_merges = true;
    const json_t *vocab = NULL, *merges = NULL, *added = json_object_get(root, "added_tokens");
    if (!json_is_object(root)) {
        rc = hf_bad(&h, "the top level", "an object");
        goto out;
    }
    if ((rc = hf_json_model(&h, root, &vocab, &merges)) ||
        (rc = hf_norm(&h, json_object_get(root, "normalizer"), 0)) ||
        (rc = hf_pre(&h, json_object_get(root, "pre_tokenizer"), 0)) ||
        (rc = hf_alloc(&h, vocab, merges, added)) || (rc = hf_vocab(&h, vocab)) ||
        (rc = hf_added(&h, added)) || (rc = hf_merges(&h, merges)) || (rc = hf_flags(&h)))
        goto out;
    h.s.attrs = h.attrs;
    if ((rc = tok_finish(t, &h.s, what, e)))
        goto out;
    hf_specials(t, root, &h);
out:
    for (int i = 0; i < COORD_TOK_MAX_PATTERNS; i++)
        free(h.own[i]);
    free(h.s.p);
    free(h.s.plen);
    free(h.attrs);
    free(h.s.ma);
    free(h.s.mb);
    free(h.s.mal);
    free(h.s.mbl);
    json_decref(root);
    return rc;
}
