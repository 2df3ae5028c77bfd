/* SPDX-License-Identifier: MIT */
/* coordinator/chat/jinja_lib.c: what templates call - Jinja2's filters and tests, the str /
 * dict / list methods an immutable sandbox allows, the globals Hugging Face adds
 * (raise_exception, strftime_now) with Jinja's own (namespace, range, dict), and tojson as
 * Python's json.dumps writes it. Case mappings are ASCII's. */
#include "jinja_internal.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* argument @pos or keyword @name of a call, or NULL */
static struct jv *arg(struct jv **args, const char **kw, int n, int pos, const char *name)
{
    int p = 0;
    for (int i = 0; i < n; i++) {
        if (kw && kw[i]) {
            if (name && !strcmp(kw[i], name))
                return args[i];
        } else if (p++ == pos) {
            return args[i];
        }
    }
    return NULL;
}

static struct jv *need_str(struct jctx *c, struct jv *v, const char *what, int line)
{
    if (v->t == JV_UNDEF)
        jinja_err(c, line, "%s", v->undef);
    if (v->t != JV_STR)
        jinja_err(c, line, "%s: expected a string, got %s", what, jinja_type_name(v));
    return v;
}

static struct jv *mkstr(struct jctx *c, struct jbuf *b)
{
    struct jv *r = jinja_str(c, "", 0);
    r->str.s = b->s ? b->s : "";
    r->str.n = b->n;
    return r;
}

static int64_t need_int(struct jctx *c, struct jv *v, const char *what, int line)
{
    if (v->t == JV_INT)
        return v->i;
    if (v->t == JV_BOOL)
        return v->b;
    jinja_err(c, line, "%s: expected an integer, got %s", what, jinja_type_name(v));
}

/* width in bytes of the UTF-8 character at @s */
static size_t cw(const char *s, size_t n)
{
    size_t w = 1;
    while (w < n && ((unsigned char)s[w] & 0xc0) == 0x80)
        w++;
    return w;
}

static bool in_chars(struct jctx *c, const struct jv *chars, const char *s, size_t w)
{
    jinja_charge(c, 1 + chars->str.n / 16);
    for (size_t i = 0; i < chars->str.n;) {
        size_t k = cw(chars->str.s + i, chars->str.n - i);
        if (k == w && !memcmp(chars->str.s + i, s, w))
            return true;
        i += k;
    }
    return false;
}

struct jv *jinja_strip(struct jctx *c, struct jv *v, const struct jv *chars, int how)
{
    const char *s = v->str.s;
    size_t a = 0, b = v->str.n, w;
    jinja_charge(c, b / 64);
    if (how & 1)
        while (a < b) {
            w = cw(s + a, b - a);
            bool drop = chars ? in_chars(c, chars, s + a, w) : jinja_isspace_at(s + a, b - a, &w);
            if (!drop)
                break;
            a += w;
        }
    if (how & 2)
        while (b > a) {
            size_t i = b - 1;
            while (i > a && ((unsigned char)s[i] & 0xc0) == 0x80)
                i--;
            w = b - i;
            size_t w2;
            bool drop =
                chars ? in_chars(c, chars, s + i, w) : jinja_isspace_at(s + i, w, &w2) && w2 == w;
            if (!drop)
                break;
            b = i;
        }
    if (a == 0 && b == v->str.n)
        return v;
    return jinja_str(c, s + a, b - a);
}

static struct jv *case_map(struct jctx *c, struct jv *v,
                           int mode) /* 0 lower 1 upper 2 title 3 cap */
{
    struct jv *r = jinja_str(c, v->str.s, v->str.n);
    char *s = (char *)r->str.s;
    bool start = true;
    for (size_t i = 0; i < r->str.n; i++) {
        char ch = s[i];
        bool alpha = (ch | 32) >= 'a' && (ch | 32) <= 'z';
        bool up = mode == 1 || (mode == 2 && start) || (mode == 3 && i == 0);
        if (alpha)
            s[i] = up ? (char)(ch & ~32) : (char)(ch | 32);
        /* title(): a word starts after any character that is not a letter */
        start = !alpha && !((unsigned char)ch >= 0x80);
        if ((unsigned char)ch >= 0x80)
            start = false;
    }
    return r;
}

/* a list of strings as it grows */
struct parts {
    struct jv **v;
    size_t n, cap;
};

static void parts_add(struct jctx *c, struct parts *l, const char *s, size_t n)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        struct jv **nv = jinja_alloc(c->arena, cap * sizeof(*nv), c->fail);
        if (l->n)
            memcpy(nv, l->v, l->n * sizeof(*nv));
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = jinja_str(c, s, n);
}

