/* SPDX-License-Identifier: MIT */
/* coordinator/chat/jinja_methods.c: the str / dict / list methods an immutable sandbox allows,
 * one table per type, and the globals Hugging Face adds (raise_exception, strftime_now) with
 * Jinja's own (namespace, range, dict). Case mappings are ASCII's. */
#include "jinja_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ARGS                                                                                       \
    struct jctx *c, const char *name, struct jv *self, struct jv **args, const char **kw, int n,   \
        int line

/* ---- str ---- */
/* startswith / endswith: a prefix or a tuple of them */
static struct jv *m_startswith(ARGS)
{
    struct jv *a0 = jinja_arg(args, kw, n, 0, NULL);
    const char *s = self->str.s;
    size_t len = self->str.n;
    struct jv *opts = a0->t == JV_LIST && a0->tuple ? a0 : NULL;
    size_t k = opts ? opts->list.n : 1;
    for (size_t i = 0; i < k; i++) {
        struct jv *p = jinja_need_str(c, opts ? opts->list.v[i] : a0, name, line);
        if (p->str.n <= len && !memcmp(name[0] == 's' ? s : s + len - p->str.n, p->str.s, p->str.n))
            return jinja_shared(&jinja_true);
    }
    return jinja_shared(&jinja_false);
}

/* strip / lstrip / rstrip */
static struct jv *m_strip(ARGS)
{
    struct jv *a0 = jinja_arg(args, kw, n, 0, NULL);
    if (a0 && a0->t != JV_NONE)
        jinja_need_str(c, a0, name, line);
    return jinja_strip(c, self, a0 && a0->t != JV_NONE ? a0 : NULL,
                       name[0] == 'l'   ? 1
                       : name[0] == 'r' ? 2
                                        : 3);
}

/* split / rsplit */
static struct jv *m_split(ARGS)
{
    struct jv *sep = jinja_arg(args, kw, n, 0, "sep"), *mx = jinja_arg(args, kw, n, 1, "maxsplit");
    return jinja_split(c, self, sep, mx ? jinja_need_int(c, mx, name, line) : -1, name[0] == 'r',
                       line);
}

static struct jv *m_replace(ARGS)
{
    struct jv *a0 = jinja_arg(args, kw, n, 0, NULL), *a1 = jinja_arg(args, kw, n, 1, NULL);
    struct jv *a2 = jinja_arg(args, kw, n, 2, "count");
    return jinja_replace(c, self, a0, a1, a2 ? jinja_need_int(c, a2, name, line) : -1, line);
}

/* lower / upper / title / capitalize */
static struct jv *m_case(ARGS) { return jinja_case_map(c, self, jinja_case_of(name)); }

/* find / rfind / count: positions counted in characters */
static struct jv *m_find(ARGS)
{
    struct jv *a0 = jinja_arg(args, kw, n, 0, NULL);
    const char *s = self->str.s;
    size_t len = self->str.n;
    jinja_need_str(c, a0, name, line);
    jinja_charge(c, len / 16);
    size_t nl = a0->str.n;
    if (!nl) /* the empty string: found at 0 (find), at the end (rfind), between chars */
        return jinja_int(c,
                         name[0] == 'f' ? 0 : (int64_t)jinja_utf8_count(s, len) + (name[0] == 'c'));
    /* memmem is linear; positions are counted in characters as the search moves on */
    int64_t found = -1, cnt = 0, chars = 0;
    size_t at = 0;
    for (const char *f; at + nl <= len && (f = memmem(s + at, len - at, a0->str.s, nl));) {
        size_t i = (size_t)(f - s);
        chars += (int64_t)jinja_utf8_count(s + at, i - at);
        found = chars;
        cnt++;
        if (name[0] == 'f')
            break;
        chars += (int64_t)jinja_utf8_count(s + i, nl);
        at = i + nl;
    }
    return jinja_int(c, name[0] == 'c' ? cnt : found);
}

static struct jv *m_join(ARGS)
{
    struct jv *items = jinja_iter_list(c, jinja_arg(args, kw, n, 0, NULL), line);
    struct jbuf b = {0};
    for (size_t i = 0; i < items->list.n; i++) {
        if (i)
            jinja_buf_put(c, &b, self->str.s, self->str.n);
        struct jv *it = jinja_need_str(c, items->list.v[i], "join", line);
        jinja_buf_put(c, &b, it->str.s, it->str.n);
    }
    return jinja_mkstr(c, &b);
}

