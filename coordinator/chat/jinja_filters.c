/* SPDX-License-Identifier: MIT */
/* coordinator/chat/jinja_filters.c: Jinja2's filters, one table. */
#include "jinja_internal.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ARGS                                                                                       \
    struct jctx *c, const char *name, struct jv *v, struct jv **args, const char **kw, int n,      \
        int line

/* The item of @v that an attribute= argument names: an integer, or a dotted path (a.b.0) whose
 * integer parts are indexes; an undefined stays undefined. */
static struct jv *attr_path(struct jctx *c, struct jv *v, struct jv *attr, int line)
{
    if (attr->t == JV_INT)
        return jinja_getitem(c, v, attr, line);
    jinja_need_str(c, attr, "attribute", line);
    /* dotted: a.b.c, an integer part an index */
    const char *s = attr->str.s;
    while (*s) {
        const char *d = strchr(s, '.');
        size_t k = d ? (size_t)(d - s) : strlen(s);
        struct jv *key = jinja_str(c, s, k);
        char *end;
        long long idx = strtoll(key->str.s, &end, 10);
        if (k && !*end)
            key = jinja_int(c, idx);
        v = v->t == JV_UNDEF ? v : jinja_getitem(c, v, key, line);
        s += k + (d != NULL);
    }
    return v;
}

/* select / reject / selectattr / rejectattr */
static struct jv *select_items(struct jctx *c, struct jv *v, struct jv **args, const char **kw,
                               int n, bool attr, bool keep, int line)
{
    struct jv *items = jinja_iter_list(c, v, line);
    struct jv *a = attr ? jinja_arg(args, kw, n, 0, "attribute") : NULL;
    if (attr && !a)
        jinja_err(c, line, "selectattr/rejectattr: expected an attribute");
    int first = attr ? 1 : 0;
    struct jv *test = jinja_arg(args, kw, n, first, NULL);
    struct jv *r = jinja_list(c, items->list.n);
    size_t k = 0;
    for (size_t i = 0; i < items->list.n; i++) {
        struct jv *x = attr ? attr_path(c, items->list.v[i], a, line) : items->list.v[i];
        bool ok;
        if (!test) {
            ok = jinja_truthy(x);
        } else {
            jinja_need_str(c, test, "select", line);
            int extra = 0;
            for (int j = 0; j < n; j++)
                extra += !kw[j];
            extra -= first + 1;
            ok = jinja_test(c, test->str.s, x, args + first + 1, extra > 0 ? extra : 0, line);
        }
        if (ok == keep)
            r->list.v[k++] = items->list.v[i];
    }
    r->list.n = k;
    return r;
}

/* the key a sort / min / max / unique compares: an attribute, strings lowered unless
 * case-sensitive */
static struct jv *sort_key(struct jctx *c, struct jv *x, struct jv *attr, bool cs, int line)
{
    if (attr && attr->t != JV_NONE)
        x = attr_path(c, x, attr, line);
    if (!cs && x->t == JV_STR)
        x = jinja_case_map(c, x, 0);
    return x;
}

static struct jv *sorted(struct jctx *c, struct jv *v, bool reverse, bool cs, struct jv *attr,
                         int line)
{
    struct jv *items = jinja_iter_list(c, v, line);
    size_t n = items->list.n;
    struct jv *r = jinja_list(c, n), **keys = jinja_alloc(c->arena, n * sizeof(*keys) + 1, c->fail);
    memcpy(r->list.v, items->list.v, n * sizeof(*keys));
    for (size_t i = 0; i < n; i++)
        keys[i] = sort_key(c, r->list.v[i], attr, cs, line);
    /* stable insertion sort (a template's lists are short; every compare is charged) */
    for (size_t i = 1; i < n; i++)
        for (size_t j = i; j > 0; j--) {
            int o = jinja_compare(c, keys[j - 1], keys[j], line);
            if (reverse ? o >= 0 : o <= 0)
                break;
            struct jv *t = keys[j];
            keys[j] = keys[j - 1];
            keys[j - 1] = t;
            t = r->list.v[j];
            r->list.v[j] = r->list.v[j - 1];
            r->list.v[j - 1] = t;
        }
    return r;
}

static bool flag(struct jv *v) { return v && jinja_truthy(v); }

