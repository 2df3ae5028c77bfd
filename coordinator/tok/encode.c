/* SPDX-License-Identifier: MIT */
/* coordinator/tok/encode.c: text to ids: the special-token partition, the regex pre-tokenizer,
 * the merger (SPM by score, BPE by rank, llama2.c's run.c rules) over a word cache, and
 * coord_tok_encode_ex(). */
#include "tok_internal.h"
#include "utf8.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <ctype.h>
#include <errno.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

/* The hash of a word's symbol ids in the word cache (tok_hash_bytes()'s FNV-1a step, a 32-bit id
 * at a time). */
static uint32_t hash_ids(const int32_t *v, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint32_t)v[i]) * 16777619u;
    return h ^ (h >> 15);
}

/* The space of SPM text: U+2581 with COORD_TOKF_ESCAPE_WS (llama.cpp), else ' ' (llama2.c,
 * whose tokenizer.bin has the pieces unescaped); *@w gets its bytes. */
static const char *spm_space(const struct coord_tok *t, size_t *w)
{
    bool esc = t->type == COORD_TOK_SPM && (t->flags & COORD_TOKF_ESCAPE_WS);
    *w = esc ? 3 : 1;
    return esc ? TOK_ESC_WS : " ";
}

/* Whether SPM merging may make piece @id: llama2.c any; llama.cpp (SentencePiece) not a control,
 * unknown, byte or unused one. */
static bool spm_makes(const struct coord_tok *t, int id)
{
    int ty = tok_ttype(t, id);
    return t->type == COORD_TOK_SPM_LLAMA2C ||
           !(ty == COORD_TOKT_CONTROL || ty == COORD_TOKT_UNKNOWN || ty == COORD_TOKT_BYTE ||
             ty == COORD_TOKT_UNUSED);
}

/* Whether every piece that SPM merging can make is spaces then text without a space (see
 * spm_space()), as SentencePiece's split_by_whitespace makes them. Then no merge joins the end
 * of a word to the space that starts the next, and words merge apart. */
bool tok_words_apart(const struct coord_tok *t)
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
        int id = tok_lookup_n(t, m->s + m->sym[l].off, n);
        if (id < 0 || !spm_makes(t, id) || (llama2c && !(t->scores[id] > -1e10f)))
            return 0;
        b.id = id;
        b.prio = t->scores[id];
    } else {
        if (m->sym[l].id < 0 || m->sym[r].id < 0)
            return 0;
        int rank = tok_merge_rank(t, m->sym[l].id, m->sym[r].id);
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
        size_t l = byte_level ? 1 : tok_utf8_len((unsigned char)s[off]);
        if (l > n - off)
            l = n - off;
        struct sym *y = &m->sym[m->n];
        y->off = (uint32_t)off;
        y->len = (uint32_t)l;
        y->prev = m->n - 1;
        y->next = off + l == n ? -1 : m->n + 1;
        y->id = byte_level ? t->byte_ids[(unsigned char)s[off]] : tok_lookup_n(t, s + off, l);
        if (y->id >= 0 && (tok_ttype(t, y->id) == COORD_TOKT_CONTROL ||
                           tok_ttype(t, y->id) == COORD_TOKT_UNKNOWN))
            y->id = -1;
        m->n++;
        off += l;
    }
}

