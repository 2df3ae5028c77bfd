/* SPDX-License-Identifier: MIT */
/* coordinator/chat/jinja_value.c: the arena and errors, and values with Python's semantics
 * (truth, equality, order, str() and repr(), attributes, items, slices and calls). */
#include "jinja_internal.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const struct jv jinja_none = {.t = JV_NONE};
const struct jv jinja_true = {.t = JV_BOOL, .b = true};
const struct jv jinja_false = {.t = JV_BOOL, .b = false};

/* ---- arena ---- */
struct jchunk {
    struct jchunk *next;
    size_t size, used;
    _Alignas(16) unsigned char data[];
};

void *jinja_alloc(struct jarena *a, size_t n, struct jfail *f)
{
    n = (n + 15) & ~(size_t)15;
    struct jchunk *h = a->head;
    if (!h || h->size - h->used < n) {
        size_t size = n > (60u << 10) ? n : (60u << 10);
        if (a->used + size + sizeof(*h) > a->limit)
            jinja_throw(f, -E2BIG, "the template used more than %zu MiB of memory", a->limit >> 20);
        h = malloc(sizeof(*h) + size);
        if (!h)
            jinja_throw(f, -ENOMEM, "out of memory");
        a->used += size + sizeof(*h);
        h->size = size;
        h->used = 0;
        /* a big block goes behind the current one, which keeps its free space */
        if (a->head && n == size) {
            h->next = a->head->next;
            a->head->next = h;
        } else {
            h->next = a->head;
            a->head = h;
        }
    }
    void *p = h->data + h->used;
    h->used += n;
    memset(p, 0, n);
    return p;
}

void jinja_arena_free(struct jarena *a)
{
    while (a->head) {
        struct jchunk *n = a->head->next;
        free(a->head);
        a->head = n;
    }
    a->used = 0;
}

void jinja_throw(struct jfail *f, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(f->msg, sizeof(f->msg), fmt, ap);
    va_end(ap);
    /* one line (a raise_exception message may hold newlines, from the request too), cut on a
     * character's boundary */
    char *o = f->msg; /* line breaks as Python's " ".join(msg.splitlines()) joins them */
    for (const char *m = f->msg; *m; m++) {
        if (*m != '\n' && *m != '\r') {
            *o++ = *m;
            continue;
        }
        if (*m == '\r' && m[1] == '\n')
            m++;
        if (m[1])
            *o++ = ' ';
    }
    *o = 0;
    if (n >= (int)sizeof(f->msg)) {
        size_t k = strlen(f->msg);
        while (k && ((unsigned char)f->msg[k - 1] & 0xc0) == 0x80)
            k--;
        if (k && (unsigned char)f->msg[k - 1] >= 0xc0)
            k--;
        f->msg[k] = 0;
    }
    f->rc = rc;
    longjmp(f->jb, 1);
}

void jinja_err(struct jctx *c, int line, const char *fmt, ...)
{
    char m[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof(m), fmt, ap);
    va_end(ap);
    if (line > 0)
        jinja_throw(c->fail, -EINVAL, "line %d: %s", line, m);
    jinja_throw(c->fail, -EINVAL, "%s", m);
}

void jinja_charge(struct jctx *c, size_t n)
{
    c->steps += (long)(n > (size_t)c->lim->max_steps ? (size_t)c->lim->max_steps : n);
    if (c->steps > c->lim->max_steps)
        jinja_throw(c->fail, -E2BIG, "the template took more than %ld steps", c->lim->max_steps);
}

void jinja_deeper(struct jctx *c, int line)
{
    if (++c->vdepth > 256)
        jinja_throw(c->fail, -E2BIG, "%s%.0d%sa value nested deeper than 256 (or holding itself)",
                    line > 0 ? "line " : "", line > 0 ? line : 0, line > 0 ? ": " : "");
}