/* default / d */
static struct jv *f_default(ARGS)
{
    struct jv *d = jinja_arg(args, kw, n, 0, "default_value"),
              *b = jinja_arg(args, kw, n, 1, "boolean");
    if (v->t == JV_UNDEF || (flag(b) && !jinja_truthy(v)))
        return d ? d : jinja_str(c, "", 0);
    return v;
}

/* length / count */
static struct jv *f_length(ARGS)
{
    switch (v->t) {
    case JV_STR:
        return jinja_int(c, (int64_t)jinja_utf8_count(v->str.s, v->str.n));
    case JV_LIST:
        return jinja_int(c, (int64_t)v->list.n);
    case JV_DICT:
    case JV_NS:
        return jinja_int(c, (int64_t)v->dict.n);
    case JV_UNDEF:
        return jinja_int(c, 0);
    default:
        jinja_err(c, line, "object of type '%s' has no len()", jinja_type_name(v));
    }
}

static struct jv *f_tojson(ARGS)
{
    /* Hugging Face's tojson(x, ensure_ascii=False, indent=None, separators=None,
     * sort_keys=False): its positions too */
    struct jv *ind = jinja_arg(args, kw, n, 1, "indent"),
              *sk = jinja_arg(args, kw, n, 3, "sort_keys");
    struct jv *asc = jinja_arg(args, kw, n, 0, "ensure_ascii"),
              *sep = jinja_arg(args, kw, n, 2, "separators");
    int indent = -1;
    if (ind && ind->t != JV_NONE) {
        int64_t k = jinja_need_int(c, ind, "tojson indent", line);
        indent = k < 0 ? 0 : k > 64 ? 64 : (int)k;
    }
    const char *isep = indent >= 0 ? "," : ", ", *ksep = ": ";
    if (sep && sep->t != JV_NONE) {
        if (sep->t != JV_LIST || sep->list.n != 2)
            jinja_err(c, line, "tojson: separators must be a pair of strings");
        isep = jinja_need_str(c, sep->list.v[0], "tojson separators", line)->str.s;
        ksep = jinja_need_str(c, sep->list.v[1], "tojson separators", line)->str.s;
    }
    struct jbuf b = {0};
    jinja_tojson(c, &b, v, indent, 0, isep, ksep, flag(sk), flag(asc), line);
    return jinja_mkstr(c, &b);
}

static struct jv *f_trim(ARGS)
{
    struct jv *s = jinja_to_str(c, v, line), *ch = jinja_arg(args, kw, n, 0, "chars");
    if (ch && ch->t != JV_NONE)
        jinja_need_str(c, ch, "trim", line);
    return jinja_strip(c, s, ch && ch->t != JV_NONE ? ch : NULL, 3);
}

static struct jv *f_string(ARGS) { return jinja_to_str(c, v, line); }

static struct jv *f_safe(ARGS) { return v; }

static struct jv *f_list(ARGS)
{
    struct jv *it = jinja_iter_list(c, v, line), *l = jinja_list(c, it->list.n);
    memcpy(l->list.v, it->list.v, it->list.n * sizeof(*l->list.v));
    return l;
}

static struct jv *f_items(ARGS)
{
    if (v->t == JV_UNDEF)
        return jinja_list(c, 0);
    if (v->t != JV_DICT)
        jinja_err(c, line, "items: expected a mapping, got %s", jinja_type_name(v));
    return jinja_call(c, jinja_method(c, v, "items"), NULL, NULL, 0, line);
}

/* upper / lower / title / capitalize */
static struct jv *f_case(ARGS)
{
    struct jv *s = jinja_to_str(c, v, line);
    return jinja_case_map(c, s, jinja_case_of(name));
}

static struct jv *f_replace(ARGS)
{
    struct jv *s = jinja_to_str(c, v, line), *a1 = jinja_arg(args, kw, n, 1, "new");
    struct jv *old = jinja_arg(args, kw, n, 0, "old"), *cnt = jinja_arg(args, kw, n, 2, "count");
    if (!old || !a1)
        jinja_err(c, line, "replace: expected old and new strings");
    return jinja_replace(c, s, old, a1,
                         cnt && cnt->t != JV_NONE ? jinja_need_int(c, cnt, "replace", line) : -1,
                         line);
}

