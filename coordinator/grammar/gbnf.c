/* SPDX-License-Identifier: MIT */
/* coordinator/grammar/gbnf.c: llama.cpp's GBNF grammars.
 *
 *   rule ::= alternatives     (a rule per line; inside parentheses and after | lines go on)
 *   elements: "literal"  [class]  [^class]  .  rule-name  ( group )   each with * + ? {m} {m,}
 *   {m,n}; escapes \n \r \t \\ \" \[ \] \- \xHH \uHHHH \UHHHHHHHH; # comments; start rule "root"
 *
 * What is regular - a rule that references only regular rules, without recursion - becomes a
 * lexeme (a regex), and so does each run of regular elements inside a rule that is not; the rest
 * is the context-free grammar over them. Lexemes are greedy (see grammar.h): a run like
 * `[a-z]+` followed, at the grammar's level, by something that may start with a letter reads all
 * the letters first. A lexeme that may be empty is its non-empty part, made optional. */
#include "gr_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "utf8.h"
#include "util.h"

#define GB_MAX_RULES 4096
#define GB_MAX_DEPTH 64

struct gb_alts;

enum gb_kind { GB_LIT, GB_CLASS, GB_ANY, GB_REF, GB_GROUP };

struct gb_el {
    enum gb_kind kind;
    char *lit; /* GB_LIT: UTF-8 */
    size_t lit_n;
    struct gr_cset set; /* GB_CLASS */
    int ref;            /* GB_REF: rule index */
    struct gb_alts *grp;
    int min, max; /* repetition; max -1: unbounded */
};

struct gb_seq {
    struct gb_el *el;
    int n, cap;
};

struct gb_alts {
    struct gb_seq *seq;
    int n, cap;
};

struct gb_rule {
    char *name;
    struct gb_alts *alts; /* NULL: referenced, never defined */
    int state;            /* regularity search: 0 not yet, 1 on the path, 2 done */
    bool regular;
    int nt; /* its nonterminal, -1 not yet */
};

struct gb {
    const char *s;
    size_t n, i;
    struct gb_rule *rules;
    int n_rules, cap_rules;
    struct gr_grammar *g;
    struct gr_rebuild b;
    struct shardlm_err *e;
    int depth;
};

static int gb_fail(struct gb *p, const char *what)
{
    size_t line = 1, col = 1;
    for (size_t k = 0; k < p->i && k < p->n; k++, col++)
        if (p->s[k] == '\n') {
            line++;
            col = 0;
        }
    return shardlm_fail(p->e, -EINVAL, "gbnf: line %zu column %zu: %s", line, col, what);
}

/* ---- parsing ---- */

/* Skips spaces and comments; newlines too when @newlines. */
static void skip(struct gb *p, bool newlines)
{
    while (p->i < p->n) {
        char c = p->s[p->i];
        if (c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n')) {
            p->i++;
        } else if (c == '#') {
            while (p->i < p->n && p->s[p->i] != '\n')
                p->i++;
        } else {
            break;
        }
    }
}

static bool name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
}

/* The rule named s[0..n): found or declared. Returns its index or -errno. */
static int rule_index(struct gb *p, const char *s, size_t n)
{
    for (int i = 0; i < p->n_rules; i++)
        if (strlen(p->rules[i].name) == n && !memcmp(p->rules[i].name, s, n))
            return i;
    if (p->n_rules >= GB_MAX_RULES)
        return gb_fail(p, "more than 4096 rules");
    if (gr_grow((void **)&p->rules, &p->cap_rules, p->n_rules, 1, sizeof(*p->rules)))
        return shardlm_fail(p->e, -ENOMEM, "out of memory");
    char *name = strndup(s, n);
    if (!name)
        return shardlm_fail(p->e, -ENOMEM, "out of memory");
    p->rules[p->n_rules] = (struct gb_rule){.name = name, .nt = -1};
    return p->n_rules++;
}

/* One character of a literal or a class at p->i (after the caller saw it is not the closing
 * one): its code point, or -1 with @e set. */
