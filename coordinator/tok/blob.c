/* SPDX-License-Identifier: MIT */
/* coordinator/tok/blob.c: the stored tokenizer: the blob coord_tok_save() writes into a .shlm
 * (tok_kind 2; its layout in tokenizer.h) and coord_tok_load() parses back, trusting nothing, and
 * coord_tok_from_shlm(), which reads whichever kind a .shlm holds. */
#include "tok_internal.h"

#include "shlm.h"
#include "sniff.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define BLOB_MAGIC COORD_FORMAT_TOK_BLOB_MAGIC /* format/sniff.h: the sniffer knows it too */
#define BLOB_VERSION 2 /* with a chat template; a tokenizer without one is saved as version 1 */
#define BLOB_HEAD 48 /* magic 8 + 10 u32/i32 fields */

bool coord_tok_is_blob(const uint8_t *buf, size_t len)
{
    return len >= 8 && memcmp(buf, BLOB_MAGIC, 8) == 0;
}

static void put32(uint8_t **o, uint32_t v)
{
    memcpy(*o, &v, 4);
    *o += 4;
}

int coord_tok_save(const struct coord_tok *t, uint8_t **buf, size_t *len)
{
    size_t n = (size_t)t->vocab_size, size = BLOB_HEAD + n * 5 + (size_t)t->n_merges * 8 + 8;
    for (size_t i = 0; i < n; i++)
        size += 4 + (size_t)t->vocab_len[i];
    for (int i = 0; i < t->n_patterns; i++)
        size += 4 + strlen(t->patterns[i]);
    size_t tl = t->chat_template ? strlen(t->chat_template) : 0;
    size += tl ? 4 + tl : 0;
    uint8_t *b = malloc(size), *o = b;
    if (!b)
        return -ENOMEM;
    memcpy(o, BLOB_MAGIC, 8);
    o += 8;
    put32(&o, tl ? 2 : 1);
    put32(&o, (uint32_t)t->type);
    put32(&o, t->flags);
    put32(&o, (uint32_t)t->vocab_size);
    put32(&o, (uint32_t)t->max_token_length);
    put32(&o, (uint32_t)t->bos_id);
    put32(&o, (uint32_t)t->eos_id);
    put32(&o, (uint32_t)t->unk_id);
    put32(&o, (uint32_t)t->n_merges);
    put32(&o, (uint32_t)t->n_patterns);
    memcpy(o, t->scores, n * 4);
    o += n * 4;
    memcpy(o, t->attrs, n);
    o += n;
    for (size_t i = 0; i < n; i++) {
        put32(&o, t->vocab_len[i]);
        memcpy(o, t->vocab[i], t->vocab_len[i]);
        o += t->vocab_len[i];
    }
    for (int r = 0; r < t->n_merges; r++) {
        put32(&o, (uint32_t)t->merges[r * 3]);
        put32(&o, (uint32_t)t->merges[r * 3 + 1]);
    }
    for (int i = 0; i < t->n_patterns; i++) {
        size_t l = strlen(t->patterns[i]);
        put32(&o, (uint32_t)l);
        memcpy(o, t->patterns[i], l);
        o += l;
    }
    if (tl) {
        put32(&o, (uint32_t)tl);
        memcpy(o, t->chat_template, tl);
        o += tl;
    }
    uint64_t h = shlm_fnv1a(SHLM_FNV_OFFSET, b, (size_t)(o - b));
    memcpy(o, &h, 8);
    o += 8;
    *buf = b;
    *len = (size_t)(o - b);
    return 0;
}

/* Where coord_tok_load() reads: @left bytes at @p. */
struct cur {
    const uint8_t *p;
    size_t left;
};

/* Takes @n bytes into @out (NULL: skips them); false, taking nothing, past the end. */
static bool take(struct cur *c, void *out, size_t n)
{
    if (c->left < n)
        return false;
    if (out)
        memcpy(out, c->p, n);
    c->p += n;
    c->left -= n;
    return true;
}

/* Checks the magic, version and checksum of blob @buf (@len bytes) and reads its head fields
 * into @s. Returns 0 or -EINVAL with @e set. */
