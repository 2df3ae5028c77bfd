/* SPDX-License-Identifier: MIT */
/* coordinator/grammar/gr_internal.h: what the grammar engine's files share.
 *
 *   regex.c   regular expressions: an AST over code-point sets, ECMAScript's syntax parsed into
 *             it, and the NFA over bytes built from it (UTF-8, or a JSON string's encodings)
 *   lexer.c   lexemes (interned by their regex) and the lexer: a DFA over sets of NFA states,
 *             built lazily one transition at a time
 *   earley.c  the context-free grammar over lexemes and its Earley parser, rows pushed and
 *             popped as a stack (the mask's walk tries a lexeme and takes it back)
 *   matcher.c the vocabulary's trie, one sequence's state, the mask and the commit
 *   schema.c  JSON Schema to a grammar; gbnf.c llama.cpp's GBNF; the regex and choice sources
 *   calls.c   tool calls: a model's call syntax around its tools' argument schemas
 */
#ifndef SHARDLM_COORD_GR_INTERNAL_H
#define SHARDLM_COORD_GR_INTERNAL_H

#include "grammar.h"

#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GR_MAX_CP 0x10FFFF

/* ---- growing arrays -------------------------------------------------------------------- */

/* Makes room for @n more elements of @size bytes in *@p (length *@len, capacity *@cap).
 * Returns 0 or -ENOMEM (the array left as it was). */
int gr_grow(void **p, int *cap, int len, int n, size_t size);
#define GR_PUSH(arr, len, cap, val)                                                                \
    (gr_grow((void **)&(arr), &(cap), (len), 1, sizeof(*(arr))) ? -ENOMEM                          \
                                                                : ((arr)[(len)++] = (val), 0))

uint64_t gr_hash(const void *p, size_t n, uint64_t h);

/* ---- regular expressions --------------------------------------------------------------- */

struct gr_range {
    uint32_t lo, hi; /* code points (or bytes), inclusive */
};

/* A set of code points: sorted, disjoint, not adjacent ranges. */
struct gr_cset {
    struct gr_range *r;
    int n, cap;
};

enum gr_enc {
    GR_ENC_UTF8 = 0, /* a code point is its UTF-8 bytes */
    GR_ENC_JSON = 1, /* ... any of its encodings inside a JSON string: raw UTF-8 (not '"', '\\',
                      * nor below U+0020), a short escape, \uXXXX (either case), a surrogate pair */
    GR_ENC_BYTE = 2, /* the set holds bytes, matched as themselves */
};

enum gr_re_kind {
    GR_RE_NONE,  /* matches nothing */
    GR_RE_EMPTY, /* matches the empty string */
    GR_RE_SET,   /* one code point of a set */
    GR_RE_CAT,
    GR_RE_ALT,
    GR_RE_REP,  /* sub{min,max}; max -1: unbounded */
    GR_RE_BOOL, /* matches every one of sub[0..n_pos) and none of sub[n_pos..n_sub) (n_pos >= 1):
                 * built as a DFA (determinized whole, at most GR_BOOL_MAX_STATES states) */
};
#define GR_BOOL_MAX_STATES 20000

struct gr_re {
    enum gr_re_kind kind;
    enum gr_enc enc;    /* GR_RE_SET */
    struct gr_cset set; /* GR_RE_SET */
    struct gr_re **sub; /* GR_RE_CAT, GR_RE_ALT: n_sub; GR_RE_REP: one */
    int n_sub, cap_sub;
    int min, max;             /* GR_RE_REP */
    int n_pos;                /* GR_RE_BOOL */
    struct gr_re *next_alloc; /* every node of a builder, for freeing */
};

/* Owns the nodes of the regexes being built. */
struct gr_rebuild {
    struct gr_re *all;
    long n_nodes;
    long max_nodes; /* the most nodes (0: no limit): a huge pattern is refused */
    struct shardlm_err *e;
};

int gr_cset_add(struct gr_cset *s, uint32_t lo, uint32_t hi);
int gr_cset_add_set(struct gr_cset *s, const struct gr_cset *t);
/* *@out = the code points 0..GR_MAX_CP not in @s. */
int gr_cset_negate(const struct gr_cset *s, struct gr_cset *out);
bool gr_cset_has(const struct gr_cset *s, uint32_t c);
void gr_cset_free(struct gr_cset *s);

