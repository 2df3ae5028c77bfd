/* SPDX-License-Identifier: MIT */
/* coordinator/grammar/matcher.c: the vocabulary's trie, one sequence's state, the mask of the
 * tokens allowed next and the commit of a token.
 *
 * A sequence is at a lexer state q (inside the lexeme being read; "consumed": some of its bytes
 * are read) over the parser's stack of rows. A byte b moves q to q' = step(q, b); where q' is dead
 * and q is the end of some lexemes, those lexemes end (the row after them is pushed) and b starts
 * the next lexeme from that row's start state. The mask walks the trie with the same rule: a
 * subtree is cut as soon as its prefix is refused, and the row after a lexeme is pushed once for
 * all the children of a node that need it. */
#include "gr_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "utf8.h"

#define GR_PLAIN_MAX 64

/* 12 bytes: a long walk reads the whole trie (Llama 3's: 267k nodes), so its size is its time */
struct gr_tnode {
    uint32_t end;     /* one past this node's subtree (preorder) */
    uint32_t tok_beg; /* its tokens in gr_trie.toks, and its subtree's first; one past the
                       * subtree's last is nodes[end].tok_beg (node n_nodes: a sentinel) */
    uint16_t tok_n;
    uint8_t byte;
    uint8_t np_below : 1; /* a token that is not plain (see gr_vocab) is in its subtree */
    uint8_t np_here : 1;  /* ... its own tokens are not plain (all alike: the same bytes) */
};

/* Tokens as a trie in preorder: node 0 is the root; a node's children follow it. */
struct gr_trie {
    struct gr_tnode *nodes;
    uint32_t n_nodes;
    int32_t *toks; /* token ids, ordered by their bytes */
};

struct gr_vocab {
    int n;
    int eos;
    uint32_t max_len;    /* bytes of the longest token */
    struct gr_trie full; /* every token with bytes */
    /* "plain" tokens: at most GR_PLAIN_MAX whole UTF-8 characters, none of them '"', '\\' or
     * below U+0020 - what a JSON string holds as it is. From a lexer state where every plain
     * character goes to one next state, and from that one..., a token of k plain characters
     * takes k such steps whatever its characters: the plain tokens of at most K characters
     * (plain_upto[K]) are all taken when K steps are; only the others (the np trie) need
     * walking there. */
    uint32_t *plain_upto[GR_PLAIN_MAX + 1];
    long n_upto[GR_PLAIN_MAX + 1];
    struct gr_trie np;
    /* the plain tokens below the big nodes of the full trie, as masks: where plain characters
     * keep the lexer's state, a walk takes them with one OR instead of one bit per token. A node
     * is big with at least sub_min plain tokens below it and a prefix of whole plain characters.
     * sub_of[node]: its mask + 1, 0: none. */
    uint16_t *sub_of;
    uint32_t *sub_bits; /* (n_sub x gr_mask_words) */
    uint32_t *sub_n;    /* the tokens of each */
    char *arena;   /* the tokens' bytes: token t is arena[off[t] .. off[t + 1]) (none: empty) */
    uint64_t *off; /* (n + 1) */
};

struct walk_frame {
    uint32_t end, next;
    int32_t q;
};

/* Boundaries met by a walk. */
struct bnds {
    struct gr_bnd *b;
    int n, cap;
};

struct gr_matcher {
    struct gr_grammar *g;
    const struct gr_vocab *v;
    struct gr_parser p;
    struct walk_frame *st; /* the mask's walk's stack (the longest token's bytes + 1) */
    struct bnds *lv; /* the boundaries of the mask's walks (the longest token's bytes + 2): [0]
                      * from the sequence's state, [d] below a boundary resolved d deep */
    int32_t q;     /* lexer state */
    bool consumed; /* bytes of the present lexeme were read */
    bool done;     /* EOS committed */
};

/* ---- vocabulary ---- */

struct tok_ref {
    const uint8_t *b;
    uint32_t n;
    int32_t id;
};

