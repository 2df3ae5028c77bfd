/* coordinator/: tokenizers. llama2.c's run.c rules for tokenizer.bin vocabularies; llama.cpp's
 * llm_tokenizer_spm / llm_tokenizer_bpe rules (and its special-token partition) for GGUF and
 * Hugging Face tokenizer.json sources; a versioned blob for .shlm files.
 *
 * Every builder fills a struct tok_src (pieces, scores, types, merges as strings or ids,
 * regexes) and tok_finish() turns it into the tokenizer: one arena of pieces, an open-addressing
 * map piece -> id, merges resolved to ids with a map (left, right) -> rank, the compiled regexes,
 * the decoded text of each token. Encoding merges with a binary heap (llama.cpp's priority
 * queue) word by word where the vocabulary allows it (SPM pieces that never span a word's end
 * and the next space; BPE pre-tokens), a word met before from a cache: linear in the text. */
#include "tokenizer.h"

#include "gguf.h"
#include "shlm.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "tokenizer.c reads and writes its little-endian blob in place"
#endif

#define BLOB_MAGIC "SHLMTOK"
#define BLOB_VERSION 1
#define BLOB_HEAD 48 /* magic 8 + 10 u32/i32 fields */
#define MAX_PATTERN 4096
#define MAX_MERGES (1 << 24)
#define RE_MATCH_LIMIT 1000000 /* per match: the shipped regexes need a few per character */

/* GPT-2 pre-tokenizer and the ones llama.cpp uses for other GGUF `tokenizer.ggml.pre` values */
#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define RE_GPT2_NOWS "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RE_LLAMA3                                                                                 \
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"    \
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN2                                                                                  \
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"    \
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* HF Metaspace(split = true): every U+2581 starts a new pre-token */
#define RE_METASPACE "\\x{2581}?[^\\x{2581}]+|\\x{2581}"

static const char ESC_WS[] = "\xe2\x96\x81"; /* U+2581 */

/* ---- helpers ---- */

static uint32_t hash_bytes(const void *p, size_t n)
{
    const uint8_t *b = p;
    uint32_t h = 2166136261u; /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 16777619u;
    return h ^ (h >> 15);
}

static uint32_t hash_pair(int32_t a, int32_t b)
{
    uint64_t k = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull; /* murmur3 fmix64 */
    k ^= k >> 33;
    return (uint32_t)k;
}

static uint32_t hash_ids(const int32_t *v, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint32_t)v[i]) * 16777619u;
    return h ^ (h >> 15);
}

static uint64_t fnv64(const uint8_t *p, size_t n)
{
    uint64_t h = 14695981039346656037ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* Bytes of the UTF-8 character whose first byte is @c (llama.cpp unicode_len_utf8: a stray
 * continuation byte counts as one). */
static size_t utf8_len(unsigned char c)
{
    static const uint8_t lens[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lens[c >> 4];
}

/* A map capacity: a power of two at least twice @n. */
static uint32_t map_cap(size_t n)
{
    uint32_t c = 16;
    while (c < 2 * n)
        c <<= 1;
    return c;
}

static int lookup_map(const struct coord_tok *t, const char *s, size_t n)
{
    if (!t->piece_map)
        return -1;
    uint32_t h = hash_bytes(s, n);
    for (uint32_t i = h & t->piece_mask;; i = (i + 1) & t->piece_mask) {
        int32_t id = t->piece_map[i].id;
        if (id < 0)
            return -1;
        if (t->piece_map[i].hash == h && t->vocab_len[id] == n && memcmp(t->vocab[id], s, n) == 0)
            return id;
    }
}

/* The id of piece @s[0, n), or -1; one-byte pieces (most characters of a text) from a table. */
static int lookup_n(const struct coord_tok *t, const char *s, size_t n)
{
    return n == 1 ? t->char_ids[(unsigned char)s[0]] : lookup_map(t, s, n);
}

static int lookup(const struct coord_tok *t, const char *s) { return lookup_n(t, s, strlen(s)); }

static int merge_rank(const struct coord_tok *t, int32_t a, int32_t b)
{
    if (!t->merge_map)
        return -1;
    for (uint32_t i = hash_pair(a, b) & t->merge_mask;; i = (i + 1) & t->merge_mask) {
        int32_t r = t->merge_map[i];
        if (r < 0)
            return -1;
        if (t->merges[r * 3] == a && t->merges[r * 3 + 1] == b)
            return r;
    }
}

static int ttype(const struct coord_tok *t, int id) { return t->attrs[id] & COORD_TOKA_TYPE; }

static bool is_special(const struct coord_tok *t, int id)
{
    int ty = ttype(t, id);
    return ty == COORD_TOKT_CONTROL || ty == COORD_TOKT_USER_DEFINED || ty == COORD_TOKT_UNKNOWN;
}

/* GPT-2 bytes_to_unicode(): printable Latin-1 bytes stand for themselves, the others for
 * U+0100 onwards in byte order. */
static uint32_t gpt2_cp(unsigned b)
{
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))
        return b;
    unsigned n = 0;
    for (unsigned i = 0; i < b; i++)
        if (!((i >= 33 && i <= 126) || (i >= 161 && i <= 172) || (i >= 174 && i <= 255)))
            n++;
    return 256 + n;
}

static size_t put_utf8(char *o, uint32_t cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | cp >> 6);
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12);
        o[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18);
    o[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    o[2] = (char)(0x80 | (cp >> 6 & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Decodes one well-formed UTF-8 character of at most @n bytes at @s: its length, or 0. */
static size_t get_utf8(const char *s, size_t n, uint32_t *cp)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t l = utf8_len(u[0]);
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

/* The bytes of the well-formed UTF-8 character (RFC 3629) that @c starts, or 0: a
 * continuation byte, or a lead byte of an overlong form (C0, C1) or past U+10FFFF. */
static size_t utf8_need(unsigned char c)
{
    return c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3
         : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
}

/* Whether @c may follow the lead byte @lead at place @i (1..3) of a well-formed character: a
 * continuation byte, in the narrower range the second byte has after E0 and F0 (no overlong
 * forms), ED (no surrogates) and F4 (nothing past U+10FFFF). */
static bool utf8_follows(unsigned char lead, size_t i, unsigned char c)
{
    if ((c & 0xC0) != 0x80)
        return false;
    if (i != 1)
        return true;
    return !((lead == 0xE0 && c < 0xA0) || (lead == 0xED && c > 0x9F) ||
             (lead == 0xF0 && c < 0x90) || (lead == 0xF4 && c > 0x8F));
}

/* The bytes of the well-formed UTF-8 character at @s (RFC 3629: no overlong forms, surrogates
 * or code points past U+10FFFF), or 0. */
static size_t utf8_valid(const unsigned char *s, size_t n)
{
    size_t l = utf8_need(s[0]);
    if (!l || l > n)
        return 0;
    for (size_t i = 1; i < l; i++)
        if (!utf8_follows(s[0], i, s[i]))
            return 0;
    return l;
}

/* Whether @p is "<0xNN>" (upper-case hex, as SentencePiece writes it); *@b gets NN. */
static bool byte_piece(const char *p, size_t n, unsigned *b)
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

/* ---- building ---- */

/* What a builder hands to tok_finish(); pointers are borrowed (they outlive the call). */
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
};

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
    memset(t, 0, sizeof(*t));
}

static int show_piece(char *buf, size_t cap, const char *p, size_t n)
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
    return 0;
}