static int blob_head(const uint8_t *buf, size_t len, struct tok_src *s, const char *what,
                     struct shardlm_err *e)
{
    if (len < BLOB_HEAD + 8 || !coord_tok_is_blob(buf, len))
        return shardlm_fail(e, -EINVAL,
                            "%s: not a tokenizer blob (magic \"%s\", %d bytes at "
                            "least)",
                            what, BLOB_MAGIC, BLOB_HEAD + 8);
    uint32_t f[10];
    memcpy(f, buf + 8, sizeof(f));
    if (f[0] < 1 || f[0] > BLOB_VERSION)
        return shardlm_fail(e, -EINVAL, "%s: tokenizer blob version %u, expected 1..%d", what, f[0],
                            BLOB_VERSION);
    uint64_t h;
    memcpy(&h, buf + len - 8, 8);
    if (h != shlm_fnv1a(SHLM_FNV_OFFSET, buf, len - 8))
        return shardlm_fail(e, -EINVAL, "%s: tokenizer blob checksum mismatch (corrupt)", what);
    *s = (struct tok_src){.type = (enum coord_tok_type)f[1],
                          .flags = f[2],
                          .n = (int)f[3],
                          .max_token_length = (int)f[4],
                          .bos = (int32_t)f[5],
                          .eos = (int32_t)f[6],
                          .unk = (int32_t)f[7],
                          .n_merges = (int)f[8],
                          .n_patterns = (int)f[9],
                          .strict_merges = true,
                          .version = (int)f[0]};
    if (f[1] > COORD_TOK_BPE)
        return shardlm_fail(e, -EINVAL, "%s: tokenizer type %u, expected 0..2", what, f[1]);
    if (f[2] & ~COORD_TOKF_ALL)
        return shardlm_fail(e, -EINVAL, "%s: tokenizer flags 0x%x has unknown bits", what, f[2]);
    size_t body = len - 8 - BLOB_HEAD;
    /* each token takes at least 9 bytes (score, type, length), each merge 8 */
    if (f[3] == 0 || f[3] > COORD_TOK_MAX_VOCAB || f[3] > body / 9)
        return shardlm_fail(e, -EINVAL, "%s: %u tokens in %zu bytes", what, f[3], len);
    if (f[8] > TOK_MAX_MERGES || f[8] > (body - (size_t)f[3] * 9) / 8)
        return shardlm_fail(e, -EINVAL, "%s: %u merges in %zu bytes", what, f[8], len);
    if (f[9] > (s->type == COORD_TOK_BPE ? COORD_TOK_MAX_PATTERNS : 0))
        return shardlm_fail(e, -EINVAL, "%s: %u pre-tokenizer regexes for tokenizer type %u", what,
                            f[9], f[1]);
    return 0;
}

/* The checks of head fields @s that span several fields: a llama2.c tokenizer's, special ids. */
static int blob_fields(const struct tok_src *s, const char *what, struct shardlm_err *e)
{
    if (s->type == COORD_TOK_SPM_LLAMA2C &&
        (s->max_token_length <= 0 || s->max_token_length > 4096 ||
         (s->flags & ~COORD_TOKF_ADD_BOS) || s->n_merges))
        return shardlm_fail(e, -EINVAL,
                            "%s: llama2.c tokenizer with max_token_length %d, flags "
                            "0x%x, %d merges",
                            what, s->max_token_length, s->flags, s->n_merges);
    if ((s->bos < -1 || s->bos >= s->n) || (s->eos < -1 || s->eos >= s->n) ||
        (s->unk < -1 || s->unk >= s->n))
        return shardlm_fail(e, -EINVAL, "%s: special ids bos %d eos %d unk %d, expected -1..%d",
                            what, s->bos, s->eos, s->unk, s->n - 1);
    return 0;
}

/* The scores, types and pieces of the s->n tokens at @c (pieces borrowed from the blob).
 * Returns 0 or -EINVAL with @e set. */
static int blob_tokens(struct cur *c, struct tok_src *s, float *scores, uint8_t *attrs,
                       const char *what, struct shardlm_err *e)
{
    int n = s->n;
    take(c, scores, (size_t)n * 4); /* blob_head() checked the room for these two */
    take(c, attrs, (size_t)n);
    for (int i = 0; i < n; i++) {
        uint8_t a = attrs[i];
        if ((a & COORD_TOKA_TYPE) > COORD_TOKT_BYTE ||
            (a & ~(COORD_TOKA_TYPE | COORD_TOKA_LSTRIP | COORD_TOKA_RSTRIP)))
            return shardlm_fail(e, -EINVAL, "%s: token %d: attribute 0x%02x is not a token type",
                                what, i, a);
    }
    for (int i = 0; i < n; i++) {
        uint32_t l;
        if (!take(c, &l, 4) || l > c->left || l > COORD_TOK_MAX_PIECE)
            return shardlm_fail(e, -EINVAL, "%s: token %d: length past the end of the blob", what,
                                i);
        s->p[i] = (const char *)c->p;
        s->plen[i] = l;
        take(c, NULL, l);
        if (s->type == COORD_TOK_SPM_LLAMA2C &&
            ((int)l > s->max_token_length || memchr(s->p[i], 0, l)))
            return shardlm_fail(e, -EINVAL,
                                "%s: token %d: %u bytes, expected a C string of at "
                                "most %d",
                                what, i, l, s->max_token_length);
    }
    return 0;
}