/* str.split / rsplit */
static struct jv *split(struct jctx *c, struct jv *s, struct jv *sep, int64_t max, bool right,
                        int line)
{
    struct parts all = {0}; /* in the arena: a split may be deep inside macro calls */
    const char *p = s->str.s;
    size_t len = s->str.n;
    jinja_charge(c, len / 16);
    if (sep && sep->t != JV_NONE) {
        need_str(c, sep, "split", line);
        if (!sep->str.n)
            jinja_err(c, line, "empty separator");
        if (!right) {
            size_t i = 0;
            while (max < 0 || (int64_t)all.n < max) {
                const char *f = memmem(p + i, len - i, sep->str.s, sep->str.n);
                if (!f)
                    break;
                parts_add(c, &all, p + i, (size_t)(f - (p + i)));
                i = (size_t)(f - p) + sep->str.n;
            }
            parts_add(c, &all, p + i, len - i);
        } else {
            size_t end = len;
            jinja_charge(c, len / 64 * (sep->str.n / 8 + 1)); /* the backward scan compares */
            while (max < 0 || (int64_t)all.n < max) {
                const char *f = NULL;
                for (size_t k = end; k >= sep->str.n && !f; k--)
                    if (!memcmp(p + k - sep->str.n, sep->str.s, sep->str.n))
                        f = p + k - sep->str.n;
                if (!f)
                    break;
                parts_add(c, &all, f + sep->str.n, end - (size_t)(f - p) - sep->str.n);
                end = (size_t)(f - p);
            }
            parts_add(c, &all, p, end);
            for (size_t i = 0; i < all.n / 2; i++) {
                struct jv *t = all.v[i];
                all.v[i] = all.v[all.n - 1 - i];
                all.v[all.n - 1 - i] = t;
            }
        }
    } else {
        /* runs of whitespace; no empty strings */
        size_t i = 0, w;
        if (right)
            jinja_err(c, line, "rsplit() without a separator is not supported");
        for (;;) {
            while (i < len && jinja_isspace_at(p + i, len - i, &w))
                i += w;
            if (i >= len)
                break;
            if (max >= 0 && (int64_t)all.n == max) { /* Python keeps the rest as it is */
                parts_add(c, &all, p + i, len - i);
                break;
            }
            size_t b = i;
            while (i < len && !jinja_isspace_at(p + i, len - i, &w))
                i += cw(p + i, len - i);
            parts_add(c, &all, p + b, i - b);
        }
    }
    struct jv *l = jinja_list(c, all.n);
    if (all.n)
        memcpy(l->list.v, all.v, all.n * sizeof(*all.v));
    return l;
}

static struct jv *replace(struct jctx *c, struct jv *s, struct jv *old, struct jv *new,
                          int64_t count, int line)
{
    need_str(c, old, "replace", line);
    need_str(c, new, "replace", line);
    struct jbuf b = {0};
    size_t i = 0, done = 0;
    if (!old->str.n) { /* Python inserts @new between every character */
        while ((count < 0 || (int64_t)done < count)) {
            jinja_buf_put(c, &b, new->str.s, new->str.n);
            done++;
            if (i >= s->str.n)
                break;
            size_t w = cw(s->str.s + i, s->str.n - i);
            jinja_buf_put(c, &b, s->str.s + i, w);
            i += w;
        }
        jinja_buf_put(c, &b, s->str.s + i, s->str.n - i);
        return mkstr(c, &b);
    }
    while (count < 0 || (int64_t)done < count) {
        const char *f = memmem(s->str.s + i, s->str.n - i, old->str.s, old->str.n);
        if (!f)
            break;
        jinja_buf_put(c, &b, s->str.s + i, (size_t)(f - s->str.s) - i);
        jinja_buf_put(c, &b, new->str.s, new->str.n);
        i = (size_t)(f - s->str.s) + old->str.n;
        done++;
    }
    jinja_buf_put(c, &b, s->str.s + i, s->str.n - i);
    return mkstr(c, &b);
}

/* ---- methods ---- */
static struct jv *m_str(struct jctx *c, struct jv *self, struct jv **args, const char **kw, int n,
                        int line, const char *name)
{
    struct jv *a0 = arg(args, kw, n, 0, NULL), *a1 = arg(args, kw, n, 1, NULL);
    const char *s = self->str.s;
    size_t len = self->str.n;
    if (!strcmp(name, "startswith") || !strcmp(name, "endswith")) {
        if (!a0)
            jinja_err(c, line, "%s() takes at least 1 argument", name);
        struct jv *opts = a0->t == JV_LIST && a0->tuple ? a0 : NULL;
        size_t k = opts ? opts->list.n : 1;
        for (size_t i = 0; i < k; i++) {
            struct jv *p = need_str(c, opts ? opts->list.v[i] : a0, name, line);
            if (p->str.n <= len &&
                !memcmp(name[0] == 's' ? s : s + len - p->str.n, p->str.s, p->str.n))
                return jinja_shared(&jinja_true);
        }
        return jinja_shared(&jinja_false);
    }
    if (!strcmp(name, "strip") || !strcmp(name, "lstrip") || !strcmp(name, "rstrip")) {
        if (a0 && a0->t != JV_NONE)
            need_str(c, a0, name, line);
        return jinja_strip(c, self, a0 && a0->t != JV_NONE ? a0 : NULL,
                          name[0] == 'l'   ? 1
                          : name[0] == 'r' ? 2
                                           : 3);
    }
    if (!strcmp(name, "split") || !strcmp(name, "rsplit")) {
        struct jv *sep = arg(args, kw, n, 0, "sep"), *mx = arg(args, kw, n, 1, "maxsplit");
        return split(c, self, sep, mx ? need_int(c, mx, name, line) : -1, name[0] == 'r', line);
    }
    if (!strcmp(name, "replace")) {
        if (!a0 || !a1)
            jinja_err(c, line, "replace() takes at least 2 arguments");
        struct jv *a2 = arg(args, kw, n, 2, "count");
        return replace(c, self, a0, a1, a2 ? need_int(c, a2, name, line) : -1, line);
    }
    if (!strcmp(name, "lower") || !strcmp(name, "upper") || !strcmp(name, "title") ||
        !strcmp(name, "capitalize"))
        return case_map(c, self, name[0] == 'l' ? 0 : name[0] == 'u' ? 1 : name[0] == 't' ? 2 : 3);
    if (!strcmp(name, "find") || !strcmp(name, "rfind") || !strcmp(name, "count")) {
        if (!a0)
            jinja_err(c, line, "%s() takes at least 1 argument", name);
        need_str(c, a0, name, line);
        jinja_charge(c, len / 16);
        size_t nl = a0->str.n;
        if (!nl) /* the empty string: found at 0 (find), at the end (rfind), between chars */
            return jinja_int(c, name[0] == 'f' ? 0 : (int64_t)jinja_utf8_count(s, len) + (name[0] == 'c'));
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
    if (!strcmp(name, "join")) {
        if (!a0)
            jinja_err(c, line, "join() takes exactly one argument");
        struct jv *items = jinja_iter_list(c, a0, line);
        struct jbuf b = {0};
        for (size_t i = 0; i < items->list.n; i++) {
            if (i)
                jinja_buf_put(c, &b, s, len);
            struct jv *it = need_str(c, items->list.v[i], "join", line);
            jinja_buf_put(c, &b, it->str.s, it->str.n);
        }
        return mkstr(c, &b);
    }
    if (!strncmp(name, "is", 2)) {
        bool any = false, all = true, cased = false;
        size_t w;
        for (size_t i = 0; i < len; i += w) {
            w = cw(s + i, len - i);
            unsigned char ch = (unsigned char)s[i];
            bool ok;
            if (!strcmp(name, "isspace")) {
                ok = jinja_isspace_at(s + i, len - i, &w);
                w = cw(s + i, len - i);
            } else if (!strcmp(name, "isdigit")) {
                ok = ch >= '0' && ch <= '9';
            } else if (!strcmp(name, "isalpha")) {
                ok = (ch | 32) >= 'a' && (ch | 32) <= 'z';
            } else if (!strcmp(name, "isalnum")) {
                ok = ((ch | 32) >= 'a' && (ch | 32) <= 'z') || (ch >= '0' && ch <= '9');
            } else if (!strcmp(name, "islower") || !strcmp(name, "isupper")) {
                bool lo = ch >= 'a' && ch <= 'z', up = ch >= 'A' && ch <= 'Z';
                cased |= lo || up;
                ok = name[2] == 'l' ? !up : !lo;
            } else {
                return NULL;
            }
            any = true;
            all &= ok;
        }
        if (!strcmp(name, "islower") || !strcmp(name, "isupper"))
            return jinja_bool(all && cased);
        return jinja_bool(any && all);
    }
    if (!strcmp(name, "splitlines")) { /* Python's line boundaries */
        size_t n = 0, b = 0;
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
                i += cw(s + i, len - i);
                continue;
            }
            l->list.v[n++] = jinja_str(c, s + b, i - b);
            i += w;
            b = i;
        }
        if (b < len)
            l->list.v[n++] = jinja_str(c, s + b, len - b);
        l->list.n = n;
        return l;
    }
    return NULL;
}