static struct jv *f_join(ARGS)
{
    struct jv *sep = jinja_arg(args, kw, n, 0, "d"), *attr = jinja_arg(args, kw, n, 1, "attribute");
    struct jv *items = jinja_iter_list(c, v, line);
    struct jbuf b = {0};
    if (sep)
        jinja_need_str(c, sep, "join", line);
    for (size_t i = 0; i < items->list.n; i++) {
        if (i && sep)
            jinja_buf_put(c, &b, sep->str.s, sep->str.n);
        struct jv *x = items->list.v[i];
        if (attr && attr->t != JV_NONE)
            x = attr_path(c, x, attr, line);
        jinja_str_into(c, &b, x, false, line);
    }
    return jinja_mkstr(c, &b);
}

/* first / last */
static struct jv *f_first(ARGS)
{
    struct jv *items = jinja_iter_list(c, v, line);
    if (!items->list.n)
        return jinja_undef(c, "No %s item, sequence was empty.", name);
    return items->list.v[name[0] == 'f' ? 0 : items->list.n - 1];
}

static struct jv *f_reverse(ARGS)
{
    if (v->t == JV_STR) {
        struct jv *chars = jinja_iter_list(c, v, line);
        struct jbuf b = {0};
        for (size_t i = chars->list.n; i > 0; i--)
            jinja_buf_put(c, &b, chars->list.v[i - 1]->str.s, chars->list.v[i - 1]->str.n);
        return jinja_mkstr(c, &b);
    }
    struct jv *items = jinja_iter_list(c, v, line), *r = jinja_list(c, items->list.n);
    for (size_t i = 0; i < items->list.n; i++)
        r->list.v[i] = items->list.v[items->list.n - 1 - i];
    return r;
}

/* select / reject */
static struct jv *f_select(ARGS)
{
    return select_items(c, v, args, kw, n, false, name[0] == 's', line);
}

/* selectattr / rejectattr */
static struct jv *f_selectattr(ARGS)
{
    return select_items(c, v, args, kw, n, true, name[0] == 's', line);
}

static struct jv *f_map(ARGS)
{
    struct jv *a0 = jinja_arg(args, kw, n, 0, NULL);
    struct jv *items = jinja_iter_list(c, v, line), *r = jinja_list(c, items->list.n);
    struct jv *attr = jinja_arg(args, kw, n, -1, "attribute"),
              *def = jinja_arg(args, kw, n, -1, "default");
    for (size_t i = 0; i < items->list.n; i++) {
        struct jv *x = items->list.v[i];
        if (attr) {
            x = attr_path(c, x, attr, line);
            if (x->t == JV_UNDEF && def)
                x = def;
        } else {
            if (!a0)
                jinja_err(c, line, "map: expected a filter name or attribute=");
            jinja_need_str(c, a0, "map", line);
            x = jinja_filter(c, a0->str.s, x, args + 1, kw + 1, n - 1, line);
        }
        r->list.v[i] = x;
    }
    return r;
}

static struct jv *f_sort(ARGS)
{
    return sorted(c, v, flag(jinja_arg(args, kw, n, 0, "reverse")),
                  flag(jinja_arg(args, kw, n, 1, "case_sensitive")),
                  jinja_arg(args, kw, n, 2, "attribute"), line);
}

static struct jv *f_dictsort(ARGS)
{
    if (v->t != JV_DICT)
        jinja_err(c, line, "dictsort: expected a mapping");
    struct jv *by = jinja_arg(args, kw, n, 1, "by");
    bool by_value = by && by->t == JV_STR && !strcmp(by->str.s, "value");
    struct jv *items = jinja_call(c, jinja_method(c, v, "items"), NULL, NULL, 0, line);
    return sorted(c, items, flag(jinja_arg(args, kw, n, 2, "reverse")),
                  flag(jinja_arg(args, kw, n, 0, "case_sensitive")), jinja_int(c, by_value), line);
}