/* ---- UTF-8 and Python's whitespace ---- */
size_t jinja_utf8_count(const char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += ((unsigned char)s[i] & 0xc0) != 0x80;
    return k;
}

bool jinja_isspace_at(const char *s, size_t n, size_t *w)
{
    const unsigned char *u = (const unsigned char *)s;
    *w = 1;
    if (!n)
        return false;
    if (u[0] < 0x80)
        return u[0] == ' ' || (u[0] >= 9 && u[0] <= 13) || (u[0] >= 0x1c && u[0] <= 0x1f);
    if (n >= 2 && u[0] == 0xc2 && (u[1] == 0x85 || u[1] == 0xa0)) {
        *w = 2;
        return true;
    }
    if (n >= 3 && u[0] == 0xe1 && u[1] == 0x9a && u[2] == 0x80) { /* U+1680 */
        *w = 3;
        return true;
    }
    if (n >= 3 && u[0] == 0xe2 && u[1] == 0x80 &&
        (u[2] <= 0x8a || u[2] == 0xa8 || u[2] == 0xa9 || u[2] == 0xaf)) {
        *w = 3; /* U+2000..200A, 2028, 2029, 202F */
        return true;
    }
    if (n >= 3 && ((u[0] == 0xe2 && u[1] == 0x81 && u[2] == 0x9f) ||  /* U+205F */
                   (u[0] == 0xe3 && u[1] == 0x80 && u[2] == 0x80))) { /* U+3000 */
        *w = 3;
        return true;
    }
    return false;
}

/* ---- values ---- */
struct jv *jinja_new(struct jctx *c, enum jv_type t)
{
    struct jv *v = jinja_alloc(c->arena, sizeof(*v), c->fail);
    v->t = t;
    return v;
}

struct jv *jinja_str(struct jctx *c, const char *s, size_t n)
{
    jinja_charge(c, n / 64);
    struct jv *v = jinja_new(c, JV_STR);
    char *d = jinja_alloc(c->arena, n + 1, c->fail);
    if (n)
        memcpy(d, s, n);
    v->str.s = d;
    v->str.n = n;
    return v;
}

struct jv *jinja_int(struct jctx *c, int64_t i)
{
    struct jv *v = jinja_new(c, JV_INT);
    v->i = i;
    return v;
}

struct jv *jinja_float(struct jctx *c, double f)
{
    struct jv *v = jinja_new(c, JV_FLOAT);
    v->f = f;
    return v;
}

struct jv *jinja_bool(bool b) { return jinja_shared(b ? &jinja_true : &jinja_false); }

struct jv *jinja_list(struct jctx *c, size_t n)
{
    jinja_charge(c, n);
    struct jv *v = jinja_new(c, JV_LIST);
    v->list.v = jinja_alloc(c->arena, n * sizeof(*v->list.v) + 1, c->fail);
    v->list.n = n;
    return v;
}

struct jv *jinja_dict(struct jctx *c, size_t cap)
{
    struct jv *v = jinja_new(c, JV_DICT);
    v->dict.cap = cap ? cap : 4;
    v->dict.k = jinja_alloc(c->arena, v->dict.cap * sizeof(*v->dict.k), c->fail);
    v->dict.v = jinja_alloc(c->arena, v->dict.cap * sizeof(*v->dict.v), c->fail);
    return v;
}

static void dict_append(struct jctx *c, struct jv *d, struct jv *k, struct jv *v)
{
    if (d->dict.n == d->dict.cap) {
        size_t cap = d->dict.cap * 2;
        struct jv **nk = jinja_alloc(c->arena, cap * sizeof(*nk), c->fail);
        struct jv **nv = jinja_alloc(c->arena, cap * sizeof(*nv), c->fail);
        memcpy(nk, d->dict.k, d->dict.n * sizeof(*nk));
        memcpy(nv, d->dict.v, d->dict.n * sizeof(*nv));
        d->dict.k = nk;
        d->dict.v = nv;
        d->dict.cap = cap;
    }
    d->dict.k[d->dict.n] = k;
    d->dict.v[d->dict.n++] = v;
}