static const char *const str_methods[] = {
    "startswith", "endswith", "strip",   "lstrip",  "rstrip",     "split",
    "rsplit",     "replace",  "lower",   "upper",   "title",      "capitalize",
    "find",       "rfind",    "count",   "join",    "isspace",    "isdigit",
    "isalpha",    "isalnum",  "islower", "isupper", "splitlines", NULL};

#define METHOD(fname, ...)                                                                         \
    static struct jv *fname(struct jctx *c, struct jv *self, struct jv **args, const char **kw,    \
                            int n, int line)                                                       \
    {                                                                                              \
        (void)args, (void)kw, (void)n, (void)line;                                                 \
        __VA_ARGS__                                                                                \
    }

/* a bound method: self is a two-item list (object, name) */
static struct jv *call_str_method(struct jctx *c, struct jv *self, struct jv **args,
                                  const char **kw, int n, int line)
{
    struct jv *r = m_str(c, self->list.v[0], args, kw, n, line, self->list.v[1]->str.s);
    if (!r)
        jinja_err(c, line, "'str' object has no method '%s'", self->list.v[1]->str.s);
    return r;
}

METHOD(m_items, {
    struct jv *o = self;
    struct jv *l = jinja_list(c, o->dict.n);
    for (size_t i = 0; i < o->dict.n; i++) {
        struct jv *t = jinja_list(c, 2);
        t->tuple = true;
        t->list.v[0] = o->dict.k[i];
        t->list.v[1] = o->dict.v[i];
        l->list.v[i] = t;
    }
    return l;
})
METHOD(m_keys, {
    struct jv *l = jinja_list(c, self->dict.n);
    memcpy(l->list.v, self->dict.k, self->dict.n * sizeof(*l->list.v));
    return l;
})
METHOD(m_values, {
    struct jv *l = jinja_list(c, self->dict.n);
    memcpy(l->list.v, self->dict.v, self->dict.n * sizeof(*l->list.v));
    return l;
})
METHOD(m_get, {
    struct jv *k = arg(args, kw, n, 0, NULL), *d = arg(args, kw, n, 1, NULL);
    if (!k)
        jinja_err(c, line, "get expected at least 1 argument");
    struct jv *v = jinja_dict_get(c, self, k);
    return v ? v : d ? d : jinja_shared(&jinja_none);
})
METHOD(m_copy, {
    struct jv *d = jinja_dict(c, self->dict.n);
    for (size_t i = 0; i < self->dict.n; i++)
        jinja_dict_put(c, d, self->dict.k[i], self->dict.v[i]);
    return d;
})
METHOD(m_list_index, {
    struct jv *x = arg(args, kw, n, 0, NULL);
    for (size_t i = 0; x && i < self->list.n; i++)
        if (jinja_equal(c, self->list.v[i], x))
            return jinja_int(c, (int64_t)i);
    jinja_err(c, line, "the value is not in the list");
})
METHOD(m_list_count, {
    struct jv *x = arg(args, kw, n, 0, NULL);
    int64_t k = 0;
    for (size_t i = 0; x && i < self->list.n; i++)
        k += jinja_equal(c, self->list.v[i], x);
    return jinja_int(c, k);
})

