/* SPDX-License-Identifier: MIT */
/* coordinator/chat/jinja_parse.c: a Jinja template's tokens into its syntax tree - a
 * recursive-descent parser with Jinja2's precedence. */
#include "jinja_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static struct jtok *peek(struct jparse *p) { return &p->toks[p->pos]; }
static struct jtok *peek2(struct jparse *p)
{
    return &p->toks[p->pos + (p->toks[p->pos].t != JT_EOF)];
}
static struct jtok *next(struct jparse *p)
{
    struct jtok *t = &p->toks[p->pos];
    if (t->t != JT_EOF)
        p->pos++;
    return t;
}
static bool is_op(const struct jtok *t, const char *op)
{
    return t->t == JT_OP && !strcmp(t->s, op);
}
static bool is_name(const struct jtok *t, const char *name)
{
    return t->t == JT_NAME && !strcmp(t->s, name);
}
static bool skip_op(struct jparse *p, const char *op)
{
    if (!is_op(peek(p), op))
        return false;
    p->pos++;
    return true;
}
static bool skip_name(struct jparse *p, const char *name)
{
    if (!is_name(peek(p), name))
        return false;
    p->pos++;
    return true;
}
static void expect_op(struct jparse *p, const char *op)
{
    if (!skip_op(p, op))
        jinja_throw(p->f, -EINVAL, "line %d: expected '%s'", peek(p)->line, op);
}
static const char *expect_name(struct jparse *p)
{
    struct jtok *t = next(p);
    if (t->t != JT_NAME)
        jinja_perr(p, t->line, "expected a name");
    return t->s;
}
static void expect_end(struct jparse *p)
{
    if (peek(p)->t != JT_BLOCK_END)
        jinja_perr(p, peek(p)->line, "expected the end of the tag (%})");
    p->pos++;
}

static struct jx *node(struct jparse *p, enum jx_kind k, int line)
{
    struct jx *x = jinja_alloc(p->a, sizeof(*x), p->f);
    x->kind = k;
    x->line = line;
    return x;
}

static void enter(struct jparse *p, int line)
{
    if (++p->depth > p->max_depth)
        jinja_throw(p->f, -E2BIG, "line %d: nested deeper than %d", line, p->max_depth);
}

/* A left-leaning chain (a + b + c ...) nests one level per operator: each counts against the
 * depth limit, as recursion would (the evaluator recurses through the tree). */
static void chain(struct jparse *p, int *n, int line)
{
    enter(p, line);
    (*n)++;
}

static struct jx *parse_expr(struct jparse *p);
static struct jx *parse_or(struct jparse *p);
static struct jx *parse_unary(struct jparse *p, bool filters);

/* Arguments of a call, a filter or a test, after its '(' through ')'. */
static void parse_args(struct jparse *p, struct jx *x)
{
    struct jx *args[64];
    const char *kw[64];
    int n = 0;
    while (!skip_op(p, ")")) {
        if (n) {
            expect_op(p, ",");
            if (skip_op(p, ")"))
                break;
        }
        if (n == 64)
            jinja_perr(p, peek(p)->line, "more than 64 arguments");
        kw[n] = NULL;
        if (peek(p)->t == JT_NAME && is_op(peek2(p), "=")) {
            kw[n] = next(p)->s;
            p->pos++;
        } else if (is_op(peek(p), "*") || is_op(peek(p), "**")) {
            jinja_perr(p, peek(p)->line, "*args and **kwargs in calls are not supported");
        }
        args[n++] = parse_expr(p);
    }
    x->nargs = n;
    x->args = jinja_alloc(p->a, (size_t)n * sizeof(*x->args) + 1, p->f);
    x->kw = jinja_alloc(p->a, (size_t)n * sizeof(*x->kw) + 1, p->f);
    memcpy(x->args, args, (size_t)n * sizeof(*args));
    memcpy(x->kw, kw, (size_t)n * sizeof(*kw));
}

static struct jx *lit(struct jparse *p, struct jv *v, int line)
{
    struct jx *x = node(p, JX_LIT, line);
    x->lit = v;
    return x;
}

static struct jv *const_value(struct jparse *p, enum jv_type t)
{
    struct jv *v = jinja_alloc(p->a, sizeof(*v), p->f);
    v->t = t;
    return v;
}