/* isspace / isdigit / isalpha / isalnum / islower / isupper, ASCII's but for spaces */
static struct jv *m_is(ARGS)
{
    const char *s = self->str.s;
    size_t len = self->str.n, w;
    bool any = false, all = true, cased = false, lower_upper = name[2] == 'l' || name[2] == 'u';
    for (size_t i = 0; i < len; i += w) {
        w = jinja_char_width(s + i, len - i);
        unsigned char ch = (unsigned char)s[i];
        bool ok;
        if (name[2] == 's') {
            ok = jinja_isspace_at(s + i, len - i, &w);
            w = jinja_char_width(s + i, len - i);
        } else if (name[2] == 'd') {
            ok = ch >= '0' && ch <= '9';
        } else if (!strcmp(name, "isalpha")) {
            ok = (ch | 32) >= 'a' && (ch | 32) <= 'z';
        } else if (!strcmp(name, "isalnum")) {
            ok = ((ch | 32) >= 'a' && (ch | 32) <= 'z') || (ch >= '0' && ch <= '9');
        } else {
            bool lo = ch >= 'a' && ch <= 'z', up = ch >= 'A' && ch <= 'Z';
            cased |= lo || up;
            ok = name[2] == 'l' ? !up : !lo;
        }
        any = true;
        all &= ok;
    }
    if (lower_upper)
        return jinja_bool(all && cased);
    return jinja_bool(any && all);
}

/* Python's line boundaries */
static struct jv *m_splitlines(ARGS)
{
    const char *s = self->str.s;
    size_t len = self->str.n, k = 0, b = 0;
    struct jv *l = jinja_list(c, jinja_utf8_count(s, len) + 1);
    for (size_t i = 0; i < len;) {
        const unsigned char *u = (const unsigned char *)s + i;
        size_t w = 0;
        if (*u == '\n' || *u == '\v' || *u == '\f' || (*u >= 0x1c && *u <= 0x1e))
            w = 1;
        else if (*u == '\r')
            w = i + 1 < len && u[1] == '\n' ? 2 : 1;
        else if (i + 1 < len && u[0] == 0xc2 && u[1] == 0x85)
            w = 2;
        else if (i + 2 < len && u[0] == 0xe2 && u[1] == 0x80 && (u[2] == 0xa8 || u[2] == 0xa9))
            w = 3;
        if (!w) {
            i += jinja_char_width(s + i, len - i);
            continue;
        }
        l->list.v[k++] = jinja_str(c, s + b, i - b);
        i += w;
        b = i;
    }
    if (b < len)
        l->list.v[k++] = jinja_str(c, s + b, len - b);
    l->list.n = k;
    return l;
}

#define AT_LEAST_1 "%s() takes at least 1 argument"
const struct jinja_fn jinja_str_methods[] = {
    {"capitalize", 0, NULL, {.method = m_case}},
    {"count", 1, AT_LEAST_1, {.method = m_find}},
    {"endswith", 1, AT_LEAST_1, {.method = m_startswith}},
    {"find", 1, AT_LEAST_1, {.method = m_find}},
    {"isalnum", 0, NULL, {.method = m_is}},
    {"isalpha", 0, NULL, {.method = m_is}},
    {"isdigit", 0, NULL, {.method = m_is}},
    {"islower", 0, NULL, {.method = m_is}},
    {"isspace", 0, NULL, {.method = m_is}},
    {"isupper", 0, NULL, {.method = m_is}},
    {"join", 1, "%s() takes exactly one argument", {.method = m_join}},
    {"lower", 0, NULL, {.method = m_case}},
    {"lstrip", 0, NULL, {.method = m_strip}},
    {"replace", 2, "%s() takes at least 2 arguments", {.method = m_replace}},
    {"rfind", 1, AT_LEAST_1, {.method = m_find}},
    {"rsplit", 0, NULL, {.method = m_split}},
    {"rstrip", 0, NULL, {.method = m_strip}},
    {"split", 0, NULL, {.method = m_split}},
    {"splitlines", 0, NULL, {.method = m_splitlines}},
    {"startswith", 1, AT_LEAST_1, {.method = m_startswith}},
    {"strip", 0, NULL, {.method = m_strip}},
    {"title", 0, NULL, {.method = m_case}},
    {"upper", 0, NULL, {.method = m_case}},
};
const size_t jinja_nstr_methods = sizeof(jinja_str_methods) / sizeof(*jinja_str_methods);