static struct jv *bound(struct jctx *c, jfunc fn, struct jv *self, const char *name)
{
    struct jv *f = jinja_alloc(c->arena, sizeof(*f), c->fail);
    f->t = JV_FUNC;
    f->func.fn = fn;
    f->func.self = self;
    f->func.name = name;
    return f;
}

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
    if (o->t == JV_STR) {
        for (int i = 0; str_methods[i]; i++)
            if (!strcmp(str_methods[i], name)) {
                struct jv *pair = jinja_list(c, 2);
                pair->list.v[0] = o;
                pair->list.v[1] = jinja_str(c, str_methods[i], strlen(str_methods[i]));
                return bound(c, call_str_method, pair, str_methods[i]);
            }
    } else if (o->t == JV_DICT) {
        if (!strcmp(name, "items"))
            return bound(c, m_items, o, "items");
        if (!strcmp(name, "keys"))
            return bound(c, m_keys, o, "keys");
        if (!strcmp(name, "values"))
            return bound(c, m_values, o, "values");
        if (!strcmp(name, "get"))
            return bound(c, m_get, o, "get");
        if (!strcmp(name, "copy"))
            return bound(c, m_copy, o, "copy");
    } else if (o->t == JV_LIST) {
        if (!strcmp(name, "index"))
            return bound(c, m_list_index, o, "index");
        if (!strcmp(name, "count"))
            return bound(c, m_list_count, o, "count");
    }
    return NULL;
}

/* ---- globals ---- */
METHOD(g_raise, {
    struct jv *m = arg(args, kw, n, 0, NULL);
    struct jbuf b = {0};
    if (m)
        jinja_str_into(c, &b, m, false, line);
    jinja_throw(c->fail, -EINVAL, "%s", b.s ? b.s : "");
})
METHOD(g_strftime, {
    struct jv *f = arg(args, kw, n, 0, NULL);
    if (!f)
        jinja_err(c, line, "strftime_now() takes a format");
    need_str(c, f, "strftime_now", line);
    if (f->str.n > 256)
        jinja_err(c, line, "strftime_now: a format longer than 256 bytes");
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    char out[2048];
    size_t k = f->str.n ? strftime(out, sizeof(out), f->str.s, &tm) : 0;
    return jinja_str(c, out, k);
})
METHOD(g_namespace, {
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
})
METHOD(g_dict, {
    struct jv *d = jinja_dict(c, (size_t)n + 1);
    for (int i = 0; i < n; i++) {
        if (!kw[i])
            jinja_err(c, line, "dict() takes keyword arguments here");
        jinja_dict_put(c, d, jinja_str(c, kw[i], strlen(kw[i])), args[i]);
    }
    return d;
})
METHOD(g_range, {
    int64_t v[3] = {0, 0, 1};
    if (n < 1 || n > 3)
        jinja_err(c, line, "range() takes 1 to 3 arguments");
    for (int i = 0; i < n; i++)
        v[n == 1 ? 1 : i] = need_int(c, args[i], "range", line);
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
})

struct jv *jinja_global(const char *name)
{
    static const struct jv globals[] = {
        {.t = JV_FUNC, .func = {g_raise, NULL, "raise_exception"}},
        {.t = JV_FUNC, .func = {g_strftime, NULL, "strftime_now"}},
        {.t = JV_FUNC, .func = {g_namespace, NULL, "namespace"}},
        {.t = JV_FUNC, .func = {g_dict, NULL, "dict"}},
        {.t = JV_FUNC, .func = {g_range, NULL, "range"}},
    };
    for (size_t i = 0; i < sizeof(globals) / sizeof(*globals); i++)
        if (!strcmp(globals[i].func.name, name))
            return jinja_shared(&globals[i]);
    return NULL;
}

/* ---- tojson: Python's json.dumps ---- */
static void json_put_string(struct jctx *c, struct jbuf *b, const char *s, size_t n, bool ascii)
{
    jinja_buf_put(c, b, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        char esc[16];
        int m = 0;
        if (ch == '"' || ch == '\\')
            m = snprintf(esc, sizeof(esc), "\\%c", ch);
        else if (ch == '\n')
            m = snprintf(esc, sizeof(esc), "\\n");
        else if (ch == '\r')
            m = snprintf(esc, sizeof(esc), "\\r");
        else if (ch == '\t')
            m = snprintf(esc, sizeof(esc), "\\t");
        else if (ch == '\b')
            m = snprintf(esc, sizeof(esc), "\\b");
        else if (ch == '\f')
            m = snprintf(esc, sizeof(esc), "\\f");
        else if (ch < 0x20 || (ascii && ch == 0x7f)) /* ensure_ascii: all but ' '..'~' */
            m = snprintf(esc, sizeof(esc), "\\u%04x", ch);
        else if (ascii && ch >= 0x80) {
            size_t w = cw(s + i, n - i);
            unsigned u = ch & (w == 4 ? 7 : w == 3 ? 15 : 31);
            for (size_t k = 1; k < w; k++)
                u = u << 6 | ((unsigned char)s[i + k] & 63);
            if (u >= 0x10000)
                m = snprintf(esc, sizeof(esc), "\\u%04x\\u%04x", 0xd800 + ((u - 0x10000) >> 10),
                             0xdc00 + ((u - 0x10000) & 0x3ff));
            else
                m = snprintf(esc, sizeof(esc), "\\u%04x", u);
            jinja_buf_put(c, b, s + i - run, run);
            run = 0;
            jinja_buf_put(c, b, esc, (size_t)m);
            i += w - 1;
            continue;
        }
        if (m) {
            jinja_buf_put(c, b, s + i - run, run);
            run = 0;
            jinja_buf_put(c, b, esc, (size_t)m);
        } else {
            run++;
        }
    }
    jinja_buf_put(c, b, s + n - run, run);
    jinja_buf_put(c, b, "\"", 1);
}

