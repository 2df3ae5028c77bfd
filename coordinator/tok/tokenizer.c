/* SPDX-License-Identifier: MIT */
/* coordinator/tok/tokenizer.c: the tokenizer itself: tok_finish() (what every source's builder
 * ends with), its tables, coord_tok_free(), and coord_tok_from_image() (which source a file is).
 *
 * llama2.c's run.c rules for tokenizer.bin vocabularies (from_llama2c.c); llama.cpp's
 * llm_tokenizer_spm / llm_tokenizer_bpe rules (and its special-token partition) for GGUF
 * (from_gguf.c) and Hugging Face tokenizer.json (from_hf_json.c) sources; a versioned blob for
 * .shlm files (blob.c). Every builder fills a struct tok_src (pieces, scores, types, merges as
 * strings or ids, regexes) and tok_finish() turns it into the tokenizer: one arena of pieces, an
 * open-addressing map piece -> id, merges resolved to ids with a map (left, right) -> rank, the
 * compiled regexes, the decoded text of each token (decode.c). Encoding (encode.c) merges with a
 * binary heap (llama.cpp's priority queue) word by word where the vocabulary allows it (SPM
 * pieces that never span a word's end and the next space; BPE pre-tokens), a word met before
 * from a cache: linear in the text. */
#include "tok_internal.h"

#include "gguf.h"
#include "shlm.h"
#include "sniff.h"
#include "utf8.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <errno.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RE_MATCH_LIMIT 1000000 /* per match: the shipped regexes need a few per character */

void coord_tok_free(struct coord_tok *t)
{
    free(t->vocab);
    free(t->vocab_len);
    free(t->scores);
    free(t->attrs);
    free(t->merges);
    for (int i = 0; i < COORD_TOK_MAX_PATTERNS; i++) {
        free(t->patterns[i]);
        pcre2_code_free(t->re[i]);
    }
    pcre2_match_context_free(t->mctx);
    free(t->arena);
    free(t->dec);
    free(t->dec_len);
    free(t->dec_arena);
    free(t->piece_map);
    free(t->merge_map);
    free(t->specials);
    free(t->chat_template);
    memset(t, 0, sizeof(*t));
}

/* The id of control or user-defined token @text, or -1. */
static int special_id(const struct coord_tok *t, const char *text)
{
    size_t n = strlen(text);
    for (int id = 0; id < t->vocab_size; id++) {
        unsigned type = t->attrs[id] & COORD_TOKA_TYPE;
        if ((type == COORD_TOKT_CONTROL || type == COORD_TOKT_USER_DEFINED) &&
            t->vocab_len[id] == n && !memcmp(t->vocab[id], text, n))
            return id;
    }
    return -1;
}

int coord_tok_eog_ids(const struct coord_tok *t, int32_t *out)
{
    static const char *const names[] = {"<|eot_id|>",
                                        "<|eom_id|>",
                                        "<|im_end|>",
                                        "<|end|>",
                                        "<end_of_turn>",
                                        "<|endoftext|>",
                                        "<|end_of_text|>",
                                        "<|return|>",
                                        "<|call|>",
                                        "<EOT>",
                                        "<|END_OF_TURN_TOKEN|>",
                                        "\xef\xbd\x9c"
                                        "end"
                                        "\xe2\x96\x81"
                                        "of"
                                        "\xe2\x96\x81"
                                        "sentence"
                                        "\xef\xbd\x9c" /* DeepSeek's */};
    /* gpt-oss (harmony) ends a turn with <|return|> or <|call|>; its <|end|> ends one message
     * of the turn (the reasoning before the answer) - unlike Phi-3's, whose <|end|> ends it */
    bool harmony = special_id(t, "<|return|>") >= 0 && special_id(t, "<|channel|>") >= 0;
    int n = 0;
    if (t->eos_id >= 0)
        out[n++] = t->eos_id;
    for (size_t k = 0; k < sizeof(names) / sizeof(*names) && n < COORD_TOK_MAX_EOG; k++) {
        if (harmony ? !strcmp(names[k], "<|end|>") : !strcmp(names[k], "<|call|>"))
            continue;
        int id = special_id(t, names[k]);
        if (id >= 0 && id != t->eos_id)
            out[n++] = id;
    }
    return n;
}