/* ---- dict ---- */
static struct jv *m_items(ARGS)
{
    struct jv *l = jinja_list(c, self->dict.n);
    for (size_t i = 0; i < self->dict.n; i++) {
        struct jv *t = jinja_list(c, 2);
        t->tuple = true;
        t->list.v[0] = self->dict.k[i];
        t->list.v[1] = self->dict.v[i];
        l->list.v[i] = t;
    }
    return l;
}

static struct jv *m_keys(ARGS)
{
    struct jv *l = jinja_list(c, self->dict.n);
    memcpy(l->list.v, self->dict.k, self->dict.n * sizeof(*l->list.v));
    return l;
}

static struct jv *m_values(ARGS)
{
    struct jv *l = jinja_list(c, self->dict.n);
    memcpy(l->list.v, self->dict.v, self->dict.n * sizeof(*l->list.v));
    return l;
}

static struct jv *m_get(ARGS)
{
    struct jv *k = jinja_arg(args, kw, n, 0, NULL), *d = jinja_arg(args, kw, n, 1, NULL);
    struct jv *v = jinja_dict_get(c, self, k);
    return v ? v : d ? d : jinja_shared(&jinja_none);
}

static struct jv *m_copy(ARGS)
{
    struct jv *d = jinja_dict(c, self->dict.n);
    for (size_t i = 0; i < self->dict.n; i++)
        jinja_dict_put(c, d, self->dict.k[i], self->dict.v[i]);
    return d;
}

const struct jinja_fn jinja_dict_methods[] = {
    {"copy", 0, NULL, {.method = m_copy}},
    {"get", 1, "%s expected at least 1 argument", {.method = m_get}},
    {"items", 0, NULL, {.method = m_items}},
    {"keys", 0, NULL, {.method = m_keys}},
    {"values", 0, NULL, {.method = m_values}},
};
const size_t jinja_ndict_methods = sizeof(jinja_dict_methods) / sizeof(*jinja_dict_methods);

/* ---- list ---- */
static struct jv *m_list_index(ARGS)
{
    struct jv *x = jinja_arg(args, kw, n, 0, NULL);
    for (size_t i = 0; x && i < self->list.n; i++)
        if (jinja_equal(c, self->list.v[i], x))
            return jinja_int(c, (int64_t)i);
    jinja_err(c, line, "the value is not in the list");
}

static struct jv *m_list_count(ARGS)
{
    struct jv *x = jinja_arg(args, kw, n, 0, NULL);
    int64_t k = 0;
    for (size_t i = 0; x && i < self->list.n; i++)
        k += jinja_equal(c, self->list.v[i], x);
    return jinja_int(c, k);
}

const struct jinja_fn jinja_list_methods[] = {
    {"count", 0, NULL, {.method = m_list_count}},
    {"index", 0, NULL, {.method = m_list_index}},
};
const size_t jinja_nlist_methods = sizeof(jinja_list_methods) / sizeof(*jinja_list_methods);

/* ---- binding and calling ---- */
struct jv *jinja_method(struct jctx *c, struct jv *o, const char *name)
{
    static const char *const dict_unsafe[] = {"clear",      "pop",    "popitem",
                                              "setdefault", "update", NULL};
    static const char *const list_unsafe[] = {"append", "clear",   "extend", "insert", "pop",
                                              "remove", "reverse", "sort",   NULL};
    const char *const *unsafe = o->t == JV_DICT   ? dict_unsafe
                                : o->t == JV_LIST ? list_unsafe
                                                  : NULL;
    for (int i = 0; unsafe && unsafe[i]; i++)
        if (!strcmp(unsafe[i], name))
            return jinja_undef(c, "access to attribute '%s' of '%s' object is unsafe.", name,
                               jinja_type_name(o));
    const struct jinja_fn *m =
        o->t == JV_STR    ? jinja_lookup(jinja_str_methods, jinja_nstr_methods, name)
        : o->t == JV_DICT ? jinja_lookup(jinja_dict_methods, jinja_ndict_methods, name)
        : o->t == JV_LIST ? jinja_lookup(jinja_list_methods, jinja_nlist_methods, name)
                          : NULL;
    if (!m)
        return NULL;
    struct jv *f = jinja_alloc(c->arena, sizeof(*f), c->fail);
    f->t = JV_FUNC;
    f->func.self = o;
    f->func.name = m->name;
    f->func.method = m;
    return f;
}