static void json_newline(struct jctx *c, struct jbuf *b, int indent, int level)
{
    jinja_buf_put(c, b, "\n", 1);
    for (int i = 0; i < indent * level; i++)
        jinja_buf_put(c, b, " ", 1);
}

void jinja_tojson(struct jctx *c, struct jbuf *b, const struct jv *v, int indent, int level,
                 const char *item_sep, const char *key_sep, bool sort_keys, bool ascii, int line)
{
    jinja_charge(c, 1);
    if (level > 256)
        jinja_err(c, line, "tojson: nested deeper than 256");
    char num[48];
    switch (v->t) {
    case JV_NONE:
        jinja_buf_put(c, b, "null", 4);
        return;
    case JV_BOOL:
        jinja_buf_put(c, b, v->b ? "true" : "false", v->b ? 4 : 5);
        return;
    case JV_INT:
    case JV_STR: {
        if (v->t == JV_STR) {
            json_put_string(c, b, v->str.s, v->str.n, ascii);
            return;
        }
        int m = snprintf(num, sizeof(num), "%lld", (long long)v->i);
        jinja_buf_put(c, b, num, (size_t)m);
        return;
    }
    case JV_FLOAT:
        if (isnan(v->f) || isinf(v->f)) {
            const char *s = isnan(v->f) ? "NaN" : v->f < 0 ? "-Infinity" : "Infinity";
            jinja_buf_put(c, b, s, strlen(s));
            return;
        }
        jinja_str_into(c, b, v, false, line);
        return;
    case JV_LIST:
        if (!v->list.n) {
            jinja_buf_put(c, b, "[]", 2);
            return;
        }
        jinja_buf_put(c, b, "[", 1);
        for (size_t i = 0; i < v->list.n; i++) {
            if (i)
                jinja_buf_put(c, b, item_sep, strlen(item_sep));
            if (indent >= 0)
                json_newline(c, b, indent, level + 1);
            jinja_tojson(c, b, v->list.v[i], indent, level + 1, item_sep, key_sep, sort_keys, ascii,
                        line);
        }
        if (indent >= 0)
            json_newline(c, b, indent, level);
        jinja_buf_put(c, b, "]", 1);
        return;
    case JV_DICT: {
        if (!v->dict.n) {
            jinja_buf_put(c, b, "{}", 2);
            return;
        }
        size_t n = v->dict.n, *order = jinja_alloc(c->arena, n * sizeof(size_t), c->fail);
        struct jv **keys = jinja_alloc(c->arena, n * sizeof(*keys), c->fail);
        for (size_t i = 0; i < n; i++) {
            struct jv *k = v->dict.k[i];
            order[i] = i;
            if (k->t == JV_STR)
                keys[i] = k;
            else if (k->t == JV_INT || k->t == JV_FLOAT)
                keys[i] = jinja_to_str(c, k, line);
            else if (k->t == JV_BOOL)
                keys[i] = jinja_str(c, k->b ? "true" : "false", k->b ? 4 : 5);
            else if (k->t == JV_NONE)
                keys[i] = jinja_str(c, "null", 4);
            else
                jinja_err(c, line, "keys must be str, int, float, bool or None, not %s",
                     jinja_type_name(k));
        }
        if (sort_keys) /* insertion sort: stable, and dicts of templates are small */
            for (size_t i = 1; i < n; i++)
                for (size_t j = i;
                     j > 0 && jinja_compare(c, keys[order[j - 1]], keys[order[j]], line) > 0; j--) {
                    size_t t = order[j];
                    order[j] = order[j - 1];
                    order[j - 1] = t;
                }
        jinja_buf_put(c, b, "{", 1);
        for (size_t i = 0; i < n; i++) {
            if (i)
                jinja_buf_put(c, b, item_sep, strlen(item_sep));
            if (indent >= 0)
                json_newline(c, b, indent, level + 1);
            json_put_string(c, b, keys[order[i]]->str.s, keys[order[i]]->str.n, ascii);
            jinja_buf_put(c, b, key_sep, strlen(key_sep));
            jinja_tojson(c, b, v->dict.v[order[i]], indent, level + 1, item_sep, key_sep, sort_keys,
                        ascii, line);
        }
        if (indent >= 0)
            json_newline(c, b, indent, level);
        jinja_buf_put(c, b, "}", 1);
        return;
    }
    default:
        jinja_err(c, line, "Object of type %s is not JSON serializable", jinja_type_name(v));
    }
}