static struct jv *f_unique(ARGS)
{
    struct jv *items = jinja_iter_list(c, v, line), *r = jinja_list(c, items->list.n);
    bool cs = flag(jinja_arg(args, kw, n, 0, "case_sensitive"));
    struct jv *attr = jinja_arg(args, kw, n, 1, "attribute");
    size_t k = 0;
    for (size_t i = 0; i < items->list.n; i++) {
        struct jv *key = sort_key(c, items->list.v[i], attr, cs, line);
        bool seen = false;
        for (size_t j = 0; j < k && !seen; j++)
            seen = jinja_equal(c, sort_key(c, r->list.v[j], attr, cs, line), key);
        if (!seen)
            r->list.v[k++] = items->list.v[i];
    }
    r->list.n = k;
    return r;
}

/* min / max */
static struct jv *f_min(ARGS)
{
    struct jv *items = jinja_iter_list(c, v, line);
    if (!items->list.n)
        return jinja_undef(c, "No aggregated item, sequence was empty.");
    bool cs = flag(jinja_arg(args, kw, n, 0, "case_sensitive"));
    struct jv *attr = jinja_arg(args, kw, n, 1, "attribute"), *best = items->list.v[0];
    for (size_t i = 1; i < items->list.n; i++) {
        int o = jinja_compare(c, sort_key(c, items->list.v[i], attr, cs, line),
                              sort_key(c, best, attr, cs, line), line);
        if (name[1] == 'i' ? o < 0 : o > 0)
            best = items->list.v[i];
    }
    return best;
}

static struct jv *f_sum(ARGS)
{
    struct jv *items = jinja_iter_list(c, v, line), *attr = jinja_arg(args, kw, n, 0, "attribute");
    struct jv *acc = jinja_arg(args, kw, n, 1, "start");
    acc = acc ? acc : jinja_int(c, 0);
    for (size_t i = 0; i < items->list.n; i++) {
        struct jv *x = attr && attr->t != JV_NONE ? attr_path(c, items->list.v[i], attr, line)
                                                  : items->list.v[i];
        if (!(x->t == JV_INT || x->t == JV_FLOAT || x->t == JV_BOOL) ||
            !(acc->t == JV_INT || acc->t == JV_FLOAT || acc->t == JV_BOOL))
            jinja_err(c, line, "sum: expected numbers");
        if (acc->t == JV_FLOAT || x->t == JV_FLOAT)
            acc = jinja_float(
                c, (acc->t == JV_FLOAT ? acc->f : (double)(acc->t == JV_INT ? acc->i : acc->b)) +
                       (x->t == JV_FLOAT ? x->f : (double)(x->t == JV_INT ? x->i : x->b)));
        else {
            int64_t r;
            if (__builtin_add_overflow(acc->t == JV_INT ? acc->i : acc->b,
                                       x->t == JV_INT ? x->i : x->b, &r))
                jinja_err(c, line, "an integer past 64 bits");
            acc = jinja_int(c, r);
        }
    }
    return acc;
}

static struct jv *f_abs(ARGS)
{
    if (v->t == JV_FLOAT)
        return jinja_float(c, fabs(v->f));
    int64_t x = jinja_need_int(c, v, "abs", line);
    if (x == INT64_MIN)
        jinja_err(c, line, "an integer past 64 bits");
    return jinja_int(c, x < 0 ? -x : x);
}

static struct jv *f_int(ARGS)
{
    struct jv *def = jinja_arg(args, kw, n, 0, "default");
    if (v->t == JV_INT)
        return v;
    if (v->t == JV_BOOL)
        return jinja_int(c, v->b);
    if (v->t == JV_FLOAT && isfinite(v->f) && fabs(v->f) < 9.2e18)
        return jinja_int(c, (int64_t)v->f);
    if (v->t == JV_STR) {
        char *end;
        errno = 0;
        long long x = strtoll(v->str.s, &end, 10);
        while (*end == ' ' || *end == '\t' || *end == '\n')
            end++;
        if (!errno && end != v->str.s && !*end)
            return jinja_int(c, x);
        double f = strtod(v->str.s, &end);
        if (end != v->str.s && !*end && isfinite(f) && fabs(f) < 9.2e18)
            return jinja_int(c, (int64_t)f);
    }
    return def ? def : jinja_int(c, 0);
}