/* A list of expressions up to @close (a tuple, list or dict literal's items). */
static struct jx *parse_items(struct jparse *p, enum jx_kind kind, const char *close, int line)
{
    struct jx *x = node(p, kind, line);
    int cap = 8;
    x->args = jinja_alloc(p->a, (size_t)cap * sizeof(*x->args), p->f);
    while (!skip_op(p, close)) {
        if (x->nargs) {
            expect_op(p, ",");
            if (skip_op(p, close))
                break;
        }
        if (x->nargs + 2 > cap) {
            struct jx **na = jinja_alloc(p->a, (size_t)cap * 2 * sizeof(*na), p->f);
            memcpy(na, x->args, (size_t)x->nargs * sizeof(*na));
            x->args = na;
            cap *= 2;
        }
        x->args[x->nargs++] = parse_expr(p);
        if (kind == JX_DICT) {
            expect_op(p, ":");
            x->args[x->nargs++] = parse_expr(p);
        }
    }
    return x;
}

static struct jx *parse_primary(struct jparse *p)
{
    struct jtok *t = next(p);
    switch (t->t) {
    case JT_NAME: {
        if (!strcmp(t->s, "true") || !strcmp(t->s, "True"))
            return lit(p, jinja_shared(&jinja_true), t->line);
        if (!strcmp(t->s, "false") || !strcmp(t->s, "False"))
            return lit(p, jinja_shared(&jinja_false), t->line);
        if (!strcmp(t->s, "none") || !strcmp(t->s, "None"))
            return lit(p, jinja_shared(&jinja_none), t->line);
        struct jx *x = node(p, JX_NAME, t->line);
        x->name = t->s;
        return x;
    }
    case JT_STRING: {
        /* adjacent literals join, as in Python */
        size_t n = t->n;
        const char *s = t->s;
        while (peek(p)->t == JT_STRING) {
            struct jtok *u = next(p);
            char *j = jinja_alloc(p->a, n + u->n + 1, p->f);
            memcpy(j, s, n);
            memcpy(j + n, u->s, u->n);
            s = j;
            n += u->n;
        }
        struct jv *v = const_value(p, JV_STR);
        v->str.s = s;
        v->str.n = n;
        return lit(p, v, t->line);
    }
    case JT_INT: {
        struct jv *v = const_value(p, JV_INT);
        v->i = t->i;
        return lit(p, v, t->line);
    }
    case JT_FLOAT: {
        struct jv *v = const_value(p, JV_FLOAT);
        v->f = t->f;
        return lit(p, v, t->line);
    }
    case JT_OP:
        if (!strcmp(t->s, "(")) {
            if (skip_op(p, ")"))
                return node(p, JX_TUPLE, t->line);
            struct jx *e = parse_expr(p);
            if (skip_op(p, ")"))
                return e;
            expect_op(p, ",");
            struct jx *tup = parse_items(p, JX_TUPLE, ")", t->line);
            struct jx **na = jinja_alloc(p->a, (size_t)(tup->nargs + 1) * sizeof(*na), p->f);
            na[0] = e;
            memcpy(na + 1, tup->args, (size_t)tup->nargs * sizeof(*na));
            tup->args = na;
            tup->nargs++;
            return tup;
        }
        if (!strcmp(t->s, "["))
            return parse_items(p, JX_LIST, "]", t->line);
        if (!strcmp(t->s, "{"))
            return parse_items(p, JX_DICT, "}", t->line);
        break;
    default:
        break;
    }
    jinja_throw(p->f, -EINVAL, "line %d: unexpected %s", t->line,
                t->t == JT_EOF                               ? "end of template"
                : t->t == JT_VAR_END || t->t == JT_BLOCK_END ? "end of tag"
                : t->t == JT_OP                              ? t->s
                                                             : "token");
}

/* a[...] after its '[' */
static struct jx *parse_subscript(struct jparse *p, struct jx *obj, int line)
{
    struct jx *parts[3] = {NULL, NULL, NULL};
    int k = 0;
    bool slice = false;
    for (;;) {
        if (is_op(peek(p), ":")) {
            p->pos++;
            slice = true;
            if (++k > 2)
                jinja_perr(p, line, "a slice with more than three parts");
            continue;
        }
        if (skip_op(p, "]"))
            break;
        if (parts[k])
            jinja_perr(p, line, "expected ']'");
        parts[k] = parse_expr(p);
    }
    struct jx *x = node(p, slice ? JX_SLICE : JX_ITEM, line);
    x->a = obj;
    if (!slice) {
        if (!parts[0])
            jinja_perr(p, line, "an empty subscript");
        x->b = parts[0];
        return x;
    }
    x->nargs = 3;
    x->args = jinja_alloc(p->a, 3 * sizeof(*x->args), p->f);
    memcpy(x->args, parts, sizeof(parts));
    return x;
}