static long gb_char(struct gb *p)
{
    if (p->i >= p->n)
        return gb_fail(p, "the text ends inside a literal or a class"), -1;
    if (p->s[p->i] != '\\') {
        const unsigned char *u = (const unsigned char *)p->s + p->i;
        size_t l = coord_utf8_char(u, p->n - p->i);
        if (!l)
            return gb_fail(p, "not UTF-8"), -1;
        p->i += l;
        return (long)coord_utf8_decode(u, l);
    }
    p->i++;
    if (p->i >= p->n)
        return gb_fail(p, "a lone \\ at the end"), -1;
    char c = p->s[p->i++];
    int digits = c == 'x' ? 2 : c == 'u' ? 4 : c == 'U' ? 8 : 0;
    if (digits) {
        long v = 0;
        for (int k = 0; k < digits; k++, p->i++) {
            char h = p->i < p->n ? p->s[p->i] : 0;
            int d = h >= '0' && h <= '9'   ? h - '0'
                    : h >= 'a' && h <= 'f' ? h - 'a' + 10
                    : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                           : -1;
            if (d < 0)
                return gb_fail(p, "a \\x, \\u or \\U escape without its hex digits"), -1;
            v = v * 16 + d;
        }
        if (v > GR_MAX_CP || (v >= 0xD800 && v <= 0xDFFF))
            return gb_fail(p, "an escape past U+10FFFF or a surrogate"), -1;
        return v;
    }
    switch (c) {
    case 'n':
        return '\n';
    case 'r':
        return '\r';
    case 't':
        return '\t';
    case '\\':
    case '"':
    case '[':
    case ']':
    case '-':
    case '/':
        return c;
    default:
        return gb_fail(p, "an unknown escape"), -1;
    }
}

static struct gb_alts *parse_alts(struct gb *p, bool nested);

static int parse_element(struct gb *p, struct gb_el *el)
{
    char c = p->s[p->i];
    *el = (struct gb_el){.min = 1, .max = 1, .ref = -1};
    if (c == '"') {
        p->i++;
        char buf[8];
        size_t cap = 0;
        el->kind = GB_LIT;
        while (p->i < p->n && p->s[p->i] != '"') {
            long cp = gb_char(p);
            if (cp < 0)
                return -EINVAL;
            size_t k = coord_utf8_put(buf, (uint32_t)cp);
            if (el->lit_n + k + 1 > cap) {
                cap = cap ? cap * 2 : 16;
                char *q = realloc(el->lit, cap);
                if (!q)
                    return shardlm_fail(p->e, -ENOMEM, "out of memory");
                el->lit = q;
            }
            memcpy(el->lit + el->lit_n, buf, k);
            el->lit_n += k;
        }
        if (p->i >= p->n)
            return gb_fail(p, "an unclosed \"");
        p->i++;
        return 0;
    }
    if (c == '[') {
        p->i++;
        bool neg = p->i < p->n && p->s[p->i] == '^';
        if (neg)
            p->i++;
        struct gr_cset s = {0};
        while (p->i < p->n && p->s[p->i] != ']') {
            long lo = gb_char(p), hi = lo;
            if (lo < 0)
                goto class_fail;
            if (p->i + 1 < p->n && p->s[p->i] == '-' && p->s[p->i + 1] != ']') {
                p->i++;
                if ((hi = gb_char(p)) < 0)
                    goto class_fail;
                if (hi < lo) {
                    gb_fail(p, "a class range out of order");
                    goto class_fail;
                }
            }
            if (gr_cset_add(&s, (uint32_t)lo, (uint32_t)hi)) {
                shardlm_fail(p->e, -ENOMEM, "out of memory");
                goto class_fail;
            }
        }
        if (p->i >= p->n) {
            gb_fail(p, "an unclosed [");
            goto class_fail;
        }
        p->i++;
        el->kind = GB_CLASS;
        if (neg) {
            if (gr_cset_negate(&s, &el->set)) {
                shardlm_fail(p->e, -ENOMEM, "out of memory");
                goto class_fail;
            }
            gr_cset_free(&s);
        } else {
            el->set = s;
        }
        return 0;
    class_fail:
        gr_cset_free(&s);
        return -EINVAL;
    }
    if (c == '(') {
        p->i++;
        if (++p->depth > GB_MAX_DEPTH)
            return gb_fail(p, "groups nested more than 64 deep");
        el->kind = GB_GROUP;
        el->grp = parse_alts(p, true);
        p->depth--;
        if (!el->grp)
            return -EINVAL;
        skip(p, true);
        if (p->i >= p->n || p->s[p->i] != ')')
            return gb_fail(p, "an unclosed (");
        p->i++;
        return 0;
    }
    if (c == '.') {
        p->i++;
        el->kind = GB_ANY;
        return 0;
    }
    if (name_char(c)) {
        size_t b = p->i;
        while (p->i < p->n && name_char(p->s[p->i]))
            p->i++;
        el->kind = GB_REF;
        el->ref = rule_index(p, p->s + b, p->i - b);
        return el->ref < 0 ? el->ref : 0;
    }
    return gb_fail(p, "expected a literal, a class, a group, . or a rule name");
}

