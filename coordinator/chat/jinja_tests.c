/* SPDX-License-Identifier: MIT */
/* coordinator/chat/jinja_tests.c: Jinja2's tests (`v is name(args)`), one table. */
#include "jinja_internal.h"

#include <string.h>

#define ARGS struct jctx *c, const char *name, struct jv *v, struct jv **args, int n, int line
/* a test that only looks at the value's type */
#define TYPE_TEST(fname, expr)                                                                     \
    static bool fname(ARGS) { return expr; }

TYPE_TEST(t_defined, v->t != JV_UNDEF)
TYPE_TEST(t_undefined, v->t == JV_UNDEF)
TYPE_TEST(t_none, v->t == JV_NONE)
TYPE_TEST(t_boolean, v->t == JV_BOOL)
TYPE_TEST(t_true, v->t == JV_BOOL && v->b)
TYPE_TEST(t_false, v->t == JV_BOOL && !v->b)
TYPE_TEST(t_integer, v->t == JV_INT)
TYPE_TEST(t_float, v->t == JV_FLOAT)
TYPE_TEST(t_number, v->t == JV_INT || v->t == JV_FLOAT || v->t == JV_BOOL)
TYPE_TEST(t_string, v->t == JV_STR)
TYPE_TEST(t_mapping, v->t == JV_DICT)
TYPE_TEST(t_iterable, v->t == JV_STR || v->t == JV_LIST || v->t == JV_DICT || v->t == JV_UNDEF)
TYPE_TEST(t_sequence, v->t == JV_STR || v->t == JV_LIST || v->t == JV_DICT)
TYPE_TEST(t_callable, v->t == JV_MACRO || v->t == JV_FUNC)

/* lower / upper: str.islower() / str.isupper() */
static bool t_case(ARGS)
{
    if (v->t != JV_STR)
        return false;
    struct jv *r = jinja_method(c, v, name[0] == 'l' ? "islower" : "isupper");
    return jinja_truthy(jinja_call(c, r, NULL, NULL, 0, line));
}

/* odd / even / divisibleby */
static bool t_parity(ARGS)
{
    if (v->t != JV_INT && v->t != JV_BOOL)
        jinja_err(c, line, "test %s: expected an integer", name);
    int64_t x = v->t == JV_INT ? v->i : v->b;
    if (name[0] == 'o')
        return x % 2 != 0;
    if (name[0] == 'e')
        return x % 2 == 0;
    struct jv *a = n > 0 ? args[0] : NULL;
    int64_t d = a && (a->t == JV_INT) ? a->i : 0;
    if (!d)
        jinja_err(c, line, "divisibleby: expected a non-zero integer");
    return d == -1 || x % d == 0;
}

static bool t_sameas(ARGS)
{
    struct jv *a = n > 0 ? args[0] : NULL;
    return a && (v == a || (v->t == a->t && (v->t == JV_NONE || v->t == JV_UNDEF ||
                                             (v->t == JV_BOOL && v->b == a->b))));
}

static bool t_in(ARGS)
{
    struct jv *a = args[0];
    if (a->t == JV_STR)
        return v->t == JV_STR && memmem(a->str.s, a->str.n, v->str.s, v->str.n);
    struct jv *items = jinja_iter_list(c, a, line);
    for (size_t i = 0; i < items->list.n; i++)
        if (jinja_equal(c, items->list.v[i], v))
            return true;
    return false;
}

/* the comparisons: eq, ne, lt, le, gt, ge and their other names */
static bool t_eq(ARGS) { return jinja_equal(c, v, args[0]); }
static bool t_ne(ARGS) { return !jinja_equal(c, v, args[0]); }
static bool t_lt(ARGS) { return jinja_compare(c, v, args[0], line) < 0; }
static bool t_le(ARGS) { return jinja_compare(c, v, args[0], line) <= 0; }
static bool t_gt(ARGS) { return jinja_compare(c, v, args[0], line) > 0; }
static bool t_ge(ARGS) { return jinja_compare(c, v, args[0], line) >= 0; }

#define COMPARE "test %s: expected a value to compare with"
/* sorted by name (strcmp: the operators first) */
const struct jinja_fn jinja_tests[] = {
    {"!=", 1, COMPARE, {.test = t_ne}},
    {"<", 1, COMPARE, {.test = t_lt}},
    {"<=", 1, COMPARE, {.test = t_le}},
    {"==", 1, COMPARE, {.test = t_eq}},
    {">", 1, COMPARE, {.test = t_gt}},
    {">=", 1, COMPARE, {.test = t_ge}},
    {"boolean", 0, NULL, {.test = t_boolean}},
    {"callable", 0, NULL, {.test = t_callable}},
    {"defined", 0, NULL, {.test = t_defined}},
    {"divisibleby", 0, NULL, {.test = t_parity}},
    {"eq", 1, COMPARE, {.test = t_eq}},
    {"equalto", 1, COMPARE, {.test = t_eq}},
    {"even", 0, NULL, {.test = t_parity}},
    {"false", 0, NULL, {.test = t_false}},
    {"float", 0, NULL, {.test = t_float}},
    {"ge", 1, COMPARE, {.test = t_ge}},
    {"greaterthan", 1, COMPARE, {.test = t_gt}},
    {"gt", 1, COMPARE, {.test = t_gt}},
    {"in", 1, "test %s: expected a container", {.test = t_in}},
    {"integer", 0, NULL, {.test = t_integer}},
    {"iterable", 0, NULL, {.test = t_iterable}},
    {"le", 1, COMPARE, {.test = t_le}},
    {"lessthan", 1, COMPARE, {.test = t_lt}},
    {"lower", 0, NULL, {.test = t_case}},
    {"lt", 1, COMPARE, {.test = t_lt}},
    {"mapping", 0, NULL, {.test = t_mapping}},
    {"ne", 1, COMPARE, {.test = t_ne}},
    {"none", 0, NULL, {.test = t_none}},
    {"number", 0, NULL, {.test = t_number}},
    {"odd", 0, NULL, {.test = t_parity}},
    {"sameas", 0, NULL, {.test = t_sameas}},
    {"sequence", 0, NULL, {.test = t_sequence}},
    {"string", 0, NULL, {.test = t_string}},
    {"true", 0, NULL, {.test = t_true}},
    {"undefined", 0, NULL, {.test = t_undefined}},
    {"upper", 0, NULL, {.test = t_case}},
};
const size_t jinja_ntests = sizeof(jinja_tests) / sizeof(*jinja_tests);

bool jinja_test(struct jctx *c, const char *name, struct jv *v, struct jv **args, int n, int line)
{
    const struct jinja_fn *t = jinja_lookup(jinja_tests, jinja_ntests, name);
    if (!t)
        jinja_err(c, line, "no test named '%s'", name);
    jinja_check_arity(c, t, NULL, n, line);
    return t->test(c, name, v, args, n, line);
}