static int cmp_tok(const void *a, const void *b)
{
    const struct tok_ref *x = a, *y = b;
    uint32_t n = x->n < y->n ? x->n : y->n;
    int c = memcmp(x->b, y->b, n);
    if (c)
        return c;
    if (x->n != y->n)
        return x->n < y->n ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static int plain_chars(const uint8_t *b, uint32_t n);

/* The trie of the @k tokens @t (sorted by cmp_tok, @total bytes). Returns 0 or -ENOMEM. */
static int trie_build(struct gr_trie *tr, const struct tok_ref *t, int k, long total)
{
    tr->nodes = malloc(sizeof(*tr->nodes) * (size_t)(total + 2)); /* + the sentinel */
    tr->toks = malloc(sizeof(int32_t) * (size_t)(k ? k : 1));
    uint32_t *path = malloc(sizeof(uint32_t) * (size_t)(total + 1)); /* node at each depth */
    if (!tr->nodes || !tr->toks || !path) {
        free(path);
        return -ENOMEM;
    }
    tr->nodes[0] = (struct gr_tnode){0};
    tr->n_nodes = 1;
    path[0] = 0;
    uint32_t depth = 0; /* nodes open on the path below the root */
    const struct tok_ref *prev = NULL;
    for (int i = 0; i < k; i++) {
        const struct tok_ref *r = &t[i];
        uint32_t common = 0;
        if (prev)
            while (common < prev->n && common < r->n && prev->b[common] == r->b[common])
                common++;
        while (depth > common) /* close the nodes past the shared prefix */
            tr->nodes[path[depth--]].end = tr->n_nodes;
        for (uint32_t d = common; d < r->n; d++) {
            uint32_t id = tr->n_nodes++;
            tr->nodes[id] = (struct gr_tnode){.byte = r->b[d], .tok_beg = (uint32_t)i};
            path[++depth] = id;
        }
        struct gr_tnode *node = &tr->nodes[path[depth]];
        if (!node->tok_n)
            node->tok_beg = (uint32_t)i;
        node->tok_n++;
        tr->toks[i] = r->id;
        if (plain_chars(r->b, r->n) < 0) {
            node->np_here = true;
            for (uint32_t d = 1; d <= depth; d++)
                tr->nodes[path[d]].np_below = true;
        }
        prev = r;
    }
    while (depth > 0)
        tr->nodes[path[depth--]].end = tr->n_nodes;
    tr->nodes[0].end = tr->n_nodes;
    tr->nodes[tr->n_nodes] = (struct gr_tnode){.tok_beg = (uint32_t)k}; /* the sentinel */
    free(path);
    return 0;
}

/* The characters of a plain token (see gr_vocab), or -1. */
static int plain_chars(const uint8_t *b, uint32_t n)
{
    int k = 0;
    for (uint32_t i = 0; i < n; k++) {
        size_t l = coord_utf8_char(b + i, n - i);
        if (!l || (l == 1 && (b[i] < 0x20 || b[i] == '"' || b[i] == '\\')) || k >= GR_PLAIN_MAX)
            return -1;
        i += (uint32_t)l;
    }
    return k;
}

/* The masks of the big nodes (see gr_vocab) of @v's full trie. Returns 0 or -ENOMEM. */
static int sub_masks(struct gr_vocab *v)
{
    const struct gr_trie *tr = &v->full;
    uint32_t nn = tr->n_nodes, nt = tr->nodes[nn].tok_beg;
    int words = gr_mask_words(v);
    /* a vocabulary's size over 256 (Llama 3's 128k: ~70 nodes), at least 256 tokens */
    long sub_min = v->n / 256 > 256 ? v->n / 256 : 256;
    uint32_t *plain_before = malloc(sizeof(uint32_t) * ((size_t)nt + 1)); /* in trie order */
    uint32_t *ends = malloc(sizeof(uint32_t) * ((size_t)v->max_len + 2));
    v->sub_of = calloc(nn + 1, sizeof(uint16_t));
    int rc = -ENOMEM;
    if (!plain_before || !ends || !v->sub_of)
        goto out;
    plain_before[0] = 0;
    for (uint32_t i = 0; i < nt; i++) {
        int32_t id = tr->toks[i];
        uint32_t len = (uint32_t)(v->off[id + 1] - v->off[id]);
        plain_before[i + 1] =
            plain_before[i] + (plain_chars((uint8_t *)v->arena + v->off[id], len) > 0);
    }
    int sp = 0, n_sub = 0;
    for (uint32_t c = 1; c < nn; c++) { /* preorder: a node's depth from its open ancestors */
        while (sp && ends[sp - 1] <= c)
            sp--;
        uint32_t depth = (uint32_t)sp + 1;
        ends[sp++] = tr->nodes[c].end;
        const struct gr_tnode *nd = &tr->nodes[c];
        uint32_t first = tr->toks[nd->tok_beg];
        uint32_t below = plain_before[tr->nodes[nd->end].tok_beg] - plain_before[nd->tok_beg];
        if (below >= sub_min && n_sub < UINT16_MAX &&
            plain_chars((uint8_t *)v->arena + v->off[first], depth) > 0)
            v->sub_of[c] = (uint16_t)++n_sub;
    }
    v->sub_bits = calloc((size_t)n_sub * (size_t)words + 1, sizeof(uint32_t));
    v->sub_n = calloc((size_t)n_sub + 1, sizeof(uint32_t));
    if (!v->sub_bits || !v->sub_n)
        goto out;
    for (uint32_t c = 1; c < nn; c++) {
        if (!v->sub_of[c])
            continue;
        uint32_t *bits = v->sub_bits + (size_t)(v->sub_of[c] - 1) * (size_t)words;
        const struct gr_tnode *nd = &tr->nodes[c];
        for (uint32_t i = nd->tok_beg; i < tr->nodes[nd->end].tok_beg; i++)
            if (plain_before[i + 1] > plain_before[i])
                bits[tr->toks[i] >> 5] |= 1u << (tr->toks[i] & 31);
        v->sub_n[v->sub_of[c] - 1] =
            plain_before[tr->nodes[nd->end].tok_beg] - plain_before[nd->tok_beg];
    }
    rc = 0;
out:
    free(plain_before);
    free(ends);
    return rc;
}

int gr_vocab_new(int n, const char *const *bytes, const uint32_t *lens, int eos,
                 struct gr_vocab **out, struct shardlm_err *e)
{
    if (n <= 0 || eos >= n)
        return shardlm_fail(e, -EINVAL, "grammar: a vocabulary of %d tokens with EOS %d", n, eos);
    struct gr_vocab *v = calloc(1, sizeof(*v));
    struct tok_ref *t = malloc(sizeof(*t) * (size_t)n);
    struct tok_ref *np = malloc(sizeof(*np) * (size_t)n);
    long total = 1, np_total = 1;
    int k = 0, k_np = 0;
    if (!v || !t || !np)
        goto oom;
    for (int k = 0; k <= GR_PLAIN_MAX; k++)
        if (!(v->plain_upto[k] = calloc((size_t)(n + 31) / 32, sizeof(uint32_t))))
            goto oom;
    for (int i = 0; i < n; i++)
        if (bytes[i] && lens[i] && i != eos) {
            struct tok_ref r = {(const uint8_t *)bytes[i], lens[i], i};
            t[k++] = r;
            total += lens[i];
            if (lens[i] > v->max_len)
                v->max_len = lens[i];
            int pc = plain_chars(r.b, r.n);
            if (pc > 0) {
                for (int j = pc; j <= GR_PLAIN_MAX; j++) {
                    v->plain_upto[j][i >> 5] |= 1u << (i & 31);
                    v->n_upto[j]++;
                }
            } else {
                np[k_np++] = r;
                np_total += lens[i];
            }
        }
    qsort(t, (size_t)k, sizeof(*t), cmp_tok);
    qsort(np, (size_t)k_np, sizeof(*np), cmp_tok);
    v->n = n;
    v->eos = eos;
    v->arena = malloc((size_t)total);
    v->off = malloc(sizeof(uint64_t) * ((size_t)n + 1));
    if (!v->arena || !v->off || trie_build(&v->full, t, k, total) ||
        trie_build(&v->np, np, k_np, np_total))
        goto oom;
    v->off[0] = 0;
    for (int i = 0; i < n; i++) {
        bool kept = bytes[i] && lens[i] && i != eos;
        if (kept)
            memcpy(v->arena + v->off[i], bytes[i], lens[i]);
        v->off[i + 1] = v->off[i] + (kept ? lens[i] : 0);
    }
    if (sub_masks(v))
        goto oom;
    free(t);
    free(np);
    *out = v;
    return 0;
oom:
    free(t);
    free(np);
    gr_vocab_free(v);
    return shardlm_fail(e, -ENOMEM, "grammar: out of memory for the vocabulary's trie");
}

void gr_vocab_free(struct gr_vocab *v)
{
    if (!v)
        return;
    free(v->full.nodes);
    free(v->full.toks);
    free(v->np.nodes);
    free(v->np.toks);
    for (int k = 0; k <= GR_PLAIN_MAX; k++)
        free(v->plain_upto[k]);
    free(v->arena);
    free(v->off);
    free(v->sub_of);
    free(v->sub_bits);
    free(v->sub_n);
    free(v);
}

int gr_vocab_size(const struct gr_vocab *v) { return v->n; }

int gr_mask_words(const struct gr_vocab *v) { return (v->n + 31) / 32; }

/* ---- matcher ---- */

int gr_matcher_new(struct gr_grammar *g, const struct gr_vocab *v, struct gr_matcher **out,
                   struct shardlm_err *e)
{
    struct gr_matcher *m = calloc(1, sizeof(*m));
    if (!m)
        return shardlm_fail(e, -ENOMEM, "grammar: out of memory");
    m->g = g;
    m->v = v;
    m->st = malloc(sizeof(*m->st) * ((size_t)v->max_len + 1));
    m->lv = calloc((size_t)v->max_len + 2, sizeof(*m->lv));
    if (!m->st || !m->lv) {
        free(m->st);
        free(m->lv);
        free(m);
        return shardlm_fail(e, -ENOMEM, "grammar: out of memory");
    }
    int rc = gr_parser_init(&m->p, g, e);
    if (rc) {
        free(m->st);
        free(m->lv);
        free(m);
        return rc;
    }
    m->q = m->p.rows[0].lex_start;
    *out = m;
    return 0;
}

int gr_matcher_clone(const struct gr_matcher *m, struct gr_matcher **out, struct shardlm_err *e)
{
    struct gr_matcher *c = calloc(1, sizeof(*c));
    if (!c)
        return shardlm_fail(e, -ENOMEM, "grammar: out of memory");
    *c = *m;
    memset(&c->p, 0, sizeof(c->p));
    c->st = malloc(sizeof(*c->st) * ((size_t)m->v->max_len + 1));
    c->lv = calloc((size_t)m->v->max_len + 2, sizeof(*c->lv));
    c->p.max_items = m->p.max_items;
    c->p.items = malloc(sizeof(*c->p.items) * (size_t)(m->p.n_items ? m->p.n_items : 1));
    c->p.rows = malloc(sizeof(*c->p.rows) * (size_t)m->p.n_rows);
    c->p.ix = malloc(sizeof(*c->p.ix) * (size_t)(m->p.n_ix ? m->p.n_ix : 1));
    if (!c->st || !c->lv || !c->p.items || !c->p.rows || !c->p.ix) {
        gr_matcher_free(c);
        return shardlm_fail(e, -ENOMEM, "grammar: out of memory");
    }
    memcpy(c->p.items, m->p.items, sizeof(*c->p.items) * (size_t)m->p.n_items);
    memcpy(c->p.rows, m->p.rows, sizeof(*c->p.rows) * (size_t)m->p.n_rows);
    if (m->p.n_ix)
        memcpy(c->p.ix, m->p.ix, sizeof(*c->p.ix) * (size_t)m->p.n_ix);
    c->p.n_ix = c->p.cap_ix = m->p.n_ix;
    c->p.n_items = c->p.cap_items = m->p.n_items;
    c->p.n_rows = c->p.cap_rows = m->p.n_rows;
    *out = c;
    return 0;
}

void gr_matcher_free(struct gr_matcher *m)
{
    if (!m)
        return;
    gr_parser_free(&m->p);
    free(m->st);
    for (uint32_t d = 0; m->lv && d < m->v->max_len + 2; d++)
        free(m->lv[d].b);
    free(m->lv);
    free(m);
}

static int32_t top_start(const struct gr_matcher *m)
{
    return m->p.rows[m->p.n_rows - 1].lex_start;
}

/* Ends the lexeme read to @q: pushes the row after it. 1: pushed; 0: it cannot end there. */
static int end_lexeme(struct gr_matcher *m, int32_t q)
{
    const struct gr_dstate *d = &m->g->lex.ds[q];
    if (!d->n_acc)
        return 0;
    int rc = gr_parser_push(&m->p, m->g, d->acc, d->n_acc);
    return rc < 0 ? 0 : rc;
}

/* Whether the text so far may end here. */
static bool can_end(struct gr_matcher *m)
{
    if (!m->consumed)
        return m->p.rows[m->p.n_rows - 1].accepting;
    if (!end_lexeme(m, m->q))
        return false;
    bool ok = m->p.rows[m->p.n_rows - 1].accepting;
    gr_parser_pop(&m->p);
    return ok;
}

bool gr_matcher_accepting(struct gr_matcher *m) { return !m->done && can_end(m); }

bool gr_matcher_done(const struct gr_matcher *m) { return m->done; }

/* Takes byte @b. Returns false (state possibly changed: the caller restores it) if refused. */
static bool step_byte(struct gr_matcher *m, uint8_t b)
{
    struct gr_lexer *l = &m->g->lex;
    if (m->q >= 0) {
        int32_t q2 = gr_lexer_step(l, m->q, b);
        if (q2 >= 0) {
            m->q = q2;
            m->consumed = true;
            return true;
        }
    }
    if (!m->consumed || m->q < 0 || !end_lexeme(m, m->q))
        return false;
    int32_t s = top_start(m);
    if (s < 0)
        return false;
    int32_t q2 = gr_lexer_step(l, s, b);
    if (q2 < 0)
        return false;
    m->q = q2;
    return true;
}

bool gr_matcher_commit_bytes(struct gr_matcher *m, const char *s, size_t n)
{
    if (m->done)
        return false;
    int rows = m->p.n_rows;
    int32_t q = m->q;
    bool consumed = m->consumed;
    for (size_t i = 0; i < n; i++)
        if (!step_byte(m, (uint8_t)s[i])) {
            while (m->p.n_rows > rows)
                gr_parser_pop(&m->p);
            m->q = q;
            m->consumed = consumed;
            return false;
        }
    return true;
}

bool gr_matcher_commit(struct gr_matcher *m, int t)
{
    const struct gr_vocab *v = m->v;
    if (m->done || t < 0 || t >= v->n)
        return false;
    if (t == v->eos) {
        if (!can_end(m))
            return false;
        m->done = true;
        return true;
    }
    if (v->off[t + 1] == v->off[t]) /* special or unused: never in a grammar */
        return false;
    return gr_matcher_commit_bytes(m, v->arena + v->off[t], (size_t)(v->off[t + 1] - v->off[t]));
}

/* ---- the mask ---- */

/* Walks past this many trie nodes are kept per lexer state: below it, walking is cheaper than
 * the copy of a kept mask. */
#define GR_MC_MIN_NODES 4096

struct walk {
    struct gr_matcher *m;
    const struct gr_trie *t; /* the trie walked: the vocabulary's full one or its np one */
    uint32_t *mask;
    long count;
    long nodes;
    bool oom;
};

/* dst |= src over @n words, 4 at a time. */
static void or_words(uint32_t *restrict dst, const uint32_t *restrict src, int n)
{
    typedef uint32_t v4 __attribute__((vector_size(16)));
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        v4 a, b;
        memcpy(&a, dst + i, sizeof(a));
        memcpy(&b, src + i, sizeof(b));
        a |= b;
        memcpy(dst + i, &a, sizeof(a));
    }
    for (; i < n; i++)
        dst[i] |= src[i];
}