/* Node constructors: NULL (with the builder's error set) when out of memory or past max_nodes. */
struct gr_re *gr_re_new(struct gr_rebuild *b, enum gr_re_kind kind);
struct gr_re *gr_re_set(struct gr_rebuild *b, enum gr_enc enc, const struct gr_cset *s);
struct gr_re *gr_re_range(struct gr_rebuild *b, enum gr_enc enc, uint32_t lo, uint32_t hi);
struct gr_re *gr_re_lit(struct gr_rebuild *b, enum gr_enc enc, const char *s, size_t n);
struct gr_re *gr_re_cat(struct gr_rebuild *b, struct gr_re *x, struct gr_re *y);
struct gr_re *gr_re_alt(struct gr_rebuild *b, struct gr_re *x, struct gr_re *y);
struct gr_re *gr_re_rep(struct gr_rebuild *b, struct gr_re *x, int min, int max);
/* Strings @pos matches and none of @neg (n_neg may be 0) match: a GR_RE_BOOL. */
struct gr_re *gr_re_but(struct gr_rebuild *b, struct gr_re *pos, struct gr_re *const *neg,
                        int n_neg);
/* Any UTF-8 text, then @stop at its first occurrence: the text with @stop holds it only at
 * its end (so a greedy lexer ends the lexeme exactly there). */
struct gr_re *gr_re_until(struct gr_rebuild *b, const char *stop);
/* Strings both @x and @y match. */
struct gr_re *gr_re_and(struct gr_rebuild *b, struct gr_re *x, struct gr_re *y);
int gr_re_add(struct gr_rebuild *b, struct gr_re *parent, struct gr_re *child);
void gr_rebuild_free(struct gr_rebuild *b);

/* Parses the ECMAScript regular expression @src (@n bytes, UTF-8) whose characters are encoded
 * by @enc. @anchored: the regex must match the whole text (a JSON Schema pattern is a search:
 * pass false and it becomes .*(?:src).* unless it starts with ^ / ends with $). Returns the AST
 * or NULL with b->e naming what is not supported (backreferences, lookaround, ...). */
struct gr_re *gr_re_parse(struct gr_rebuild *b, const char *src, size_t n, enum gr_enc enc,
                          bool anchored);
/* Whether @r matches the empty string. */
bool gr_re_nullable(const struct gr_re *r);
/* A canonical text of @r, for interning (malloc'd, NUL-terminated), or NULL. */
char *gr_re_key(const struct gr_re *r, size_t *len);

/* ---- NFA and lexer ---------------------------------------------------------------------- */

struct gr_nedge {
    uint8_t lo, hi;
    int32_t to;
};

struct gr_nstate {
    struct gr_nedge *e;
    int32_t *eps;
    int n_e, cap_e, n_eps, cap_eps;
    int32_t lexeme; /* the lexeme this state accepts, -1 */
};

struct gr_lexeme {
    char *key; /* gr_re_key() of its regex */
    size_t key_len;
    int32_t start, accept; /* NFA states */
    bool nullable;
};

#define GR_DEAD (-1)
#define GR_UNSET (-2)
#define GR_MIXED (-3)

struct gr_dstate {
    int32_t *set; /* sorted NFA states (after epsilon closure: states with edges or accepting) */
    int n_set;
    int32_t *acc; /* lexemes accepting here, ascending */
    int n_acc;
    int32_t plain; /* where every plain character (see matcher.c) leads: a state, GR_DEAD,
                    * GR_MIXED (not all to one place), GR_UNSET (not known yet) */
    int8_t keeps;  /* gr_lexer_keeps_plain: 1 yes, 0 no, -1 not known yet */
    uint64_t hash;
};

#define GR_PSETS 5

struct gr_lexer {
    struct gr_nstate *ns;
    int n_ns, cap_ns;
    long max_states; /* NFA states, all lexemes together (0: no limit) */
    struct gr_lexeme *lx;
    int n_lx, cap_lx;
    int32_t *lx_map; /* open addressing by key: lexeme id, -1 empty */
    int lx_mask;
    struct gr_dstate *ds;
    int n_ds, cap_ds;
    /* the states' transitions: state q's on byte b at rows[q >> GR_ROW_SHIFT][(q & (2^shift - 1))
     * * 256 + b], GR_UNSET until computed, GR_DEAD; in chunks of rows, never moved */
    int32_t **rows;
    int cap_rows;
    struct gr_dslot {
        uint32_t tag; /* the set hash's high half: most misses without a look at the state */
        int32_t id;   /* -1: empty */
    } * ds_map;       /* open addressing by set hash */
    int ds_mask;
    long max_dstates; /* DFA states (0: no limit); past it a transition is GR_DEAD and overflow set
                       */
    bool overflow;
    /* scratch for closures */
    uint32_t *mark;
    uint32_t gen;
    int32_t *stack, *buf;
    int32_t *pset[GR_PSETS]; /* plain_next's: the target and one set per byte of a character */
    int8_t *nkeeps; /* (cap_scratch) by NFA state: its closure alone keeps plain text (1), not
                     * (2), not known yet (0) */
    int cap_scratch;
};