static struct jv *f_float(ARGS)
{
    struct jv *def = jinja_arg(args, kw, n, 0, "default");
    if (v->t == JV_FLOAT)
        return v;
    if (v->t == JV_INT || v->t == JV_BOOL)
        return jinja_float(c, v->t == JV_INT ? (double)v->i : v->b);
    if (v->t == JV_STR) {
        char *end;
        double f = strtod(v->str.s, &end);
        if (end != v->str.s && !*end)
            return jinja_float(c, f);
    }
    return def ? def : jinja_float(c, 0);
}

static struct jv *f_round(ARGS)
{
    struct jv *pr = jinja_arg(args, kw, n, 0, "precision"),
              *m = jinja_arg(args, kw, n, 1, "method");
    int64_t p = pr ? jinja_need_int(c, pr, "round", line) : 0;
    const char *how = m ? jinja_need_str(c, m, "round", line)->str.s : "common";
    if (v->t != JV_FLOAT && !strcmp(how, "common") && p >= 0) /* round(int) is that int */
        return jinja_int(c, jinja_need_int(c, v, "round", line));
    double x = v->t == JV_FLOAT ? v->f : (double)jinja_need_int(c, v, "round", line);
    double s = pow(10, (double)(p > 20 ? 20 : p < -20 ? -20 : p)), r;
    if (!strcmp(how, "floor") || !strcmp(how, "ceil")) {
        r = (how[0] == 'f' ? floor(x * s) : ceil(x * s)) / s;
    } else if (p >= 0 && isfinite(x)) { /* Python's round: the exact value, half to even */
        char d[400];
        snprintf(d, sizeof(d), "%.*f", (int)(p > 20 ? 20 : p), x);
        r = strtod(d, NULL);
    } else {
        r = nearbyint(x * s) / s;
    }
    return jinja_float(c, r);
}

static struct jv *f_attr(ARGS)
{
    struct jv *a0 = jinja_arg(args, kw, n, 0, NULL);
    return jinja_getattr(c, v, jinja_need_str(c, a0, "attr", line)->str.s, line);
}

/* escape / e */
static struct jv *f_escape(ARGS)
{
    struct jv *s = jinja_to_str(c, v, line);
    struct jbuf b = {0};
    for (size_t i = 0; i < s->str.n; i++) {
        const char *r = NULL;
        switch (s->str.s[i]) {
        case '&':
            r = "&amp;";
            break;
        case '<':
            r = "&lt;";
            break;
        case '>':
            r = "&gt;";
            break;
        case '"':
            r = "&#34;";
            break;
        case '\'':
            r = "&#39;";
            break;
        }
        if (r)
            jinja_buf_put(c, &b, r, strlen(r));
        else
            jinja_buf_put(c, &b, s->str.s + i, 1);
    }
    return jinja_mkstr(c, &b);
}

static struct jv *f_indent(ARGS)
{
    struct jv *s = jinja_to_str(c, v, line), *w = jinja_arg(args, kw, n, 0, "width");
    bool first = flag(jinja_arg(args, kw, n, 1, "first")),
         blank = flag(jinja_arg(args, kw, n, 2, "blank"));
    struct jv *ind = w && w->t == JV_STR ? w : NULL;
    struct jbuf pad = {0};
    if (ind) {
        jinja_buf_put(c, &pad, ind->str.s, ind->str.n);
    } else {
        int64_t k = w ? jinja_need_int(c, w, "indent", line) : 4;
        for (int64_t i = 0; i < k && i < 256; i++)
            jinja_buf_put(c, &pad, " ", 1);
    }
    struct jv *lines = jinja_split(c, s, jinja_str(c, "\n", 1), -1, false, line);
    struct jbuf b = {0};
    if (first)
        jinja_buf_put(c, &b, pad.s ? pad.s : "", pad.n);
    for (size_t i = 0; i < lines->list.n; i++) {
        struct jv *l = lines->list.v[i];
        if (i) {
            jinja_buf_put(c, &b, "\n", 1);
            if (l->str.n || blank)
                jinja_buf_put(c, &b, pad.s ? pad.s : "", pad.n);
        }
        jinja_buf_put(c, &b, l->str.s, l->str.n);
    }
    return jinja_mkstr(c, &b);
}

/* runs of \w: letters and digits; emoji, symbols and punctuation outside ASCII are told apart
 * by block */