struct jv *jinja_call_method(struct jctx *c, const struct jv *f, struct jv **args, const char **kw,
                             int n, int line)
{
    const struct jinja_fn *m = f->func.method;
    jinja_check_arity(c, m, kw, n, line);
    return m->method(c, m->name, f->func.self, args, kw, n, line);
}

/* ---- globals ---- */
static struct jv *g_raise(struct jctx *c, struct jv *self, struct jv **args, const char **kw, int n,
                          int line)
{
    struct jv *m = jinja_arg(args, kw, n, 0, NULL);
    struct jbuf b = {0};
    if (m)
        jinja_str_into(c, &b, m, false, line);
    jinja_throw(c->fail, -EINVAL, "%s", b.s ? b.s : "");
}

static struct jv *g_strftime(struct jctx *c, struct jv *self, struct jv **args, const char **kw,
                             int n, int line)
{
    struct jv *f = jinja_arg(args, kw, n, 0, NULL);
    if (!f)
        jinja_err(c, line, "strftime_now() takes a format");
    jinja_need_str(c, f, "strftime_now", line);
    if (f->str.n > 256)
        jinja_err(c, line, "strftime_now: a format longer than 256 bytes");
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    char out[2048];
    size_t k = f->str.n ? strftime(out, sizeof(out), f->str.s, &tm) : 0;
    return jinja_str(c, out, k);
}

static struct jv *g_namespace(struct jctx *c, struct jv *self, struct jv **args, const char **kw,
                              int n, int line)
{
    struct jv *ns = jinja_dict(c, (size_t)n + 4);
    ns->t = JV_NS;
    for (int i = 0; i < n; i++) {
        if (kw[i]) {
            jinja_dict_put(c, ns, jinja_str(c, kw[i], strlen(kw[i])), args[i]);
        } else if (args[i]->t == JV_DICT) {
            for (size_t k = 0; k < args[i]->dict.n; k++)
                jinja_dict_put(c, ns, args[i]->dict.k[k], args[i]->dict.v[k]);
        } else {
            jinja_err(c, line, "namespace() takes keyword arguments or a dict");
        }
    }
    return ns;
}

static struct jv *g_dict(struct jctx *c, struct jv *self, struct jv **args, const char **kw, int n,
                         int line)
{
    struct jv *d = jinja_dict(c, (size_t)n + 1);
    for (int i = 0; i < n; i++) {
        if (!kw[i])
            jinja_err(c, line, "dict() takes keyword arguments here");
        jinja_dict_put(c, d, jinja_str(c, kw[i], strlen(kw[i])), args[i]);
    }
    return d;
}

static struct jv *g_range(struct jctx *c, struct jv *self, struct jv **args, const char **kw, int n,
                          int line)
{
    int64_t v[3] = {0, 0, 1};
    if (n < 1 || n > 3)
        jinja_err(c, line, "range() takes 1 to 3 arguments");
    for (int i = 0; i < n; i++)
        v[n == 1 ? 1 : i] = jinja_need_int(c, args[i], "range", line);
    if (!v[2])
        jinja_err(c, line, "range() arg 3 must not be zero");
    int64_t count = v[2] > 0 ? (v[1] > v[0] ? (v[1] - v[0] - 1) / v[2] + 1 : 0)
                             : (v[0] > v[1] ? (v[0] - v[1] - 1) / -v[2] + 1 : 0);
    if (count > 100000)
        jinja_throw(c->fail, -E2BIG, "line %d: range() of more than 100000 items", line);
    struct jv *l = jinja_list(c, (size_t)count);
    for (int64_t i = 0; i < count; i++)
        l->list.v[i] = jinja_int(c, v[0] + i * v[2]);
    return l;
}

struct jv *jinja_global(const char *name)
{
    static const struct jv globals[] = {
        {.t = JV_FUNC, .func = {.fn = g_raise, .name = "raise_exception"}},
        {.t = JV_FUNC, .func = {.fn = g_strftime, .name = "strftime_now"}},
        {.t = JV_FUNC, .func = {.fn = g_namespace, .name = "namespace"}},
        {.t = JV_FUNC, .func = {.fn = g_dict, .name = "dict"}},
        {.t = JV_FUNC, .func = {.fn = g_range, .name = "range"}},
    };
    for (size_t i = 0; i < sizeof(globals) / sizeof(*globals); i++)
        if (!strcmp(globals[i].func.name, name))
            return jinja_shared(&globals[i]);
    return NULL;
}