/* The decimal count at p->i (the text need not end in a NUL): 0..10000, or -1 (none, or more). */
static long gb_count(struct gb *p)
{
    long v = 0;
    size_t b = p->i;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9' && v <= 10000)
        v = v * 10 + (p->s[p->i++] - '0');
    return p->i == b || v > 10000 ? -1 : v;
}

/* A postfix repetition after an element: applied to @el (nested repetitions multiply out). */
static int parse_postfix(struct gb *p, struct gb_el *el)
{
    for (;;) {
        if (p->i >= p->n)
            return 0;
        char c = p->s[p->i];
        long lo, hi;
        if (c == '*' || c == '+' || c == '?') {
            p->i++;
            lo = c == '+';
            hi = c == '?' ? 1 : -1;
        } else if (c == '{') {
            p->i++;
            skip(p, false);
            if ((lo = gb_count(p)) < 0)
                return gb_fail(p, "expected a count 0..10000 after {");
            skip(p, false);
            hi = lo;
            if (p->i < p->n && p->s[p->i] == ',') {
                p->i++;
                skip(p, false);
                hi = -1;
                if (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
                    hi = gb_count(p);
                    if (hi < lo)
                        return gb_fail(p, "{m,n} with n below m or past 10000");
                    skip(p, false);
                }
            }
            if (p->i >= p->n || p->s[p->i] != '}')
                return gb_fail(p, "an unclosed {");
            p->i++;
        } else {
            return 0;
        }
        if (el->min != 1 || el->max != 1) { /* x*+ etc: wrap the repeated element in a group */
            struct gb_alts *g = calloc(1, sizeof(*g));
            struct gb_seq *sq = g ? calloc(1, sizeof(*sq)) : NULL;
            struct gb_el *inner = sq ? malloc(sizeof(*inner)) : NULL;
            if (!inner) {
                free(g);
                free(sq);
                return shardlm_fail(p->e, -ENOMEM, "out of memory");
            }
            *inner = *el;
            sq->el = inner;
            sq->n = sq->cap = 1;
            g->seq = sq;
            g->n = g->cap = 1;
            *el = (struct gb_el){.kind = GB_GROUP, .grp = g, .ref = -1};
        }
        el->min = (int)lo;
        el->max = (int)hi;
    }
}

static void free_alts(struct gb_alts *a);

static void free_el(struct gb_el *el)
{
    free(el->lit);
    gr_cset_free(&el->set);
    free_alts(el->grp);
}

static void free_alts(struct gb_alts *a)
{
    if (!a)
        return;
    for (int i = 0; i < a->n; i++) {
        for (int j = 0; j < a->seq[i].n; j++)
            free_el(&a->seq[i].el[j]);
        free(a->seq[i].el);
    }
    free(a->seq);
    free(a);
}