static struct jv *f_wordcount(ARGS)
{
    struct jv *s = jinja_to_str(c, v, line);
    int64_t words = 0;
    bool in = false;
    for (size_t i = 0; i < s->str.n;) {
        size_t w = jinja_char_width(s->str.s + i, s->str.n - i);
        unsigned char ch = (unsigned char)s->str.s[i];
        unsigned u = ch;
        if (ch >= 0x80) {
            u = ch & (w == 4 ? 7 : w == 3 ? 15 : 31);
            for (size_t k = 1; k < w; k++)
                u = u << 6 | ((unsigned char)s->str.s[i + k] & 63);
        }
        bool word =
            u < 0x80
                ? (ch == '_' || ((ch | 32) >= 'a' && (ch | 32) <= 'z') || (ch >= '0' && ch <= '9'))
                : !(u <= 0xbf || (u >= 0x2000 && u <= 0x2bff) || (u >= 0x3000 && u <= 0x303f) ||
                    (u >= 0xfe00 && u <= 0xfe6f) || (u >= 0x1f000 && u <= 0x1faff));
        words += word && !in;
        in = word;
        i += w;
    }
    return jinja_int(c, words);
}

/* sorted by name */
const struct jinja_fn jinja_filters[] = {
    {"abs", 0, NULL, {.filter = f_abs}},
    {"attr", 1, "%s: expected a name", {.filter = f_attr}},
    {"capitalize", 0, NULL, {.filter = f_case}},
    {"count", 0, NULL, {.filter = f_length}},
    {"d", 0, NULL, {.filter = f_default}},
    {"default", 0, NULL, {.filter = f_default}},
    {"dictsort", 0, NULL, {.filter = f_dictsort}},
    {"e", 0, NULL, {.filter = f_escape}},
    {"escape", 0, NULL, {.filter = f_escape}},
    {"first", 0, NULL, {.filter = f_first}},
    {"float", 0, NULL, {.filter = f_float}},
    {"indent", 0, NULL, {.filter = f_indent}},
    {"int", 0, NULL, {.filter = f_int}},
    {"items", 0, NULL, {.filter = f_items}},
    {"join", 0, NULL, {.filter = f_join}},
    {"last", 0, NULL, {.filter = f_first}},
    {"length", 0, NULL, {.filter = f_length}},
    {"list", 0, NULL, {.filter = f_list}},
    {"lower", 0, NULL, {.filter = f_case}},
    {"map", 0, NULL, {.filter = f_map}},
    {"max", 0, NULL, {.filter = f_min}},
    {"min", 0, NULL, {.filter = f_min}},
    {"reject", 0, NULL, {.filter = f_select}},
    {"rejectattr", 0, NULL, {.filter = f_selectattr}},
    {"replace", 0, NULL, {.filter = f_replace}},
    {"reverse", 0, NULL, {.filter = f_reverse}},
    {"round", 0, NULL, {.filter = f_round}},
    {"safe", 0, NULL, {.filter = f_safe}},
    {"select", 0, NULL, {.filter = f_select}},
    {"selectattr", 0, NULL, {.filter = f_selectattr}},
    {"sort", 0, NULL, {.filter = f_sort}},
    {"string", 0, NULL, {.filter = f_string}},
    {"sum", 0, NULL, {.filter = f_sum}},
    {"title", 0, NULL, {.filter = f_case}},
    {"tojson", 0, NULL, {.filter = f_tojson}},
    {"trim", 0, NULL, {.filter = f_trim}},
    {"unique", 0, NULL, {.filter = f_unique}},
    {"upper", 0, NULL, {.filter = f_case}},
    {"wordcount", 0, NULL, {.filter = f_wordcount}},
};
const size_t jinja_nfilters = sizeof(jinja_filters) / sizeof(*jinja_filters);

struct jv *jinja_filter(struct jctx *c, const char *name, struct jv *v, struct jv **args,
                        const char **kw, int n, int line)
{
    const struct jinja_fn *f = jinja_lookup(jinja_filters, jinja_nfilters, name);
    if (!f)
        jinja_err(c, line, "no filter named '%s'", name);
    jinja_check_arity(c, f, kw, n, line);
    return f->filter(c, name, v, args, kw, n, line);
}