static struct jx *parse_postfix(struct jparse *p, struct jx *x)
{
    int n = 0;
    for (;;) {
        struct jtok *t = peek(p);
        if (is_op(t, ".") || is_op(t, "[") || is_op(t, "("))
            chain(p, &n, t->line);
        if (is_op(t, ".")) {
            p->pos++;
            struct jtok *u = next(p);
            if (u->t == JT_NAME) {
                struct jx *a = node(p, JX_ATTR, t->line);
                a->a = x;
                a->name = u->s;
                x = a;
            } else if (u->t == JT_INT) {
                struct jx *a = node(p, JX_ITEM, t->line);
                a->a = x;
                a->b = lit(p, const_value(p, JV_INT), t->line);
                a->b->lit->i = u->i;
                x = a;
            } else {
                jinja_perr(p, t->line, "expected a name after '.'");
            }
        } else if (is_op(t, "[")) {
            p->pos++;
            x = parse_subscript(p, x, t->line);
        } else if (is_op(t, "(")) {
            p->pos++;
            struct jx *c = node(p, JX_CALL, t->line);
            c->a = x;
            parse_args(p, c);
            x = c;
        } else {
            p->depth -= n;
            return x;
        }
    }
}

/* name [(args)] of a filter or a test, dotted names joined */
static const char *dotted_name(struct jparse *p)
{
    const char *n = expect_name(p);
    while (is_op(peek(p), ".") && peek2(p)->t == JT_NAME) {
        p->pos++;
        const char *m = next(p)->s;
        size_t a = strlen(n), b = strlen(m);
        char *j = jinja_alloc(p->a, a + b + 2, p->f);
        memcpy(j, n, a);
        j[a] = '.';
        memcpy(j + a + 1, m, b);
        n = j;
    }
    return n;
}

static struct jx *parse_filter(struct jparse *p, struct jx *x, int line)
{
    struct jx *f = node(p, JX_FILTER, line);
    f->a = x;
    f->name = dotted_name(p);
    if (skip_op(p, "("))
        parse_args(p, f);
    return f;
}

static struct jx *parse_filter_expr(struct jparse *p, struct jx *x)
{
    int n = 0;
    for (;;) {
        struct jtok *t = peek(p);
        if (is_op(t, "|") || is_name(t, "is") || is_op(t, "("))
            chain(p, &n, t->line);
        if (is_op(t, "|")) {
            p->pos++;
            x = parse_filter(p, x, t->line);
        } else if (is_name(t, "is")) {
            p->pos++;
            struct jx *e = node(p, JX_TEST, t->line);
            e->negated = skip_name(p, "not");
            e->a = x;
            e->name = dotted_name(p);
            struct jtok *u = peek(p);
            if (skip_op(p, "(")) {
                parse_args(p, e);
            } else if ((u->t == JT_NAME || u->t == JT_STRING || u->t == JT_INT ||
                        u->t == JT_FLOAT || is_op(u, "[") || is_op(u, "{")) &&
                       !is_name(u, "else") && !is_name(u, "or") && !is_name(u, "and")) {
                if (is_name(u, "is"))
                    jinja_perr(p, u->line, "you cannot chain multiple tests with is");
                e->nargs = 1;
                e->args = jinja_alloc(p->a, sizeof(*e->args), p->f);
                e->kw = jinja_alloc(p->a, sizeof(*e->kw), p->f);
                e->args[0] = parse_postfix(p, parse_primary(p));
            }
            x = e;
        } else if (is_op(t, "(")) {
            p->pos++;
            struct jx *c = node(p, JX_CALL, t->line);
            c->a = x;
            parse_args(p, c);
            x = c;
        } else {
            p->depth -= n;
            return x;
        }
    }
}