static long dict_find(struct jctx *c, const struct jv *d, const struct jv *k)
{
    jinja_charge(c, d->dict.n);
    for (size_t i = 0; i < d->dict.n; i++)
        if (jinja_equal(c, d->dict.k[i], k))
            return (long)i;
    return -1;
}

void jinja_dict_put(struct jctx *c, struct jv *d, struct jv *k, struct jv *v)
{
    long i = dict_find(c, d, k);
    if (i >= 0)
        d->dict.v[i] = v;
    else
        dict_append(c, d, k, v);
}

struct jv *jinja_dict_get(struct jctx *c, const struct jv *d, const struct jv *k)
{
    long i = dict_find(c, d, k);
    return i >= 0 ? d->dict.v[i] : NULL;
}

struct jv *jinja_dict_gets(struct jctx *c, const struct jv *d, const char *k)
{
    jinja_charge(c, d->dict.n);
    size_t n = strlen(k);
    for (size_t i = 0; i < d->dict.n; i++) {
        const struct jv *x = d->dict.k[i];
        if (x->t == JV_STR && x->str.n == n && !memcmp(x->str.s, k, n))
            return d->dict.v[i];
    }
    return NULL;
}

struct jv *jinja_undef(struct jctx *c, const char *fmt, ...)
{
    char m[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof(m), fmt, ap);
    va_end(ap);
    struct jv *v = jinja_new(c, JV_UNDEF);
    size_t n = strlen(m);
    char *d = jinja_alloc(c->arena, n + 1, c->fail);
    memcpy(d, m, n);
    v->undef = d;
    return v;
}

struct jv *jinja_from_json(struct jctx *c, json_t *j, int depth)
{
    if (depth > 256)
        jinja_throw(c->fail, -E2BIG, "the variables nest deeper than 256");
    jinja_charge(c, 1);
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        struct jv *d = jinja_dict(c, json_object_size(j));
        const char *k;
        json_t *v;
        json_object_foreach(j, k, v)
            dict_append(c, d, jinja_str(c, k, strlen(k)), jinja_from_json(c, v, depth + 1));
        return d;
    }
    case JSON_ARRAY: {
        struct jv *l = jinja_list(c, json_array_size(j));
        for (size_t i = 0; i < l->list.n; i++)
            l->list.v[i] = jinja_from_json(c, json_array_get(j, i), depth + 1);
        return l;
    }
    case JSON_STRING:
        return jinja_str(c, json_string_value(j), json_string_length(j));
    case JSON_INTEGER:
        return jinja_int(c, json_integer_value(j));
    case JSON_REAL:
        return jinja_float(c, json_real_value(j));
    case JSON_TRUE:
        return jinja_shared(&jinja_true);
    case JSON_FALSE:
        return jinja_shared(&jinja_false);
    default:
        return jinja_shared(&jinja_none);
    }
}

bool jinja_truthy(const struct jv *v)
{
    switch (v->t) {
    case JV_UNDEF:
    case JV_NONE:
        return false;
    case JV_BOOL:
        return v->b;
    case JV_INT:
        return v->i != 0;
    case JV_FLOAT:
        return v->f != 0;
    case JV_STR:
        return v->str.n > 0;
    case JV_LIST:
        return v->list.n > 0;
    case JV_DICT:
        return v->dict.n > 0;
    default:
        return true;
    }
}

const char *jinja_type_name(const struct jv *v)
{
    switch (v->t) {
    case JV_UNDEF:
        return "Undefined";
    case JV_NONE:
        return "NoneType";
    case JV_BOOL:
        return "bool";
    case JV_INT:
        return "int";
    case JV_FLOAT:
        return "float";
    case JV_STR:
        return "str";
    case JV_LIST:
        return v->tuple ? "tuple" : "list";
    case JV_DICT:
        return "dict";
    case JV_NS:
        return "Namespace";
    case JV_MACRO:
        return "Macro";
    case JV_LOOP:
        return "LoopContext";
    default:
        return "builtin_function_or_method";
    }
}