int coord_tok_set_chat_template(struct coord_tok *t, const char *s, size_t n, const char *what,
                                struct shardlm_err *e)
{
    if (n > COORD_TOK_MAX_TEMPLATE)
        return shardlm_fail(e, -EINVAL, "%s: the chat template has %zu bytes, more than %u", what,
                            n, COORD_TOK_MAX_TEMPLATE);
    if (memchr(s, 0, n) || !coord_utf8_valid(s, n, NULL))
        return shardlm_fail(e, -EINVAL, "%s: the chat template is not UTF-8 text", what);
    char *c = malloc(n + 1);
    if (!c)
        return shardlm_fail(e, -ENOMEM, "%s: out of memory", what);
    memcpy(c, s, n);
    c[n] = 0;
    free(t->chat_template);
    t->chat_template = c;
    return 0;
}

void tok_show_piece(char *buf, size_t cap, const char *p, size_t n)
{
    size_t o = 0;
    for (size_t i = 0; i < n && o + 5 < cap; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c >= 0x20 && c != 0x7f && c != '\'' && c != '\\')
            buf[o++] = (char)c;
        else
            o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", c);
    }
    buf[o] = 0;
}

bool tok_byte_piece(const char *p, size_t n, unsigned *b)
{
    static const char hex[] = "0123456789ABCDEF";
    if (n != 6 || memcmp(p, "<0x", 3) != 0 || p[5] != '>')
        return false;
    const char *h = memchr(hex, p[3], 16), *l = memchr(hex, p[4], 16);
    if (!h || !l || !p[3] || !p[4])
        return false;
    *b = (unsigned)((h - hex) * 16 + (l - hex));
    return true;
}

/* The map piece -> id (struct coord_tok.piece_map) and the ids of one-byte pieces. A piece
 * twice is an error, but in a llama2.c vocabulary (the first one wins). Returns 0 or -errno. */
static int build_piece_map(struct coord_tok *t, const char *what, struct shardlm_err *e)
{
    bool llama2c = t->type == COORD_TOK_SPM_LLAMA2C;
    t->piece_mask = tok_map_cap((size_t)t->vocab_size) - 1;
    t->piece_map = malloc(((size_t)t->piece_mask + 1) * sizeof(*t->piece_map));
    if (!t->piece_map)
        return shardlm_fail(e, -ENOMEM, "%s: out of memory", what);
    memset(t->piece_map, 0xff, ((size_t)t->piece_mask + 1) * sizeof(*t->piece_map));
    for (int id = 0; id < t->vocab_size; id++) {
        size_t n = t->vocab_len[id];
        if (n == 0 && !llama2c) /* holes and empty pieces are never looked up */
            continue;
        uint32_t h = tok_hash_bytes(t->vocab[id], n), i = h & t->piece_mask;
        int32_t o;
        for (; (o = t->piece_map[i].id) >= 0; i = (i + 1) & t->piece_mask)
            if (t->vocab_len[o] == n && memcmp(t->vocab[o], t->vocab[id], n) == 0)
                break;
        if (o >= 0) {
            if (llama2c) /* the first one wins, as the earlier sorted lookup mostly did */
                continue;
            char s[64];
            tok_show_piece(s, sizeof(s), t->vocab[id], n);
            return shardlm_fail(e, -EINVAL, "%s: token %d '%s' duplicates token %d", what, id, s,
                                o);
        }
        t->piece_map[i].id = id;
        t->piece_map[i].hash = h;
    }
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        t->char_ids[b] = tok_lookup_map(t, &c, 1);
    }
    return 0;
}

