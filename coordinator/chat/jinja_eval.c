/* SPDX-License-Identifier: MIT */
/* coordinator/chat/jinja_eval.c: rendering a parsed template - expressions (arithmetic as
 * Python's), scopes as Jinja2 keeps them (a for loop's body and a macro have their own; if does
 * not), the statements, and the API (coord_jinja_parse / render). */
#include "jinja_internal.h"
#include "utf8.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const struct coord_jinja_limits coord_jinja_default_limits = {
    .max_output = 8u << 20, .max_memory = 64u << 20, .max_steps = 10000000, .max_depth = 32};

#define PARSE_DEPTH 100         /* nested statements and expressions of a template */
#define TEMPLATE_MAX (1u << 20) /* bytes of a template's source */
#define TEMPLATE_MEMORY (64u << 20)

/* ---- scopes ---- */
static struct jscope *scope_new(struct jctx *c, struct jscope *parent)
{
    struct jscope *s = jinja_alloc(c->arena, sizeof(*s), c->fail);
    s->parent = parent;
    return s;
}

static void scope_set(struct jctx *c, struct jscope *s, const char *name, struct jv *v)
{
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->names[i], name)) {
            s->vals[i] = v;
            return;
        }
    if (s->n == s->cap) {
        int cap = s->cap ? s->cap * 2 : 2;
        const char **nn = jinja_alloc(c->arena, (size_t)cap * sizeof(*nn), c->fail);
        struct jv **nv = jinja_alloc(c->arena, (size_t)cap * sizeof(*nv), c->fail);
        if (s->n) {
            memcpy(nn, s->names, (size_t)s->n * sizeof(*nn));
            memcpy(nv, s->vals, (size_t)s->n * sizeof(*nv));
        }
        s->names = nn;
        s->vals = nv;
        s->cap = cap;
    }
    jinja_charge(c, (size_t)s->n);
    s->names[s->n] = name;
    s->vals[s->n++] = v;
}

static struct jv *scope_get(struct jctx *c, struct jscope *s, const char *name)
{
    for (; s; s = s->parent) {
        jinja_charge(c, (size_t)s->n / 8);
        for (int i = s->n - 1; i >= 0; i--)
            if (!strcmp(s->names[i], name))
                return s->vals[i];
    }
    return NULL;
}

/* ---- expressions ---- */
const char *const jinja_op_names[] = {
    [JINJA_OP_ADD] = "+",  [JINJA_OP_SUB] = "-",       [JINJA_OP_MUL] = "*",
    [JINJA_OP_DIV] = "/",  [JINJA_OP_FLOORDIV] = "//", [JINJA_OP_MOD] = "%",
    [JINJA_OP_POW] = "**", [JINJA_OP_CONCAT] = "~",    [JINJA_OP_NEG] = "-",
    [JINJA_OP_POS] = "+",  [JINJA_OP_NOT] = "not",
};
static struct jv *ev(struct jctx *c, const struct jx *x, struct jscope *sc);

/* @op of two integers (bools as 0 / 1), Python's way: floor division and a modulo with the
 * divisor's sign; past 64 bits fails */
static struct jv *arith_int(struct jctx *c, enum jinja_op op, int64_t x, int64_t y, int line)
{
    int64_t r = 0;
    bool ovf = false;
    switch (op) {
    case JINJA_OP_ADD:
        ovf = __builtin_add_overflow(x, y, &r);
        break;
    case JINJA_OP_SUB:
        ovf = __builtin_sub_overflow(x, y, &r);
        break;
    case JINJA_OP_MUL:
        ovf = __builtin_mul_overflow(x, y, &r);
        break;
    case JINJA_OP_FLOORDIV:
    case JINJA_OP_MOD:
        if (!y)
            jinja_err(c, line, "integer division or modulo by zero");
        if (x == INT64_MIN && y == -1) {
            ovf = op == JINJA_OP_FLOORDIV;
            break;
        }
        r = op == JINJA_OP_FLOORDIV ? x / y - ((x % y != 0) && ((x < 0) != (y < 0))) : x % y;
        if (op == JINJA_OP_MOD && r != 0 && ((r < 0) != (y < 0)))
            r += y;
        break;
    case JINJA_OP_POW:
        if (y < 0)
            return jinja_float(c, pow((double)x, (double)y));
        r = 1;
        for (int64_t i = 0; i < y && !ovf; i++) {
            ovf = __builtin_mul_overflow(r, x, &r);
            if (r == 0 || r == 1)
                break;
            if (r == -1 && x == -1) {
                r = (y % 2) ? -1 : 1;
                break;
            }
        }
        break;
    default: /* / is a float's; the others are not binary */
        break;
    }
    if (ovf)
        jinja_err(c, line, "an integer past 64 bits");
    return jinja_int(c, r);
}