bool jinja_equal(struct jctx *c, const struct jv *a, const struct jv *b)
{
    jinja_charge(c, 1);
    if (jinja_is_num(a) && jinja_is_num(b)) {
        if (a->t == JV_FLOAT || b->t == JV_FLOAT)
            return jinja_num_f(a) == jinja_num_f(b);
        return jinja_num_i(a) == jinja_num_i(b);
    }
    if (a->t != b->t)
        return false;
    switch (a->t) {
    case JV_UNDEF:
    case JV_NONE:
        return true;
    case JV_STR:
        jinja_charge(c, a->str.n / 64);
        return a->str.n == b->str.n && !memcmp(a->str.s, b->str.s, a->str.n);
    case JV_LIST: {
        if (a->tuple != b->tuple || a->list.n != b->list.n)
            return false;
        bool eq = true;
        jinja_deeper(c, 0);
        for (size_t i = 0; i < a->list.n && eq; i++)
            eq = jinja_equal(c, a->list.v[i], b->list.v[i]);
        c->vdepth--;
        return eq;
    }
    case JV_DICT: {
        if (a->dict.n != b->dict.n)
            return false;
        bool eq = true;
        jinja_deeper(c, 0);
        for (size_t i = 0; i < a->dict.n && eq; i++) {
            struct jv *o = jinja_dict_get(c, b, a->dict.k[i]);
            eq = o && jinja_equal(c, a->dict.v[i], o);
        }
        c->vdepth--;
        return eq;
    }
    case JV_FUNC: /* the same function on the same object; a str's method bound twice is two
                   * objects, as it always was here */
        return a == b ||
               (a->func.fn == b->func.fn && a->func.method == b->func.method &&
                a->func.self == b->func.self && !(a->func.method && a->func.self->t == JV_STR));
    default:
        return a == b;
    }
}

int jinja_compare(struct jctx *c, const struct jv *a, const struct jv *b, int line)
{
    jinja_charge(c, 1);
    if (jinja_is_num(a) && jinja_is_num(b)) {
        if (a->t == JV_FLOAT || b->t == JV_FLOAT) {
            double x = jinja_num_f(a), y = jinja_num_f(b);
            return x < y ? -1 : x > y;
        }
        int64_t x = jinja_num_i(a), y = jinja_num_i(b);
        return x < y ? -1 : x > y;
    }
    if (a->t == JV_STR && b->t == JV_STR) {
        size_t n = a->str.n < b->str.n ? a->str.n : b->str.n;
        int r = memcmp(a->str.s, b->str.s, n);
        return r ? r : a->str.n < b->str.n ? -1 : a->str.n > b->str.n;
    }
    if (a->t == JV_LIST && b->t == JV_LIST && a->tuple == b->tuple) {
        int r = 0;
        jinja_deeper(c, line);
        for (size_t i = 0; i < a->list.n && i < b->list.n && !r; i++)
            if (!jinja_equal(c, a->list.v[i], b->list.v[i]))
                r = jinja_compare(c, a->list.v[i], b->list.v[i], line);
        c->vdepth--;
        return r ? r : a->list.n < b->list.n ? -1 : a->list.n > b->list.n;
    }
    if (a->t == JV_UNDEF || b->t == JV_UNDEF)
        jinja_err(c, line, "%s", (a->t == JV_UNDEF ? a : b)->undef);
    jinja_err(c, line, "'<' not supported between instances of '%s' and '%s'", jinja_type_name(a),
              jinja_type_name(b));
}