static struct gb_alts *parse_alts(struct gb *p, bool nested)
{
    struct gb_alts *a = calloc(1, sizeof(*a));
    if (!a) {
        shardlm_fail(p->e, -ENOMEM, "out of memory");
        return NULL;
    }
    for (;;) {
        if (gr_grow((void **)&a->seq, &a->cap, a->n, 1, sizeof(*a->seq))) {
            shardlm_fail(p->e, -ENOMEM, "out of memory");
            goto fail;
        }
        struct gb_seq *sq = &a->seq[a->n++];
        *sq = (struct gb_seq){0};
        for (;;) {
            skip(p, nested);
            if (p->i >= p->n)
                break;
            char c = p->s[p->i];
            if (c == '|' || c == ')' || c == '\n')
                break;
            struct gb_el el;
            int rc = parse_element(p, &el);
            if (!rc)
                rc = parse_postfix(p, &el);
            if (!rc && gr_grow((void **)&sq->el, &sq->cap, sq->n, 1, sizeof(*sq->el)))
                rc = shardlm_fail(p->e, -ENOMEM, "out of memory");
            if (rc) {
                free_el(&el);
                goto fail;
            }
            sq->el[sq->n++] = el;
        }
        if (p->i < p->n && p->s[p->i] == '|') {
            p->i++;
            skip(p, true);
            continue;
        }
        return a;
    }
fail:
    free_alts(a);
    return NULL;
}

static int parse(struct gb *p)
{
    for (;;) {
        skip(p, true);
        if (p->i >= p->n)
            return 0;
        size_t b = p->i;
        while (p->i < p->n && name_char(p->s[p->i]))
            p->i++;
        if (p->i == b)
            return gb_fail(p, "expected a rule name");
        int r = rule_index(p, p->s + b, p->i - b);
        if (r < 0)
            return r;
        if (p->rules[r].alts) {
            p->i = b;
            return gb_fail(p, "a rule defined twice");
        }
        skip(p, false);
        if (p->i + 3 > p->n || memcmp(p->s + p->i, "::=", 3))
            return gb_fail(p, "expected ::= after the rule name");
        p->i += 3;
        skip(p, true);
        if (!(p->rules[r].alts = parse_alts(p, false)))
            return -EINVAL;
        if (p->i < p->n && p->s[p->i] == ')')
            return gb_fail(p, "an unmatched )");
    }
}

/* ---- regular or not ---- */

static bool alts_regular(struct gb *p, const struct gb_alts *a);

static bool rule_regular(struct gb *p, int r)
{
    struct gb_rule *ru = &p->rules[r];
    if (ru->state == 1)
        return false; /* recursion */
    if (ru->state == 2)
        return ru->regular;
    ru->state = 1;
    bool reg = alts_regular(p, ru->alts);
    ru->state = 2;
    ru->regular = reg;
    return reg;
}

static bool el_regular(struct gb *p, const struct gb_el *el)
{
    if (el->kind == GB_REF)
        return rule_regular(p, el->ref);
    if (el->kind == GB_GROUP)
        return alts_regular(p, el->grp);
    return true;
}

static bool alts_regular(struct gb *p, const struct gb_alts *a)
{
    bool reg = true;
    for (int i = 0; i < a->n; i++)
        for (int j = 0; j < a->seq[i].n; j++)
            reg &= el_regular(p, &a->seq[i].el[j]); /* every rule visited: no short cut */
    return reg;
}

/* ---- regexes of the regular parts ---- */

static struct gr_re *re_alts(struct gb *p, const struct gb_alts *a);

static struct gr_re *re_el(struct gb *p, const struct gb_el *el)
{
    struct gr_re *r = NULL;
    if (++p->depth > GB_MAX_DEPTH * 4) {
        gb_fail(p, "regular rules nested too deep");
        return NULL;
    }
    switch (el->kind) {
    case GB_LIT:
        r = gr_re_lit(&p->b, GR_ENC_UTF8, el->lit ? el->lit : "", el->lit_n);
        break;
    case GB_CLASS:
        r = gr_re_set(&p->b, GR_ENC_UTF8, &el->set);
        break;
    case GB_ANY:
        r = gr_re_range(&p->b, GR_ENC_UTF8, 0, GR_MAX_CP);
        break;
    case GB_REF:
        r = re_alts(p, p->rules[el->ref].alts);
        break;
    case GB_GROUP:
        r = re_alts(p, el->grp);
        break;
    }
    p->depth--;
    if (r && (el->min != 1 || el->max != 1))
        r = gr_re_rep(&p->b, r, el->min, el->max);
    return r;
}