/* Resolves merge @r (strings or ids) into t->merges[r]; 1 when it cannot be (skipped). */
static int resolve_merge(struct coord_tok *t, const struct tok_src *s, int r, char **scratch,
                         size_t *cap, const char *what, struct shardlm_err *e)
{
    int a, b;
    char sa[48], sb[48];
    if (s->mid) {
        a = s->mid[r * 2];
        b = s->mid[r * 2 + 1];
        if (a < 0 || a >= t->vocab_size || b < 0 || b >= t->vocab_size)
            return shardlm_fail(e, -EINVAL, "%s: merge %d: ids %d %d, expected 0..%d", what, r, a,
                                b, t->vocab_size - 1);
    } else {
        a = tok_lookup_n(t, s->ma[r], s->mal[r]);
        b = tok_lookup_n(t, s->mb[r], s->mbl[r]);
        if (a < 0 || b < 0) {
            if (!s->strict_merges)
                return 1;
            tok_show_piece(sa, sizeof(sa), s->ma[r], s->mal[r]);
            tok_show_piece(sb, sizeof(sb), s->mb[r], s->mbl[r]);
            return shardlm_fail(e, -EINVAL,
                                "%s: merge %d ('%s' '%s'): '%s' is not in the "
                                "vocabulary",
                                what, r, sa, sb, a < 0 ? sa : sb);
        }
    }
    size_t la = t->vocab_len[a], lb = t->vocab_len[b];
    if (la == 0 || lb == 0) { /* a hole or an empty piece never merges */
        if (!s->strict_merges)
            return 1;
        return shardlm_fail(e, -EINVAL, "%s: merge %d: token %d or %d is empty", what, r, a, b);
    }
    if (la + lb > *cap) {
        char *n = realloc(*scratch, la + lb);
        if (!n)
            return shardlm_fail(e, -ENOMEM, "%s: out of memory", what);
        *scratch = n;
        *cap = la + lb;
    }
    memcpy(*scratch, t->vocab[a], la);
    memcpy(*scratch + la, t->vocab[b], lb);
    int m = tok_lookup_n(t, *scratch, la + lb);
    if (m < 0) {
        if (!s->strict_merges)
            return 1;
        tok_show_piece(sa, sizeof(sa), t->vocab[a], la);
        tok_show_piece(sb, sizeof(sb), t->vocab[b], lb);
        return shardlm_fail(e, -EINVAL,
                            "%s: merge %d ('%s' '%s'): their concatenation is not in "
                            "the vocabulary",
                            what, r, sa, sb);
    }
    int k = t->n_merges++;
    t->merges[k * 3] = a;
    t->merges[k * 3 + 1] = b;
    t->merges[k * 3 + 2] = m;
    return 0;
}

/* Resolves the merges of @s to ids, by rank (struct coord_tok.merges), and builds the map
 * (left, right) -> rank. Returns 0 or -errno with @e set. */
static int build_merges(struct coord_tok *t, const struct tok_src *s, const char *what,
                        struct shardlm_err *e)
{
    if (s->n_merges == 0)
        return 0;
    t->merges = malloc((size_t)s->n_merges * 3 * sizeof(int32_t));
    if (!t->merges)
        return shardlm_fail(e, -ENOMEM, "%s: out of memory", what);
    char *scratch = NULL;
    size_t cap = 0;
    for (int r = 0; r < s->n_merges; r++) {
        int rc = resolve_merge(t, s, r, &scratch, &cap, what, e);
        if (rc < 0) {
            free(scratch);
            return rc;
        }
    }
    free(scratch);
    t->merge_mask = tok_map_cap((size_t)t->n_merges) - 1;
    t->merge_map = malloc(((size_t)t->merge_mask + 1) * sizeof(int32_t));
    if (!t->merge_map)
        return shardlm_fail(e, -ENOMEM, "%s: out of memory", what);
    memset(t->merge_map, 0xff, ((size_t)t->merge_mask + 1) * sizeof(int32_t));
    for (int r = 0; r < t->n_merges; r++) {
        int32_t a = t->merges[r * 3], b = t->merges[r * 3 + 1];
        uint32_t i = tok_hash_pair(a, b) & t->merge_mask;
        for (; t->merge_map[i] >= 0; i = (i + 1) & t->merge_mask)
            if (t->merges[t->merge_map[i] * 3] == a && t->merges[t->merge_map[i] * 3 + 1] == b)
                break;
        if (t->merge_map[i] < 0) /* a repeated pair keeps its first (best) rank */
            t->merge_map[i] = r;
    }
    return 0;
}

/* Compiles the pre-tokenizer regexes of @s (UTF-8, Unicode properties), JIT where it can be
 * had, under match limits. Returns 0 or -errno with @e set. */