static struct jx *parse_unary(struct jparse *p, bool filters)
{
    struct jtok *t = peek(p);
    enter(p, t->line);
    struct jx *x;
    if (is_op(t, "-") || is_op(t, "+")) {
        p->pos++;
        x = node(p, JX_UNARY, t->line);
        x->op = t->s[0] == '-' ? JINJA_OP_NEG : JINJA_OP_POS;
        x->a = parse_unary(p, false);
    } else {
        x = parse_postfix(p, parse_primary(p));
    }
    if (filters)
        x = parse_filter_expr(p, x);
    p->depth--;
    return x;
}

static struct jx *binary(struct jparse *p, struct jx *l, enum jinja_op op, struct jx *r, int line)
{
    struct jx *x = node(p, JX_BINARY, line);
    x->op = op;
    x->a = l;
    x->b = r;
    return x;
}

static struct jx *parse_pow(struct jparse *p)
{
    struct jx *l = parse_unary(p, true);
    int n = 0;
    while (is_op(peek(p), "**")) {
        int line = next(p)->line;
        chain(p, &n, line);
        l = binary(p, l, JINJA_OP_POW, parse_unary(p, true), line);
    }
    p->depth -= n;
    return l;
}

static struct jx *parse_math2(struct jparse *p)
{
    struct jx *l = parse_pow(p);
    int n = 0;
    for (;;) {
        struct jtok *t = peek(p);
        int op = is_op(t, "*")    ? JINJA_OP_MUL
                 : is_op(t, "/")  ? JINJA_OP_DIV
                 : is_op(t, "//") ? JINJA_OP_FLOORDIV
                 : is_op(t, "%")  ? JINJA_OP_MOD
                                  : -1;
        if (op < 0) {
            p->depth -= n;
            return l;
        }
        p->pos++;
        chain(p, &n, t->line);
        l = binary(p, l, (enum jinja_op)op, parse_pow(p), t->line);
    }
}

static struct jx *parse_concat(struct jparse *p)
{
    struct jx *l = parse_math2(p);
    int n = 0;
    while (is_op(peek(p), "~")) {
        int line = next(p)->line;
        chain(p, &n, line);
        l = binary(p, l, JINJA_OP_CONCAT, parse_math2(p), line);
    }
    p->depth -= n;
    return l;
}

static struct jx *parse_math1(struct jparse *p)
{
    struct jx *l = parse_concat(p);
    int n = 0;
    for (;;) {
        struct jtok *t = peek(p);
        int op = is_op(t, "+") ? JINJA_OP_ADD : is_op(t, "-") ? JINJA_OP_SUB : -1;
        if (op < 0) {
            p->depth -= n;
            return l;
        }
        p->pos++;
        chain(p, &n, t->line);
        l = binary(p, l, (enum jinja_op)op, parse_concat(p), t->line);
    }
}

static struct jx *parse_compare(struct jparse *p)
{
    struct jx *first = parse_math1(p);
    struct jx *args[33];
    enum jinja_cmp ops[32];
    int n = 0;
    args[0] = first;
    for (;;) {
        struct jtok *t = peek(p);
        int op = is_op(t, "==")     ? JINJA_CMP_EQ
                 : is_op(t, "!=")   ? JINJA_CMP_NE
                 : is_op(t, "<")    ? JINJA_CMP_LT
                 : is_op(t, "<=")   ? JINJA_CMP_LE
                 : is_op(t, ">")    ? JINJA_CMP_GT
                 : is_op(t, ">=")   ? JINJA_CMP_GE
                 : is_name(t, "in") ? JINJA_CMP_IN
                                    : -1;
        if (op < 0 && is_name(t, "not") && is_name(peek2(p), "in")) {
            op = JINJA_CMP_NOTIN;
            p->pos++;
        }
        if (op < 0)
            break;
        if (n == 32)
            jinja_perr(p, t->line, "a comparison chain longer than 32");
        p->pos++;
        ops[n++] = (enum jinja_cmp)op;
        args[n] = parse_math1(p);
    }
    if (!n)
        return first;
    struct jx *x = node(p, JX_COMPARE, first->line);
    x->nargs = n + 1;
    x->args = jinja_alloc(p->a, (size_t)(n + 1) * sizeof(*x->args), p->f);
    x->ops = jinja_alloc(p->a, (size_t)n * sizeof(*x->ops), p->f);
    memcpy(x->args, args, (size_t)(n + 1) * sizeof(*args));
    memcpy(x->ops, ops, (size_t)n * sizeof(*ops));
    return x;
}