static struct gr_re *re_alts(struct gb *p, const struct gb_alts *a)
{
    struct gr_re *alt = gr_re_new(&p->b, GR_RE_ALT);
    for (int i = 0; alt && i < a->n; i++) {
        struct gr_re *cat = gr_re_new(&p->b, GR_RE_CAT);
        if (!cat)
            return NULL;
        for (int j = 0; j < a->seq[i].n; j++)
            if (gr_re_add(&p->b, cat, re_el(p, &a->seq[i].el[j])))
                return NULL;
        if (!cat->n_sub)
            cat->kind = GR_RE_EMPTY;
        if (gr_re_add(&p->b, alt, cat))
            return NULL;
    }
    return alt;
}

/* ---- the context-free part ---- */

/* The symbol of regex @r: its lexeme, or when it may be empty a nonterminal -> L | empty with L
 * its non-empty strings. Returns the symbol (>= 0 lexeme, < 0 ~nonterminal) or INT32_MIN. */
static int32_t lexeme_symbol(struct gb *p, struct gr_re *r)
{
    if (!r)
        return INT32_MIN;
    if (!gr_re_nullable(r)) {
        int lx = gr_lexer_add(&p->g->lex, r);
        return lx < 0 ? (gr_fail_code(p->e, lx, "gbnf"), INT32_MIN) : lx;
    }
    struct gr_re *empty = gr_re_new(&p->b, GR_RE_EMPTY);
    struct gr_re *ne = empty ? gr_re_but(&p->b, r, &empty, 1) : NULL;
    int lx = ne ? gr_lexer_add(&p->g->lex, ne) : -EINVAL;
    int nt = lx < 0 ? lx : gr_cfg_nt(&p->g->cfg);
    int rc = nt < 0 ? nt : gr_cfg_rule(&p->g->cfg, nt, &lx, 1);
    if (!rc)
        rc = gr_cfg_rule(&p->g->cfg, nt, NULL, 0);
    if (rc)
        return gr_fail_code(p->e, rc, "gbnf"), INT32_MIN;
    return ~nt;
}

static int cfg_alts(struct gb *p, const struct gb_alts *a, int lhs);

static int rule_nt(struct gb *p, int r)
{
    struct gb_rule *ru = &p->rules[r];
    if (ru->nt >= 0)
        return ru->nt;
    if ((ru->nt = gr_cfg_nt(&p->g->cfg)) < 0)
        return gr_fail_code(p->e, ru->nt, "gbnf");
    int rc;
    if (ru->regular) {
        int32_t sym = lexeme_symbol(p, re_alts(p, ru->alts));
        if (sym == INT32_MIN)
            return -EINVAL;
        rc = gr_cfg_rule(&p->g->cfg, ru->nt, &sym, 1);
        rc = rc ? gr_fail_code(p->e, rc, "gbnf") : 0;
    } else {
        rc = cfg_alts(p, ru->alts, ru->nt);
    }
    return rc ? rc : ru->nt;
}

/* The symbol of one non-regular element, its repetition applied. INT32_MIN on an error. */
static int32_t el_symbol(struct gb *p, const struct gb_el *el)
{
    int base;
    if (el->kind == GB_REF) {
        base = rule_nt(p, el->ref);
    } else { /* a group */
        base = gr_cfg_nt(&p->g->cfg);
        if (base >= 0) {
            int rc = cfg_alts(p, el->grp, base);
            base = rc ? rc : base;
        } else {
            gr_fail_code(p->e, base, "gbnf");
        }
    }
    if (base < 0)
        return INT32_MIN;
    if (el->min == 1 && el->max == 1)
        return ~base;
    /* x{min,max}: x min times, then max - min optional ones (or x* when unbounded) */
    struct gr_cfg *g = &p->g->cfg;
    int top = gr_cfg_nt(g), rc = top < 0 ? top : 0;
    int32_t *syms = malloc(sizeof(int32_t) * ((size_t)el->min + 1));
    if (!syms)
        rc = -ENOMEM;
    for (int k = 0; !rc && k < el->min; k++)
        syms[k] = ~base;
    int tail = -1;
    if (!rc && el->max < 0) { /* tail -> x tail | empty */
        tail = gr_cfg_nt(g);
        int32_t two[2] = {~base, ~tail};
        rc = tail < 0 ? tail : gr_cfg_rule(g, tail, two, 2);
        if (!rc)
            rc = gr_cfg_rule(g, tail, NULL, 0);
    } else if (!rc && el->max > el->min) { /* opt_k -> x opt_{k+1} | empty */
        int next = -1;
        for (int k = el->max - el->min; !rc && k > 0; k--) {
            int o = gr_cfg_nt(g);
            int32_t two[2] = {~base, next >= 0 ? ~next : 0};
            rc = o < 0 ? o : gr_cfg_rule(g, o, two, next >= 0 ? 2 : 1);
            if (!rc)
                rc = gr_cfg_rule(g, o, NULL, 0);
            next = o;
        }
        tail = next;
    }
    if (!rc) {
        int n = el->min;
        if (tail >= 0)
            syms[n++] = ~tail;
        rc = gr_cfg_rule(g, top, syms, n);
    }
    free(syms);
    if (rc)
        return gr_fail_code(p->e, rc, "gbnf"), INT32_MIN;
    return ~top;
}