/* @op of two numbers, one of them a float (or the operator /) */
static struct jv *arith_float(struct jctx *c, enum jinja_op op, double x, double y, int line)
{
    double r = 0;
    switch (op) {
    case JINJA_OP_ADD:
        r = x + y;
        break;
    case JINJA_OP_SUB:
        r = x - y;
        break;
    case JINJA_OP_MUL:
        r = x * y;
        break;
    case JINJA_OP_DIV:
    case JINJA_OP_FLOORDIV:
    case JINJA_OP_MOD:
        if (y == 0)
            jinja_err(c, line, "float division by zero");
        r = op == JINJA_OP_DIV ? x / y : op == JINJA_OP_FLOORDIV ? floor(x / y) : fmod(x, y);
        if (op == JINJA_OP_MOD && r != 0 && ((r < 0) != (y < 0)))
            r += y;
        break;
    case JINJA_OP_POW:
        r = pow(x, y);
        break;
    default:
        break;
    }
    return jinja_float(c, r);
}

/* str or list @a repeated @b times (an int or a bool) */
static struct jv *repeat(struct jctx *c, struct jv *a, struct jv *b, int line)
{
    int64_t k = jinja_num_i(b) < 0 ? 0 : jinja_num_i(b);
    size_t unit = a->t == JV_STR ? a->str.n : a->list.n;
    if (!unit) /* nothing repeated any number of times */
        k = 0;
    if (unit && (uint64_t)k > c->lim->max_output / unit)
        jinja_throw(c->fail, -E2BIG, "line %d: a repetition past the output limit", line);
    if (a->t == JV_STR) {
        struct jbuf s = {0};
        for (int64_t i = 0; i < k; i++)
            jinja_buf_put(c, &s, a->str.s, a->str.n);
        return jinja_mkstr(c, &s);
    }
    struct jv *r = jinja_list(c, unit * (size_t)k);
    r->tuple = a->tuple;
    for (int64_t i = 0; i < k; i++)
        memcpy(r->list.v + (size_t)i * unit, a->list.v, unit * sizeof(*r->list.v));
    return r;
}

/* a @op b for a binary operator: numbers, ~ of anything, + of two strs or two lists (tuples),
 * * of a str or list and an int */
static struct jv *arith(struct jctx *c, enum jinja_op op, struct jv *a, struct jv *b, int line)
{
    if (op == JINJA_OP_CONCAT) {
        struct jbuf s = {0};
        jinja_str_into(c, &s, a, false, line);
        jinja_str_into(c, &s, b, false, line);
        return jinja_mkstr(c, &s);
    }
    if (a->t == JV_UNDEF)
        jinja_undefined_error(c, a, line);
    if (b->t == JV_UNDEF)
        jinja_undefined_error(c, b, line);
    if (jinja_is_num(a) && jinja_is_num(b)) {
        if (a->t != JV_FLOAT && b->t != JV_FLOAT && op != JINJA_OP_DIV)
            return arith_int(c, op, jinja_num_i(a), jinja_num_i(b), line);
        return arith_float(c, op, jinja_num_f(a), jinja_num_f(b), line);
    }
    if (op == JINJA_OP_ADD && a->t == JV_STR && b->t == JV_STR) {
        struct jbuf s = {0};
        jinja_buf_put(c, &s, a->str.s, a->str.n);
        jinja_buf_put(c, &s, b->str.s, b->str.n);
        return jinja_mkstr(c, &s);
    }
    if (op == JINJA_OP_ADD && a->t == JV_LIST && b->t == JV_LIST && a->tuple == b->tuple) {
        struct jv *r = jinja_list(c, a->list.n + b->list.n);
        r->tuple = a->tuple;
        memcpy(r->list.v, a->list.v, a->list.n * sizeof(*r->list.v));
        memcpy(r->list.v + a->list.n, b->list.v, b->list.n * sizeof(*r->list.v));
        return r;
    }
    if (op == JINJA_OP_MUL && (a->t == JV_INT || a->t == JV_BOOL) &&
        (b->t == JV_STR || b->t == JV_LIST))
        return repeat(c, b, a, line);
    if (op == JINJA_OP_MUL && (b->t == JV_INT || b->t == JV_BOOL) &&
        (a->t == JV_STR || a->t == JV_LIST))
        return repeat(c, a, b, line);
    if (op == JINJA_OP_ADD && a->t == JV_STR)
        jinja_err(c, line, "can only concatenate str (not \"%s\") to str", jinja_type_name(b));
    jinja_err(c, line, "unsupported operand type(s) for %s: '%s' and '%s'", jinja_op_names[op],
              jinja_type_name(a), jinja_type_name(b));
}