static struct jx *parse_not(struct jparse *p)
{
    struct jtok *t = peek(p);
    if (is_name(t, "not")) {
        p->pos++;
        enter(p, t->line);
        struct jx *x = node(p, JX_UNARY, t->line);
        x->op = JINJA_OP_NOT;
        x->a = parse_not(p);
        p->depth--;
        return x;
    }
    return parse_compare(p);
}

/* a and b and ... (@op "and", JX_AND over parse_not) or a or b ... (JX_OR over parse_and) */
static struct jx *parse_logic(struct jparse *p, const char *op, enum jx_kind kind,
                              struct jx *(*operand)(struct jparse *))
{
    struct jx *l = operand(p);
    int n = 0;
    while (is_name(peek(p), op)) {
        int line = next(p)->line;
        chain(p, &n, line);
        struct jx *x = node(p, kind, line);
        x->a = l;
        x->b = operand(p);
        l = x;
    }
    p->depth -= n;
    return l;
}

static struct jx *parse_and(struct jparse *p) { return parse_logic(p, "and", JX_AND, parse_not); }

static struct jx *parse_or(struct jparse *p) { return parse_logic(p, "or", JX_OR, parse_and); }

/* Jinja2's parse_condexpr: b if a else c, chained to the right */
static struct jx *parse_expr(struct jparse *p)
{
    enter(p, peek(p)->line);
    struct jx *x = parse_or(p);
    int n = 0;
    while (is_name(peek(p), "if")) {
        int line = next(p)->line;
        chain(p, &n, line);
        struct jx *c = node(p, JX_COND, line);
        c->b = x;
        c->a = parse_or(p);
        if (skip_name(p, "else"))
            c->c = parse_expr(p);
        x = c;
    }
    p->depth -= n + 1;
    return x;
}

/* An expression, or an implicit tuple of them (set x = a, b / for x in a, b). */
static struct jx *parse_tuple(struct jparse *p)
{
    int line = peek(p)->line;
    struct jx *first = parse_expr(p);
    if (!is_op(peek(p), ","))
        return first;
    struct jx *x = node(p, JX_TUPLE, line);
    struct jx *items[64];
    int n = 0;
    items[n++] = first;
    while (skip_op(p, ",")) {
        struct jtok *t = peek(p);
        if (t->t == JT_BLOCK_END || t->t == JT_VAR_END || is_name(t, "if"))
            break;
        if (n == 64)
            jinja_perr(p, line, "a tuple of more than 64 items");
        items[n++] = parse_expr(p);
    }
    x->nargs = n;
    x->args = jinja_alloc(p->a, (size_t)n * sizeof(*x->args), p->f);
    memcpy(x->args, items, (size_t)n * sizeof(*items));
    return x;
}

/* Names of an assignment target: a, or a, b, or (a, b). */
static void parse_targets(struct jparse *p, struct js *s)
{
    const char *names[16];
    int n = 0;
    bool paren = skip_op(p, "(");
    do {
        if (n == 16)
            jinja_perr(p, peek(p)->line, "more than 16 names in a target");
        if (paren && is_op(peek(p), ")"))
            break;
        names[n++] = expect_name(p);
    } while (skip_op(p, ","));
    if (paren)
        expect_op(p, ")");
    s->ntargets = n;
    s->targets = jinja_alloc(p->a, (size_t)n * sizeof(*s->targets), p->f);
    memcpy(s->targets, names, (size_t)n * sizeof(*names));
}

static struct js *stmt(struct jparse *p, enum js_kind k, int line)
{
    struct js *s = jinja_alloc(p->a, sizeof(*s), p->f);
    s->kind = k;
    s->line = line;
    return s;
}

static struct js *parse_body(struct jparse *p, const char *const *ends, int nends);

/* The statements up to the tag {% @end %}, that tag consumed. */
static struct js *parse_body_to(struct jparse *p, const char *end)
{
    const char *const ends[] = {end};
    struct js *body = parse_body(p, ends, 1);
    next(p);
    expect_end(p);
    return body;
}