/* ---- str() and repr() ---- */
void jinja_buf_put(struct jctx *c, struct jbuf *b, const char *s, size_t n)
{
    if (b->n + n > c->lim->max_output) /* every text built, not only the rendering */
        jinja_throw(c->fail, -E2BIG, "the template's output passed %zu bytes", c->lim->max_output);
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *ns = jinja_alloc(c->arena, cap, c->fail);
        if (b->n)
            memcpy(ns, b->s, b->n);
        b->s = ns;
        b->cap = cap;
    }
    jinja_charge(c, n / 64);
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}

static void put_s(struct jctx *c, struct jbuf *b, const char *s)
{
    jinja_buf_put(c, b, s, strlen(s));
}

/* Python's repr() of a float: the shortest digits that read back to it, positional between
 * 1e-4 and 1e16, else d.ddde+XX. */
static void float_repr(double f, char *out, size_t len)
{
    if (isnan(f)) {
        snprintf(out, len, "nan");
        return;
    }
    if (isinf(f)) {
        snprintf(out, len, f < 0 ? "-inf" : "inf");
        return;
    }
    char e[40];
    int p;
    for (p = 1; p <= 17; p++) {
        snprintf(e, sizeof(e), "%.*e", p - 1, f);
        if (strtod(e, NULL) == f)
            break;
    }
    /* e: [-]d[.ddd]e[+-]XX */
    char digits[24];
    int nd = 0, exp10;
    const char *q = e;
    bool neg = *q == '-';
    if (neg)
        q++;
    for (; *q && *q != 'e'; q++)
        if (*q != '.')
            digits[nd++] = *q;
    exp10 = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    digits[nd] = 0;
    char *o = out;
    if (neg)
        *o++ = '-';
    if (exp10 >= 16 || exp10 < -4) {
        *o++ = digits[0];
        if (nd > 1) {
            *o++ = '.';
            memcpy(o, digits + 1, (size_t)nd - 1);
            o += nd - 1;
        }
        snprintf(o, len - (size_t)(o - out), "e%c%02d", exp10 < 0 ? '-' : '+', abs(exp10));
        return;
    }
    if (exp10 < 0) {
        *o++ = '0';
        *o++ = '.';
        for (int i = -1; i > exp10; i--)
            *o++ = '0';
        memcpy(o, digits, (size_t)nd);
        o += nd;
    } else {
        for (int i = 0; i <= exp10; i++)
            *o++ = i < nd ? digits[i] : '0';
        *o++ = '.';
        if (nd > exp10 + 1) {
            memcpy(o, digits + exp10 + 1, (size_t)(nd - exp10 - 1));
            o += nd - exp10 - 1;
        } else {
            *o++ = '0';
        }
    }
    *o = 0;
}

/* Whether Python prints code point @u as it is in a repr (str.isprintable()), roughly: not a
 * control, separator (but space) or format character. */
static bool py_printable(unsigned u)
{
    if (u < 0x20 || (u >= 0x7f && u <= 0xa0) || u == 0xad)
        return false;
    if (u == 0x1680 || (u >= 0x2000 && u <= 0x200f) || (u >= 0x2028 && u <= 0x202f) ||
        (u >= 0x205f && u <= 0x2064) || u == 0x3000 || u == 0xfeff || (u >= 0xfff9 && u <= 0xfffb))
        return false;
    return true;
}

