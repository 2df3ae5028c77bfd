/* SPDX-License-Identifier: MIT */
/* coordinator/tok/tok_internal.h: what the tokenizer's files share and callers never see: the
 * builders' common input (struct tok_src, tok_finish()), the lookups into the tables tok_finish()
 * builds, and UTF-8 helpers. The lookups and UTF-8 steps run per character of a text, so they are
 * static inline here: the encoder's loops need them inlined, as in the one file they came from. */
#ifndef SHARDLM_COORD_TOK_INTERNAL_H
#define SHARDLM_COORD_TOK_INTERNAL_H

#include "tokenizer.h"

#include <string.h>

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "coordinator/tok/ reads its little-endian formats (tokenizer.bin, the blob) in place"
#endif

#define TOK_MAX_PATTERN 4096   /* bytes of one pre-tokenizer regex */
#define TOK_MAX_MERGES (1 << 24)
#define TOK_ESC_WS "\xe2\x96\x81" /* U+2581: the space of SentencePiece pieces */

/* The GPT-2 pre-tokenizer: GGUF "gpt2" and HF ByteLevel(use_regex) */
#define TOK_RE_GPT2                                                                               \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

/* What a builder (from_llama2c.c, from_gguf.c, from_hf_json.c, blob.c) hands to tok_finish();
 * pointers are borrowed (they outlive the call). */
struct tok_src {
    enum coord_tok_type type;
    unsigned flags;
    int n;
    const char **p;     /* (n) pieces */
    uint32_t *plen;     /* (n) */
    const float *scores; /* (n) or NULL */
    const uint8_t *attrs; /* (n) or NULL: normal */
    int bos, eos, unk;
    int max_token_length; /* llama2.c only */
    int n_merges;
    const char **ma, **mb; /* (n_merges) merges as strings, or */
    uint32_t *mal, *mbl;
    const int32_t *mid;    /* (n_merges, 2) merges as ids */
    bool strict_merges;    /* an unresolvable merge is an error (else skipped, as llama.cpp) */
    int n_patterns;
    const char *pat[COORD_TOK_MAX_PATTERNS];
    size_t patlen[COORD_TOK_MAX_PATTERNS];
    int version;      /* blob.c: the blob's format version */
    const char *tmpl; /* blob.c: the chat template (tmpl_len bytes) or NULL */
    size_t tmpl_len;
};

/* tokenizer.c: turns @s into @t (zeroed first). Returns 0 or -errno with @e set; @t is freed on
 * failure. */
int tok_finish(struct coord_tok *t, const struct tok_src *s, const char *what,
               struct shardlm_err *e);
/* tokenizer.c: writes piece @p (@n bytes) into @buf (@cap bytes) for an error message, control
 * bytes, quotes and backslashes as \xNN. */
void tok_show_piece(char *buf, size_t cap, const char *p, size_t n);
/* tokenizer.c: whether @p is "<0xNN>" (upper-case hex, as SentencePiece writes it); *@b gets NN. */
bool tok_byte_piece(const char *p, size_t n, unsigned *b);
/* decode.c: fills t->dec, t->dec_len, t->dec_arena: the text each token decodes to. Returns 0 or
 * -ENOMEM with @e set. */
int tok_build_decoded(struct coord_tok *t, const char *what, struct shardlm_err *e);
/* encode.c: whether SPM words can merge apart (struct coord_tok.words_apart). */
bool tok_words_apart(const struct coord_tok *t);

/* ---- the tables tok_finish() builds ---- */

/* A map capacity: a power of two at least twice @n. */
static inline uint32_t tok_map_cap(size_t n)
{
    uint32_t c = 16;
    while (c < 2 * n)
        c <<= 1;
    return c;
}

/* The hash of a piece in t->piece_map (32-bit FNV-1a, then a shift: its low bits index the map;
 * the blob's 64-bit checksum is another job, see shlm_fnv1a()). */