/* Every token of the subtree of @nd. */
static void allow_all(struct walk *w, const struct gr_tnode *nd)
{
    const int32_t *toks = w->t->toks;
    uint32_t sub_end = w->t->nodes[nd->end].tok_beg;
    for (uint32_t i = nd->tok_beg; i < sub_end; i++) {
        int32_t t = toks[i];
        w->mask[t >> 5] |= 1u << (t & 31);
    }
    w->count += sub_end - nd->tok_beg;
}

static void allow(struct walk *w, const struct gr_tnode *nd)
{
    const int32_t *toks = w->t->toks;
    for (uint32_t i = 0; i < nd->tok_n; i++) {
        int32_t t = toks[nd->tok_beg + i];
        w->mask[t >> 5] |= 1u << (t & 31);
    }
    w->count += nd->tok_n;
}

/* The subtree below node @node, reached at lexer state @q0, without ending the lexeme: tokens
 * read inside it go to the mask, the nodes where it would have to end to @out (marked root
 * directly below the trie's root when @top: the walk from the sequence's state). Iterative: from
 * the root this is the long walk. */
static void walk_below(struct walk *w, uint32_t node, int32_t q0, bool top, struct bnds *out)
{
    struct gr_lexer *l = &w->m->g->lex;
    const struct gr_vocab *v = w->m->v;
    const struct gr_tnode *nodes = w->t->nodes;
    const uint16_t *sub_of = w->t == &v->full ? v->sub_of : NULL;
    int words = gr_mask_words(v);
    struct walk_frame *st = w->m->st;
    int sp = 0;
    int cov = -1; /* from this depth down the plain tokens are in the mask already (a big node's
                   * mask went in above): the subtrees of plain tokens only are skipped */
    uint32_t c = node + 1, end = nodes[node].end;
    int32_t q = q0;
    long visited = 0;
    for (;;) {
        while (c < end) {
            const struct gr_tnode *nd = &nodes[c];
            if (cov >= 0 && !nd->np_below) {
                c = nd->end;
                continue;
            }
            visited++;
            int32_t q2 = gr_lexer_row(l, q)[nd->byte];
            if (q2 == GR_UNSET)
                q2 = gr_lexer_step_slow(l, q, nd->byte);
            if (q2 < 0) {
                if (l->ds[q].n_acc &&
                    GR_PUSH(out->b, out->n, out->cap, ((struct gr_bnd){c, q, top && sp == 0})))
                    w->oom = true;
                c = nd->end;
                continue;
            }
            uint16_t sub = sub_of && cov < 0 ? sub_of[c] : 0;
            /* whether plain text keeps the lexeme alive from q2, the prefix being whole
             * characters: then every plain token below is taken */
            bool keeps =
                (!nd->np_below || sub) && (nd->tok_n || (nodes[c + 1].byte & 0xC0) != 0x80) &&
                (l->ds[q2].keeps > 0 || (l->ds[q2].keeps < 0 && gr_lexer_keeps_plain(l, q2)));
            if (keeps && sub) { /* (its plain tokens: none in the mask yet) */
                or_words(w->mask, v->sub_bits + (size_t)(sub - 1) * (size_t)words, words);
                w->count += v->sub_n[sub - 1];
                if (!nd->np_below) {
                    c = nd->end;
                    continue;
                }
            } else if (keeps) {
                allow_all(w, nd);
                c = nd->end;
                continue;
            }
            if (nd->tok_n && (nd->np_here || (cov < 0 && !keeps)))
                allow(w, nd);      /* (a plain one below a big node's mask is in it already) */
            if (nd->end > c + 1) { /* depth < max_len: st is deep enough */
                st[sp++] = (struct walk_frame){end, nd->end, q};
                if (keeps)
                    cov = sp;
                end = nd->end;
                q = q2;
                c++;
                continue;
            }
            c = nd->end;
        }
        if (!sp)
            break;
        sp--;
        if (sp < cov)
            cov = -1;
        end = st[sp].end;
        c = st[sp].next;
        q = st[sp].q;
    }
    w->nodes += visited;
}