static bool contains(struct jctx *c, struct jv *hay, struct jv *needle, int line)
{
    switch (hay->t) {
    case JV_STR:
        if (needle->t != JV_STR)
            jinja_err(c, line, "'in <string>' requires string as left operand, not %s",
                      jinja_type_name(needle));
        jinja_charge(c, hay->str.n / 16);
        return needle->str.n == 0 ||
               memmem(hay->str.s, hay->str.n, needle->str.s, needle->str.n) != NULL;
    case JV_LIST:
        for (size_t i = 0; i < hay->list.n; i++)
            if (jinja_equal(c, hay->list.v[i], needle))
                return true;
        return false;
    case JV_DICT:
        return jinja_dict_get(c, hay, needle) != NULL;
    case JV_UNDEF:
        return false;
    default:
        jinja_err(c, line, "argument of type '%s' is not iterable", jinja_type_name(hay));
    }
}

static struct jv *eval_args(struct jctx *c, const struct jx *x, struct jscope *sc, struct jv ***out)
{
    *out = jinja_alloc(c->arena, (size_t)x->nargs * sizeof(**out) + 1, c->fail);
    for (int i = 0; i < x->nargs; i++)
        (*out)[i] = ev(c, x->args[i], sc);
    return NULL;
}

/* A filter chain applied to @input (where the chain's innermost a is NULL) or to its a. */
static struct jv *eval_filter(struct jctx *c, const struct jx *x, struct jscope *sc,
                              struct jv *input)
{
    struct jv *v = !x->a                     ? input
                   : x->a->kind == JX_FILTER ? eval_filter(c, x->a, sc, input)
                                             : ev(c, x->a, sc);
    struct jv **args;
    eval_args(c, x, sc, &args);
    return jinja_filter(c, x->name, v, args, x->kw, x->nargs, x->line);
}

/* -v, +v, not v */
static struct jv *unary(struct jctx *c, enum jinja_op op, struct jv *v, int line)
{
    if (op == JINJA_OP_NOT)
        return jinja_bool(!jinja_truthy(v));
    if (v->t == JV_UNDEF)
        jinja_undefined_error(c, v, line);
    if (!jinja_is_num(v))
        jinja_err(c, line, "bad operand type for unary %s: '%s'", jinja_op_names[op],
                  jinja_type_name(v));
    if (op == JINJA_OP_POS)
        return v->t == JV_BOOL ? jinja_int(c, v->b) : v;
    if (v->t == JV_FLOAT)
        return jinja_float(c, -v->f);
    if (jinja_num_i(v) == INT64_MIN)
        jinja_err(c, line, "an integer past 64 bits");
    return jinja_int(c, -jinja_num_i(v));
}