/* The end of the word that starts at @s[a] (a character boundary) in @s[0, n): the next space
 * character that follows one that is not a space, else @n. With t->words_apart no piece can
 * span that point (see tok_words_apart()), so words merge apart; else the text is one word. */
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
        i += space ? w : tok_utf8_len((unsigned char)s[i]);
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
 * before it is neither empty nor all spaces: see tok_words_apart()) merging and emitting the word
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
    if (l) /* an empty piece into a buffer not yet allocated: memcpy's NULL is undefined */
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
    int prefix = len ? tok_lookup(t, " ") : -1;
    if (!rc && prefix >= 0)
        rc = llama2c_push(m, prefix, &buf, &cap, out);
    for (size_t i = 0; i < len && !rc;) {
        size_t l = 1;
        while (l < 4 && i + l < len && ((unsigned char)text[i + l] & 0xC0) == 0x80)
            l++;
        int id = tok_lookup_n(t, text + i, l);
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

/* Where a pre-tokenizer regex runs, for its error message: the fragment's offset in the text,
 * whether a prefix space was put before it, and which of t->re[] runs. */
struct re_where {
    size_t frag_off;
    bool prefix;
    int pattern;
};

/* Splits the valid UTF-8 text @s[off, off + len) by @re into matches and the text between
 * them, in order. */
static int re_split_valid(const struct coord_tok *t, const pcre2_code *re, pcre2_match_data *md,
                          const char *s, size_t off, size_t len, struct svec *out,
                          const struct re_where *w, struct shardlm_err *e)
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
        if (rc == PCRE2_ERROR_NOMEMORY)
            return -ENOMEM;
        if (rc < 0) {
            /* the limits are tokenizer.c's (RE_MATCH_LIMIT, the heap's), against regexes that
             * backtrack without end; the search began at @off + pos of the prepared fragment */
            PCRE2_UCHAR why[120];
            if (pcre2_get_error_message(rc, why, sizeof(why)) < 0)
                snprintf((char *)why, sizeof(why), "error %d", rc);
            size_t at = off + pos, lead = w->prefix ? 1 : 0;
            bool limit = rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_DEPTHLIMIT ||
                         rc == PCRE2_ERROR_HEAPLIMIT;
            return shardlm_fail(e, -EINVAL,
                                "pre-tokenizer regex %d %s searching the text from byte %zu "
                                "(PCRE2: %s)",
                                w->pattern + 1,
                                limit ? "hit PCRE2's limit against runaway backtracking" : "failed",
                                w->frag_off + (at > lead ? at - lead : 0), (const char *)why);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (ms < pos || me < ms || me > len)
            return -EINVAL; /* \K games */
        if (me == ms) { /* an empty match: no piece, move on by a character */
            pos = ms + tok_utf8_len((unsigned char)sub[ms]);
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
                    const char *s, size_t off, size_t len, struct svec *out,
                    const struct re_where *w, struct shardlm_err *e)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = off, end = off + len;
    while (i < end) {
        size_t a = i, l;
        while (i < end && (l = coord_utf8_char(u + i, end - i)))
            i += l;
        int rc;
        if (i > a && (rc = re_split_valid(t, re, md, s, a, i - a, out, w, e)))
            return rc;
        a = i;
        while (i < end && !coord_utf8_char(u + i, end - i))
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
        int ty = tok_ttype(t, id);
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

/* Writes @s[0, n) to @work, after a ' ' when @prefix, each ' ' as U+2581 with
 * COORD_TOKF_ESCAPE_WS. Returns its bytes (at most 3 * (n + 1)). */
static size_t prepare_text(const struct coord_tok *t, const char *s, size_t n, bool prefix,
                           char *work)
{
    size_t k = 0;
    if (prefix)
        work[k++] = ' ';
    memcpy(work + k, s, n);
    k += n;
    if (!(t->flags & COORD_TOKF_ESCAPE_WS))
        return k;
    size_t sp = 0; /* in place, from the end: each ' ' takes 3 bytes */
    for (size_t i = 0; i < k; i++)
        sp += work[i] == ' ';
    size_t o = k + 2 * sp;
    for (size_t i = k; i-- > 0;) {
        if (work[i] == ' ') {
            o -= 3;
            memcpy(work + o, TOK_ESC_WS, 3);
        } else {
            work[--o] = work[i];
        }
    }
    return k + 2 * sp;
}

/* SPM (llama.cpp llm_tokenizer_spm_session) on one text fragment. */
static int encode_spm(const struct coord_tok *t, struct merger *m, const char *s, size_t n,
                      bool prefix, char *work, struct ivec *out)
{
    size_t k = prepare_text(t, s, n, prefix, work);
    return merge_text(m, work, k, false, out);
}

/* Splits @work[0, k) into the pre-tokens of t->re[] applied in turn, into *@words (*@next: the
 * other buffer, swapped). Returns 0 or -errno. */
static int pre_tokenize(const struct coord_tok *t, pcre2_match_data *md, const char *work, size_t k,
                        struct svec *words, struct svec *next, struct re_where *w,
                        struct shardlm_err *e)
{
    int rc;
    words->n = 0;
    if (k && (rc = svec_push(words, 0, k)))
        return rc;
    for (int p = 0; p < t->n_patterns; p++) {
        next->n = 0;
        w->pattern = p;
        for (size_t i = 0; i < words->n; i++)
            if ((rc =
                     re_split(t, t->re[p], md, work, words->v[i].off, words->v[i].len, next, w, e)))
                return rc;
        struct svec tmp = *words;
        *words = *next;
        *next = tmp;
    }
    return 0;
}

/* COORD_TOKF_IGNORE_MERGES: the id of pre-token @ws[0, wl) when it is a piece (its GPT-2
 * characters, written at @enc, when @bl), else -1. */
static int whole_word(const struct coord_tok *t, const char *ws, size_t wl, bool bl, char *enc)
{
    if (!bl)
        return tok_lookup_n(t, ws, wl);
    size_t el = 0;
    for (size_t i = 0; i < wl; i++)
        el += coord_utf8_put(enc + el, tok_gpt2_cp((unsigned char)ws[i]));
    return tok_lookup_n(t, enc, el);
}

/* BPE (llama.cpp llm_tokenizer_bpe_session) on one text fragment. */
static int encode_bpe(const struct coord_tok *t, struct merger *m, const char *s, size_t n,
                      size_t s_off, bool prefix, char *work, pcre2_match_data *md,
                      struct svec *words, struct svec *next, struct ivec *out,
                      struct shardlm_err *e)
{
    bool bl = t->flags & COORD_TOKF_BYTE_LEVEL;
    struct re_where w = {.frag_off = s_off, .prefix = prefix && !(bl && n && s[0] == ' ')};
    size_t k = prepare_text(t, s, n, w.prefix, work);
    int rc;
    if ((rc = pre_tokenize(t, md, work, k, words, next, &w, e)))
        return rc;
    char *enc = work + k; /* room for a byte-level word: 2 bytes per byte */
    for (size_t w = 0; w < words->n; w++) {
        const char *ws = work + words->v[w].off;
        size_t wl = words->v[w].len;
        int id = t->flags & COORD_TOKF_IGNORE_MERGES ? whole_word(t, ws, wl, bl, enc) : -1;
        if (id >= 0) {
            if (ivec_push(out, id))
                return -ENOMEM;
            continue;
        }
        if ((rc = merge_text(m, ws, wl, bl, out)))
            return rc;
    }
    return 0;
}

/* The NFC form of fragment @s (@n bytes) in a malloc'd *@out of *@outn bytes (at most 3 * @n:
 * Unicode's bound), for a tokenizer whose normalizer is NFC (Hugging Face applies it to each
 * fragment between added tokens). *@out is NULL where the text is unchanged: ASCII, already in
 * NFC, or not UTF-8 (left as it is). Returns 0 or -ENOMEM. */
static int nfc(const char *s, size_t n, char **out, size_t *outn)
{
    size_t i = 0;
    *out = NULL;
    while (i < n && !(s[i] & 0x80))
        i++;
    if (i == n || n > INT32_MAX / 3)
        return 0;
    UErrorCode err = U_ZERO_ERROR;
    const UNormalizer2 *nf = unorm2_getNFCInstance(&err);
    int32_t ulen = 0, dlen = 0, blen = 0;
    UChar *u = malloc((n + 1) * sizeof(UChar)), *d = NULL;
    int rc = -ENOMEM;
    if (U_FAILURE(err) || !u)
        goto out;
    rc = 0;
    u_strFromUTF8(u, (int32_t)n + 1, &ulen, s, (int32_t)n, &err);
    if (U_FAILURE(err) || unorm2_quickCheck(nf, u, ulen, &err) == UNORM_YES || U_FAILURE(err))
        goto out;
    d = malloc((3 * (size_t)ulen + 1) * sizeof(UChar));
    *out = malloc(3 * n + 1);
    if (!d || !*out) {
        rc = -ENOMEM;
        goto out_free;
    }
    dlen = unorm2_normalize(nf, u, ulen, d, 3 * ulen + 1, &err);
    if (!U_FAILURE(err))
        u_strToUTF8(*out, (int32_t)(3 * n + 1), &blen, d, dlen, &err);
    if (U_FAILURE(err) || (size_t)blen > 3 * n)
        goto out_free; /* (not expected: the text as it is) */
    *outn = (size_t)blen;
    goto out;
out_free:
    free(*out);
    *out = NULL;
out:
    free(d);
    free(u);
    return rc;
}

/* llama.cpp llama_tokenize_impl(): BOS, then the fragments between special tokens each
 * encoded, the special tokens as they are, into @out. Returns 0 or -errno. */
static int encode_fragments(const struct coord_tok *t, const char *text, size_t len, unsigned flags,
                            bool bos, struct merger *m, struct ivec *out, struct shardlm_err *e)
{
    struct fvec fr = {0};
    struct svec words = {0}, next = {0};
    pcre2_match_data *md = NULL;
    /* work: prefix + text escaped (3 bytes a character at most), then a byte-level word (2);
     * NFC may make a text 3 times longer */
    size_t cap = t->flags & COORD_TOKF_NFC ? len * 3 : len;
    char *work = malloc(cap * 9 + 17);
    m->sym = malloc((cap * 3 + 4) * sizeof(struct sym));
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
        const char *fs = text + f.off;
        size_t fn = f.len;
        char *norm = NULL;
        if ((t->flags & COORD_TOKF_NFC) && (rc = nfc(fs, fn, &norm, &fn)))
            break;
        if (norm)
            fs = norm;
        if (t->type == COORD_TOK_SPM)
            rc = encode_spm(t, m, fs, fn, prefix, work, out);
        else
            rc = encode_bpe(t, m, fs, fn, f.off, prefix, work, md, &words, &next, out, e);
        free(norm);
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

int coord_tok_encode_err(const struct coord_tok *t, const char *text, size_t len, unsigned flags,
                         int32_t *out, int max, struct shardlm_err *e)
{
    bool bos = (flags & COORD_TOK_ENC_BOS) ||
               ((flags & COORD_TOK_ENC_ADD_SPECIAL) && (t->flags & COORD_TOKF_ADD_BOS));
    bool eos = (flags & COORD_TOK_ENC_EOS) ||
               ((flags & COORD_TOK_ENC_ADD_SPECIAL) && (t->flags & COORD_TOKF_ADD_EOS));
    e->msg[0] = 0;
    if (t->type == COORD_TOK_SPM_LLAMA2C && memchr(text, 0, len)) /* run.c takes C strings */
        return shardlm_fail(e, -EILSEQ, "a NUL byte, which a llama2.c tokenizer cannot take");
    if (len > (SIZE_MAX >> 4) || len > UINT32_MAX / 8)
        return shardlm_fail(e, -E2BIG, "%zu bytes of text, more than a tokenizer call takes", len);
    struct ivec ids = {0};
    /* a word cache of up to 2048 words, fewer for a short text */
    struct merger m = {.t = t, .words_mask = tok_map_cap(len / 32 < 1024 ? len / 32 : 1024) - 1};
    m.words = calloc(m.words_mask + 1, sizeof(struct word));
    if (!m.words)
        return -ENOMEM;
    int rc = t->type == COORD_TOK_SPM_LLAMA2C
                 ? encode_llama2c(t, text, len, bos, &m, &ids)
                 : encode_fragments(t, text, len, flags, bos, &m, &ids, e);
    if (!rc && eos && t->eos_id >= 0)
        rc = ivec_push(&ids, t->eos_id);
    if (!rc && ids.n > (size_t)(max > 0 ? max : 0))
        rc = -ENOSPC;
    if (!rc && ids.n)
        memcpy(out, ids.v, ids.n * sizeof(int32_t));
    if (!rc)
        rc = (int)ids.n;
    if (rc < 0 && !e->msg[0])
        shardlm_fail(e, rc, "%s",
                     rc == -EILSEQ   ? "a character this vocabulary cannot spell"
                     : rc == -ENOSPC ? "more tokens than there is room for"
                                     : strerror(-rc));
    free(m.sym);
    free(m.heap.v);
    free(m.words);
    free(ids.v);
    return rc;
}

int coord_tok_encode_ex(const struct coord_tok *t, const char *text, size_t len, unsigned flags,
                        int32_t *out, int max)
{
    struct shardlm_err e;
    return coord_tok_encode_err(t, text, len, flags, out, max, &e);
}

int coord_tok_encode(const struct coord_tok *t, const char *text, bool bos, bool eos, int32_t *out,
                     int max)
{
    return coord_tok_encode_ex(t, text, strlen(text),
                               (bos ? COORD_TOK_ENC_BOS : 0) | (eos ? COORD_TOK_ENC_EOS : 0), out,
                               max);
}