static int cmp_bnd(const void *a, const void *b)
{
    const struct gr_bnd *x = a, *y = b;
    if (x->qp != y->qp)
        return (x->qp > y->qp) - (x->qp < y->qp);
    return (x->node > y->node) - (x->node < y->node);
}

/* Groups the boundaries @bl by their state qp (nodes stay in preorder within a group): a
 * counting sort over the distinct states, O(n), where a state's long walk may meet a boundary
 * at most of the trie's nodes (the groups in the order their states were first met); a sort
 * when they are few, or the states too many for its table. Returns 0 or -ENOMEM. */
static int group_bnd(struct bnds *bl)
{
    enum { SLOTS = 1024, MAX_KEYS = SLOTS / 2, FEW = 32 };
    if (bl->n <= FEW) { /* an insertion sort */
        for (int i = 1; i < bl->n; i++) {
            struct gr_bnd x = bl->b[i];
            int j = i;
            for (; j > 0 && cmp_bnd(&bl->b[j - 1], &x) > 0; j--)
                bl->b[j] = bl->b[j - 1];
            bl->b[j] = x;
        }
        return 0;
    }
    int32_t key[SLOTS];
    int slot_of[SLOTS], n_keys = 0;
    long count[MAX_KEYS] = {0};
    for (int i = 0; i < SLOTS; i++)
        key[i] = GR_UNSET;
    int *which = malloc(sizeof(int) * (size_t)bl->n);
    struct gr_bnd *out = malloc(sizeof(*out) * (size_t)bl->n);
    if (!which || !out) {
        free(which);
        free(out);
        return -ENOMEM;
    }
    for (int i = 0; i < bl->n; i++) {
        uint32_t h = ((uint32_t)bl->b[i].qp * 0x9E3779B1u) >> 22; /* (SLOTS = 2^10) */
        while (key[h] != GR_UNSET && key[h] != bl->b[i].qp)
            h = (h + 1) & (SLOTS - 1);
        if (key[h] == GR_UNSET) {
            if (n_keys == MAX_KEYS) { /* many states: sorted instead */
                free(which);
                free(out);
                qsort(bl->b, (size_t)bl->n, sizeof(*bl->b), cmp_bnd);
                return 0;
            }
            key[h] = bl->b[i].qp;
            slot_of[h] = n_keys++;
        }
        which[i] = slot_of[h];
        count[which[i]]++;
    }
    long at = 0;
    for (int k = 0; k < n_keys; k++) {
        long c = count[k];
        count[k] = at;
        at += c;
    }
    for (int i = 0; i < bl->n; i++)
        out[count[which[i]]++] = bl->b[i];
    free(which);
    free(bl->b);
    bl->b = out;
    bl->cap = bl->n;
    return 0;
}