/* a op b op c ...: each comparison in turn, stopping at the first false one */
static struct jv *compare_chain(struct jctx *c, const struct jx *x, struct jscope *sc)
{
    struct jv *l = ev(c, x->args[0], sc);
    for (int i = 0; i < x->nargs - 1; i++) {
        struct jv *r = ev(c, x->args[i + 1], sc);
        bool ok;
        switch (x->ops[i]) {
        case JINJA_CMP_EQ:
            ok = jinja_equal(c, l, r);
            break;
        case JINJA_CMP_NE:
            ok = !jinja_equal(c, l, r);
            break;
        case JINJA_CMP_LT:
            ok = jinja_compare(c, l, r, x->line) < 0;
            break;
        case JINJA_CMP_LE:
            ok = jinja_compare(c, l, r, x->line) <= 0;
            break;
        case JINJA_CMP_GT:
            ok = jinja_compare(c, l, r, x->line) > 0;
            break;
        case JINJA_CMP_GE:
            ok = jinja_compare(c, l, r, x->line) >= 0;
            break;
        case JINJA_CMP_IN:
            ok = contains(c, r, l, x->line);
            break;
        default:
            ok = !contains(c, r, l, x->line);
            break;
        }
        if (!ok)
            return jinja_shared(&jinja_false);
        l = r;
    }
    return jinja_shared(&jinja_true);
}

/* {k: v, ...}: keys must be hashable */
static struct jv *dict_display(struct jctx *c, const struct jx *x, struct jscope *sc)
{
    struct jv *d = jinja_dict(c, (size_t)x->nargs / 2);
    for (int i = 0; i + 1 < x->nargs; i += 2) {
        struct jv *k = ev(c, x->args[i], sc);
        if (k->t == JV_LIST && !k->tuple)
            jinja_err(c, x->line, "unhashable type: 'list'");
        if (k->t == JV_DICT || k->t == JV_NS)
            jinja_err(c, x->line, "unhashable type: 'dict'");
        jinja_dict_put(c, d, k, ev(c, x->args[i + 1], sc));
    }
    return d;
}

static struct jv *ev(struct jctx *c, const struct jx *x, struct jscope *sc)
{
    jinja_charge(c, 1);
    switch (x->kind) {
    case JX_LIT:
        return x->lit;
    case JX_NAME: {
        struct jv *v = scope_get(c, sc, x->name);
        if (!v)
            v = jinja_global(x->name);
        return v ? v : jinja_undef(c, "'%s' is undefined", x->name);
    }
    case JX_ATTR:
        return jinja_getattr(c, ev(c, x->a, sc), x->name, x->line);
    case JX_ITEM: {
        struct jv *o = ev(c, x->a, sc);
        return jinja_getitem(c, o, ev(c, x->b, sc), x->line);
    }
    case JX_SLICE: {
        struct jv *o = ev(c, x->a, sc), *parts[3];
        for (int i = 0; i < 3; i++)
            parts[i] = x->args[i] ? ev(c, x->args[i], sc) : NULL;
        return jinja_slice(c, o, parts, x->line);
    }
    case JX_CALL: {
        struct jv *f = ev(c, x->a, sc), **args;
        eval_args(c, x, sc, &args);
        return jinja_call(c, f, args, x->kw, x->nargs, x->line);
    }
    case JX_FILTER:
        return eval_filter(c, x, sc, NULL);
    case JX_TEST: {
        struct jv *v = ev(c, x->a, sc), **args;
        eval_args(c, x, sc, &args);
        bool r = jinja_test(c, x->name, v, args, x->nargs, x->line);
        return jinja_bool(x->negated ? !r : r);
    }
    case JX_UNARY:
        return unary(c, x->op, ev(c, x->a, sc), x->line);
    case JX_BINARY: {
        struct jv *a = ev(c, x->a, sc);
        return arith(c, x->op, a, ev(c, x->b, sc), x->line);
    }
    case JX_AND: {
        struct jv *a = ev(c, x->a, sc);
        return jinja_truthy(a) ? ev(c, x->b, sc) : a;
    }
    case JX_OR: {
        struct jv *a = ev(c, x->a, sc);
        return jinja_truthy(a) ? a : ev(c, x->b, sc);
    }
    case JX_COMPARE:
        return compare_chain(c, x, sc);
    case JX_COND:
        if (jinja_truthy(ev(c, x->a, sc)))
            return ev(c, x->b, sc);
        return x->c ? ev(c, x->c, sc)
                    : jinja_undef(c, "the if expression was false and had no else");
    case JX_LIST:
    case JX_TUPLE: {
        struct jv *l = jinja_list(c, (size_t)x->nargs);
        l->tuple = x->kind == JX_TUPLE;
        for (int i = 0; i < x->nargs; i++)
            l->list.v[i] = ev(c, x->args[i], sc);
        return l;
    }
    case JX_DICT:
        return dict_display(c, x, sc);
    }
    jinja_err(c, x->line, "an unknown expression");
}