static void str_repr(struct jctx *c, struct jbuf *b, const char *s, size_t n)
{
    bool sq = memchr(s, '\'', n) != NULL, dq = memchr(s, '"', n) != NULL;
    char q = sq && !dq ? '"' : '\'';
    jinja_buf_put(c, b, &q, 1);
    for (size_t i = 0; i < n;) {
        unsigned char ch = (unsigned char)s[i];
        unsigned u = ch;
        size_t w = 1;
        if (ch >= 0xc0) {
            w = ch >= 0xf0 ? 4 : ch >= 0xe0 ? 3 : 2;
            if (i + w > n)
                w = n - i;
            u = ch & (ch >= 0xf0 ? 7 : ch >= 0xe0 ? 15 : 31);
            for (size_t k = 1; k < w; k++)
                u = u << 6 | ((unsigned char)s[i + k] & 63);
        }
        char esc[12];
        if (ch == '\\' || ch == (unsigned char)q) {
            esc[0] = '\\';
            esc[1] = (char)ch;
            jinja_buf_put(c, b, esc, 2);
        } else if (ch == '\n' || ch == '\r' || ch == '\t') {
            esc[0] = '\\';
            esc[1] = ch == '\n' ? 'n' : ch == '\r' ? 'r' : 't';
            jinja_buf_put(c, b, esc, 2);
        } else if (!py_printable(u)) {
            int m = snprintf(esc, sizeof(esc),
                             u < 0x100     ? "\\x%02x"
                             : u < 0x10000 ? "\\u%04x"
                                           : "\\U%08x",
                             u);
            jinja_buf_put(c, b, esc, (size_t)m);
        } else {
            jinja_buf_put(c, b, s + i, w);
        }
        i += w;
    }
    jinja_buf_put(c, b, &q, 1);
}

void jinja_str_into(struct jctx *c, struct jbuf *b, const struct jv *v, bool repr, int line)
{
    char num[48];
    jinja_charge(c, 1);
    switch (v->t) {
    case JV_UNDEF:
        if (repr)
            put_s(c, b, "Undefined");
        return;
    case JV_NONE:
        put_s(c, b, "None");
        return;
    case JV_BOOL:
        put_s(c, b, v->b ? "True" : "False");
        return;
    case JV_INT:
        snprintf(num, sizeof(num), "%lld", (long long)v->i);
        put_s(c, b, num);
        return;
    case JV_FLOAT:
        float_repr(v->f, num, sizeof(num));
        put_s(c, b, num);
        return;
    case JV_STR:
        if (repr)
            str_repr(c, b, v->str.s, v->str.n);
        else
            jinja_buf_put(c, b, v->str.s, v->str.n);
        return;
    case JV_LIST:
        jinja_deeper(c, line);
        put_s(c, b, v->tuple ? "(" : "[");
        for (size_t i = 0; i < v->list.n; i++) {
            if (i)
                put_s(c, b, ", ");
            jinja_str_into(c, b, v->list.v[i], true, line);
        }
        put_s(c, b, v->tuple ? (v->list.n == 1 ? ",)" : ")") : "]");
        c->vdepth--;
        return;
    case JV_DICT:
    case JV_NS:
        jinja_deeper(c, line);
        put_s(c, b, v->t == JV_NS ? "<Namespace {" : "{");
        for (size_t i = 0; i < v->dict.n; i++) {
            if (i)
                put_s(c, b, ", ");
            jinja_str_into(c, b, v->dict.k[i], true, line);
            put_s(c, b, ": ");
            jinja_str_into(c, b, v->dict.v[i], true, line);
        }
        put_s(c, b, v->t == JV_NS ? "}>" : "}");
        c->vdepth--;
        return;
    case JV_LOOP:
        put_s(c, b, "<LoopContext>");
        return;
    case JV_MACRO:
        put_s(c, b, "<Macro '");
        put_s(c, b, v->macro.def->name);
        put_s(c, b, "'>");
        return;
    default:
        put_s(c, b, "<built-in method ");
        put_s(c, b, v->func.name);
        put_s(c, b, ">");
        return;
    }
}

struct jv *jinja_to_str(struct jctx *c, struct jv *v, int line)
{
    if (v->t == JV_STR)
        return v;
    struct jbuf b = {0};
    jinja_str_into(c, &b, v, false, line);
    struct jv *s = jinja_new(c, JV_STR);
    s->str.s = b.s ? b.s : "";
    s->str.n = b.n;
    return s;
}

/* ---- attribute, item, call ---- */
_Noreturn void jinja_undefined_error(struct jctx *c, const struct jv *v, int line)
{
    jinja_err(c, line, "%s", v->undef);
}