static void resolve(struct walk *w, const struct gr_bnd *b, int n, int depth);

/* Node @c, reached at lexer state @q2 inside a lexeme: its tokens and its subtree's, lexemes
 * ending below it where the parser allows (@depth: lexemes ended within the token so far). */
static void visit(struct walk *w, uint32_t c, int32_t q2, int depth)
{
    const struct gr_tnode *nd = &w->t->nodes[c];
    if (nd->tok_n)
        allow(w, nd);
    if (nd->end == c + 1)
        return;
    struct bnds *b = &w->m->lv[depth]; /* (depth <= the node's depth < max_len + 2) */
    b->n = 0;
    walk_below(w, c, q2, false, b);
    if (b->n && group_bnd(b))
        w->oom = true;
    else if (b->n)
        resolve(w, b->b, b->n, depth + 1);
}

/* The tokens through the boundaries @b (n, grouped by qp), @depth lexemes ended within them
 * before: end the lexeme (one push per qp) and go on from the next lexeme's start. */
static void resolve(struct walk *w, const struct gr_bnd *b, int n, int depth)
{
    struct gr_matcher *m = w->m;
    struct gr_lexer *l = &m->g->lex;
    const struct gr_tnode *nodes = w->t->nodes;
    for (int i = 0; i < n;) {
        int j = i;
        while (j < n && b[j].qp == b[i].qp)
            j++;
        if (end_lexeme(m, b[i].qp)) {
            int32_t s = top_start(m);
            for (int k = i; k < j && s >= 0; k++) {
                if (b[k].root && !m->consumed)
                    continue;
                int32_t q2 = gr_lexer_step(l, s, nodes[b[k].node].byte);
                if (q2 >= 0)
                    visit(w, b[k].node, q2, depth);
            }
            gr_parser_pop(&m->p);
        }
        i = j;
    }
}