/* ---- statements ---- */
enum { FLOW_NEXT, FLOW_BREAK, FLOW_CONTINUE };

static int exec_body(struct jctx *c, struct jbuf *out, const struct js *s, struct jscope *sc);

/* Binds @v to @s's targets in @sc (several names: unpacked). */
static void assign(struct jctx *c, const struct js *s, struct jscope *sc, struct jv *v)
{
    if (s->ntargets == 1) {
        scope_set(c, sc, s->targets[0], v);
        return;
    }
    struct jv *items = jinja_iter_list(c, v, s->line);
    if (items->list.n != (size_t)s->ntargets)
        jinja_err(c, s->line, "cannot unpack %zu values into %d names", items->list.n, s->ntargets);
    for (int i = 0; i < s->ntargets; i++)
        scope_set(c, sc, s->targets[i], items->list.v[i]);
}

static struct jv *loop_cycle(struct jctx *c, struct jv *self, struct jv **args, const char **kw,
                             int n, int line)
{
    (void)kw;
    if (!n)
        jinja_err(c, line, "no items for cycling given");
    return args[self->loop.i % (size_t)n];
}

/* loop.@name */
struct jv *jinja_loop_attr(struct jctx *c, struct jv *l, const char *name)
{
    static const struct jv no_prev = {.t = JV_UNDEF, .undef = "there is no previous item"};
    static const struct jv no_next = {.t = JV_UNDEF, .undef = "there is no next item"};
    size_t i = l->loop.i, n = l->loop.items->list.n;
    static const char *const ints[] = {"index",  "index0", "revindex", "revindex0",
                                       "length", "depth",  "depth0"};
    const int64_t vals[] = {
        (int64_t)i + 1, (int64_t)i, (int64_t)(n - i), (int64_t)(n - i - 1), (int64_t)n, 1, 0};
    for (int k = 0; k < 7; k++)
        if (!strcmp(name, ints[k]))
            return jinja_int(c, vals[k]);
    if (!strcmp(name, "first"))
        return jinja_bool(i == 0);
    if (!strcmp(name, "last"))
        return jinja_bool(i + 1 == n);
    if (!strcmp(name, "previtem"))
        return i ? l->loop.items->list.v[i - 1] : jinja_shared(&no_prev);
    if (!strcmp(name, "nextitem"))
        return i + 1 < n ? l->loop.items->list.v[i + 1] : jinja_shared(&no_next);
    if (!strcmp(name, "cycle")) {
        struct jv *f = jinja_new(c, JV_FUNC);
        f->func.fn = loop_cycle;
        f->func.self = l;
        f->func.name = "cycle";
        return f;
    }
    return jinja_undef(c, "'LoopContext' has no attribute '%s'", name);
}

static int exec_for(struct jctx *c, struct jbuf *out, const struct js *s, struct jscope *sc)
{
    struct jv *items = jinja_iter_list(c, ev(c, s->expr, sc), s->line);
    if (s->cond) { /* the filter sees the targets, not loop */
        struct jv *kept = jinja_list(c, items->list.n);
        size_t k = 0;
        for (size_t i = 0; i < items->list.n; i++) {
            struct jscope *f = scope_new(c, sc);
            assign(c, s, f, items->list.v[i]);
            if (jinja_truthy(ev(c, s->cond, f)))
                kept->list.v[k++] = items->list.v[i];
        }
        kept->list.n = k;
        items = kept;
    }
    bool completed = false;
    size_t n = items->list.n;
    for (size_t i = 0; i < n; i++) {
        jinja_charge(c, 1);
        struct jscope *body = scope_new(c, sc);
        assign(c, s, body, items->list.v[i]);
        struct jv *loop = jinja_new(c, JV_LOOP);
        loop->loop.items = items;
        loop->loop.i = i;
        scope_set(c, body, "loop", loop);
        int f = exec_body(c, out, s->body, body);
        completed |= f == FLOW_NEXT;
        if (f == FLOW_BREAK)
            break;
    }
    /* Jinja2 runs else unless a body ran to its end: break or continue in every one counts as
     * no iteration */
    if (!completed && s->orelse)
        return exec_body(c, out, s->orelse, scope_new(c, sc));
    return FLOW_NEXT;
}