/* The merges (into @mid), regexes and (version 2) chat template at @c, which must end the blob.
 * Returns 0 or -EINVAL. */
static int blob_merges_regexes(struct cur *c, struct tok_src *s, int32_t *mid, const char *what,
                               struct shardlm_err *e)
{
    if (!take(c, mid, (size_t)s->n_merges * 8))
        return shardlm_fail(e, -EINVAL, "%s: merges past the end of the blob", what);
    for (int i = 0; i < s->n_patterns; i++) {
        uint32_t l;
        if (!take(c, &l, 4) || l > c->left)
            return shardlm_fail(e, -EINVAL, "%s: regex %d past the end of the blob", what, i);
        s->pat[i] = (const char *)c->p;
        s->patlen[i] = l;
        take(c, NULL, l);
    }
    if (s->version >= 2) {
        uint32_t l;
        if (!take(c, &l, 4) || l > c->left || l == 0) /* version 2 carries one */
            return shardlm_fail(e, -EINVAL, "%s: the chat template is empty or past the blob's end",
                                what);
        s->tmpl = l ? (const char *)c->p : NULL;
        s->tmpl_len = l;
        take(c, NULL, l);
    }
    if (c->left)
        return shardlm_fail(e, -EINVAL, "%s: %zu bytes after the tokenizer", what, c->left);
    return 0;
}

int coord_tok_load(struct coord_tok *t, const uint8_t *buf, size_t len, const char *what,
                   struct shardlm_err *e)
{
    memset(t, 0, sizeof(*t));
    struct tok_src s;
    int rc;
    if ((rc = blob_head(buf, len, &s, what, e)) || (rc = blob_fields(&s, what, e)))
        return rc;
    struct cur c = {buf + BLOB_HEAD, len - 8 - BLOB_HEAD};
    int n = s.n;
    float *scores = malloc((size_t)n * sizeof(float));
    uint8_t *attrs = malloc((size_t)n);
    s.p = malloc((size_t)n * sizeof(char *));
    s.plen = malloc((size_t)n * sizeof(uint32_t));
    int32_t *mid = malloc((size_t)(s.n_merges ? s.n_merges : 1) * 2 * sizeof(int32_t));
    if (!scores || !attrs || !s.p || !s.plen || !mid) {
        rc = shardlm_fail(e, -ENOMEM, "%s: out of memory", what);
        goto out;
    }
    if ((rc = blob_tokens(&c, &s, scores, attrs, what, e)) ||
        (rc = blob_merges_regexes(&c, &s, mid, what, e)))
        goto out;
    s.mid = mid;
    s.scores = scores;
    s.attrs = attrs;
    if ((rc = tok_finish(t, &s, what, e)))
        goto out;
    if (s.tmpl && (rc = coord_tok_set_chat_template(t, s.tmpl, s.tmpl_len, what, e))) {
        coord_tok_free(t);
        goto out;
    }
    if (t->max_token_length != s.max_token_length) { /* one blob per tokenizer */
        rc = shardlm_fail(e, -EINVAL,
                          "%s: max_token_length %d, but the longest token has %d "
                          "bytes",
                          what, s.max_token_length, t->max_token_length);
        coord_tok_free(t);
    }
out:
    free(scores);
    free(attrs);
    free(s.p);
    free(s.plen);
    free(mid);
    return rc;
}

int coord_tok_from_shlm(struct coord_tok *t, const struct shlm_model *m, const char *what,
                        struct shardlm_err *e)
{
    const struct shlm_header *h = m->hdr;
    const uint8_t *tb = m->base + h->tok_offset;
    memset(t, 0, sizeof(*t));
    /* the header checksum covers this field; files made before it have 0 and are unchecked */
    if (h->tok_checksum && shlm_hash(tb, h->tok_bytes) != h->tok_checksum)
        return shardlm_fail(e, -EIO,
                            "%s: the stored tokenizer does not match its checksum (the "
                            "file is corrupt)",
                            what);
    if (h->tok_kind == SHLM_TOK_LLAMA2C)
        return coord_tok_init(t, tb, h->tok_bytes, (int)h->cfg.vocab_size, what, e);
    if (h->tok_kind == SHLM_TOK_BLOB)
        return coord_tok_load(t, tb, h->tok_bytes, what, e);
    return shardlm_fail(e, -EINVAL, "%s: header field tok_kind is %u, expected %d or %d", what,
                        h->tok_kind, SHLM_TOK_LLAMA2C, SHLM_TOK_BLOB);
}