/* {% if %} ... {% elif %} ... {% else %} ... {% endif %} */
static struct js *parse_if(struct jparse *p, int line)
{
    struct js *s = stmt(p, JS_IF, line);
    s->expr = parse_tuple(p);
    expect_end(p);
    static const char *const ends[] = {"elif", "else", "endif"};
    s->body = parse_body(p, ends, 3);
    struct js *cur = s;
    for (;;) {
        struct jtok *e = next(p);
        if (!strcmp(e->s, "elif")) {
            struct js *el = stmt(p, JS_IF, e->line);
            el->expr = parse_tuple(p);
            expect_end(p);
            el->body = parse_body(p, ends, 3);
            cur->orelse = el;
            cur = el;
        } else if (!strcmp(e->s, "else")) {
            expect_end(p);
            cur->orelse = parse_body_to(p, "endif");
            break;
        } else {
            expect_end(p);
            break;
        }
    }
    return s;
}

/* {% for targets in items [if cond] %} ... [{% else %} ...] {% endfor %} */
static struct js *parse_for(struct jparse *p, int line)
{
    struct js *s = stmt(p, JS_FOR, line);
    parse_targets(p, s);
    if (!skip_name(p, "in"))
        jinja_perr(p, line, "for: expected 'in'");
    /* the iterable stops before 'if' (the filter) and 'recursive' */
    s->expr = parse_or(p);
    if (is_op(peek(p), ",")) {
        struct jx *tup = node(p, JX_TUPLE, line);
        struct jx *items[64];
        int n = 0;
        items[n++] = s->expr;
        while (skip_op(p, ",") && peek(p)->t != JT_BLOCK_END && !is_name(peek(p), "if")) {
            if (n == 64)
                jinja_perr(p, line, "a tuple of more than 64 items");
            items[n++] = parse_or(p);
        }
        tup->nargs = n;
        tup->args = jinja_alloc(p->a, (size_t)n * sizeof(*items), p->f);
        memcpy(tup->args, items, (size_t)n * sizeof(*items));
        s->expr = tup;
    }
    if (skip_name(p, "if"))
        s->cond = parse_expr(p);
    if (is_name(peek(p), "recursive"))
        jinja_perr(p, line, "recursive for loops are not supported");
    expect_end(p);
    static const char *const ends[] = {"else", "endfor"};
    s->body = parse_body(p, ends, 2);
    if (!strcmp(next(p)->s, "else")) {
        expect_end(p);
        static const char *const ends2[] = {"endfor"};
        s->orelse = parse_body(p, ends2, 1);
        next(p);
    }
    expect_end(p);
    return s;
}

/* {% set targets = expr %}, {% set ns.attr = expr %} or {% set name [| filters] %} ... {% endset %}
 */
static struct js *parse_set(struct jparse *p, int line)
{
    struct js *s = stmt(p, JS_SET, line);
    if (peek(p)->t == JT_NAME && is_op(peek2(p), ".")) {
        s->ntargets = 1;
        s->targets = jinja_alloc(p->a, sizeof(*s->targets), p->f);
        s->targets[0] = next(p)->s;
        p->pos++;
        s->attr = expect_name(p);
        expect_op(p, "=");
        s->expr = parse_tuple(p);
        expect_end(p);
    } else {
        parse_targets(p, s);
        if (skip_op(p, "=")) {
            s->expr = parse_tuple(p);
            expect_end(p);
        } else {
            s->kind = JS_SETBLOCK;
            if (s->ntargets != 1)
                jinja_perr(p, line, "a set block assigns one name");
            while (skip_op(p, "|"))
                s->filter = parse_filter(p, s->filter, line);
            expect_end(p);
            s->body = parse_body_to(p, "endset");
        }
    }
    return s;
}

/* {% macro name(params = defaults) %} ... {% endmacro [name] %} */
static struct js *parse_macro(struct jparse *p, int line)
{
    struct js *s = stmt(p, JS_MACRO, line);
    s->name = expect_name(p);
    expect_op(p, "(");
    const char *names[32];
    struct jx *defs[32];
    int n = 0;
    while (!skip_op(p, ")")) {
        if (n)
            expect_op(p, ",");
        if (skip_op(p, ")"))
            break;
        if (n == 32)
            jinja_perr(p, line, "a macro of more than 32 parameters");
        names[n] = expect_name(p);
        defs[n] = skip_op(p, "=") ? parse_expr(p) : NULL;
        n++;
    }
    s->ntargets = n;
    s->targets = jinja_alloc(p->a, (size_t)n * sizeof(*names) + 1, p->f);
    s->defaults = jinja_alloc(p->a, (size_t)n * sizeof(*defs) + 1, p->f);
    memcpy(s->targets, names, (size_t)n * sizeof(*names));
    memcpy(s->defaults, defs, (size_t)n * sizeof(*defs));
    expect_end(p);
    static const char *const ends[] = {"endmacro"};
    s->body = parse_body(p, ends, 1);
    next(p);
    if (peek(p)->t == JT_NAME && !strcmp(peek(p)->s, s->name))
        p->pos++;
    expect_end(p);
    return s;
}