static struct jv *render_to_string(struct jctx *c, const struct js *body, struct jscope *sc)
{
    struct jbuf b = {0};
    exec_body(c, &b, body, sc);
    struct jv *r = jinja_str(c, "", 0);
    r->str.s = b.s ? b.s : "";
    r->str.n = b.n;
    return r;
}

struct jv *jinja_call_macro(struct jctx *c, struct jv *m, struct jv **args, const char **kw, int n,
                            int line)
{
    const struct js *d = m->macro.def;
    if (++c->depth > c->lim->max_depth)
        jinja_throw(c->fail, -E2BIG, "line %d: macro calls nested deeper than %d", line,
                    c->lim->max_depth);
    struct jscope *sc = scope_new(c, m->macro.closure);
    struct jv **bound = jinja_alloc(c->arena, (size_t)d->ntargets * sizeof(*bound) + 1, c->fail);
    int pos = 0;
    for (int i = 0; i < n; i++) {
        if (!kw[i]) {
            if (pos >= d->ntargets)
                jinja_err(c, line, "macro '%s' takes not more than %d argument(s)", d->name,
                          d->ntargets);
            bound[pos++] = args[i];
            continue;
        }
        int k = 0;
        while (k < d->ntargets && strcmp(d->targets[k], kw[i]))
            k++;
        if (k == d->ntargets)
            jinja_err(c, line, "macro '%s' has no argument '%s'", d->name, kw[i]);
        bound[k] = args[i];
    }
    for (int i = 0; i < d->ntargets; i++) {
        struct jv *v = bound[i];
        if (!v)
            v = d->defaults[i] ? ev(c, d->defaults[i], sc)
                               : jinja_undef(c, "parameter '%s' was not provided", d->targets[i]);
        scope_set(c, sc, d->targets[i], v);
    }
    struct jv *r = render_to_string(c, d->body, sc);
    c->depth--;
    return r;
}

static int exec_body(struct jctx *c, struct jbuf *out, const struct js *s, struct jscope *sc)
{
    for (; s; s = s->next) {
        jinja_charge(c, 1);
        switch (s->kind) {
        case JS_TEXT:
            jinja_buf_put(c, out, s->text, s->len);
            break;
        case JS_OUTPUT:
            jinja_str_into(c, out, ev(c, s->expr, sc), false, s->line);
            break;
        case JS_IF: {
            const struct js *b = jinja_truthy(ev(c, s->expr, sc)) ? s->body : s->orelse;
            if (b) {
                int f = exec_body(c, out, b, sc);
                if (f != FLOW_NEXT)
                    return f;
            }
            break;
        }
        case JS_FOR: {
            int f = exec_for(c, out, s, sc);
            if (f != FLOW_NEXT)
                return f;
            break;
        }
        case JS_SET: {
            struct jv *v = ev(c, s->expr, sc);
            if (!s->attr) {
                assign(c, s, sc, v);
                break;
            }
            struct jv *ns = scope_get(c, sc, s->targets[0]);
            if (!ns || ns->t != JV_NS)
                jinja_err(c, s->line, "cannot assign attribute on non-namespace object");
            jinja_dict_put(c, ns, jinja_str(c, s->attr, strlen(s->attr)), v);
            break;
        }
        case JS_SETBLOCK: {
            struct jv *v = render_to_string(c, s->body, sc);
            if (s->filter)
                v = eval_filter(c, s->filter, sc, v);
            assign(c, s, sc, v);
            break;
        }
        case JS_MACRO: {
            struct jv *m = jinja_new(c, JV_MACRO);
            m->macro.def = s;
            m->macro.closure = sc;
            scope_set(c, sc, s->name, m);
            break;
        }
        case JS_FILTER: {
            struct jv *v = eval_filter(c, s->filter, sc, render_to_string(c, s->body, sc));
            jinja_str_into(c, out, v, false, s->line);
            break;
        }
        case JS_BREAK:
            return FLOW_BREAK;
        case JS_CONTINUE:
            return FLOW_CONTINUE;
        }
    }
    return FLOW_NEXT;
}