static int build_regexes(struct coord_tok *t, const struct tok_src *s, const char *what,
                         struct shardlm_err *e)
{
    if (s->n_patterns == 0)
        return 0;
    t->mctx = pcre2_match_context_create(NULL);
    if (!t->mctx)
        return shardlm_fail(e, -ENOMEM, "%s: out of memory", what);
    pcre2_set_match_limit(t->mctx, RE_MATCH_LIMIT);
    pcre2_set_depth_limit(t->mctx, RE_MATCH_LIMIT);
    pcre2_set_heap_limit(t->mctx, 64 * 1024); /* KiB */
    for (int i = 0; i < s->n_patterns; i++) {
        if (s->patlen[i] == 0 || s->patlen[i] > TOK_MAX_PATTERN ||
            memchr(s->pat[i], 0, s->patlen[i]))
            return shardlm_fail(e, -EINVAL,
                                "%s: pre-tokenizer regex %d is %zu bytes, expected "
                                "1..%d without NUL",
                                what, i, s->patlen[i], TOK_MAX_PATTERN);
        t->patterns[i] = malloc(s->patlen[i] + 1);
        if (!t->patterns[i])
            return shardlm_fail(e, -ENOMEM, "%s: out of memory", what);
        memcpy(t->patterns[i], s->pat[i], s->patlen[i]);
        t->patterns[i][s->patlen[i]] = 0;
        t->n_patterns = i + 1;
        int err;
        PCRE2_SIZE at;
        t->re[i] = pcre2_compile((PCRE2_SPTR)s->pat[i], s->patlen[i],
                                 PCRE2_UTF | PCRE2_UCP, &err, &at, NULL);
        if (!t->re[i]) {
            PCRE2_UCHAR msg[120];
            pcre2_get_error_message(err, msg, sizeof(msg));
            return shardlm_fail(e, -EINVAL, "%s: pre-tokenizer regex %d: %s at offset %zu", what, i,
                                (const char *)msg, (size_t)at);
        }
        /* the regexes were 60% of a GPT-2 encode interpreted; JIT makes that 3x faster. Where it
         * cannot be had (no JIT support, no executable memory) the interpreter runs */
        (void)pcre2_jit_compile(t->re[i], PCRE2_JIT_COMPLETE);
    }
    return 0;
}

/* The byte tokens (struct coord_tok.byte_ids): byte-level, the GPT-2 character of each byte;
 * else "<0xNN>", or SPM's one-byte piece (llama.cpp byte_to_token). */
static void build_byte_ids(struct coord_tok *t)
{
    for (unsigned b = 0; b < 256; b++) {
        char buf[8];
        if (t->flags & COORD_TOKF_BYTE_LEVEL) {
            t->byte_ids[b] = tok_lookup_n(t, buf, coord_utf8_put(buf, tok_gpt2_cp(b)));
        } else {
            snprintf(buf, sizeof(buf), "<0x%02X>", b);
            t->byte_ids[b] = tok_lookup_n(t, buf, 6);
            if (t->byte_ids[b] < 0 && t->type == COORD_TOK_SPM) {
                buf[0] = (char)b;
                t->byte_ids[b] = tok_lookup_n(t, buf, 1);
            }
        }
    }
}

/* Longest first, then by id. */
static int cmp_special(const void *a, const void *b, void *arg)
{
    const struct coord_tok *t = arg;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (t->vocab_len[x] != t->vocab_len[y])
        return t->vocab_len[x] > t->vocab_len[y] ? -1 : 1;
    return (x > y) - (x < y);
}

/* The special tokens the encoder splits out of a text first (struct coord_tok.specials),
 * longest first. Returns 0 or -ENOMEM with @e set. */
static int build_specials(struct coord_tok *t, const char *what, struct shardlm_err *e)
{
    for (int i = 0; i < t->vocab_size; i++)
        if (tok_is_special(t, i) && t->vocab_len[i] > 0)
            t->n_specials++;
    if (!t->n_specials)
        return 0;
    t->specials = malloc((size_t)t->n_specials * sizeof(int32_t));
    if (!t->specials)
        return shardlm_fail(e, -ENOMEM, "%s: out of memory", what);
    int k = 0;
    for (int i = 0; i < t->vocab_size; i++)
        if (tok_is_special(t, i) && t->vocab_len[i] > 0)
            t->specials[k++] = i;
    qsort_r(t->specials, (size_t)k, sizeof(int32_t), cmp_special, t);
    return 0;
}

/* Copies what @s declares into @t: its fields, and its pieces (into one arena), scores and
 * types. Returns 0 or -ENOMEM with @e set. */
static int copy_source(struct coord_tok *t, const struct tok_src *s, const char *what,
                       struct shardlm_err *e)
{
    int n = s->n;
    t->type = s->type;
    t->flags = s->flags;
    t->vocab_size = n;
    t->bos_id = s->bos >= 0 && s->bos < n ? s->bos : -1;
    t->eos_id = s->eos >= 0 && s->eos < n ? s->eos : -1;
    t->unk_id = s->unk >= 0 && s->unk < n ? s->unk : -1;
    size_t total = 0;
    for (int i = 0; i < n; i++)
        total += (size_t)s->plen[i] + 1;
    t->vocab = malloc((size_t)n * sizeof(char *));
    t->vocab_len = malloc((size_t)n * sizeof(uint32_t));
    t->scores = calloc((size_t)n, sizeof(float));
    t->attrs = malloc((size_t)n);
    t->arena = malloc(total);
    if (!t->vocab || !t->vocab_len || !t->scores || !t->attrs || !t->arena)
        return shardlm_fail(e, -ENOMEM, "%s: out of memory", what);
    char *o = t->arena;
    int maxlen = 0;
    for (int i = 0; i < n; i++) {
        memcpy(o, s->p[i], s->plen[i]);
        o[s->plen[i]] = 0;
        t->vocab[i] = o;
        t->vocab_len[i] = s->plen[i];
        o += s->plen[i] + 1;
        if ((int)s->plen[i] > maxlen)
            maxlen = (int)s->plen[i];
        if (s->scores)
            t->scores[i] = s->scores[i];
        t->attrs[i] = s->attrs ? s->attrs[i] : COORD_TOKT_NORMAL;
    }
    t->max_token_length = s->type == COORD_TOK_SPM_LLAMA2C ? s->max_token_length : maxlen;
    return 0;
}