/* ---- tests ---- */
static bool test_by_name(struct jctx *c, const char *name, struct jv *v, struct jv **args, int n,
                         int line, bool *known)
{
    struct jv *a = n > 0 ? args[0] : NULL;
    *known = true;
    if (!strcmp(name, "defined"))
        return v->t != JV_UNDEF;
    if (!strcmp(name, "undefined"))
        return v->t == JV_UNDEF;
    if (!strcmp(name, "none"))
        return v->t == JV_NONE;
    if (!strcmp(name, "boolean"))
        return v->t == JV_BOOL;
    if (!strcmp(name, "true"))
        return v->t == JV_BOOL && v->b;
    if (!strcmp(name, "false"))
        return v->t == JV_BOOL && !v->b;
    if (!strcmp(name, "integer"))
        return v->t == JV_INT;
    if (!strcmp(name, "float"))
        return v->t == JV_FLOAT;
    if (!strcmp(name, "number"))
        return v->t == JV_INT || v->t == JV_FLOAT || v->t == JV_BOOL;
    if (!strcmp(name, "string"))
        return v->t == JV_STR;
    if (!strcmp(name, "mapping"))
        return v->t == JV_DICT;
    if (!strcmp(name, "iterable"))
        return v->t == JV_STR || v->t == JV_LIST || v->t == JV_DICT || v->t == JV_UNDEF;
    if (!strcmp(name, "sequence"))
        return v->t == JV_STR || v->t == JV_LIST || v->t == JV_DICT;
    if (!strcmp(name, "callable"))
        return v->t == JV_MACRO || v->t == JV_FUNC;
    if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        if (v->t != JV_STR)
            return false;
        struct jv *r = jinja_method(c, v, name[0] == 'l' ? "islower" : "isupper");
        return jinja_truthy(jinja_call(c, r, NULL, NULL, 0, line));
    }
    if (!strcmp(name, "odd") || !strcmp(name, "even") || !strcmp(name, "divisibleby")) {
        if (v->t != JV_INT && v->t != JV_BOOL)
            jinja_err(c, line, "test %s: expected an integer", name);
        int64_t x = v->t == JV_INT ? v->i : v->b;
        if (name[0] == 'o')
            return x % 2 != 0;
        if (name[0] == 'e')
            return x % 2 == 0;
        int64_t d = a && (a->t == JV_INT) ? a->i : 0;
        if (!d)
            jinja_err(c, line, "divisibleby: expected a non-zero integer");
        return d == -1 || x % d == 0;
    }
    if (!strcmp(name, "sameas"))
        return a && (v == a || (v->t == a->t && (v->t == JV_NONE || v->t == JV_UNDEF ||
                                                 (v->t == JV_BOOL && v->b == a->b))));
    if (!strcmp(name, "in")) {
        if (!a)
            jinja_err(c, line, "test in: expected a container");
        if (a->t == JV_STR)
            return v->t == JV_STR && memmem(a->str.s, a->str.n, v->str.s, v->str.n);
        struct jv *items = jinja_iter_list(c, a, line);
        for (size_t i = 0; i < items->list.n; i++)
            if (jinja_equal(c, items->list.v[i], v))
                return true;
        return false;
    }
    static const char *const cmp[][3] = {{"eq", "equalto", "=="},    {"ne", "!=", ""},
                                         {"lt", "lessthan", "<"},    {"le", "<=", ""},
                                         {"gt", "greaterthan", ">"}, {"ge", ">=", ""}};
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < 3; j++)
            if (cmp[i][j][0] && !strcmp(name, cmp[i][j])) {
                if (!a)
                    jinja_err(c, line, "test %s: expected a value to compare with", name);
                if (i < 2)
                    return jinja_equal(c, v, a) == (i == 0);
                int r = jinja_compare(c, v, a, line);
                return i == 2 ? r < 0 : i == 3 ? r <= 0 : i == 4 ? r > 0 : r >= 0;
            }
    *known = false;
    return false;
}

bool jinja_test(struct jctx *c, const char *name, struct jv *v, struct jv **args, int n, int line)
{
    bool known;
    bool r = test_by_name(c, name, v, args, n, line, &known);
    if (!known)
        jinja_err(c, line, "no test named '%s'", name);
    return r;
}