static inline uint32_t tok_hash_bytes(const void *p, size_t n)
{
    const uint8_t *b = p;
    uint32_t h = 2166136261u; /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 16777619u;
    return h ^ (h >> 15);
}

/* The hash of a merge (left, right) in t->merge_map. */
static inline uint32_t tok_hash_pair(int32_t a, int32_t b)
{
    uint64_t k = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull; /* murmur3 fmix64 */
    k ^= k >> 33;
    return (uint32_t)k;
}

/* The id of piece @s[0, n) in the map, or -1. */
static inline int tok_lookup_map(const struct coord_tok *t, const char *s, size_t n)
{
    if (!t->piece_map)
        return -1;
    uint32_t h = tok_hash_bytes(s, n);
    for (uint32_t i = h & t->piece_mask;; i = (i + 1) & t->piece_mask) {
        int32_t id = t->piece_map[i].id;
        if (id < 0)
            return -1;
        if (t->piece_map[i].hash == h && t->vocab_len[id] == n && memcmp(t->vocab[id], s, n) == 0)
            return id;
    }
}

/* The id of piece @s[0, n), or -1; one-byte pieces (most characters of a text) from a table. */
static inline int tok_lookup_n(const struct coord_tok *t, const char *s, size_t n)
{
    return n == 1 ? t->char_ids[(unsigned char)s[0]] : tok_lookup_map(t, s, n);
}

static inline int tok_lookup(const struct coord_tok *t, const char *s)
{
    return tok_lookup_n(t, s, strlen(s));
}

/* The rank of the merge (@a, @b), or -1. */
static inline int tok_merge_rank(const struct coord_tok *t, int32_t a, int32_t b)
{
    if (!t->merge_map)
        return -1;
    for (uint32_t i = tok_hash_pair(a, b) & t->merge_mask;; i = (i + 1) & t->merge_mask) {
        int32_t r = t->merge_map[i];
        if (r < 0)
            return -1;
        if (t->merges[r * 3] == a && t->merges[r * 3 + 1] == b)
            return r;
    }
}

static inline int tok_ttype(const struct coord_tok *t, int id)
{
    return t->attrs[id] & COORD_TOKA_TYPE;
}

/* Whether token @id is split out of a text before encoding (control, user-defined, unknown). */
static inline bool tok_is_special(const struct coord_tok *t, int id)
{
    int ty = tok_ttype(t, id);
    return ty == COORD_TOKT_CONTROL || ty == COORD_TOKT_USER_DEFINED || ty == COORD_TOKT_UNKNOWN;
}

/* ---- characters ---- */

/* GPT-2 bytes_to_unicode(): printable Latin-1 bytes stand for themselves, the others for
 * U+0100 onwards in byte order. */
static inline uint32_t tok_gpt2_cp(unsigned b)
{
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))
        return b;
    unsigned n = 0;
    for (unsigned i = 0; i < b; i++)
        if (!((i >= 33 && i <= 126) || (i >= 161 && i <= 172) || (i >= 174 && i <= 255)))
            n++;
    return 256 + n;
}

/* Bytes of the UTF-8 character whose first byte is @c (llama.cpp unicode_len_utf8: a stray
 * continuation byte counts as one). */
static inline size_t tok_utf8_len(unsigned char c)
{
    static const uint8_t lens[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lens[c >> 4];
}

/* Decodes one well-formed UTF-8 character of at most @n bytes at @s: its length, or 0. */
static inline size_t tok_get_utf8(const char *s, size_t n, uint32_t *cp)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t l = tok_utf8_len(u[0]);
    if (l > n || (l == 1 && u[0] >= 0x80))
        return 0;
    uint32_t c = l == 1 ? u[0] : l == 2 ? u[0] & 0x1Fu : l == 3 ? u[0] & 0x0Fu : u[0] & 0x07u;
    for (size_t i = 1; i < l; i++) {
        if ((u[i] & 0xC0) != 0x80)
            return 0;
        c = c << 6 | (u[i] & 0x3Fu);
    }
    *cp = c;
    return l;
}

#endif