struct jv *jinja_getattr(struct jctx *c, struct jv *o, const char *name, int line)
{
    if (o->t == JV_UNDEF)
        jinja_undefined_error(c, o, line);
    if (o->t == JV_LOOP)
        return jinja_loop_attr(c, o, name);
    if (o->t == JV_NS) {
        struct jv *v = jinja_dict_gets(c, o, name);
        return v ? v : jinja_undef(c, "'Namespace' has no attribute '%s'", name);
    }
    struct jv *m = jinja_method(c, o, name);
    if (m)
        return m;
    if (o->t == JV_DICT) {
        struct jv *v = jinja_dict_gets(c, o, name);
        return v ? v : jinja_undef(c, "'dict object' has no attribute '%s'", name);
    }
    if (o->t == JV_NONE)
        return jinja_undef(c, "'None' has no attribute '%s'", name);
    return jinja_undef(c, "'%s object' has no attribute '%s'", jinja_type_name(o), name);
}

/* Python's index @i into @n items (negative from the end); false when outside. */
static bool index_of(int64_t i, size_t n, size_t *out)
{
    if (i < 0)
        i += (int64_t)n;
    if (i < 0 || (uint64_t)i >= n)
        return false;
    *out = (size_t)i;
    return true;
}

/* byte offset of code point @k of @s */
static size_t utf8_offset(const char *s, size_t n, size_t k)
{
    size_t i = 0;
    while (i < n && k) {
        i++;
        while (i < n && ((unsigned char)s[i] & 0xc0) == 0x80)
            i++;
        k--;
    }
    return i;
}

struct jv *jinja_getitem(struct jctx *c, struct jv *o, struct jv *k, int line)
{
    if (o->t == JV_UNDEF)
        jinja_undefined_error(c, o, line);
    if (o->t == JV_DICT || o->t == JV_NS) {
        struct jv *v = jinja_dict_get(c, o, k);
        if (v)
            return v;
    } else if ((o->t == JV_LIST || o->t == JV_STR) && (k->t == JV_INT || k->t == JV_BOOL)) {
        size_t n = o->t == JV_LIST ? o->list.n : jinja_utf8_count(o->str.s, o->str.n), i;
        jinja_charge(c, o->t == JV_STR ? o->str.n / 64 : 0);
        if (!index_of(jinja_num_i(k), n, &i))
            return jinja_undef(c, "%s object has no element %lld", jinja_type_name(o),
                               (long long)jinja_num_i(k));
        if (o->t == JV_LIST)
            return o->list.v[i];
        size_t a = utf8_offset(o->str.s, o->str.n, i);
        size_t b = utf8_offset(o->str.s + a, o->str.n - a, 1);
        return jinja_str(c, o->str.s + a, b);
    }
    if (k->t == JV_STR && o->t != JV_NS)
        return jinja_getattr(c, o, k->str.s, line);
    if (k->t == JV_UNDEF)
        jinja_undefined_error(c, k, line);
    return jinja_undef(c, "'%s object' has no element of that key", jinja_type_name(o));
}