/* Adds the lexeme of regex @r (interned: the same regex gives the same id). Returns its id or
 * -ENOMEM / -E2BIG (too many NFA states). */
int gr_lexer_add(struct gr_lexer *l, const struct gr_re *r);
/* The DFA state for the start of any of the lexemes @ids (n ascending), or -errno. */
int gr_lexer_start(struct gr_lexer *l, const int32_t *ids, int n);
#define GR_ROW_SHIFT 6

/* The transitions of state @q, by byte. */
static inline int32_t *gr_lexer_row(const struct gr_lexer *l, int32_t q)
{
    return l->rows[q >> GR_ROW_SHIFT] + ((size_t)(q & ((1 << GR_ROW_SHIFT) - 1)) << 8);
}

/* Computes the transition of @q on byte @b (stored in its row). */
int32_t gr_lexer_step_slow(struct gr_lexer *l, int32_t q, uint8_t b);
static inline int32_t gr_lexer_step(struct gr_lexer *l, int32_t q, uint8_t b)
{
    int32_t t = gr_lexer_row(l, q)[b];
    return t != GR_UNSET ? t : gr_lexer_step_slow(l, q, b);
}
/* Where every "plain" character - a whole UTF-8 character but '"', '\\' and those below
 * U+0020 - leads from @q, if they all lead to one state: that state (inside a JSON string
 * without limits: @q itself; with a length limit: the next count), GR_DEAD if none is taken,
 * else GR_MIXED. Then a token of k plain characters goes k such steps from @q. */
int32_t gr_lexer_plain_next(struct gr_lexer *l, int32_t q);
/* Whether every string of plain characters read from @q stays inside the lexeme: some NFA state
 * of @q alone goes back to itself on every plain character (a JSON string's body among the keys
 * an object names). Then every plain token is taken there, whatever else @q holds. */
bool gr_lexer_keeps_plain(struct gr_lexer *l, int32_t q);
void gr_lexer_free(struct gr_lexer *l);

/* ---- grammar and Earley parser ------------------------------------------------------------ */

/* A symbol: >= 0 a lexeme (terminal), < 0 the nonterminal ~sym. */
struct gr_rule {
    int32_t lhs;      /* nonterminal index */
    int32_t off, len; /* its symbols in gr_cfg.rhs */
};

struct gr_cfg {
    struct gr_rule *rules;
    int n_rules, cap_rules;
    int32_t *rhs;
    int n_rhs, cap_rhs;
    int n_nt;
    uint8_t *nullable;           /* (n_nt) */
    int32_t start_rule;          /* S' -> S */
    int32_t *nt_rules;           /* (n_rules) rules grouped by nonterminal (after finish) */
    int32_t *nt_off;             /* (n_nt + 1) */
    long max_rules;
};

/* A new nonterminal's index, or -ENOMEM. */
int gr_cfg_nt(struct gr_cfg *g);
/* Adds rule @lhs -> @sym[0..n). Returns 0 or -ENOMEM / -E2BIG. */
int gr_cfg_rule(struct gr_cfg *g, int lhs, const int32_t *sym, int n);
/* Fixes @start as the start symbol and computes the tables, dropping the rules that cannot
 * complete (a lexeme @lex_empty[id] marks as matching nothing, a nonterminal without such
 * rules). Returns 0, -ENOENT (the start symbol cannot complete: no text matches) or -errno. */
int gr_cfg_finish(struct gr_cfg *g, int start, const uint8_t *lex_empty);
/* (n_lx) which lexemes of @l match nothing, malloc'd; NULL when out of memory. */
uint8_t *gr_lexer_empty(struct gr_lexer *l);
void gr_cfg_free(struct gr_cfg *g);

struct gr_item {
    int32_t rule;
    int16_t dot;
    int32_t origin;
};