/* ---- the API ---- */

int coord_jinja_parse(const char *src, size_t len, struct coord_jinja **out, char *err, size_t elen)
{
    *out = NULL;
    if (len > TEMPLATE_MAX) {
        snprintf(err, elen, "the template is larger than %u MiB", TEMPLATE_MAX >> 20);
        return -E2BIG;
    }
    struct coord_jinja *t = calloc(1, sizeof(*t));
    if (!t) {
        snprintf(err, elen, "out of memory");
        return -ENOMEM;
    }
    t->arena.limit = TEMPLATE_MEMORY;
    struct jfail *f = malloc(sizeof(*f)); /* on the heap: see coord_jinja_render() */
    if (!f) {
        free(t);
        snprintf(err, elen, "out of memory");
        return -ENOMEM;
    }
    if (setjmp(f->jb)) {
        snprintf(err, elen, "%s", f->msg);
        int rc = f->rc;
        jinja_arena_free(&t->arena);
        free(t);
        free(f);
        return rc;
    }
    if (memchr(src, 0, len))
        jinja_throw(f, -EINVAL, "the template holds a NUL byte");
    if (!coord_utf8_valid(src, len, NULL))
        jinja_throw(f, -EINVAL, "the template is not UTF-8 text");
    t->body = jinja_parse(src, len, &t->arena, f, PARSE_DEPTH);
    free(f);
    *out = t;
    return 0;
}

void coord_jinja_free(struct coord_jinja *t)
{
    if (!t)
        return;
    jinja_arena_free(&t->arena);
    free(t);
}

int coord_jinja_render(const struct coord_jinja *t, json_t *vars,
                       const struct coord_jinja_limits *lim, char **out, size_t *olen, char *err,
                       size_t elen)
{
    *out = NULL;
    *olen = 0;
    /* what the render changes lives on the heap: after longjmp, C leaves the values of changed
     * non-volatile locals indeterminate (C11 7.13.2.1), not those of objects behind a pointer
     * that did not change */
    struct render_state {
        struct jarena arena;
        struct jfail f;
        struct jctx c;
    } *st = calloc(1, sizeof(*st));
    if (!st) {
        snprintf(err, elen, "out of memory");
        return -ENOMEM;
    }
    st->arena.limit = (lim ? lim : &coord_jinja_default_limits)->max_memory;
    st->c = (struct jctx){
        .fail = &st->f, .arena = &st->arena, .lim = lim ? lim : &coord_jinja_default_limits};
    if (setjmp(st->f.jb)) {
        snprintf(err, elen, "%s", st->f.msg);
        jinja_arena_free(&st->arena);
        int rc = st->f.rc;
        free(st);
        return rc;
    }
    struct jctx *c = &st->c;
    c->globals = scope_new(c, NULL);
    if (vars && json_is_object(vars)) {
        const char *k;
        json_t *v;
        json_object_foreach(vars, k, v)
        {
            size_t n = strlen(k);
            char *name = jinja_alloc(&st->arena, n + 1, &st->f);
            memcpy(name, k, n);
            scope_set(c, c->globals, name, jinja_from_json(c, v, 0));
        }
    }
    struct jbuf b = {0};
    exec_body(c, &b, t->body, scope_new(c, c->globals));
    char *r = malloc(b.n + 1);
    if (!r)
        jinja_throw(&st->f, -ENOMEM, "out of memory");
    if (b.n)
        memcpy(r, b.s, b.n);
    r[b.n] = 0;
    *out = r;
    *olen = b.n;
    jinja_arena_free(&st->arena);
    free(st);
    return 0;
}