int tok_finish(struct coord_tok *t, const struct tok_src *s, const char *what,
               struct shardlm_err *e)
{
    int rc;
    memset(t, 0, sizeof(*t));
    if (s->n <= 0 || s->n > COORD_TOK_MAX_VOCAB)
        return shardlm_fail(e, -EINVAL, "%s: %d tokens, expected 1..%d", what, s->n,
                            COORD_TOK_MAX_VOCAB);
    if (s->n_patterns < 0 || s->n_patterns > COORD_TOK_MAX_PATTERNS)
        return shardlm_fail(e, -EINVAL, "%s: %d pre-tokenizer regexes, expected at most %d", what,
                            s->n_patterns, COORD_TOK_MAX_PATTERNS);
    if (s->n_merges < 0 || s->n_merges > TOK_MAX_MERGES)
        return shardlm_fail(e, -EINVAL, "%s: %d merges, expected at most %d", what, s->n_merges,
                            TOK_MAX_MERGES);
    if ((rc = copy_source(t, s, what, e)) || (rc = build_piece_map(t, what, e)) ||
        (rc = build_merges(t, s, what, e)) || (rc = build_regexes(t, s, what, e)))
        goto out_free;
    for (int i = 0; i < 256; i++) { /* "<0xNN>" pieces decode to the single byte NN */
        t->byte_pieces[i * 2] = (char)i;
        t->byte_pieces[i * 2 + 1] = 0;
    }
    t->words_apart = t->type != COORD_TOK_BPE && tok_words_apart(t);
    if (t->type == COORD_TOK_SPM_LLAMA2C) /* run.c's rules need none of the rest */
        return 0;
    build_byte_ids(t);
    if ((rc = build_specials(t, what, e)) || (rc = tok_build_decoded(t, what, e)))
        goto out_free;
    return 0;
out_free:
    coord_tok_free(t);
    return rc;
}

/* Tells the source apart by its first bytes (see tokenizer.h). */
int coord_tok_from_image(struct coord_tok *t, const uint8_t *buf, size_t size, long vocab_size,
                         const char *what, struct shardlm_err *e)
{
    memset(t, 0, sizeof(*t));
    switch (coord_format_sniff_image(buf, size)) {
    case COORD_FORMAT_SHLM: {
        struct shlm_model m;
        struct shardlm_err err;
        int rc = shlm_parse(&m, buf, size, what, &err);
        if (rc)
            return shardlm_fail(e, rc, "%s", err.msg);
        return coord_tok_from_shlm(t, &m, what, e);
    }
    case COORD_FORMAT_GGUF: {
        struct gguf_file g;
        int rc = gguf_parse(&g, buf, size, what, e);
        if (rc)
            return rc;
        rc = coord_tok_from_gguf(t, &g, what, e);
        gguf_close(&g);
        return rc;
    }
    case COORD_FORMAT_TOK_BLOB:
        return coord_tok_load(t, buf, size, what, e);
    case COORD_FORMAT_JSON:
        return coord_tok_from_hf_json(t, buf, size, what, e);
    default: /* no magic: a llama2.c tokenizer.bin */
        break;
    }
    if (vocab_size == 0) {
        int n = coord_tok_llama2c_count(buf, size);
        if (n < 0)
            return shardlm_fail(e, -EINVAL,
                                "%s: not a .shlm, GGUF, tokenizer.json or tokenizer "
                                "blob, and not a whole llama2.c tokenizer.bin (try --vocab-size)",
                                what);
        vocab_size = n;
    }
    if (vocab_size < 0 || vocab_size > COORD_TOK_MAX_VOCAB)
        return shardlm_fail(e, -EINVAL, "%s: vocabulary size %ld is out of range", what,
                            vocab_size);
    return coord_tok_init(t, buf, size, (int)vocab_size, what, e);
}