struct gr_row {
    int32_t beg, end;  /* its items */
    int32_t ix_beg, ix_end; /* in gr_parser.ix: its items that wait for a nonterminal */
    int32_t lex_start; /* lexer DFA state for its allowed lexemes (GR_DEAD: none) */
    bool accepting;    /* the start symbol is complete over everything so far */
};

struct gr_parser {
    struct gr_item *items;
    int n_items, cap_items;
    uint64_t *ix; /* per row, sorted: nonterminal << 32 | item, for the items waiting for it */
    int n_ix, cap_ix;
    struct gr_row *rows;
    int n_rows, cap_rows;
    /* scratch */
    uint64_t *seen; /* open addressing of (rule, dot, origin) in the row being built */
    uint32_t *seen_gen;
    uint32_t gen;
    int seen_mask, n_seen;
    int32_t *lex_buf;
    int cap_lex;
    long max_items; /* in one row */
};

struct gr_grammar {
    struct gr_lexer lex;
    struct gr_cfg cfg;
    uint32_t *lex_set_bits; /* scratch: lexeme set of a row */
    /* cache: sorted lexeme set -> DFA start state */
    struct gr_startc {
        uint64_t hash;
        int32_t *ids;
        int n;
        int32_t state;
    } * startc;
    int n_startc, startc_mask;
    char what[64]; /* the source kind, for messages */
    char *think_open, *think_close, *lead; /* the frame (gr_opts), NULL: none */
    /* the part of a mask that stays inside one lexeme, by lexer state, for one vocabulary
     * (matcher.c): kept for states whose walk is long */
    const struct gr_vocab *mc_vocab;
    struct gr_mcache *mc; /* (cap_mc) by DFA state; bits NULL: not kept */
    int cap_mc;
};

/* A trie node whose byte ends the lexeme being read (the lexer state of its parent, qp, is
 * the end of some lexemes and cannot take the byte): where a mask needs the parser. */
struct gr_bnd {
    uint32_t node;
    int32_t qp;
    bool root; /* the node is a first byte: only after bytes of the lexeme were read */
};

struct gr_mcache {
    uint32_t *bits; /* the tokens read whole inside the lexeme */
    long count;
    struct gr_bnd *b; /* grouped by qp */
    int n_b;
    bool np; /* b's nodes are the np trie's (see matcher.c), not the full one's */
};

/* A new empty grammar with @o's limits; @what names its source in messages. */
int gr_grammar_new(const struct gr_opts *o, const char *what, struct gr_grammar **out,
                   struct shardlm_err *e);
/* gr_cfg_finish() of @g's rules with start symbol @start (inside the frame of @g's options)
 * and its lexer's empty lexemes. */
int gr_finish(struct gr_grammar *g, int start);
/* Sets @e for -E2BIG / -ENOMEM / -ENOENT from the builders (other codes have @e set already);
 * returns rc. */
int gr_fail_code(struct shardlm_err *e, int rc, const char *what);

/* ---- JSON Schema inside a grammar (schema.c) ---------------------------------------------- */

struct gr_json; /* the JSON Schema compiler over one grammar: its JSON lexemes and memo */

/* A compiler adding to @g with @o's whitespace (o->max_ws). Returns 0 or -errno with @e set. */
int gr_json_new(struct gr_grammar *g, const struct gr_opts *o, struct gr_json **out,
                struct shardlm_err *e);
/* The nonterminal of @schema, whose $refs resolve in @root; both stay alive (and unchanged)
 * until gr_json_free(). Returns it, or -errno with the compiler's error set. */
int gr_json_value(struct gr_json *c, json_t *schema, json_t *root);
/* @j kept alive until gr_json_free() (a schema made for gr_json_value()); NULL when @j is NULL
 * or out of memory. */
json_t *gr_json_keep(struct gr_json *c, json_t *j);
void gr_json_free(struct gr_json *c);

/* Initialises @p with the first row for @g. Returns 0 or -errno. */
int gr_parser_init(struct gr_parser *p, struct gr_grammar *g, struct shardlm_err *e);
/* Pushes the row after any of the lexemes @acc (n) from the top row. Returns 1 (pushed), 0 (no
 * item takes any: nothing pushed) or -errno. */
int gr_parser_push(struct gr_parser *p, struct gr_grammar *g, const int32_t *acc, int n);
static inline void gr_parser_pop(struct gr_parser *p)
{
    p->n_rows--;
    p->n_items = p->rows[p->n_rows].beg;
    p->n_ix = p->rows[p->n_rows].ix_beg;
}
void gr_parser_free(struct gr_parser *p);

#endif
