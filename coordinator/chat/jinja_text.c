/* SPDX-License-Identifier: MIT */
/* coordinator/chat/jinja_text.c: what the filters and methods share - their arguments, Python's
 * str operations (strip, split, replace, ASCII case mappings) and tojson as Python's json.dumps
 * writes it. */
#include "jinja_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct jv *jinja_arg(struct jv **args, const char **kw, int n, int pos, const char *name)
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

struct jv *jinja_need_str(struct jctx *c, struct jv *v, const char *what, int line)
{
    if (v->t == JV_UNDEF)
        jinja_err(c, line, "%s", v->undef);
    if (v->t != JV_STR)
        jinja_err(c, line, "%s: expected a string, got %s", what, jinja_type_name(v));
    return v;
}

struct jv *jinja_mkstr(struct jctx *c, struct jbuf *b)
{
    struct jv *r = jinja_str(c, "", 0);
    r->str.s = b->s ? b->s : "";
    r->str.n = b->n;
    return r;
}

int64_t jinja_need_int(struct jctx *c, struct jv *v, const char *what, int line)
{
    if (v->t == JV_INT)
        return v->i;
    if (v->t == JV_BOOL)
        return v->b;
    jinja_err(c, line, "%s: expected an integer, got %s", what, jinja_type_name(v));
}

size_t jinja_char_width(const char *s, size_t n)
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
        size_t k = jinja_char_width(chars->str.s + i, chars->str.n - i);
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
            w = jinja_char_width(s + a, b - a);
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

enum jinja_case jinja_case_of(const char *name)
{
    return name[0] == 'l'   ? JINJA_CASE_LOWER
           : name[0] == 'u' ? JINJA_CASE_UPPER
           : name[0] == 't' ? JINJA_CASE_TITLE
                            : JINJA_CASE_CAPITALIZE;
}

struct jv *jinja_case_map(struct jctx *c, struct jv *v, enum jinja_case mode)
{
    struct jv *r = jinja_str(c, v->str.s, v->str.n);
    char *s = (char *)r->str.s;
    bool start = true;
    for (size_t i = 0; i < r->str.n; i++) {
        char ch = s[i];
        bool alpha = (ch | 32) >= 'a' && (ch | 32) <= 'z';
        bool up = mode == JINJA_CASE_UPPER || (mode == JINJA_CASE_TITLE && start) ||
                  (mode == JINJA_CASE_CAPITALIZE && i == 0);
        if (alpha)
            s[i] = up ? (char)(ch & ~32) : (char)(ch | 32);
        /* title(): a word starts after any character that is not a letter */
        start = !alpha && !((unsigned char)ch >= 0x80);
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

struct jv *jinja_split(struct jctx *c, struct jv *s, struct jv *sep, int64_t max, bool right,
                       int line)
{
    struct parts all = {0}; /* in the arena: a split may be deep inside macro calls */
    const char *p = s->str.s;
    size_t len = s->str.n;
    jinja_charge(c, len / 16);
    if (sep && sep->t != JV_NONE) {
        jinja_need_str(c, sep, "split", line);
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
                i += jinja_char_width(p + i, len - i);
            parts_add(c, &all, p + b, i - b);
        }
    }
    struct jv *l = jinja_list(c, all.n);
    if (all.n)
        memcpy(l->list.v, all.v, all.n * sizeof(*all.v));
    return l;
}

struct jv *jinja_replace(struct jctx *c, struct jv *s, struct jv *old, struct jv *new,
                         int64_t count, int line)
{
    jinja_need_str(c, old, "replace", line);
    jinja_need_str(c, new, "replace", line);
    struct jbuf b = {0};
    size_t i = 0, done = 0;
    if (!old->str.n) { /* Python inserts @new between every character */
        while ((count < 0 || (int64_t)done < count)) {
            jinja_buf_put(c, &b, new->str.s, new->str.n);
            done++;
            if (i >= s->str.n)
                break;
            size_t w = jinja_char_width(s->str.s + i, s->str.n - i);
            jinja_buf_put(c, &b, s->str.s + i, w);
            i += w;
        }
        jinja_buf_put(c, &b, s->str.s + i, s->str.n - i);
        return jinja_mkstr(c, &b);
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
    return jinja_mkstr(c, &b);
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
            size_t w = jinja_char_width(s + i, n - i);
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

/* a dict as json.dumps writes it: keys as strings (numbers, bools and None converted), sorted
 * (stably) with @sort_keys */
static void json_dict(struct jctx *c, struct jbuf *b, const struct jv *v, int indent, int level,
                      const char *item_sep, const char *key_sep, bool sort_keys, bool ascii,
                      int line)
{
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
    case JV_DICT:
        json_dict(c, b, v, indent, level, item_sep, key_sep, sort_keys, ascii, line);
        return;
    default:
        jinja_err(c, line, "Object of type %s is not JSON serializable", jinja_type_name(v));
    }
}

/* ---- the tables ---- */
static int fn_cmp(const void *key, const void *entry)
{
    return strcmp(key, ((const struct jinja_fn *)entry)->name);
}

const struct jinja_fn *jinja_lookup(const struct jinja_fn *table, size_t n, const char *name)
{
    return bsearch(name, table, n, sizeof(*table), fn_cmp);
}

void jinja_check_arity(struct jctx *c, const struct jinja_fn *f, const char **kw, int n, int line)
{
    int positional = 0;
    for (int i = 0; i < n; i++)
        positional += !(kw && kw[i]);
    if (positional < f->min_args)
        jinja_err(c, line, f->too_few, f->name);
}