/* Rules @lhs -> each sequence of @a: runs of regular elements as one lexeme each. */
static int cfg_alts(struct gb *p, const struct gb_alts *a, int lhs)
{
    for (int i = 0; i < a->n; i++) {
        const struct gb_seq *sq = &a->seq[i];
        int32_t *syms = malloc(sizeof(int32_t) * ((size_t)sq->n + 1));
        int n = 0, rc = syms ? 0 : -ENOMEM;
        for (int j = 0; !rc && j < sq->n;) {
            if (!el_regular(p, &sq->el[j])) {
                int32_t s = el_symbol(p, &sq->el[j++]);
                if (s == INT32_MIN)
                    rc = -EINVAL;
                else
                    syms[n++] = s;
                continue;
            }
            struct gr_re *cat = gr_re_new(&p->b, GR_RE_CAT);
            rc = cat ? 0 : -EINVAL;
            while (!rc && j < sq->n && el_regular(p, &sq->el[j]))
                rc = gr_re_add(&p->b, cat, re_el(p, &sq->el[j++]));
            if (!rc) {
                int32_t s = lexeme_symbol(p, cat);
                if (s == INT32_MIN)
                    rc = -EINVAL;
                else
                    syms[n++] = s;
            }
        }
        if (!rc && (rc = gr_cfg_rule(&p->g->cfg, lhs, syms, n)))
            rc = gr_fail_code(p->e, rc, "gbnf");
        free(syms);
        if (rc)
            return rc;
    }
    return 0;
}

int gr_compile_gbnf(const char *src, size_t len, const struct gr_opts *o, struct gr_grammar **out,
                    struct shardlm_err *e)
{
    struct gb p = {.s = src, .n = len, .e = e};
    int rc = gr_grammar_new(o, "gbnf", &p.g, e);
    if (rc)
        return rc;
    p.b = (struct gr_rebuild){.max_nodes = 2000000, .e = e};
    if ((rc = parse(&p)))
        goto out;
    int root = -1;
    for (int i = 0; i < p.n_rules; i++) {
        if (!p.rules[i].alts) {
            rc = shardlm_fail(e, -EINVAL, "gbnf: rule \"%.60s\" is used but not defined",
                              p.rules[i].name);
            goto out;
        }
        if (!strcmp(p.rules[i].name, "root"))
            root = i;
    }
    if (root < 0) {
        rc = shardlm_fail(e, -EINVAL, "gbnf: no rule \"root\" to start from");
        goto out;
    }
    for (int i = 0; i < p.n_rules; i++)
        rule_regular(&p, i);
    int nt = rule_nt(&p, root);
    if (nt < 0) {
        rc = nt;
        goto out;
    }
    rc = gr_finish(p.g, nt);
    if (rc)
        rc = gr_fail_code(e, rc, "gbnf");
out:
    for (int i = 0; i < p.n_rules; i++) {
        free(p.rules[i].name);
        free_alts(p.rules[i].alts);
    }
    free(p.rules);
    gr_rebuild_free(&p.b);
    if (rc) {
        gr_grammar_free(p.g);
        return rc;
    }
    *out = p.g;
    return 0;
}