/* Keeps @w's lexeme-only mask and boundaries for state @q. */
static void keep_walk(struct gr_matcher *m, int32_t q, const struct walk *w, int words)
{
    struct gr_grammar *g = m->g;
    if (g->mc_vocab && g->mc_vocab != m->v)
        return; /* kept for another vocabulary */
    if (q >= g->cap_mc) {
        int nc = g->cap_mc ? g->cap_mc : 64;
        while (nc <= q)
            nc *= 2;
        struct gr_mcache *t = realloc(g->mc, sizeof(*t) * (size_t)nc);
        if (!t)
            return;
        memset(t + g->cap_mc, 0, sizeof(*t) * (size_t)(nc - g->cap_mc));
        g->mc = t;
        g->cap_mc = nc;
    }
    struct gr_mcache *e = &g->mc[q];
    e->bits = malloc(sizeof(uint32_t) * (size_t)words);
    const struct bnds *top = &m->lv[0];
    e->b = malloc(sizeof(*e->b) * (size_t)(top->n ? top->n : 1));
    if (!e->bits || !e->b) {
        free(e->bits);
        free(e->b);
        e->bits = NULL;
        e->b = NULL;
        return;
    }
    memcpy(e->bits, w->mask, sizeof(uint32_t) * (size_t)words);
    if (top->n)
        memcpy(e->b, top->b, sizeof(*e->b) * (size_t)top->n);
    e->n_b = top->n;
    e->count = w->count;
    e->np = w->t == &m->v->np;
    g->mc_vocab = m->v;
}