/* ---- filters ---- */
static struct jv *attr_path(struct jctx *c, struct jv *v, struct jv *attr, int line)
{
    if (attr->t == JV_INT)
        return jinja_getitem(c, v, attr, line);
    need_str(c, attr, "attribute", line);
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
    struct jv *a = attr ? arg(args, kw, n, 0, "attribute") : NULL;
    if (attr && !a)
        jinja_err(c, line, "selectattr/rejectattr: expected an attribute");
    int first = attr ? 1 : 0;
    struct jv *test = arg(args, kw, n, first, NULL);
    struct jv *r = jinja_list(c, items->list.n);
    size_t k = 0;
    for (size_t i = 0; i < items->list.n; i++) {
        struct jv *x = attr ? attr_path(c, items->list.v[i], a, line) : items->list.v[i];
        bool ok;
        if (!test) {
            ok = jinja_truthy(x);
        } else {
            need_str(c, test, "select", line);
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
        x = case_map(c, x, 0);
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

struct jv *jinja_filter(struct jctx *c, const char *name, struct jv *v, struct jv **args,
                       const char **kw, int n, int line)
{
    struct jv *a0 = arg(args, kw, n, 0, NULL);
    if (!strcmp(name, "default") || !strcmp(name, "d")) {
        struct jv *d = arg(args, kw, n, 0, "default_value"), *b = arg(args, kw, n, 1, "boolean");
        if (v->t == JV_UNDEF || (flag(b) && !jinja_truthy(v)))
            return d ? d : jinja_str(c, "", 0);
        return v;
    }
    if (!strcmp(name, "length") || !strcmp(name, "count")) {
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
    if (!strcmp(name, "tojson")) {
        /* Hugging Face's tojson(x, ensure_ascii=False, indent=None, separators=None,
         * sort_keys=False): its positions too */
        struct jv *ind = arg(args, kw, n, 1, "indent"), *sk = arg(args, kw, n, 3, "sort_keys");
        struct jv *asc = arg(args, kw, n, 0, "ensure_ascii"),
                  *sep = arg(args, kw, n, 2, "separators");
        int indent = -1;
        if (ind && ind->t != JV_NONE) {
            int64_t k = need_int(c, ind, "tojson indent", line);
            indent = k < 0 ? 0 : k > 64 ? 64 : (int)k;
        }
        const char *isep = indent >= 0 ? "," : ", ", *ksep = ": ";
        if (sep && sep->t != JV_NONE) {
            if (sep->t != JV_LIST || sep->list.n != 2)
                jinja_err(c, line, "tojson: separators must be a pair of strings");
            isep = need_str(c, sep->list.v[0], "tojson separators", line)->str.s;
            ksep = need_str(c, sep->list.v[1], "tojson separators", line)->str.s;
        }
        struct jbuf b = {0};
        jinja_tojson(c, &b, v, indent, 0, isep, ksep, flag(sk), flag(asc), line);
        return mkstr(c, &b);
    }
    if (!strcmp(name, "trim")) {
        struct jv *s = jinja_to_str(c, v, line), *ch = arg(args, kw, n, 0, "chars");
        if (ch && ch->t != JV_NONE)
            need_str(c, ch, "trim", line);
        return jinja_strip(c, s, ch && ch->t != JV_NONE ? ch : NULL, 3);
    }
    if (!strcmp(name, "string"))
        return jinja_to_str(c, v, line);
    if (!strcmp(name, "safe"))
        return v;
    if (!strcmp(name, "list")) {
        struct jv *it = jinja_iter_list(c, v, line), *l = jinja_list(c, it->list.n);
        memcpy(l->list.v, it->list.v, it->list.n * sizeof(*l->list.v));
        return l;
    }
    if (!strcmp(name, "items")) {
        if (v->t == JV_UNDEF)
            return jinja_list(c, 0);
        if (v->t != JV_DICT)
            jinja_err(c, line, "items: expected a mapping, got %s", jinja_type_name(v));
        return jinja_call(c, jinja_method(c, v, "items"), NULL, NULL, 0, line);
    }
    if (!strcmp(name, "upper") || !strcmp(name, "lower") || !strcmp(name, "title") ||
        !strcmp(name, "capitalize")) {
        struct jv *s = jinja_to_str(c, v, line);
        return case_map(c, s, name[0] == 'l' ? 0 : name[0] == 'u' ? 1 : name[0] == 't' ? 2 : 3);
    }
    if (!strcmp(name, "replace")) {
        struct jv *s = jinja_to_str(c, v, line), *a1 = arg(args, kw, n, 1, "new");
        struct jv *old = arg(args, kw, n, 0, "old"), *cnt = arg(args, kw, n, 2, "count");
        if (!old || !a1)
            jinja_err(c, line, "replace: expected old and new strings");
        return replace(c, s, old, a1,
                       cnt && cnt->t != JV_NONE ? need_int(c, cnt, "replace", line) : -1, line);
    }
    if (!strcmp(name, "join")) {
        struct jv *sep = arg(args, kw, n, 0, "d"), *attr = arg(args, kw, n, 1, "attribute");
        struct jv *items = jinja_iter_list(c, v, line);
        struct jbuf b = {0};
        if (sep)
            need_str(c, sep, "join", line);
        for (size_t i = 0; i < items->list.n; i++) {
            if (i && sep)
                jinja_buf_put(c, &b, sep->str.s, sep->str.n);
            struct jv *x = items->list.v[i];
            if (attr && attr->t != JV_NONE)
                x = attr_path(c, x, attr, line);
            jinja_str_into(c, &b, x, false, line);
        }
        return mkstr(c, &b);
    }
    if (!strcmp(name, "first") || !strcmp(name, "last")) {
        struct jv *items = jinja_iter_list(c, v, line);
        if (!items->list.n)
            return jinja_undef(c, "No %s item, sequence was empty.", name);
        return items->list.v[name[0] == 'f' ? 0 : items->list.n - 1];
    }
    if (!strcmp(name, "reverse")) {
        if (v->t == JV_STR) {
            struct jv *chars = jinja_iter_list(c, v, line);
            struct jbuf b = {0};
            for (size_t i = chars->list.n; i > 0; i--)
                jinja_buf_put(c, &b, chars->list.v[i - 1]->str.s, chars->list.v[i - 1]->str.n);
            return mkstr(c, &b);
        }
        struct jv *items = jinja_iter_list(c, v, line), *r = jinja_list(c, items->list.n);
        for (size_t i = 0; i < items->list.n; i++)
            r->list.v[i] = items->list.v[items->list.n - 1 - i];
        return r;
    }
    if (!strcmp(name, "select") || !strcmp(name, "reject"))
        return select_items(c, v, args, kw, n, false, name[0] == 's', line);
    if (!strcmp(name, "selectattr") || !strcmp(name, "rejectattr"))
        return select_items(c, v, args, kw, n, true, name[0] == 's', line);
    if (!strcmp(name, "map")) {
        struct jv *items = jinja_iter_list(c, v, line), *r = jinja_list(c, items->list.n);
        struct jv *attr = arg(args, kw, n, -1, "attribute"), *def = arg(args, kw, n, -1, "default");
        for (size_t i = 0; i < items->list.n; i++) {
            struct jv *x = items->list.v[i];
            if (attr) {
                x = attr_path(c, x, attr, line);
                if (x->t == JV_UNDEF && def)
                    x = def;
            } else {
                if (!a0)
                    jinja_err(c, line, "map: expected a filter name or attribute=");
                need_str(c, a0, "map", line);
                x = jinja_filter(c, a0->str.s, x, args + 1, kw + 1, n - 1, line);
            }
            r->list.v[i] = x;
        }
        return r;
    }
    if (!strcmp(name, "sort"))
        return sorted(c, v, flag(arg(args, kw, n, 0, "reverse")),
                      flag(arg(args, kw, n, 1, "case_sensitive")), arg(args, kw, n, 2, "attribute"),
                      line);
    if (!strcmp(name, "dictsort")) {
        if (v->t != JV_DICT)
            jinja_err(c, line, "dictsort: expected a mapping");
        struct jv *by = arg(args, kw, n, 1, "by");
        bool by_value = by && by->t == JV_STR && !strcmp(by->str.s, "value");
        struct jv *items = jinja_call(c, jinja_method(c, v, "items"), NULL, NULL, 0, line);
        return sorted(c, items, flag(arg(args, kw, n, 2, "reverse")),
                      flag(arg(args, kw, n, 0, "case_sensitive")), jinja_int(c, by_value), line);
    }
    if (!strcmp(name, "unique")) {
        struct jv *items = jinja_iter_list(c, v, line), *r = jinja_list(c, items->list.n);
        bool cs = flag(arg(args, kw, n, 0, "case_sensitive"));
        struct jv *attr = arg(args, kw, n, 1, "attribute");
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
    if (!strcmp(name, "min") || !strcmp(name, "max")) {
        struct jv *items = jinja_iter_list(c, v, line);
        if (!items->list.n)
            return jinja_undef(c, "No aggregated item, sequence was empty.");
        bool cs = flag(arg(args, kw, n, 0, "case_sensitive"));
        struct jv *attr = arg(args, kw, n, 1, "attribute"), *best = items->list.v[0];
        for (size_t i = 1; i < items->list.n; i++) {
            int o = jinja_compare(c, sort_key(c, items->list.v[i], attr, cs, line),
                               sort_key(c, best, attr, cs, line), line);
            if (name[1] == 'i' ? o < 0 : o > 0)
                best = items->list.v[i];
        }
        return best;
    }
    if (!strcmp(name, "sum")) {
        struct jv *items = jinja_iter_list(c, v, line), *attr = arg(args, kw, n, 0, "attribute");
        struct jv *acc = arg(args, kw, n, 1, "start");
        acc = acc ? acc : jinja_int(c, 0);
        for (size_t i = 0; i < items->list.n; i++) {
            struct jv *x = attr && attr->t != JV_NONE ? attr_path(c, items->list.v[i], attr, line)
                                                      : items->list.v[i];
            if (!(x->t == JV_INT || x->t == JV_FLOAT || x->t == JV_BOOL) ||
                !(acc->t == JV_INT || acc->t == JV_FLOAT || acc->t == JV_BOOL))
                jinja_err(c, line, "sum: expected numbers");
            if (acc->t == JV_FLOAT || x->t == JV_FLOAT)
                acc = jinja_float(
                    c,
                    (acc->t == JV_FLOAT ? acc->f : (double)(acc->t == JV_INT ? acc->i : acc->b)) +
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
    if (!strcmp(name, "abs")) {
        if (v->t == JV_FLOAT)
            return jinja_float(c, fabs(v->f));
        int64_t x = need_int(c, v, "abs", line);
        if (x == INT64_MIN)
            jinja_err(c, line, "an integer past 64 bits");
        return jinja_int(c, x < 0 ? -x : x);
    }
    if (!strcmp(name, "int")) {
        struct jv *def = arg(args, kw, n, 0, "default");
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
    if (!strcmp(name, "float")) {
        struct jv *def = arg(args, kw, n, 0, "default");
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
    if (!strcmp(name, "round")) {
        struct jv *pr = arg(args, kw, n, 0, "precision"), *m = arg(args, kw, n, 1, "method");
        int64_t p = pr ? need_int(c, pr, "round", line) : 0;
        const char *how = m ? need_str(c, m, "round", line)->str.s : "common";
        if (v->t != JV_FLOAT && !strcmp(how, "common") && p >= 0) /* round(int) is that int */
            return jinja_int(c, need_int(c, v, "round", line));
        double x = v->t == JV_FLOAT ? v->f : (double)need_int(c, v, "round", line);
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
    if (!strcmp(name, "attr")) {
        if (!a0)
            jinja_err(c, line, "attr: expected a name");
        return jinja_getattr(c, v, need_str(c, a0, "attr", line)->str.s, line);
    }
    if (!strcmp(name, "e") || !strcmp(name, "escape")) {
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
        return mkstr(c, &b);
    }
    if (!strcmp(name, "indent")) {
        struct jv *s = jinja_to_str(c, v, line), *w = arg(args, kw, n, 0, "width");
        bool first = flag(arg(args, kw, n, 1, "first")), blank = flag(arg(args, kw, n, 2, "blank"));
        struct jv *ind = w && w->t == JV_STR ? w : NULL;
        struct jbuf pad = {0};
        if (ind) {
            jinja_buf_put(c, &pad, ind->str.s, ind->str.n);
        } else {
            int64_t k = w ? need_int(c, w, "indent", line) : 4;
            for (int64_t i = 0; i < k && i < 256; i++)
                jinja_buf_put(c, &pad, " ", 1);
        }
        struct jv *lines = split(c, s, jinja_str(c, "\n", 1), -1, false, line);
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
        return mkstr(c, &b);
    }
    if (!strcmp(name, "wordcount")) { /* runs of \w: letters and digits; emoji, symbols and
                                       * punctuation outside ASCII are told apart by block */
        struct jv *s = jinja_to_str(c, v, line);
        int64_t words = 0;
        bool in = false;
        for (size_t i = 0; i < s->str.n;) {
            size_t w = cw(s->str.s + i, s->str.n - i);
            unsigned char ch = (unsigned char)s->str.s[i];
            unsigned u = ch;
            if (ch >= 0x80) {
                u = ch & (w == 4 ? 7 : w == 3 ? 15 : 31);
                for (size_t k = 1; k < w; k++)
                    u = u << 6 | ((unsigned char)s->str.s[i + k] & 63);
            }
            bool word = u < 0x80 ? (ch == '_' || ((ch | 32) >= 'a' && (ch | 32) <= 'z') ||
                                    (ch >= '0' && ch <= '9'))
                                 : !(u <= 0xbf || (u >= 0x2000 && u <= 0x2bff) ||
                                     (u >= 0x3000 && u <= 0x303f) || (u >= 0xfe00 && u <= 0xfe6f) ||
                                     (u >= 0x1f000 && u <= 0x1faff));
            words += word && !in;
            in = word;
            i += w;
        }
        return jinja_int(c, words);
    }
    jinja_err(c, line, "no filter named '%s'", name);
}