static int build_piece_map(struct coord_tok *t, const char *what, struct shardlm_err *e)
{
    bool llama2c = t->type == COORD_TOK_SPM_LLAMA2C;
    t->piece_mask = map_cap((size_t)t->vocab_size) - 1;
    t->piece_map = malloc(((size_t)t->piece_mask + 1) * sizeof(*t->piece_map));
    if (!t->piece_map)
        return shardlm_fail(e, -ENOMEM, "%s: out of memory", what);
    memset(t->piece_map, 0xff, ((size_t)t->piece_mask + 1) * sizeof(*t->piece_map));
    for (int id = 0; id < t->vocab_size; id++) {
        size_t n = t->vocab_len[id];
        if (n == 0 && !llama2c) /* holes and empty pieces are never looked up */
            continue;
        uint32_t h = hash_bytes(t->vocab[id], n), i = h & t->piece_mask;
        int32_t o;
        for (; (o = t->piece_map[i].id) >= 0; i = (i + 1) & t->piece_mask)
            if (t->vocab_len[o] == n && memcmp(t->vocab[o], t->vocab[id], n) == 0)
                break;
        if (o >= 0) {
            if (llama2c) /* the first one wins, as the earlier sorted lookup mostly did */
                continue;
            char s[64];
            show_piece(s, sizeof(s), t->vocab[id], n);
            return shardlm_fail(e, -EINVAL, "%s: token %d '%s' duplicates token %d", what, id, s,
                              o);
        }
        t->piece_map[i].id = id;
        t->piece_map[i].hash = h;
    }
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        t->char_ids[b] = lookup_map(t, &c, 1);
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
            return shardlm_fail(e, -EINVAL, "%s: merge %d: ids %d %d, expected 0..%d", what, r, a, b,
                              t->vocab_size - 1);
    } else {
        a = lookup_n(t, s->ma[r], s->mal[r]);
        b = lookup_n(t, s->mb[r], s->mbl[r]);
        if (a < 0 || b < 0) {
            if (!s->strict_merges)
                return 1;
            show_piece(sa, sizeof(sa), s->ma[r], s->mal[r]);
            show_piece(sb, sizeof(sb), s->mb[r], s->mbl[r]);
            return shardlm_fail(e, -EINVAL, "%s: merge %d ('%s' '%s'): '%s' is not in the vocabulary",
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
    int m = lookup_n(t, *scratch, la + lb);
    if (m < 0) {
        if (!s->strict_merges)
            return 1;
        show_piece(sa, sizeof(sa), t->vocab[a], la);
        show_piece(sb, sizeof(sb), t->vocab[b], lb);
        return shardlm_fail(e, -EINVAL, "%s: merge %d ('%s' '%s'): their concatenation is not in "
                          "the vocabulary", what, r, sa, sb);
    }
    int k = t->n_merges++;
    t->merges[k * 3] = a;
    t->merges[k * 3 + 1] = b;
    t->merges[k * 3 + 2] = m;
    return 0;
}

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
    t->merge_mask = map_cap((size_t)t->n_merges) - 1;
    t->merge_map = malloc(((size_t)t->merge_mask + 1) * sizeof(int32_t));
    if (!t->merge_map)
        return shardlm_fail(e, -ENOMEM, "%s: out of memory", what);
    memset(t->merge_map, 0xff, ((size_t)t->merge_mask + 1) * sizeof(int32_t));
    for (int r = 0; r < t->n_merges; r++) {
        int32_t a = t->merges[r * 3], b = t->merges[r * 3 + 1];
        uint32_t i = hash_pair(a, b) & t->merge_mask;
        for (; t->merge_map[i] >= 0; i = (i + 1) & t->merge_mask)
            if (t->merges[t->merge_map[i] * 3] == a && t->merges[t->merge_map[i] * 3 + 1] == b)
                break;
        if (t->merge_map[i] < 0) /* a repeated pair keeps its first (best) rank */
            t->merge_map[i] = r;
    }
    return 0;
}

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
        if (s->patlen[i] == 0 || s->patlen[i] > MAX_PATTERN ||
            memchr(s->pat[i], 0, s->patlen[i]))
            return shardlm_fail(e, -EINVAL, "%s: pre-tokenizer regex %d is %zu bytes, expected "
                              "1..%d without NUL", what, i, s->patlen[i], MAX_PATTERN);
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

static int cmp_special(const void *a, const void *b, void *arg)
{
    const struct coord_tok *t = arg;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (t->vocab_len[x] != t->vocab_len[y])
        return t->vocab_len[x] > t->vocab_len[y] ? -1 : 1;
    return (x > y) - (x < y);
}

/* The text each token decodes to (llama.cpp token_to_piece with special = false). */
static int build_decoded(struct coord_tok *t, const char *what, struct shardlm_err *e)
{
    size_t total = 0;
    for (int i = 0; i < t->vocab_size; i++)
        total += t->vocab_len[i] + 1;
    t->dec = malloc((size_t)t->vocab_size * sizeof(char *));
    t->dec_len = malloc((size_t)t->vocab_size * sizeof(uint32_t));
    t->dec_arena = malloc(total ? total : 1);
    if (!t->dec || !t->dec_len || !t->dec_arena)
        return shardlm_fail(e, -ENOMEM, "%s: out of memory", what);
    /* GPT-2 character -> byte */
    int16_t inv[324];
    for (int i = 0; i < 324; i++)
        inv[i] = -1;
    for (unsigned b = 0; b < 256; b++)
        inv[gpt2_cp(b)] = (int16_t)b;
    char *o = t->dec_arena;
    for (int id = 0; id < t->vocab_size; id++) {
        const char *p = t->vocab[id];
        size_t n = t->vocab_len[id], k = 0;
        int ty = ttype(t, id);
        unsigned b;
        t->dec[id] = o;
        if (ty == COORD_TOKT_CONTROL || ty == COORD_TOKT_UNKNOWN) {
            /* empty */
        } else if (ty == COORD_TOKT_BYTE && byte_piece(p, n, &b)) {
            o[k++] = (char)b;
        } else if (ty == COORD_TOKT_USER_DEFINED || ty == COORD_TOKT_BYTE) {
            memcpy(o, p, n);
            k = n;
        } else if (t->flags & COORD_TOKF_BYTE_LEVEL) {
            for (size_t i = 0; i < n;) {
                uint32_t cp;
                size_t l = get_utf8(p + i, n - i, &cp);
                if (l && cp < 324 && inv[cp] >= 0) {
                    o[k++] = (char)inv[cp];
                } else { /* not a GPT-2 character: as it is */
                    l = l ? l : 1;
                    memcpy(o + k, p + i, l);
                    k += l;
                }
                i += l;
            }
        } else if (t->flags & COORD_TOKF_ESCAPE_WS) {
            for (size_t i = 0; i < n;) {
                if (n - i >= 3 && memcmp(p + i, ESC_WS, 3) == 0) {
                    o[k++] = ' ';
                    i += 3;
                } else {
                    o[k++] = p[i++];
                }
            }
        } else {
            memcpy(o, p, n);
            k = n;
        }
        o[k] = 0;
        t->dec_len[id] = (uint32_t)k;
        o += k + 1;
    }
    return 0;
}

/* The space of SPM text: U+2581 with COORD_TOKF_ESCAPE_WS (llama.cpp), else ' ' (llama2.c,
 * whose tokenizer.bin has the pieces unescaped); *@w gets its bytes. */
static const char *spm_space(const struct coord_tok *t, size_t *w)
{
    bool esc = t->type == COORD_TOK_SPM && (t->flags & COORD_TOKF_ESCAPE_WS);
    *w = esc ? 3 : 1;
    return esc ? ESC_WS : " ";
}

/* Whether SPM merging may make piece @id: llama2.c any; llama.cpp (SentencePiece) not a control,
 * unknown, byte or unused one. */
static bool spm_makes(const struct coord_tok *t, int id)
{
    int ty = ttype(t, id);
    return t->type == COORD_TOK_SPM_LLAMA2C ||
           !(ty == COORD_TOKT_CONTROL || ty == COORD_TOKT_UNKNOWN || ty == COORD_TOKT_BYTE ||
             ty == COORD_TOKT_UNUSED);
}

/* Whether every piece that SPM merging can make is spaces then text without a space (see
 * spm_space()), as SentencePiece's split_by_whitespace makes them. Then no merge joins the end
 * of a word to the space that starts the next, and words merge apart. */
static bool words_apart(const struct coord_tok *t)
{
    size_t w;
    const char *sp = spm_space(t, &w);
    for (int id = 0; id < t->vocab_size; id++) {
        if (!spm_makes(t, id))
            continue;
        const char *p = t->vocab[id];
        size_t n = t->vocab_len[id], k = 0;
        while (n - k >= w && memcmp(p + k, sp, w) == 0)
            k += w;
        if (memmem(p + k, n - k, sp, w))
            return false;
    }
    return true;
}

/* Turns @s into @t (zeroed first). Returns 0 or -errno with @e set; @t is freed on failure. */
static int tok_finish(struct coord_tok *t, const struct tok_src *s, const char *what,
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
    if (s->n_merges < 0 || s->n_merges > MAX_MERGES)
        return shardlm_fail(e, -EINVAL, "%s: %d merges, expected at most %d", what, s->n_merges,
                          MAX_MERGES);
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
    if (!t->vocab || !t->vocab_len || !t->scores || !t->attrs || !t->arena) {
        rc = shardlm_fail(e, -ENOMEM, "%s: out of memory", what);
        goto out_free;
    }
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
    if ((rc = build_piece_map(t, what, e)) || (rc = build_merges(t, s, what, e)) ||
        (rc = build_regexes(t, s, what, e)))
        goto out_free;
    for (int i = 0; i < 256; i++) {
        t->byte_pieces[i * 2] = (char)i;
        t->byte_pieces[i * 2 + 1] = 0;
    }
    t->words_apart = t->type != COORD_TOK_BPE && words_apart(t);
    if (t->type == COORD_TOK_SPM_LLAMA2C)
        return 0;
    for (unsigned b = 0; b < 256; b++) {
        char buf[8];
        if (t->flags & COORD_TOKF_BYTE_LEVEL) {
            t->byte_ids[b] = lookup_n(t, buf, put_utf8(buf, gpt2_cp(b)));
        } else {
            snprintf(buf, sizeof(buf), "<0x%02X>", b);
            t->byte_ids[b] = lookup_n(t, buf, 6);
            if (t->byte_ids[b] < 0 && t->type == COORD_TOK_SPM) { /* llama.cpp byte_to_token */
                buf[0] = (char)b;
                t->byte_ids[b] = lookup_n(t, buf, 1);
            }
        }
    }
    for (int i = 0; i < n; i++)
        if (is_special(t, i) && t->vocab_len[i] > 0)
            t->n_specials++;
    if (t->n_specials) {
        t->specials = malloc((size_t)t->n_specials * sizeof(int32_t));
        if (!t->specials) {
            rc = shardlm_fail(e, -ENOMEM, "%s: out of memory", what);
            goto out_free;
        }
        int k = 0;
        for (int i = 0; i < n; i++)
            if (is_special(t, i) && t->vocab_len[i] > 0)
                t->specials[k++] = i;
        qsort_r(t->specials, (size_t)k, sizeof(int32_t), cmp_special, t);
    }
    if ((rc = build_decoded(t, what, e)))
        goto out_free;
    return 0;
out_free:
    coord_tok_free(t);
    return rc;
}

/* ---- llama2.c tokenizer.bin ---- */

int coord_tok_llama2c_count(const uint8_t *buf, size_t len)
{
    if (len < 4)
        return -EINVAL;
    int32_t maxlen;
    memcpy(&maxlen, buf, 4);
    if (maxlen <= 0 || maxlen > 4096)
        return -EINVAL;
    size_t off = 4;
    int n = 0;
    while (off < len) {
        int32_t l;
        if (len - off < 8 || n >= COORD_TOK_MAX_VOCAB)
            return -EINVAL;
        memcpy(&l, buf + off + 4, 4);
        off += 8;
        if (l < 0 || l > maxlen || (size_t)l > len - off)
            return -EINVAL;
        off += (size_t)l;
        n++;
    }
    return n > 0 ? n : -EINVAL;
}

int coord_tok_init(struct coord_tok *t, const uint8_t *buf, size_t len, int vocab_size,
                   const char *what, struct shardlm_err *e)
{
    memset(t, 0, sizeof(*t));
    if (vocab_size <= 0 || vocab_size > (1 << 22))
        return shardlm_fail(e, -EINVAL, "%s: vocabulary size %d is out of range", what, vocab_size);
    if (len < 4)
        return shardlm_fail(e, -EINVAL, "%s: truncated before max_token_length", what);
    int32_t maxlen;
    memcpy(&maxlen, buf, 4);
    if (maxlen <= 0 || maxlen > 4096)
        return shardlm_fail(e, -EINVAL, "%s: field max_token_length is %d, expected 1..4096", what,
                          maxlen);
    /* every entry takes at least 8 bytes: a vocabulary larger than the file cannot be real */
    if ((size_t)vocab_size > (len - 4) / 8)
        return shardlm_fail(e, -EINVAL, "%s: %zu bytes cannot hold %d tokens", what, len, vocab_size);
    struct tok_src s = {.type = COORD_TOK_SPM_LLAMA2C, .flags = COORD_TOKF_ADD_BOS,
                        .n = vocab_size, .bos = 1, .eos = 2, .unk = -1,
                        .max_token_length = maxlen};
    s.p = malloc((size_t)vocab_size * sizeof(char *));
    s.plen = malloc((size_t)vocab_size * sizeof(uint32_t));
    float *scores = malloc((size_t)vocab_size * sizeof(float));
    uint8_t *attrs = calloc((size_t)vocab_size, 1); /* COORD_TOKT_UNDEFINED */
    int rc = 0;
    if (!s.p || !s.plen || !scores || !attrs) {
        rc = shardlm_fail(e, -ENOMEM, "%s: out of memory", what);
        goto out;
    }
    size_t off = 4;
    for (int i = 0; i < vocab_size; i++) {
        int32_t n;
        if (len - off < 8) {
            rc = shardlm_fail(e, -EINVAL, "%s: truncated at token %d", what, i);
            goto out;
        }
        memcpy(&scores[i], buf + off, 4);
        memcpy(&n, buf + off + 4, 4);
        off += 8;
        if (n < 0 || n > maxlen || (size_t)n > len - off) {
            rc = shardlm_fail(e, -EINVAL, "%s: token %d: length %d, expected 0..%d within the file",
                            what, i, n, maxlen);
            goto out;
        }
        /* run.c reads pieces as C strings: a NUL ends one */
        s.p[i] = (const char *)buf + off;
        s.plen[i] = (uint32_t)strnlen(s.p[i], (size_t)n);
        off += (size_t)n;
    }
    if (off != len) {
        rc = shardlm_fail(e, -EINVAL, "%s: %zu bytes after the %d tokens (wrong vocabulary size?)",
                        what, len - off, vocab_size);
        goto out;
    }
    s.scores = scores;
    s.attrs = attrs;
    rc = tok_finish(t, &s, what, e);
out:
    free(s.p);
    free(s.plen);
    free(scores);
    free(attrs);
    return rc;
}

/* ---- GGUF ---- */

struct pre_entry {
    const char *names; /* '|'-separated tokenizer.ggml.pre values */
    unsigned flags;
    const char *re[4];
};

/* llama.cpp llm_tokenizer_bpe's regexes for the pre-tokenizers it names */
static const struct pre_entry gguf_pres[] = {
    {"gpt-2|gpt2|mpt|olmo|jais|trillion|exaone4|granite-docling", 0, {RE_GPT2}},
    {"llama3|llama-v3|llama-bpe|falcon3|falcon-h1|pixtral|midm-2.0|lfm2",
     COORD_TOKF_IGNORE_MERGES, {RE_LLAMA3}},
    {"dbrx|smaug-bpe", 0, {RE_LLAMA3}},
    {"qwen2|stablelm2|deepseek-r1-qwen|megrez|hunyuan", 0, {RE_QWEN2}},
    {"starcoder|refact|command-r|smollm|codeshell|exaone|minerva-7b", 0, {"\\p{N}", RE_GPT2_NOWS}},
    {"default", 0,
     {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2_NOWS, "\\p{N}+", "[0-9][0-9][0-9]"}},
};

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

static void gguf_id(const struct gguf_file *g, const char *key, int n, int *id)
{
    uint32_t v;
    if (gguf_get_u32(g, key, &v) == 0 && v < (uint32_t)n)
        *id = (int)v; /* llama.cpp keeps its default for an id out of range */
}

static bool gguf_flag(const struct gguf_file *g, const char *key, bool dflt)
{
    bool v;
    return gguf_get_bool(g, key, &v) == 0 ? v : dflt;
}

static bool is_int_type(enum gguf_type ty)
{
    return ty == GGUF_UINT8 || ty == GGUF_INT8 || ty == GGUF_UINT16 || ty == GGUF_INT16 ||
           ty == GGUF_UINT32 || ty == GGUF_INT32 || ty == GGUF_UINT64 || ty == GGUF_INT64;
}

int coord_tok_from_gguf(struct coord_tok *t, const struct gguf_file *g, const char *what,
                        struct shardlm_err *e)
{
    memset(t, 0, sizeof(*t));
    struct gguf_str model, pre = {"", 0};
    if (gguf_get_str(g, "tokenizer.ggml.model", &model))
        return shardlm_fail(e, -EINVAL, "%s: tokenizer.ggml.model is missing or not a string", what);
    struct tok_src s = {.bos = -1, .eos = -1, .unk = -1, .strict_merges = false};
    bool spm = gguf_str_eq(model, "llama"), bpe = gguf_str_eq(model, "gpt2");
    if (!spm && !bpe) {
        char m[64];
        show_piece(m, sizeof(m), model.p, model.len < 40 ? model.len : 40);
        return shardlm_fail(e, -EINVAL, "%s: tokenizer.ggml.model is '%s', expected 'llama' or "
                          "'gpt2'", what, m);
    }
    const struct gguf_kv *tok = gguf_get_arr(g, "tokenizer.ggml.tokens", GGUF_STRING);
    if (!tok)
        return shardlm_fail(e, -EINVAL, "%s: tokenizer.ggml.tokens is missing or not an array of "
                          "strings", what);
    if (tok->v.arr.n == 0 || tok->v.arr.n > COORD_TOK_MAX_VOCAB)
        return shardlm_fail(e, -EINVAL, "%s: tokenizer.ggml.tokens has %llu entries, expected "
                          "1..%d", what, (unsigned long long)tok->v.arr.n, COORD_TOK_MAX_VOCAB);
    int n = (int)tok->v.arr.n;
    const struct gguf_kv *sc = gguf_find(g, "tokenizer.ggml.scores");
    if (sc && (sc->type != GGUF_ARRAY || sc->v.arr.type == GGUF_STRING ||
               sc->v.arr.n < (uint64_t)n))
        return shardlm_fail(e, -EINVAL, "%s: tokenizer.ggml.scores is not an array of %d numbers",
                          what, n);
    const struct gguf_kv *ty = gguf_find(g, "tokenizer.ggml.token_type");
    if (ty && (ty->type != GGUF_ARRAY || !is_int_type(ty->v.arr.type) ||
               ty->v.arr.n < (uint64_t)n))
        return shardlm_fail(e, -EINVAL, "%s: tokenizer.ggml.token_type is not an array of %d "
                          "integers", what, n);
    const struct gguf_kv *mg = NULL;
    if (bpe) {
        mg = gguf_get_arr(g, "tokenizer.ggml.merges", GGUF_STRING);
        if (!mg)
            return shardlm_fail(e, -EINVAL, "%s: tokenizer.ggml.merges is missing or not an array "
                              "of strings", what);
        if (mg->v.arr.n > MAX_MERGES)
            return shardlm_fail(e, -EINVAL, "%s: tokenizer.ggml.merges has %llu entries, expected "
                              "at most %d", what, (unsigned long long)mg->v.arr.n, MAX_MERGES);
        int rc = gguf_get_str(g, "tokenizer.ggml.pre", &pre);
        if (rc == -EINVAL)
            return shardlm_fail(e, -EINVAL, "%s: tokenizer.ggml.pre is not a string", what);
        if (rc)
            pre = (struct gguf_str){"default", 7};
    }

    int rc = 0;
    s.n = n;
    s.p = malloc((size_t)n * sizeof(char *));
    s.plen = malloc((size_t)n * sizeof(uint32_t));
    float *scores = calloc((size_t)n, sizeof(float));
    uint8_t *attrs = malloc((size_t)n);
    size_t nm = mg ? (size_t)mg->v.arr.n : 0;
    s.ma = malloc((nm ? nm : 1) * sizeof(char *));
    s.mb = malloc((nm ? nm : 1) * sizeof(char *));
    s.mal = malloc((nm ? nm : 1) * sizeof(uint32_t));
    s.mbl = malloc((nm ? nm : 1) * sizeof(uint32_t));
    if (!s.p || !s.plen || !scores || !attrs || !s.ma || !s.mb || !s.mal || !s.mbl) {
        rc = shardlm_fail(e, -ENOMEM, "%s: out of memory", what);
        goto out;
    }
    for (int i = 0; i < n; i++) {
        struct gguf_str p = tok->v.arr.strs[i];
        if (p.len > COORD_TOK_MAX_PIECE) {
            rc = shardlm_fail(e, -EINVAL, "%s: tokenizer.ggml.tokens[%d] is %llu bytes, expected at "
                            "most %d", what, i, (unsigned long long)p.len, COORD_TOK_MAX_PIECE);
            goto out;
        }
        s.p[i] = p.p;
        s.plen[i] = (uint32_t)p.len;
        if (sc) {
            double v = gguf_arr_num(sc, (uint64_t)i);
            scores[i] = v == v ? (float)v : 0.0f;
        }
        attrs[i] = COORD_TOKT_NORMAL;
        if (ty) {
            double v = gguf_arr_num(ty, (uint64_t)i);
            /* llama.cpp: an unknown type is "undefined" */
            attrs[i] = v >= 0 && v <= COORD_TOKT_BYTE ? (uint8_t)v : COORD_TOKT_UNDEFINED;
        }
    }
    if (spm) {
        s.type = COORD_TOK_SPM;
        s.flags = COORD_TOKF_ESCAPE_WS | COORD_TOKF_BYTE_FALLBACK;
        s.bos = 1 < n ? 1 : -1;
        s.eos = 2 < n ? 2 : -1;
        s.unk = 0;
        if (gguf_flag(g, "tokenizer.ggml.add_space_prefix", true))
            s.flags |= COORD_TOKF_SPACE_PREFIX;
        if (gguf_flag(g, "tokenizer.ggml.add_bos_token", true))
            s.flags |= COORD_TOKF_ADD_BOS;
        if (gguf_flag(g, "tokenizer.ggml.add_eos_token", false))
            s.flags |= COORD_TOKF_ADD_EOS;
    } else {
        s.type = COORD_TOK_BPE;
        s.flags = COORD_TOKF_BYTE_LEVEL;
        const struct pre_entry *pe = NULL;
        for (size_t i = 0; i < sizeof(gguf_pres) / sizeof(gguf_pres[0]) && !pe; i++)
            if (name_in(gguf_pres[i].names, pre))
                pe = &gguf_pres[i];
        if (!pe) {
            char m[64];
            show_piece(m, sizeof(m), pre.p, pre.len < 40 ? pre.len : 40);
            rc = shardlm_fail(e, -EINVAL, "%s: tokenizer.ggml.pre '%s' is not a pre-tokenizer this "
                            "build knows", what, m);
            goto out;
        }
        s.flags |= pe->flags;
        for (int i = 0; i < 4 && pe->re[i]; i++) {
            s.pat[i] = pe->re[i];
            s.patlen[i] = strlen(pe->re[i]);
            s.n_patterns = i + 1;
        }
        if (gguf_flag(g, "tokenizer.ggml.add_bos_token", false))
            s.flags |= COORD_TOKF_ADD_BOS;
        if (gguf_flag(g, "tokenizer.ggml.add_eos_token", false))
            s.flags |= COORD_TOKF_ADD_EOS;
        if (gguf_flag(g, "tokenizer.ggml.add_space_prefix", false))
            s.flags |= COORD_TOKF_SPACE_PREFIX;
        /* "a b": split at the first space after the first byte (llama.cpp) */
        for (size_t i = 0; i < nm; i++) {
            struct gguf_str m = mg->v.arr.strs[i];
            const char *sp = m.len > 1 ? memchr(m.p + 1, ' ', m.len - 1) : NULL;
            if (!sp || m.len > 2 * (uint64_t)COORD_TOK_MAX_PIECE) {
                rc = shardlm_fail(e, -EINVAL, "%s: tokenizer.ggml.merges[%zu] is not two pieces "
                                "separated by a space", what, i);
                goto out;
            }
            s.ma[i] = m.p;
            s.mal[i] = (uint32_t)(sp - m.p);
            s.mb[i] = sp + 1;
            s.mbl[i] = (uint32_t)(m.len - s.mal[i] - 1);
        }
        s.n_merges = (int)nm;
    }
    gguf_id(g, "tokenizer.ggml.bos_token_id", n, &s.bos);
    gguf_id(g, "tokenizer.ggml.eos_token_id", n, &s.eos);
    gguf_id(g, "tokenizer.ggml.unknown_token_id", n, &s.unk);
    if ((s.flags & COORD_TOKF_ADD_BOS) && s.bos < 0) {
        rc = shardlm_fail(e, -EINVAL, "%s: tokenizer.ggml.add_bos_token is true, but "
                        "tokenizer.ggml.bos_token_id is not set", what);
        goto out;
    }
    if ((s.flags & COORD_TOKF_ADD_EOS) && s.eos < 0) {
        rc = shardlm_fail(e, -EINVAL, "%s: tokenizer.ggml.add_eos_token is true, but "
                        "tokenizer.ggml.eos_token_id is not set", what);
        goto out;
    }
    /* llama.cpp: Phi-3's special tokens eat the whitespace after them */
    struct gguf_str name;
    if (gguf_get_str(g, "general.name", &name) == 0 && name.len < 256) {
        char low[256];
        for (size_t i = 0; i < name.len; i++)
            low[i] = (char)tolower((unsigned char)name.p[i]);
        low[name.len] = 0;
        if (strlen(low) == name.len && (strstr(low, "phi-3") || strstr(low, "phi3"))) {
            for (int i = 0; i < n; i++) {
                int k = attrs[i] & COORD_TOKA_TYPE;
                bool sp = k == COORD_TOKT_CONTROL || k == COORD_TOKT_USER_DEFINED ||
                          k == COORD_TOKT_UNKNOWN;
                const char *p = s.p[i];
                size_t l = s.plen[i];
                if ((sp || (l == 4 && !memcmp(p, "</s>", 4))) &&
                    !(l == 5 && !memcmp(p, "<unk>", 5)) && !(l == 3 && !memcmp(p, "<s>", 3)) &&
                    !(l == 13 && !memcmp(p, "<|endoftext|>", 13)))
                    attrs[i] |= COORD_TOKA_RSTRIP;
            }
        }
    }
    s.scores = scores;
    s.attrs = attrs;
    rc = tok_finish(t, &s, what, e);
out:
    free(s.p);
    free(s.plen);
    free(scores);
    free(attrs);
    free(s.ma);
    free(s.mb);
    free(s.mal);
    free(s.mbl);
    return rc;
}

/* ---- Hugging Face tokenizer.json ---- */

struct hf {
    struct tok_src s;
    const char *what;
    struct shardlm_err *e;
    bool byte_level, metaspace_split;
    int prefix; /* -1 unset, 0 none, 1 always, 2 first */
    char *own[COORD_TOK_MAX_PATTERNS]; /* regexes built here */
};

static int hf_bad(struct hf *h, const char *field, const char *expected)
{
    return shardlm_fail(h->e, -EINVAL, "%s: %s: expected %s", h->what, field, expected);
}

static const char *jstr(const json_t *j, size_t *n)
{
    if (!json_is_string(j))
        return NULL;
    *n = json_string_length(j);
    return json_string_value(j);
}

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
    if (!j || json_is_null(j)) {
        *out = dflt;
        return 0;
    }
    if (!json_is_boolean(j)) {
        char f[96];
        snprintf(f, sizeof(f), "%s.%s", field, key);
        return hf_bad(h, f, "true or false");
    }
    *out = json_is_true(j);
    return 0;
}

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
    if (n == 0 || n > MAX_PATTERN / 12)
        return hf_bad(h, "pre_tokenizer Split pattern String", "1..341 bytes");
    char *re = malloc(n * 12 + 1);
    if (!re)
        return shardlm_fail(h->e, -ENOMEM, "%s: out of memory", h->what);
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t l = get_utf8(s + i, n - i, &cp);
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