/* {% filter f | g %} ... {% endfilter %} */
static struct js *parse_filter_block(struct jparse *p, int line)
{
    struct js *s = stmt(p, JS_FILTER, line);
    do
        s->filter = parse_filter(p, s->filter, line);
    while (skip_op(p, "|"));
    expect_end(p);
    s->body = parse_body_to(p, "endfilter");
    return s;
}

static struct js *parse_break(struct jparse *p, int line)
{
    struct js *s = stmt(p, JS_BREAK, line);
    expect_end(p);
    return s;
}

static struct js *parse_continue(struct jparse *p, int line)
{
    struct js *s = stmt(p, JS_CONTINUE, line);
    expect_end(p);
    return s;
}

/* the tags and their parsers */
static const struct {
    const char *name;
    struct js *(*parse)(struct jparse *p, int line);
} tags[] = {
    {"if", parse_if},
    {"for", parse_for},
    {"set", parse_set},
    {"macro", parse_macro},
    {"filter", parse_filter_block},
    {"break", parse_break},
    {"continue", parse_continue},
};

/* After "{%": the tag's name is at the cursor. */
static struct js *parse_statement(struct jparse *p)
{
    struct jtok *t = next(p);
    if (t->t != JT_NAME)
        jinja_perr(p, t->line, "expected a tag name after {%");
    const char *w = t->s;
    int line = t->line;
    struct js *s = NULL;
    enter(p, line);
    for (size_t i = 0; i < sizeof(tags) / sizeof(*tags) && !s; i++)
        if (!strcmp(w, tags[i].name))
            s = tags[i].parse(p, line);
    if (!s)
        jinja_throw(p->f, -EINVAL, "line %d: unknown or unsupported tag '%s'", line, w);
    p->depth--;
    return s;
}

/* Statements until a tag named one of @ends (left at its name) or, with no @ends, the end. */
static struct js *parse_body(struct jparse *p, const char *const *ends, int nends)
{
    struct js *head = NULL, **tail = &head;
    for (;;) {
        struct jtok *t = peek(p);
        struct js *s;
        if (t->t == JT_EOF) {
            if (nends)
                jinja_throw(p->f, -EINVAL, "line %d: the template ends before {%% %s %%}", t->line,
                            ends[nends - 1]);
            return head;
        } else if (t->t == JT_DATA) {
            p->pos++;
            s = stmt(p, JS_TEXT, t->line);
            s->text = t->s;
            s->len = t->n;
        } else if (t->t == JT_VAR_BEGIN) {
            p->pos++;
            s = stmt(p, JS_OUTPUT, t->line);
            s->expr = parse_tuple(p);
            if (next(p)->t != JT_VAR_END)
                jinja_perr(p, t->line, "expected the end of the expression (}})");
        } else if (t->t == JT_BLOCK_BEGIN) {
            struct jtok *u = peek2(p);
            for (int i = 0; i < nends; i++)
                if (is_name(u, ends[i])) {
                    p->pos++;
                    return head;
                }
            if (u->t == JT_NAME &&
                (!strncmp(u->s, "end", 3) || !strcmp(u->s, "elif") || !strcmp(u->s, "else")))
                jinja_throw(p->f, -EINVAL, "line %d: unexpected {%% %s %%}", u->line, u->s);
            p->pos++;
            s = parse_statement(p);
        } else {
            jinja_perr(p, t->line, "unexpected token");
        }
        *tail = s;
        tail = &s->next;
    }
}

struct js *jinja_parse(const char *src, size_t len, struct jarena *a, struct jfail *f, int depth)
{
    struct jparse p = {.a = a, .f = f, .max_depth = depth};
    jinja_lex(&p, src, len);
    return parse_body(&p, NULL, 0);
}