/* How many plain characters every path from @q takes (see gr_vocab), when the plain tokens
 * longer than that are refused there: GR_PLAIN_MAX when all are taken; -1 when it is not so
 * simple (a character class, or a lexeme that may end in the middle). */
static int plain_reach(struct gr_lexer *l, int32_t q)
{
    int32_t s = q;
    for (int k = 0;; k++) {
        if (k == GR_PLAIN_MAX)
            return k;
        int32_t n = gr_lexer_plain_next(l, s);
        if (n == s)
            return GR_PLAIN_MAX;
        if (n == GR_DEAD)
            return l->ds[s].n_acc ? -1 : k;
        if (n < 0)
            return -1;
        s = n;
    }
}

long gr_matcher_mask(struct gr_matcher *m, uint32_t *mask)
{
    const struct gr_vocab *v = m->v;
    struct gr_grammar *g = m->g;
    int words = gr_mask_words(v);
    if (m->done) {
        memset(mask, 0, sizeof(uint32_t) * (size_t)words);
        return 0;
    }
    int32_t q = m->q;
    int reach = q >= 0 ? plain_reach(&g->lex, q) : -1;
    if (reach < 0 && q >= 0 && gr_lexer_keeps_plain(&g->lex, q))
        reach = GR_PLAIN_MAX; /* every plain token stays inside the lexeme */
    if (q < 0 && m->consumed)
        return -EINVAL; /* (cannot be: a lexeme read to a dead state) */
    struct walk w = {.m = m, .mask = mask, .t = reach >= 0 ? &v->np : &v->full};
    if (q >= 0 && q < g->cap_mc && g->mc[q].bits && g->mc_vocab == v &&
        g->mc[q].np == (reach >= 0)) {
        const struct gr_mcache *e = &g->mc[q];
        memcpy(mask, e->bits, sizeof(uint32_t) * (size_t)words);
        w.count = e->count;
        resolve(&w, e->b, e->n_b, 1);
    } else {
        if (reach >= 0) {
            memcpy(mask, v->plain_upto[reach], sizeof(uint32_t) * (size_t)words);
            w.count = v->n_upto[reach];
        } else {
            memset(mask, 0, sizeof(uint32_t) * (size_t)words);
        }
        if (q >= 0) {
            struct bnds *top = &m->lv[0];
            top->n = 0;
            walk_below(&w, 0, q, true, top);
            if (!w.oom && top->n && group_bnd(top))
                w.oom = true;
            if (!w.oom && w.nodes >= GR_MC_MIN_NODES)
                keep_walk(m, q, &w, words);
            if (!w.oom)
                resolve(&w, top->b, top->n, 1);
        }
    }
    if (w.oom)
        return -ENOMEM;
    if (v->eos >= 0 && can_end(m)) {
        mask[v->eos >> 5] |= 1u << (v->eos & 31);
        w.count++;
    }
    return w.count;
}
