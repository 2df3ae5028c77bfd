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
    bool np_below; /* a token that is not plain (see gr_vocab) is in its subtree */
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
    char *arena;   /* the tokens' bytes: token t is arena[off[t] .. off[t + 1]) (none: empty) */
    uint64_t *off; /* (n + 1) */
};

struct gr_matcher {
    struct gr_grammar *g;
    const struct gr_vocab *v;
    struct gr_parser p;
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
        if (plain_chars(r->b, r->n) < 0)
            for (uint32_t d = 1; d <= depth; d++)
                tr->nodes[path[d]].np_below = true;
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
    int rc = gr_parser_init(&m->p, g, e);
    if (rc) {
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
    c->p.max_items = m->p.max_items;
    c->p.items = malloc(sizeof(*c->p.items) * (size_t)(m->p.n_items ? m->p.n_items : 1));
    c->p.rows = malloc(sizeof(*c->p.rows) * (size_t)m->p.n_rows);
    c->p.ix = malloc(sizeof(*c->p.ix) * (size_t)(m->p.n_ix ? m->p.n_ix : 1));
    if (!c->p.items || !c->p.rows || !c->p.ix) {
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
    struct gr_bnd *b; /* boundaries met by walk_lexeme() */
    int n_b, cap_b;
    bool oom;
};

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

static void walk(struct walk *w, uint32_t first, uint32_t end, int32_t q, bool consumed);

/* Node @c, reached at lexer state @q2 inside a lexeme: its tokens and its subtree's. */
static void visit(struct walk *w, uint32_t c, int32_t q2)
{
    const struct gr_tnode *nd = &w->t->nodes[c];
    if (nd->tok_n)
        allow(w, nd);
    if (nd->end > c + 1)
        walk(w, c + 1, nd->end, q2, true);
}

/* The children first..end of a node reached at lexer state @q (@consumed: inside a lexeme),
 * lexemes ending where the parser allows: the whole mask below a node. */
static void walk(struct walk *w, uint32_t first, uint32_t end, int32_t q, bool consumed)
{
    struct gr_matcher *m = w->m;
    struct gr_lexer *l = &m->g->lex;
    const struct gr_tnode *nodes = w->t->nodes;
    bool any_dead = false;
    for (uint32_t c = first; c < end; c = nodes[c].end) {
        int32_t q2 = gr_lexer_step(l, q, nodes[c].byte);
        if (q2 < 0) {
            any_dead = true;
            continue;
        }
        visit(w, c, q2);
    }
    if (!any_dead || !consumed || !end_lexeme(m, q))
        return;
    int32_t s = top_start(m);
    if (s >= 0)
        for (uint32_t c = first; c < end; c = nodes[c].end) {
            if (gr_lexer_step(l, q, nodes[c].byte) >= 0)
                continue;
            int32_t q2 = gr_lexer_step(l, s, nodes[c].byte);
            if (q2 >= 0)
                visit(w, c, q2);
        }
    gr_parser_pop(&m->p);
}

/* The whole trie from lexer state @q0 without ending the lexeme: tokens read inside it go to
 * the mask, the nodes where it would have to end to w->b. Iterative: this is the long walk. */
static void walk_lexeme(struct walk *w, int32_t q0)
{
    struct gr_lexer *l = &w->m->g->lex;
    const struct gr_tnode *nodes = w->t->nodes;
    struct frame {
        uint32_t end, next;
        int32_t q;
    } *st = malloc(sizeof(*st) * ((size_t)w->m->v->max_len + 1));
    if (!st) {
        w->oom = true;
        return;
    }
    int sp = 0;
    uint32_t c = 1, end = nodes[0].end;
    int32_t q = q0;
    long visited = 0;
    for (;;) {
        while (c < end) {
            const struct gr_tnode *nd = &nodes[c];
            visited++;
            int32_t q2 = l->ds[q].next[nd->byte];
            if (q2 == GR_UNSET)
                q2 = gr_lexer_step_slow(l, q, nd->byte);
            if (q2 < 0) {
                if (l->ds[q].n_acc) {
                    if (GR_PUSH(w->b, w->n_b, w->cap_b, ((struct gr_bnd){c, q, sp == 0})))
                        w->oom = true;
                }
                c = nd->end;
                continue;
            }
            if (!nd->np_below && (l->ds[q2].plain == q2 || (l->ds[q2].plain == GR_UNSET &&
                                                            gr_lexer_plain_next(l, q2) == q2))) {
                /* plain tokens in a state plain characters keep: all of them */
                allow_all(w, nd);
                c = nd->end;
                continue;
            }
            if (nd->tok_n)
                allow(w, nd);
            if (nd->end > c + 1) { /* depth < max_len: st is deep enough */
                st[sp++] = (struct frame){end, nd->end, q};
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
        end = st[sp].end;
        c = st[sp].next;
        q = st[sp].q;
    }
    free(st);
    w->nodes += visited;
}

static int cmp_bnd(const void *a, const void *b)
{
    const struct gr_bnd *x = a, *y = b;
    if (x->qp != y->qp)
        return (x->qp > y->qp) - (x->qp < y->qp);
    return (x->node > y->node) - (x->node < y->node);
}

/* Groups the boundaries w->b by their state qp (in the order the states were first met; nodes
 * stay in preorder within a group): a counting sort over the distinct states, O(n), where a
 * state's long walk may meet a boundary at most of the trie's nodes. A sort when the states are
 * too many for its table. Returns 0 or -ENOMEM. */
static int group_bnd(struct walk *w)
{
    enum { SLOTS = 1024, MAX_KEYS = SLOTS / 2 };
    int32_t key[SLOTS];
    int slot_of[SLOTS], n_keys = 0;
    long count[MAX_KEYS] = {0};
    for (int i = 0; i < SLOTS; i++)
        key[i] = GR_UNSET;
    int *which = malloc(sizeof(int) * (size_t)w->n_b);
    struct gr_bnd *out = malloc(sizeof(*out) * (size_t)w->n_b);
    if (!which || !out) {
        free(which);
        free(out);
        return -ENOMEM;
    }
    for (int i = 0; i < w->n_b; i++) {
        uint32_t h = ((uint32_t)w->b[i].qp * 0x9E3779B1u) >> 22; /* (SLOTS = 2^10) */
        while (key[h] != GR_UNSET && key[h] != w->b[i].qp)
            h = (h + 1) & (SLOTS - 1);
        if (key[h] == GR_UNSET) {
            if (n_keys == MAX_KEYS) { /* many states: sorted instead */
                free(which);
                free(out);
                qsort(w->b, (size_t)w->n_b, sizeof(*w->b), cmp_bnd);
                return 0;
            }
            key[h] = w->b[i].qp;
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
    for (int i = 0; i < w->n_b; i++)
        out[count[which[i]]++] = w->b[i];
    free(which);
    free(w->b);
    w->b = out;
    w->cap_b = w->n_b;
    return 0;
}

/* The tokens through the boundaries @b (n, grouped by qp): end the lexeme (one push per qp) and
 * go on from the next lexeme's start. */
static void resolve(struct walk *w, const struct gr_bnd *b, int n)
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
                    visit(w, b[k].node, q2);
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
    e->b = malloc(sizeof(*e->b) * (size_t)(w->n_b ? w->n_b : 1));
    if (!e->bits || !e->b) {
        free(e->bits);
        free(e->b);
        e->bits = NULL;
        e->b = NULL;
        return;
    }
    memcpy(e->bits, w->mask, sizeof(uint32_t) * (size_t)words);
    if (w->n_b)
        memcpy(e->b, w->b, sizeof(*e->b) * (size_t)w->n_b);
    e->n_b = w->n_b;
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
    struct walk w = {.m = m, .mask = mask, .t = reach >= 0 ? &v->np : &v->full};
    if (q >= 0 && q < g->cap_mc && g->mc[q].bits && g->mc_vocab == v &&
        g->mc[q].np == (reach >= 0)) {
        const struct gr_mcache *e = &g->mc[q];
        memcpy(mask, e->bits, sizeof(uint32_t) * (size_t)words);
        w.count = e->count;
        resolve(&w, e->b, e->n_b);
    } else {
        if (reach >= 0) {
            memcpy(mask, v->plain_upto[reach], sizeof(uint32_t) * (size_t)words);
            w.count = v->n_upto[reach];
        } else {
            memset(mask, 0, sizeof(uint32_t) * (size_t)words);
        }
        if (q >= 0) {
            walk_lexeme(&w, q);
            if (w.oom) {
                free(w.b);
                return -ENOMEM;
            }
            if (w.n_b && group_bnd(&w)) {
                free(w.b);
                return -ENOMEM;
            }
            if (w.nodes >= GR_MC_MIN_NODES)
                keep_walk(m, q, &w, words);
            resolve(&w, w.b, w.n_b);
        } else if (m->consumed) {
            return -EINVAL;
        }
        free(w.b);
    }
    if (v->eos >= 0 && can_end(m)) {
        mask[v->eos >> 5] |= 1u << (v->eos & 31);
        w.count++;
    }
    return w.count;
}