/* o[a:b:s] */
struct jv *jinja_slice(struct jctx *c, struct jv *o, struct jv *parts[3], int line)
{
    if (o->t == JV_UNDEF)
        jinja_undefined_error(c, o, line);
    if (o->t != JV_LIST && o->t != JV_STR)
        jinja_err(c, line, "'%s' object is not subscriptable", jinja_type_name(o));
    int64_t v[3];
    for (int i = 0; i < 3; i++) {
        struct jv *p = parts[i];
        if (p && p->t != JV_NONE && p->t != JV_INT && p->t != JV_BOOL)
            jinja_err(c, line, "slice indices must be integers or None");
        v[i] = p && p->t != JV_NONE ? jinja_num_i(p) : INT64_MIN;
    }
    int64_t step = v[2] == INT64_MIN ? 1 : v[2];
    if (step == 0)
        jinja_err(c, line, "slice step cannot be zero");
    int64_t n =
        o->t == JV_LIST ? (int64_t)o->list.n : (int64_t)jinja_utf8_count(o->str.s, o->str.n);
    /* Python's PySlice_AdjustIndices */
    int64_t lo = step < 0 ? -1 : 0, hi = step < 0 ? n - 1 : n, start, stop;
    start = v[0] == INT64_MIN ? (step < 0 ? hi : lo) : v[0];
    stop = v[1] == INT64_MIN ? (step < 0 ? lo : hi) : v[1];
    if (v[0] != INT64_MIN) {
        if (start < 0)
            start = start + n < lo ? lo : start + n;
        else if (start > hi)
            start = hi;
    }
    if (v[1] != INT64_MIN) {
        if (stop < 0)
            stop = stop + n < lo ? lo : stop + n;
        else if (stop > hi)
            stop = hi;
    }
    size_t count = 0;
    if (step > 0 && start < stop)
        count = (size_t)((stop - start - 1) / step + 1);
    else if (step < 0 && stop < start)
        count = (size_t)((start - stop - 1) / (-step) + 1);
    if (o->t == JV_LIST) {
        struct jv *r = jinja_list(c, count);
        r->tuple = o->tuple;
        for (size_t i = 0; i < count; i++)
            r->list.v[i] = o->list.v[start + (int64_t)i * step];
        return r;
    }
    /* code point offsets of the string, then the picked characters */
    jinja_charge(c, o->str.n / 16);
    size_t *off = jinja_alloc(c->arena, ((size_t)n + 1) * sizeof(size_t), c->fail);
    size_t k = 0;
    for (size_t i = 0; i < o->str.n; i++)
        if (((unsigned char)o->str.s[i] & 0xc0) != 0x80)
            off[k++] = i;
    off[k] = o->str.n;
    struct jbuf b = {0};
    if (step == 1 && count)
        jinja_buf_put(c, &b, o->str.s + off[start], off[start + (int64_t)count] - off[start]);
    else
        for (size_t i = 0; i < count; i++) {
            int64_t j = start + (int64_t)i * step;
            jinja_buf_put(c, &b, o->str.s + off[j], off[j + 1] - off[j]);
        }
    return jinja_str(c, b.s ? b.s : "", b.n);
}

struct jv *jinja_call(struct jctx *c, struct jv *f, struct jv **args, const char **kw, int n,
                      int line)
{
    if (f->t == JV_FUNC && f->func.method)
        return jinja_call_method(c, f, args, kw, n, line);
    if (f->t == JV_FUNC)
        return f->func.fn(c, f->func.self, args, kw, n, line);
    if (f->t == JV_MACRO)
        return jinja_call_macro(c, f, args, kw, n, line);
    if (f->t == JV_UNDEF)
        jinja_undefined_error(c, f, line);
    jinja_err(c, line, "'%s' object is not callable", jinja_type_name(f));
}

struct jv *jinja_iter_list(struct jctx *c, struct jv *v, int line)
{
    switch (v->t) {
    case JV_LIST:
        return v;
    case JV_UNDEF:
        return jinja_list(c, 0);
    case JV_DICT: {
        struct jv *l = jinja_list(c, v->dict.n);
        memcpy(l->list.v, v->dict.k, v->dict.n * sizeof(*l->list.v));
        return l;
    }
    case JV_STR: {
        size_t n = jinja_utf8_count(v->str.s, v->str.n), k = 0;
        struct jv *l = jinja_list(c, n);
        for (size_t i = 0; i < v->str.n; k++) {
            size_t w = utf8_offset(v->str.s + i, v->str.n - i, 1);
            l->list.v[k] = jinja_str(c, v->str.s + i, w);
            i += w;
        }
        return l;
    }
    default:
        jinja_err(c, line, "'%s' object is not iterable", jinja_type_name(v));
    }
}