static int hf_pre(struct hf *h, const json_t *p, int depth)
{
    if (!p || json_is_null(p))
        return 0;
    if (!json_is_object(p) || depth > 4)
        return hf_bad(h, "pre_tokenizer", "an object");
    const json_t *ty = json_object_get(p, "type");
    int rc;
    bool b;
    if (jstr_is(ty, "Sequence")) {
        const json_t *seq = json_object_get(p, "pretokenizers");
        if (!json_is_array(seq))
            return hf_bad(h, "pre_tokenizer.pretokenizers", "an array");
        for (size_t i = 0; i < json_array_size(seq); i++)
            if ((rc = hf_pre(h, json_array_get(seq, i), depth + 1)))
                return rc;
        return 0;
    }
    if (jstr_is(ty, "ByteLevel")) {
        h->byte_level = true;
        if ((rc = jbool(h, p, "add_prefix_space", "pre_tokenizer", &b, true)))
            return rc;
        if (b)
            h->prefix = 1;
        if ((rc = jbool(h, p, "use_regex", "pre_tokenizer", &b, true)))
            return rc;
        return b ? hf_add_pattern(h, RE_GPT2, strlen(RE_GPT2), false) : 0;
    }
    if (jstr_is(ty, "Metaspace")) {
        size_t n;
        const char *r = jstr(json_object_get(p, "replacement"), &n);
        if (!r || n != 3 || memcmp(r, ESC_WS, 3) != 0)
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
    if (jstr_is(ty, "Split")) {
        const json_t *pat = json_object_get(p, "pattern");
        const json_t *beh = json_object_get(p, "behavior");
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
    if (jstr_is(ty, "Digits")) {
        if ((rc = jbool(h, p, "individual_digits", "pre_tokenizer Digits", &b, false)))
            return rc;
        const char *re = b ? "\\p{N}" : "\\p{N}+";
        return hf_add_pattern(h, re, strlen(re), false);
    }
    size_t n;
    const char *name = jstr(ty, &n);
    char m[48];
    show_piece(m, sizeof(m), name ? name : "?", name ? (n < 32 ? n : 32) : 1);
    return shardlm_fail(h->e, -EINVAL, "%s: pre_tokenizer type '%s' is not supported (ByteLevel, "
                      "Metaspace, Split, Digits, Sequence)", h->what, m);
}

static int hf_norm(struct hf *h, const json_t *p, int depth)
{
    if (!p || json_is_null(p))
        return 0;
    if (!json_is_object(p) || depth > 4)
        return hf_bad(h, "normalizer", "an object");
    const json_t *ty = json_object_get(p, "type");
    int rc;
    if (jstr_is(ty, "Sequence")) {
        const json_t *seq = json_object_get(p, "normalizers");
        if (!json_is_array(seq))
            return hf_bad(h, "normalizer.normalizers", "an array");
        for (size_t i = 0; i < json_array_size(seq); i++)
            if ((rc = hf_norm(h, json_array_get(seq, i), depth + 1)))
                return rc;
        return 0;
    }
    if (jstr_is(ty, "Prepend")) {
        if (!jstr_is(json_object_get(p, "prepend"), ESC_WS))
            return hf_bad(h, "normalizer Prepend prepend", "\"\\u2581\"");
        h->prefix = 1;
        return 0;
    }
    if (jstr_is(ty, "Replace")) {
        const json_t *pat = json_object_get(p, "pattern");
        if (!json_is_object(pat) || !jstr_is(json_object_get(pat, "String"), " ") ||
            !jstr_is(json_object_get(p, "content"), ESC_WS))
            return hf_bad(h, "normalizer Replace", "' ' replaced by \"\\u2581\"");
        h->s.flags |= COORD_TOKF_ESCAPE_WS;
        return 0;
    }
    /* FIXME: NFC is not applied (llama.cpp does not either): already-composed text is fine */
    if (jstr_is(ty, "NFC"))
        return 0;
    size_t n;
    const char *name = jstr(ty, &n);
    char m[48];
    show_piece(m, sizeof(m), name ? name : "?", name ? (n < 32 ? n : 32) : 1);
    return shardlm_fail(h->e, -EINVAL, "%s: normalizer type '%s' is not supported (Prepend and "
                      "Replace of \"\\u2581\", NFC, Sequence)", h->what, m);
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
        int id = s ? lookup_n(t, s, n) : -1;
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

static int first_of(const struct coord_tok *t, const char *const *names)
{
    for (; *names; names++) {
        int id = lookup(t, *names);
        if (id >= 0)
            return id;
    }
    return -1;
}

static int hf_json_model(struct hf *h, const json_t *root, const json_t **vocab,
                         const json_t **merges)
{
    const json_t *model = json_object_get(root, "model");
    int rc;
    bool b;
    if (!json_is_object(model))
        return hf_bad(h, "model", "an object");
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
static int hf_place(struct hf *h, const char *p, size_t n, json_int_t id, int cap,
                    const char *field)
{
    if (id < 0 || id >= cap) {
        char f[160];
        snprintf(f, sizeof(f), "%s id %lld", field, (long long)id);
        return shardlm_fail(h->e, -EINVAL, "%s: %s: expected 0..%d (ids must stay within twice "
                          "the number of tokens)", h->what, f, cap - 1);
    }
    if (n > COORD_TOK_MAX_PIECE)
        return hf_bad(h, field, "pieces of at most 65536 bytes");
    int i = (int)id;
    if (h->s.p[i]) {
        if (h->s.plen[i] == n && memcmp(h->s.p[i], p, n) == 0)
            return 0;
        char a[48], b[48];
        show_piece(a, sizeof(a), h->s.p[i], h->s.plen[i]);
        show_piece(b, sizeof(b), p, n);
        return shardlm_fail(h->e, -EINVAL, "%s: %s: id %d is both '%s' and '%s'", h->what, field, i,
                          a, b);
    }
    h->s.p[i] = p;
    h->s.plen[i] = (uint32_t)n;
    if (i >= h->s.n)
        h->s.n = i + 1;
    return 0;
}

int coord_tok_from_hf_json(struct coord_tok *t, const uint8_t *json, size_t len, const char *what,
                           struct shardlm_err *e)
{
    memset(t, 0, sizeof(*t));
    json_error_t jerr;
    json_t *root = json_loadb((const char *)json, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL,
                              &jerr);
    if (!root) { /* jansson quotes the input: keep the error on one line */
        char msg[200];
        show_piece(msg, sizeof(msg), jerr.text, strnlen(jerr.text, sizeof(jerr.text)));
        return shardlm_fail(e, -EINVAL, "%s: not JSON: %s at line %d", what, msg, jerr.line);
    }
    struct hf h = {.what = what, .e = e, .prefix = -1};
    h.s.type = COORD_TOK_BPE;
    h.s.bos = h.s.eos = h.s.unk = -1;
    h.s.strict_merges = true;
    const json_t *vocab = NULL, *merges = NULL, *added = NULL;
    uint8_t *attrs = NULL;
    int rc, cap = 0;
    if (!json_is_object(root)) {
        rc = hf_bad(&h, "the top level", "an object");
        goto out;
    }
    if ((rc = hf_json_model(&h, root, &vocab, &merges)) ||
        (rc = hf_norm(&h, json_object_get(root, "normalizer"), 0)) ||
        (rc = hf_pre(&h, json_object_get(root, "pre_tokenizer"), 0)))
        goto out;
    added = json_object_get(root, "added_tokens");
    if (added && !json_is_null(added) && !json_is_array(added)) {
        rc = hf_bad(&h, "added_tokens", "an array");
        goto out;
    }
    /* ids: dense from 0, holes allowed up to the number of entries again */
    size_t entries = json_object_size(vocab) + json_array_size(added);
    if (entries == 0 || entries > COORD_TOK_MAX_VOCAB / 2) {
        rc = shardlm_fail(e, -EINVAL, "%s: %zu tokens, expected 1..%d", what, entries,
                        COORD_TOK_MAX_VOCAB / 2);
        goto out;
    }
    cap = (int)(2 * entries);
    h.s.p = calloc((size_t)cap, sizeof(char *));
    h.s.plen = calloc((size_t)cap, sizeof(uint32_t));
    attrs = calloc((size_t)cap, 1);
    size_t nm = json_array_size(merges);
    if (nm > MAX_MERGES) {
        rc = hf_bad(&h, "model.merges", "at most 16777216 merges");
        goto out;
    }
    h.s.ma = malloc((nm ? nm : 1) * sizeof(char *));
    h.s.mb = malloc((nm ? nm : 1) * sizeof(char *));
    h.s.mal = malloc((nm ? nm : 1) * sizeof(uint32_t));
    h.s.mbl = malloc((nm ? nm : 1) * sizeof(uint32_t));
    if (!h.s.p || !h.s.plen || !attrs || !h.s.ma || !h.s.mb || !h.s.mal || !h.s.mbl) {
        rc = shardlm_fail(e, -ENOMEM, "%s: out of memory", what);
        goto out;
    }
    const char *key;
    size_t key_len;
    const json_t *val;
    json_object_keylen_foreach((json_t *)vocab, key, key_len, val)
    {
        if (!json_is_integer(val)) {
            rc = hf_bad(&h, "model.vocab", "integer ids");
            goto out;
        }
        if ((rc = hf_place(&h, key, key_len, json_integer_value(val), cap, "model.vocab")))
            goto out;
    }
    size_t unk_n = 0;
    const char *unk = jstr(json_object_get(json_object_get(root, "model"), "unk_token"), &unk_n);
    for (int i = 0; i < cap; i++) {
        unsigned b;
        if (!h.s.p[i])
            continue;
        if (unk && unk_n == h.s.plen[i] && memcmp(unk, h.s.p[i], unk_n) == 0)
            attrs[i] = COORD_TOKT_UNKNOWN;
        else if ((h.s.flags & COORD_TOKF_BYTE_FALLBACK) && byte_piece(h.s.p[i], h.s.plen[i], &b))
            attrs[i] = COORD_TOKT_BYTE;
        else
            attrs[i] = COORD_TOKT_NORMAL;
    }
    for (size_t i = 0; i < json_array_size(added); i++) {
        const json_t *a = json_array_get(added, i);
        const json_t *id = json_object_get(a, "id");
        size_t n = 0;
        const char *c = jstr(json_object_get(a, "content"), &n);
        bool special, ls, rs;
        if (!json_is_object(a) || !json_is_integer(id) || !c || n == 0) {
            rc = hf_bad(&h, "added_tokens", "objects with an integer id and a non-empty content");
            goto out;
        }
        if ((rc = jbool(&h, a, "special", "added_tokens", &special, false)) ||
            (rc = jbool(&h, a, "lstrip", "added_tokens", &ls, false)) ||
            (rc = jbool(&h, a, "rstrip", "added_tokens", &rs, false)) ||
            (rc = hf_place(&h, c, n, json_integer_value(id), cap, "added_tokens")))
            goto out;
        int k = (int)json_integer_value(id);
        bool is_unk = unk && unk_n == n && memcmp(unk, c, n) == 0;
        attrs[k] = (uint8_t)((is_unk ? COORD_TOKT_UNKNOWN
                                     : special ? COORD_TOKT_CONTROL : COORD_TOKT_USER_DEFINED) |
                             (ls ? COORD_TOKA_LSTRIP : 0) | (rs ? COORD_TOKA_RSTRIP : 0));
    }
    for (int i = 0; i < h.s.n; i++)
        if (!h.s.p[i]) { /* a hole: never produced, never looked up */
            h.s.p[i] = "";
            attrs[i] = COORD_TOKT_UNUSED;
        }
    for (size_t i = 0; i < nm; i++) {
        const json_t *m = json_array_get(merges, i);
        size_t n, n2;
        const char *a = jstr(m, &n), *b;
        if (a) { /* "a b": split at the first space after the first byte */
            const char *sp = n > 1 ? memchr(a + 1, ' ', n - 1) : NULL;
            if (!sp || !sp[1]) {
                rc = hf_bad(&h, "model.merges", "\"a b\" strings or [\"a\", \"b\"] pairs");
                goto out;
            }
            b = sp + 1;
            n2 = n - (size_t)(b - a);
            n = (size_t)(sp - a);
        } else if (json_is_array(m) && json_array_size(m) == 2 &&
                   (a = jstr(json_array_get(m, 0), &n)) && (b = jstr(json_array_get(m, 1), &n2))) {
        } else {
            rc = hf_bad(&h, "model.merges", "\"a b\" strings or [\"a\", \"b\"] pairs");
            goto out;
        }
        if (n > COORD_TOK_MAX_PIECE || n2 > COORD_TOK_MAX_PIECE) {
            rc = hf_bad(&h, "model.merges", "pieces of at most 65536 bytes");
            goto out;
        }
        h.s.ma[i] = a;
        h.s.mal[i] = (uint32_t)n;
        h.s.mb[i] = b;
        h.s.mbl[i] = (uint32_t)n2;
    }
    h.s.n_merges = (int)nm;
    if (h.byte_level)
        h.s.flags |= COORD_TOKF_BYTE_LEVEL;
    if (h.metaspace_split && (rc = hf_add_pattern(&h, RE_METASPACE, strlen(RE_METASPACE), false)))
        goto out;
    if (h.prefix >= 1)
        h.s.flags |= COORD_TOKF_SPACE_PREFIX | (h.prefix == 2 ? COORD_TOKF_PREFIX_FIRST : 0);
    h.s.attrs = attrs;
    if ((rc = tok_finish(t, &h.s, what, e)))
        goto out;
    /* special ids: the post-processor's template, else the usual names */
    int bos = -1, eos = -1;
    unsigned fl = 0;
    hf_template(t, json_object_get(root, "post_processor"), 0, &bos, &eos, &fl);
    static const char *const bos_names[] = {"<s>", "<|begin_of_text|>", "<bos>", "<|endoftext|>",
                                            NULL};
    static const char *const eos_names[] = {"</s>", "<|end_of_text|>", "<|endoftext|>", "<eos>",
                                            "<|im_end|>", NULL};
    t->bos_id = bos >= 0 ? bos : first_of(t, bos_names);
    t->eos_id = eos >= 0 ? eos : first_of(t, eos_names);
    t->unk_id = unk ? lookup_n(t, unk, unk_n) : -1;
    t->flags |= fl;
    rc = 0;
out:
    for (int i = 0; i < COORD_TOK_MAX_PATTERNS; i++)
        free(h.own[i]);
    free(h.s.p);
    free(h.s.plen);
    free(attrs);
    free(h.s.ma);
    free(h.s.mb);
    free(h.s.mal);
    free(h.s.mbl);
    json_decref(root);
    return rc;
}

/* ---- the blob ---- */

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
    uint8_t *b = malloc(size), *o = b;
    if (!b)
        return -ENOMEM;
    memcpy(o, BLOB_MAGIC, 8);
    o += 8;
    put32(&o, BLOB_VERSION);
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
    uint64_t h = fnv64(b, (size_t)(o - b));
    memcpy(o, &h, 8);
    o += 8;
    *buf = b;
    *len = (size_t)(o - b);
    return 0;
}

struct cur {
    const uint8_t *p;
    size_t left;
};

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

int coord_tok_load(struct coord_tok *t, const uint8_t *buf, size_t len, const char *what,
                   struct shardlm_err *e)
{
    memset(t, 0, sizeof(*t));
    if (len < BLOB_HEAD + 8 || !coord_tok_is_blob(buf, len))
        return shardlm_fail(e, -EINVAL, "%s: not a tokenizer blob (magic \"%s\", %d bytes at least)",
                          what, BLOB_MAGIC, BLOB_HEAD + 8);
    uint32_t f[10];
    memcpy(f, buf + 8, sizeof(f));
    if (f[0] != BLOB_VERSION)
        return shardlm_fail(e, -EINVAL, "%s: tokenizer blob version %u, expected %d", what, f[0],
                          BLOB_VERSION);
    uint64_t h;
    memcpy(&h, buf + len - 8, 8);
    if (h != fnv64(buf, len - 8))
        return shardlm_fail(e, -EINVAL, "%s: tokenizer blob checksum mismatch (corrupt)", what);
    struct tok_src s = {.type = (enum coord_tok_type)f[1], .flags = f[2], .n = (int)f[3],
                        .max_token_length = (int)f[4], .bos = (int32_t)f[5], .eos = (int32_t)f[6],
                        .unk = (int32_t)f[7], .n_merges = (int)f[8], .n_patterns = (int)f[9],
                        .strict_merges = true};
    if (f[1] > COORD_TOK_BPE)
        return shardlm_fail(e, -EINVAL, "%s: tokenizer type %u, expected 0..2", what, f[1]);
    if (f[2] & ~COORD_TOKF_ALL)
        return shardlm_fail(e, -EINVAL, "%s: tokenizer flags 0x%x has unknown bits", what, f[2]);
    size_t body = len - 8 - BLOB_HEAD;
    /* each token takes at least 9 bytes (score, type, length), each merge 8 */
    if (f[3] == 0 || f[3] > COORD_TOK_MAX_VOCAB || f[3] > body / 9)
        return shardlm_fail(e, -EINVAL, "%s: %u tokens in %zu bytes", what, f[3], len);
    if (f[8] > MAX_MERGES || f[8] > (body - (size_t)f[3] * 9) / 8)
        return shardlm_fail(e, -EINVAL, "%s: %u merges in %zu bytes", what, f[8], len);
    if (f[9] > (s.type == COORD_TOK_BPE ? COORD_TOK_MAX_PATTERNS : 0))
        return shardlm_fail(e, -EINVAL, "%s: %u pre-tokenizer regexes for tokenizer type %u", what,
                          f[9], f[1]);
    if (s.type == COORD_TOK_SPM_LLAMA2C &&
        (s.max_token_length <= 0 || s.max_token_length > 4096 ||
         (s.flags & ~COORD_TOKF_ADD_BOS) || s.n_merges))
        return shardlm_fail(e, -EINVAL, "%s: llama2.c tokenizer with max_token_length %d, flags "
                          "0x%x, %d merges", what, s.max_token_length, s.flags, s.n_merges);
    if ((s.bos < -1 || s.bos >= s.n) || (s.eos < -1 || s.eos >= s.n) ||
        (s.unk < -1 || s.unk >= s.n))
        return shardlm_fail(e, -EINVAL, "%s: special ids bos %d eos %d unk %d, expected -1..%d",
                          what, s.bos, s.eos, s.unk, s.n - 1);
    struct cur c = {buf + BLOB_HEAD, body};
    int n = s.n, rc = 0;
    float *scores = malloc((size_t)n * sizeof(float));
    uint8_t *attrs = malloc((size_t)n);
    s.p = malloc((size_t)n * sizeof(char *));
    s.plen = malloc((size_t)n * sizeof(uint32_t));
    int32_t *mid = malloc((size_t)(s.n_merges ? s.n_merges : 1) * 2 * sizeof(int32_t));
    if (!scores || !attrs || !s.p || !s.plen || !mid) {
        rc = shardlm_fail(e, -ENOMEM, "%s: out of memory", what);
        goto out;
    }
    take(&c, scores, (size_t)n * 4);
    take(&c, attrs, (size_t)n);
    for (int i = 0; i < n; i++) {
        uint8_t a = attrs[i];
        if ((a & COORD_TOKA_TYPE) > COORD_TOKT_BYTE || (a & ~(COORD_TOKA_TYPE | COORD_TOKA_LSTRIP |
                                                              COORD_TOKA_RSTRIP))) {
            rc = shardlm_fail(e, -EINVAL, "%s: token %d: attribute 0x%02x is not a token type", what,
                            i, a);
            goto out;
        }
    }
    for (int i = 0; i < n; i++) {
        uint32_t l;
        if (!take(&c, &l, 4) || l > c.left || l > COORD_TOK_MAX_PIECE) {
            rc = shardlm_fail(e, -EINVAL, "%s: token %d: length past the end of the blob", what, i);
            goto out;
        }
        s.p[i] = (const char *)c.p;
        s.plen[i] = l;
        take(&c, NULL, l);
        if (s.type == COORD_TOK_SPM_LLAMA2C &&
            ((int)l > s.max_token_length || memchr(s.p[i], 0, l))) {
            rc = shardlm_fail(e, -EINVAL, "%s: token %d: %u bytes, expected a C string of at most "
                            "%d", what, i, l, s.max_token_length);
            goto out;
        }
    }
    if (!take(&c, mid, (size_t)s.n_merges * 8)) {
        rc = shardlm_fail(e, -EINVAL, "%s: merges past the end of the blob", what);
        goto out;
    }
    for (int i = 0; i < s.n_patterns; i++) {
        uint32_t l;
        if (!take(&c, &l, 4) || l > c.left) {
            rc = shardlm_fail(e, -EINVAL, "%s: regex %d past the end of the blob", what, i);
            goto out;
        }
        s.pat[i] = (const char *)c.p;
        s.patlen[i] = l;
        take(&c, NULL, l);
    }
    if (c.left) {
        rc = shardlm_fail(e, -EINVAL, "%s: %zu bytes after the tokenizer", what, c.left);
        goto out;
    }
    s.mid = mid;
    s.scores = scores;
    s.attrs = attrs;
    if ((rc = tok_finish(t, &s, what, e)))
        goto out;
    if (t->max_token_length != s.max_token_length) { /* one blob per tokenizer */
        rc = shardlm_fail(e, -EINVAL, "%s: max_token_length %d, but the longest token has %d "
                        "bytes", what, s.max_token_length, t->max_token_length);
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
        return shardlm_fail(e, -EIO, "%s: the stored tokenizer does not match its checksum (the "
                          "file is corrupt)", what);
    if (h->tok_kind == SHLM_TOK_LLAMA2C)
        return coord_tok_init(t, tb, h->tok_bytes, (int)h->cfg.vocab_size, what, e);
    if (h->tok_kind == SHLM_TOK_BLOB)
        return coord_tok_load(t, tb, h->tok_bytes, what, e);
    return shardlm_fail(e, -EINVAL, "%s: header field tok_kind is %u, expected %d or %d", what,
                      h->tok_kind, SHLM_TOK_LLAMA2C, SHLM_TOK_BLOB);
}

int coord_tok_from_image(struct coord_tok *t, const uint8_t *buf, size_t size, long vocab_size,
                         const char *what, struct shardlm_err *e)
{
    memset(t, 0, sizeof(*t));
    if (size >= 8 && memcmp(buf, SHLM_MAGIC, sizeof(SHLM_MAGIC)) == 0) {
        struct shlm_model m;
        struct shardlm_err err;
        int rc = shlm_parse(&m, buf, size, what, &err);
        if (rc)
            return shardlm_fail(e, rc, "%s", err.msg);
        return coord_tok_from_shlm(t, &m, what, e);
    }
    if (size >= 4 && memcmp(buf, "GGUF", 4) == 0) {
        struct gguf_file g;
        int rc = gguf_parse(&g, buf, size, what, e);
        if (rc)
            return rc;
        rc = coord_tok_from_gguf(t, &g, what, e);
        gguf_close(&g);
        return rc;
    }
    if (coord_tok_is_blob(buf, size))
        return coord_tok_load(t, buf, size, what, e);
    size_t i = 0;
    while (i < size && (buf[i] == ' ' || buf[i] == '\t' || buf[i] == '\n' || buf[i] == '\r'))
        i++;
    if (i < size && buf[i] == '{')
        return coord_tok_from_hf_json(t, buf, size, what, e);
    if (vocab_size == 0) {
        int n = coord_tok_llama2c_count(buf, size);
        if (n < 0)
            return shardlm_fail(e, -EINVAL, "%s: not a .shlm, GGUF, tokenizer.json or tokenizer "
                              "blob, and not a whole llama2.c tokenizer.bin (try --vocab-size)",
                              what);
        vocab_size = n;
    }
    if (vocab_size < 0 || vocab_size > COORD_TOK_MAX_VOCAB)
        return shardlm_fail(e, -EINVAL, "%s: vocabulary size %ld is out of range", what, vocab_size);
    return coord_tok_init(t, buf, size, (int)vocab_size, what, e);
}

/* ---- encoding ---- */

struct ivec {
    int32_t *v;
    size_t n, cap;
};

static int ivec_push(struct ivec *v, int32_t x)
{
    if (v->n == v->cap) {
        size_t c = v->cap ? v->cap * 2 : 64;
        int32_t *n = realloc(v->v, c * sizeof(int32_t));
        if (!n)
            return -ENOMEM;
        v->v = n;
        v->cap = c;
    }
    v->v[v->n++] = x;
    return 0;
}

/* A symbol: a span of the text being merged; merging only grows a symbol to the right. */
struct sym {
    uint32_t off, len;
    int prev, next; /* -1 at the ends; next -2 once merged into its left neighbour */
    int32_t id;     /* its token, -1 none */
};

struct bigram {
    double prio; /* higher first: the SPM score, minus the BPE rank */
    int left, right;
    int rnext; /* right's next when queued: it changes when right merges on */
    int32_t id;
};

struct heap {
    struct bigram *v;
    size_t n, cap;
};

static bool bg_before(const struct bigram *a, const struct bigram *b)
{
    return a->prio > b->prio || (a->prio == b->prio && a->left < b->left);
}

static int heap_push(struct heap *h, struct bigram b)
{
    if (h->n == h->cap) {
        size_t c = h->cap ? h->cap * 2 : 64;
        struct bigram *n = realloc(h->v, c * sizeof(*n));
        if (!n)
            return -ENOMEM;
        h->v = n;
        h->cap = c;
    }
    size_t i = h->n++;
    while (i > 0 && bg_before(&b, &h->v[(i - 1) / 2])) {
        h->v[i] = h->v[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h->v[i] = b;
    return 0;
}

static struct bigram heap_pop(struct heap *h)
{
    struct bigram top = h->v[0], last = h->v[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n)
            break;
        if (c + 1 < h->n && bg_before(&h->v[c + 1], &h->v[c]))
            c++;
        if (!bg_before(&h->v[c], &last))
            break;
        h->v[i] = h->v[c];
        i = c;
    }
    if (h->n)
        h->v[i] = last;
    return top;
}

/* A word merged before: its symbols' ids, and the ids they merged to. */
#define WORD_SYMS 12
struct word {
    uint32_t hash;
    uint8_t n_in, n_out; /* n_in 0: empty */
    int32_t in[WORD_SYMS], out[WORD_SYMS];
};

struct merger {
    const struct coord_tok *t;
    const char *s; /* the text the symbols span */
    struct sym *sym;
    int n;
    struct heap heap;
    struct word *words; /* direct-mapped cache of merged words, or NULL */
    uint32_t words_mask;
};

/* Queues the pair (l, r) when it can merge. llama2.c: when their text is a piece scoring above
 * run.c's starting best of -1e10 (so never a NaN). SPM: when it is a piece that is not a
 * control, unknown, byte or unused one (SentencePiece's rule). BPE: when it is a ranked merge. */
static int try_pair(struct merger *m, int l, int r)
{
    if (l < 0 || r < 0)
        return 0;
    const struct coord_tok *t = m->t;
    struct bigram b = {.left = l, .right = r, .rnext = m->sym[r].next};
    if (t->type != COORD_TOK_BPE) {
        size_t n = (size_t)m->sym[l].len + m->sym[r].len;
        bool llama2c = t->type == COORD_TOK_SPM_LLAMA2C;
        if (llama2c && n > (size_t)t->max_token_length * 2) /* run.c's buffer */
            return 0;
        int id = lookup_n(t, m->s + m->sym[l].off, n);
        if (id < 0 || !spm_makes(t, id) || (llama2c && !(t->scores[id] > -1e10f)))
            return 0;
        b.id = id;
        b.prio = t->scores[id];
    } else {
        if (m->sym[l].id < 0 || m->sym[r].id < 0)
            return 0;
        int rank = merge_rank(t, m->sym[l].id, m->sym[r].id);
        if (rank < 0)
            return 0;
        b.id = t->merges[rank * 3 + 2];
        b.prio = -(double)rank;
    }
    return heap_push(&m->heap, b);
}

/* Merges the m->n symbols, linked in order: the best queued pair first, leftmost on ties, as
 * long as any pair can merge. Returns 0 or -ENOMEM. */
static int merge_syms(struct merger *m)
{
    int rc;
    m->heap.n = 0;
    for (int i = 0; i + 1 < m->n; i++)
        if ((rc = try_pair(m, i, i + 1)))
            return rc;
    while (m->heap.n) {
        struct bigram b = heap_pop(&m->heap);
        struct sym *l = &m->sym[b.left], *r = &m->sym[b.right];
        /* outdated: left merged on or into its neighbour (its next moved), or right merged on */
        if (l->next != b.right || r->next != b.rnext)
            continue;
        l->len += r->len;
        l->id = b.id;
        l->next = r->next;
        r->next = -2;
        if (l->next >= 0)
            m->sym[l->next].prev = b.left;
        if ((rc = try_pair(m, l->prev, b.left)) || (rc = try_pair(m, b.left, l->next)))
            return rc;
    }
    return 0;
}

/* Whether symbol @i is non-empty and all spaces. */
static bool sym_spaces(const struct merger *m, int i)
{
    size_t w, n = m->sym[i].len;
    const char *p = m->s + m->sym[i].off, *sp = spm_space(m->t, &w);
    if (n == 0 || p[0] != sp[0] || n % w) /* most symbols fail at once */
        return false;
    for (size_t k = 0; k < n; k += w)
        if (memcmp(p + k, sp, w) != 0)
            return false;
    return true;
}

/* Merges the m->n symbols, linked in order, as merge_syms(). Merging depends on the symbols'
 * ids alone (and their text, which the ids spell: a symbol without an id is never cached), so a
 * word met again takes the ids it merged to before, in its first symbols: English text repeats
 * its words, and merging each one anew was most of the time. */
static int merge_word(struct merger *m)
{
    int n = m->n;
    int32_t in[WORD_SYMS];
    struct word *w = NULL;
    uint32_t h = 0;
    if (m->words && n >= 2 && n <= WORD_SYMS) {
        bool ids = true;
        for (int k = 0; k < n; k++)
            ids &= (in[k] = m->sym[k].id) >= 0;
        if (ids)
            w = &m->words[(h = hash_ids(in, (size_t)n)) & m->words_mask];
    }
    if (w && w->n_in == n && w->hash == h && memcmp(w->in, in, (size_t)n * 4) == 0) {
        for (int k = 0; k < n; k++) {
            m->sym[k].id = k < w->n_out ? w->out[k] : -1;
            m->sym[k].next = k >= w->n_out ? -2 : k + 1 < w->n_out ? k + 1 : -1;
        }
        return 0;
    }
    int rc = merge_syms(m);
    if (rc || !w)
        return rc;
    w->hash = h;
    w->n_in = (uint8_t)n;
    w->n_out = 0;
    memcpy(w->in, in, (size_t)n * 4);
    for (int i = 0; i >= 0; i = m->sym[i].next)
        w->out[w->n_out++] = m->sym[i].id;
    return 0;
}

/* Emits the byte tokens of @s[0, n) (or unk); -EILSEQ when the vocabulary has neither. */
static int emit_bytes(const struct coord_tok *t, const char *s, size_t n, struct ivec *out)
{
    for (size_t i = 0; i < n; i++) {
        int id = t->byte_ids[(unsigned char)s[i]];
        if (id < 0)
            id = t->unk_id;
        if (id < 0)
            return -EILSEQ;
        if (ivec_push(out, id))
            return -ENOMEM;
    }
    return 0;
}

/* Emits the merged symbols of @m, in order. */
static int emit_syms(struct merger *m, struct ivec *out, bool byte_level)
{
    const struct coord_tok *t = m->t;
    for (int i = 0; i < m->n; i++) {
        const struct sym *y = &m->sym[i];
        int rc;
        if (y->next == -2) { /* merged into its left neighbour */
            continue;
        } else if (y->id >= 0) {
            if (ivec_push(out, y->id))
                return -ENOMEM;
        } else if (byte_level) { /* a byte whose character is not a piece */
            if (t->unk_id < 0)
                return -EILSEQ;
            if (ivec_push(out, t->unk_id))
                return -ENOMEM;
        } else if (t->type == COORD_TOK_SPM || (t->flags & COORD_TOKF_BYTE_FALLBACK)) {
            if ((rc = emit_bytes(t, m->s + y->off, y->len, out)))
                return rc;
        } else {
            if (t->unk_id < 0)
                return -EILSEQ;
            if (ivec_push(out, t->unk_id))
                return -ENOMEM;
        }
    }
    return 0;
}

/* Splits @s[0, n) into characters (bytes when @byte_level) as m->n linked symbols. */
static void split_chars(struct merger *m, const char *s, size_t n, bool byte_level)
{
    const struct coord_tok *t = m->t;
    m->s = s;
    m->n = 0;
    for (size_t off = 0; off < n;) {
        /* byte-level: @s holds raw bytes, each one GPT-2 character */
        size_t l = byte_level ? 1 : utf8_len((unsigned char)s[off]);
        if (l > n - off)
            l = n - off;
        struct sym *y = &m->sym[m->n];
        y->off = (uint32_t)off;
        y->len = (uint32_t)l;
        y->prev = m->n - 1;
        y->next = off + l == n ? -1 : m->n + 1;
        y->id = byte_level ? t->byte_ids[(unsigned char)s[off]] : lookup_n(t, s + off, l);
        if (y->id >= 0 && (ttype(t, y->id) == COORD_TOKT_CONTROL ||
                           ttype(t, y->id) == COORD_TOKT_UNKNOWN))
            y->id = -1;
        m->n++;
        off += l;
    }
}

/* The end of the word that starts at @s[a] (a character boundary) in @s[0, n): the next space
 * character that follows one that is not a space, else @n. With t->words_apart no piece can
 * span that point (see words_apart()), so words merge apart; else the text is one word. */
static size_t word_end(const struct coord_tok *t, const char *s, size_t a, size_t n)
{
    size_t w;
    const char *sp = spm_space(t, &w);
    bool prev_space = true;
    for (size_t i = a; t->words_apart && i < n;) {
        bool space = n - i >= w && memcmp(s + i, sp, w) == 0;
        if (space && !prev_space)
            return i;
        prev_space = space;
        i += space ? w : utf8_len((unsigned char)s[i]);
    }
    return n;
}

/* Merges and emits @s[0, n) (SPM: word by word; BPE: one pre-token word). Each word's
 * symbols and heap stay in the cache (symbols for the whole text first, then one heap over
 * them, missed it on every pop: 1 MB/s). Returns 0 or -errno. */
static int merge_text(struct merger *m, const char *s, size_t n, bool byte_level,
                      struct ivec *out)
{
    int rc = 0;
    for (size_t a = 0, b; a < n && !rc; a = b) {
        b = word_end(m->t, s, a, n);
        split_chars(m, s + a, b - a, byte_level);
        if (!(rc = merge_word(m)))
            rc = emit_syms(m, out, byte_level);
    }
    return rc;
}

/* Appends token @id to the llama2.c word being built (its piece after the others, in
 * *@buf of *@cap bytes), when it starts a new word (its piece begins with a space, the one
 * before it is neither empty nor all spaces: see words_apart()) merging and emitting the word
 * so far first. Returns 0 or -ENOMEM. */
static int llama2c_push(struct merger *m, int32_t id, char **buf, size_t *cap, struct ivec *out)
{
    const struct coord_tok *t = m->t;
    uint32_t l = t->vocab_len[id];
    int rc;
    if (t->words_apart && m->n && l && t->vocab[id][0] == ' ' && m->sym[m->n - 1].len &&
        !sym_spaces(m, m->n - 1)) {
        if ((rc = merge_word(m)) || (rc = emit_syms(m, out, false)))
            return rc;
        m->n = 0;
    }
    size_t off = m->n ? m->sym[m->n - 1].off + m->sym[m->n - 1].len : 0;
    if (off + l > *cap) {
        size_t c = 2 * (off + l) + 64;
        char *nb = c <= UINT32_MAX ? realloc(*buf, c) : NULL;
        if (!nb)
            return -ENOMEM;
        *buf = nb;
        *cap = c;
    }
    memcpy(*buf + off, t->vocab[id], l);
    m->s = *buf;
    if (m->n)
        m->sym[m->n - 1].next = m->n;
    m->sym[m->n] = (struct sym){.off = (uint32_t)off, .len = l, .prev = m->n - 1, .next = -1,
                                .id = id};
    m->n++;
    return 0;
}

/* llama2.c run.c encode() of @text (@len bytes, no NUL), into @out: BOS, the dummy prefix " ",
 * each UTF-8 character (a lead byte and up to 3 continuation bytes) that is a piece or else
 * its bytes as ids 3 + byte, then run.c's merges: the adjacent pair whose joined pieces are the
 * piece of best score, leftmost on ties, until none is. run.c rescans every pair after each
 * merge (quadratic: 120 KB took over 120 s); the merger makes the same merges in the same
 * order, word by word. Its symbols span the pieces laid end to end (a byte token is its
 * "<0xNN>" text, as in run.c). Returns 0, -EILSEQ (a byte past the vocabulary) or -ENOMEM. */
static int encode_llama2c(const struct coord_tok *t, const char *text, size_t len, bool bos,
                          struct merger *m, struct ivec *out)
{
    char *buf = NULL;
    size_t cap = 0;
    int rc = 0;
    m->n = 0;
    m->sym = malloc((len + 2) * sizeof(struct sym));
    if (!m->sym)
        return -ENOMEM;
    if (bos && t->bos_id >= 0)
        rc = llama2c_push(m, t->bos_id, &buf, &cap, out);
    int prefix = len ? lookup(t, " ") : -1;
    if (!rc && prefix >= 0)
        rc = llama2c_push(m, prefix, &buf, &cap, out);
    for (size_t i = 0; i < len && !rc;) {
        size_t l = 1;
        while (l < 4 && i + l < len && ((unsigned char)text[i + l] & 0xC0) == 0x80)
            l++;
        int id = lookup_n(t, text + i, l);
        if (id >= 0)
            rc = llama2c_push(m, id, &buf, &cap, out);
        for (size_t k = 0; id < 0 && k < l && !rc; k++) {
            /* byte fallback: ids 3..258 are <0x00>..<0xFF> in a llama2.c vocabulary */
            int b = (unsigned char)text[i + k] + 3;
            rc = b < t->vocab_size ? llama2c_push(m, b, &buf, &cap, out) : -EILSEQ;
        }
        i += l;
    }
    if (!rc && !(rc = merge_word(m)))
        rc = emit_syms(m, out, false);
    free(buf);
    return rc;
}

struct span {
    size_t off, len;
};

struct svec {
    struct span *v;
    size_t n, cap;
};

static int svec_push(struct svec *v, size_t off, size_t len)
{
    if (v->n == v->cap) {
        size_t c = v->cap ? v->cap * 2 : 64;
        struct span *n = realloc(v->v, c * sizeof(*n));
        if (!n)
            return -ENOMEM;
        v->v = n;
        v->cap = c;
    }
    v->v[v->n++] = (struct span){off, len};
    return 0;
}

/* Splits the valid UTF-8 text @s[off, off + len) by @re into matches and the text between
 * them, in order. */
static int re_split_valid(const struct coord_tok *t, const pcre2_code *re, pcre2_match_data *md,
                          const char *s, size_t off, size_t len, struct svec *out)
{
    const char *sub = s + off;
    size_t pos = 0, gap = 0;
    while (pos < len) {
        /* checked once by the caller: a UTF check per match would make this quadratic */
        int rc = pcre2_match(re, (PCRE2_SPTR)sub, len, pos, PCRE2_NO_UTF_CHECK, md, t->mctx);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT) /* JIT's stack is 32 KiB; the interpreter's heap */
            rc = pcre2_match(re, (PCRE2_SPTR)sub, len, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md,
                             t->mctx);
        if (rc == PCRE2_ERROR_NOMATCH)
            break;
        if (rc < 0)
            return rc == PCRE2_ERROR_NOMEMORY ? -ENOMEM : -EINVAL;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (ms < pos || me < ms || me > len)
            return -EINVAL; /* \K games */
        if (me == ms) { /* an empty match: no piece, move on by a character */
            pos = ms + utf8_len((unsigned char)sub[ms]);
            continue;
        }
        if (ms > gap && svec_push(out, off + gap, ms - gap))
            return -ENOMEM;
        if (svec_push(out, off + ms, me - ms))
            return -ENOMEM;
        gap = pos = me;
    }
    if (gap < len && svec_push(out, off + gap, len - gap))
        return -ENOMEM;
    return 0;
}

/* Splits @s[off, off + len) by @re: each run of valid UTF-8 by the regex, each run of bytes
 * that are not UTF-8 a piece of its own. */
static int re_split(const struct coord_tok *t, const pcre2_code *re, pcre2_match_data *md,
                    const char *s, size_t off, size_t len, struct svec *out)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = off, end = off + len;
    while (i < end) {
        size_t a = i, l;
        while (i < end && (l = utf8_valid(u + i, end - i)))
            i += l;
        int rc;
        if (i > a && (rc = re_split_valid(t, re, md, s, a, i - a, out)))
            return rc;
        a = i;
        while (i < end && !utf8_valid(u + i, end - i))
            i++;
        if (i > a && svec_push(out, a, i - a))
            return -ENOMEM;
    }
    return 0;
}

struct frag {
    int32_t id; /* a token, or -1: text [off, off + len) */
    size_t off, len;
};

struct fvec {
    struct frag *v;
    size_t n, cap;
};

static int fvec_push(struct fvec *v, int32_t id, size_t off, size_t len)
{
    if (v->n == v->cap) {
        size_t c = v->cap ? v->cap * 2 : 16;
        struct frag *n = realloc(v->v, c * sizeof(*n));
        if (!n)
            return -ENOMEM;
        v->v = n;
        v->cap = c;
    }
    v->v[v->n++] = (struct frag){id, off, len};
    return 0;
}

/* llama.cpp tokenizer_st_partition(): splits the text fragments at every occurrence of each
 * special token, longest first; user-defined tokens always, control and unknown ones only
 * with @parse_special. LSTRIP/RSTRIP tokens take the ASCII whitespace beside them. */
static int partition(const struct coord_tok *t, const char *text, size_t len, bool parse_special,
                     struct fvec *fr)
{
    struct fvec nf = {0};
    int rc = 0;
    if (len && (rc = fvec_push(fr, -1, 0, len)))
        return rc;
    for (int k = 0; k < t->n_specials && fr->n; k++) {
        int32_t id = t->specials[k];
        int ty = ttype(t, id);
        if (!parse_special && (ty == COORD_TOKT_CONTROL || ty == COORD_TOKT_UNKNOWN))
            continue;
        const char *p = t->vocab[id];
        size_t pl = t->vocab_len[id];
        nf.n = 0;
        for (size_t i = 0; i < fr->n && !rc; i++) {
            struct frag f = fr->v[i];
            if (f.id >= 0) {
                rc = fvec_push(&nf, f.id, 0, 0);
                continue;
            }
            size_t off = f.off, end = f.off + f.len;
            while (off < end && !rc) {
                const char *hit = memmem(text + off, end - off, p, pl);
                if (!hit) {
                    rc = fvec_push(&nf, -1, off, end - off);
                    break;
                }
                size_t m = (size_t)(hit - text), le = m;
                if (t->attrs[id] & COORD_TOKA_LSTRIP)
                    while (le > off && isspace((unsigned char)text[le - 1]))
                        le--;
                if (le > off)
                    rc = fvec_push(&nf, -1, off, le - off);
                if (!rc)
                    rc = fvec_push(&nf, id, 0, 0);
                off = m + pl;
                if (t->attrs[id] & COORD_TOKA_RSTRIP)
                    while (off < end && isspace((unsigned char)text[off]))
                        off++;
            }
        }
        struct fvec tmp = *fr;
        *fr = nf;
        nf = tmp;
    }
    free(nf.v);
    return rc;
}

/* SPM (llama.cpp llm_tokenizer_spm_session) on one text fragment. */
static int encode_spm(const struct coord_tok *t, struct merger *m, const char *s, size_t n,
                      bool prefix, char *work, struct ivec *out)
{
    size_t k = 0;
    if (prefix)
        work[k++] = ' ';
    memcpy(work + k, s, n);
    k += n;
    if (t->flags & COORD_TOKF_ESCAPE_WS) { /* in place, from the end: each ' ' takes 3 bytes */
        size_t sp = 0;
        for (size_t i = 0; i < k; i++)
            sp += work[i] == ' ';
        size_t o = k + 2 * sp;
        for (size_t i = k; i-- > 0;) {
            if (work[i] == ' ') {
                o -= 3;
                memcpy(work + o, ESC_WS, 3);
            } else {
                work[--o] = work[i];
            }
        }
        k += 2 * sp;
    }
    return merge_text(m, work, k, false, out);
}

/* BPE (llama.cpp llm_tokenizer_bpe_session) on one text fragment. */
static int encode_bpe(const struct coord_tok *t, struct merger *m, const char *s, size_t n,
                      bool prefix, char *work, pcre2_match_data *md, struct svec *words,
                      struct svec *next, struct ivec *out)
{
    bool bl = t->flags & COORD_TOKF_BYTE_LEVEL;
    size_t k = 0;
    if (prefix && !(bl && n && s[0] == ' '))
        work[k++] = ' ';
    memcpy(work + k, s, n);
    k += n;
    if (t->flags & COORD_TOKF_ESCAPE_WS) {
        size_t sp = 0;
        for (size_t i = 0; i < k; i++)
            sp += work[i] == ' ';
        size_t o = k + 2 * sp;
        for (size_t i = k; i-- > 0;) {
            if (work[i] == ' ') {
                o -= 3;
                memcpy(work + o, ESC_WS, 3);
            } else {
                work[--o] = work[i];
            }
        }
        k += 2 * sp;
    }
    int rc;
    words->n = 0;
    if (k && (rc = svec_push(words, 0, k)))
        return rc;
    for (int p = 0; p < t->n_patterns; p++) {
        next->n = 0;
        for (size_t w = 0; w < words->n; w++)
            if ((rc = re_split(t, t->re[p], md, work, words->v[w].off, words->v[w].len, next)))
                return rc;
        struct svec tmp = *words;
        *words = *next;
        *next = tmp;
    }
    char *enc = work + k; /* room for a byte-level word: 2 bytes per byte */
    for (size_t w = 0; w < words->n; w++) {
        const char *ws = work + words->v[w].off;
        size_t wl = words->v[w].len;
        if (t->flags & COORD_TOKF_IGNORE_MERGES) {
            size_t el = 0;
            const char *key = ws;
            if (bl) {
                for (size_t i = 0; i < wl; i++)
                    el += put_utf8(enc + el, gpt2_cp((unsigned char)ws[i]));
                key = enc;
            } else {
                el = wl;
            }
            int id = lookup_n(t, key, el);
            if (id >= 0) {
                if (ivec_push(out, id))
                    return -ENOMEM;
                continue;
            }
        }
        if ((rc = merge_text(m, ws, wl, bl, out)))
            return rc;
    }
    return 0;
}

/* llama.cpp llama_tokenize_impl(): BOS, then the fragments between special tokens each
 * encoded, the special tokens as they are, into @out. Returns 0 or -errno. */
static int encode_fragments(const struct coord_tok *t, const char *text, size_t len,
                            unsigned flags, bool bos, struct merger *m, struct ivec *out)
{
    struct fvec fr = {0};
    struct svec words = {0}, next = {0};
    pcre2_match_data *md = NULL;
    /* work: prefix + text escaped (3 bytes a character at most), then a byte-level word (2) */
    char *work = malloc(len * 9 + 17);
    m->sym = malloc((len * 3 + 4) * sizeof(struct sym));
    int rc = -ENOMEM;
    if (!work || !m->sym)
        goto out;
    if (t->n_patterns && !(md = pcre2_match_data_create(1, NULL)))
        goto out;
    if (bos && t->bos_id >= 0 && ivec_push(out, t->bos_id))
        goto out;
    if ((rc = partition(t, text, len, flags & COORD_TOK_ENC_PARSE_SPECIAL, &fr)))
        goto out;
    bool prev_special = true;
    for (size_t i = 0; i < fr.n && !rc; i++) {
        struct frag f = fr.v[i];
        if (f.id >= 0) {
            rc = ivec_push(out, f.id);
            prev_special = true;
            continue;
        }
        bool prefix = (t->flags & COORD_TOKF_SPACE_PREFIX) &&
                      ((t->flags & COORD_TOKF_PREFIX_FIRST) ? f.off == 0 : prev_special);
        if (t->type == COORD_TOK_SPM)
            rc = encode_spm(t, m, text + f.off, f.len, prefix, work, out);
        else
            rc = encode_bpe(t, m, text + f.off, f.len, prefix, work, md, &words, &next, out);
        prev_special = false;
    }
out:
    pcre2_match_data_free(md);
    free(work);
    free(fr.v);
    free(words.v);
    free(next.v);
    return rc;
}

int coord_tok_encode_ex(const struct coord_tok *t, const char *text, size_t len, unsigned flags,
                        int32_t *out, int max)
{
    bool bos = (flags & COORD_TOK_ENC_BOS) ||
               ((flags & COORD_TOK_ENC_ADD_SPECIAL) && (t->flags & COORD_TOKF_ADD_BOS));
    bool eos = (flags & COORD_TOK_ENC_EOS) ||
               ((flags & COORD_TOK_ENC_ADD_SPECIAL) && (t->flags & COORD_TOKF_ADD_EOS));
    if (t->type == COORD_TOK_SPM_LLAMA2C && memchr(text, 0, len)) /* run.c takes C strings */
        return -EILSEQ;
    if (len > (SIZE_MAX >> 4) || len > UINT32_MAX / 8)
        return -E2BIG;
    struct ivec ids = {0};
    /* a word cache of up to 2048 words, fewer for a short text */
    struct merger m = {.t = t, .words_mask = map_cap(len / 32 < 1024 ? len / 32 : 1024) - 1};
    m.words = calloc(m.words_mask + 1, sizeof(struct word));
    if (!m.words)
        return -ENOMEM;
    int rc = t->type == COORD_TOK_SPM_LLAMA2C
                 ? encode_llama2c(t, text, len, bos, &m, &ids)
                 : encode_fragments(t, text, len, flags, bos, &m, &ids);
    if (!rc && eos && t->eos_id >= 0)
        rc = ivec_push(&ids, t->eos_id);
    if (!rc && ids.n > (size_t)(max > 0 ? max : 0))
        rc = -ENOSPC;
    if (!rc && ids.n)
        memcpy(out, ids.v, ids.n * sizeof(int32_t));
    if (!rc)
        rc = (int)ids.n;
    free(m.sym);
    free(m.heap.v);
    free(m.words);
    free(ids.v);
    return rc;
}

int coord_tok_encode(const struct coord_tok *t, const char *text, bool bos, bool eos, int32_t *out,
                     int max)
{
    return coord_tok_encode_ex(t, text, strlen(text),
                               (bos ? COORD_TOK_ENC_BOS : 0) | (eos ? COORD_TOK_ENC_EOS : 0), out,
                               max);
}

/* ---- decoding ---- */

const char *coord_tok_decode(const struct coord_tok *t, int prev, int token, size_t *len)
{
    if (token < 0 || token >= t->vocab_size) {
        *len = 0;
        return "";
    }
    if (t->type == COORD_TOK_SPM_LLAMA2C) {
        const char *piece = t->vocab[token];
        if (prev >= 0 && prev == t->bos_id && piece[0] == ' ')
            piece++;
        unsigned char byte;
        if (sscanf(piece, "<0x%02hhX>", &byte) == 1 && strlen(piece) == 6) {
            *len = 1;
            return t->byte_pieces + byte * 2;
        }
        *len = strlen(piece);
        return piece;
    }
    const char *p = t->dec[token];
    size_t n = t->dec_len[token];
    /* the dummy prefix of the first fragment, or of the one after a special token */
    if ((t->flags & COORD_TOKF_SPACE_PREFIX) && !(t->flags & COORD_TOKF_BYTE_LEVEL) && n &&
        p[0] == ' ') {
        bool start = prev < 0 || prev >= t->vocab_size || prev == t->bos_id;
        if (!(t->flags & COORD_TOKF_PREFIX_FIRST) && !start)
            start = is_special(t, prev);
        if (start) {
            p++;
            n--;
        }
    }
    *len = n;
    return p;
}

bool coord_tok_printable(const char *piece, size_t len)
{
    if (len == 0)
        return false;
    if (len == 1) { /* bytes past ASCII are a part of a character: coord_utf8_feed() */
        unsigned char b = (unsigned char)piece[0];
        return b >= 0x80 || isprint(b) || isspace(b);
    }
    return true;
}

/* ---- UTF-8 output ---- */

static const char REPLACEMENT[] = "\xef\xbf\xbd"; /* U+FFFD */

size_t coord_utf8_feed(struct coord_utf8 *u, const char *in, size_t n, char *out)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)in[i];
        if (u->n && !utf8_follows(u->held[0], u->n, c)) { /* cut short: c starts afresh */
            memcpy(out + o, REPLACEMENT, 3);
            o += 3;
            u->n = 0;
        }
        if (u->n) {
            u->held[u->n++] = c;
            if (u->n == u->need) {
                memcpy(out + o, u->held, u->n);
                o += u->n;
                u->n = 0;
            }
            continue;
        }
        size_t need = utf8_need(c);
        if (need == 1) {
            out[o++] = (char)c;
        } else if (need == 0) {
            memcpy(out + o, REPLACEMENT, 3);
            o += 3;
        } else {
            u->held[0] = c;
            u->n = 1;
            u->need = (uint8_t)need;
        }
    }
    return o;
}

size_t coord_utf8_flush(struct coord_utf8 *u, char *out)
{
    if (!u->n)
        return 0;
    u->n = 0;
    memcpy(out, REPLACEMENT, 3);
    return 3;
}
