/* SPDX-License-Identifier: MIT */
/* coordinator/chat/jinja_parse.c: a Jinja template into its syntax tree - the lexer (Jinja2's
 * rules with trim_blocks and lstrip_blocks: newlines normalized, the last one dropped, the
 * whitespace controls) and a recursive-descent parser with Jinja2's precedence. */
#include "jinja_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

enum jt {
    JT_EOF,
    JT_DATA,
    JT_VAR_BEGIN,
    JT_VAR_END,
    JT_BLOCK_BEGIN,
    JT_BLOCK_END,
    JT_NAME,
    JT_STRING,
    JT_INT,
    JT_FLOAT,
    JT_OP
};

struct jtok {
    enum jt t;
    int line;
    const char *s; /* DATA, NAME, OP, STRING (decoded): NUL-terminated */
    size_t n;
    int64_t i;
    double f;
};

struct jparse {
    struct jarena *a;
    struct jfail *f;
    const char *src;
    size_t len;
    struct jtok *toks;
    size_t ntok, cap, pos;
    int depth, max_depth;
};

static _Noreturn void perr(struct jparse *p, int line, const char *what)
{
    jinja_throw(p->f, -EINVAL, "line %d: %s", line, what);
}

static char *pdup(struct jparse *p, const char *s, size_t n)
{
    char *d = jinja_alloc(p->a, n + 1, p->f);
    memcpy(d, s, n);
    return d;
}

static void emit(struct jparse *p, enum jt t, int line, const char *s, size_t n)
{
    if (p->ntok == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 256;
        struct jtok *nt = jinja_alloc(p->a, cap * sizeof(*nt), p->f);
        if (p->ntok)
            memcpy(nt, p->toks, p->ntok * sizeof(*nt));
        p->toks = nt;
        p->cap = cap;
    }
    struct jtok *k = &p->toks[p->ntok++];
    *k = (struct jtok){.t = t, .line = line, .s = s ? pdup(p, s, n) : NULL, .n = n};
}

static int count_nl(const char *s, size_t n)
{
    int c = 0;
    for (size_t i = 0; i < n; i++)
        c += s[i] == '\n';
    return c;
}

/* Python's str.rstrip(): the length of @s without its trailing whitespace. */
static size_t rstrip_len(const char *s, size_t n)
{
    for (;;) {
        size_t i = n, w = 0;
        if (!n)
            return 0;
        while (i > 0 && ((unsigned char)s[i - 1] & 0xc0) == 0x80 && n - i < 3)
            i--;
        i = i > 0 ? i - 1 : 0;
        if (!jinja_isspace_at(s + i, n - i, &w) || i + w != n)
            return n;
        n = i;
    }
}

/* Bytes of Python whitespace (\s) at @s, up to @n. */
static size_t span_space(const char *s, size_t n)
{
    size_t i = 0, w;
    while (i < n && jinja_isspace_at(s + i, n - i, &w))
        i += w;
    return i;
}

static bool is_digit(char ch) { return ch >= '0' && ch <= '9'; }

static bool is_base_digit(char ch, int base)
{
    if (base == 16)
        return is_digit(ch) || ((ch | 32) >= 'a' && (ch | 32) <= 'f');
    return ch >= '0' && ch < '0' + base;
}

/* The end of a run of decimal digits and underscores of @c (@r bytes) from @k. */
static size_t digits_end(const char *c, size_t r, size_t k)
{
    while (k < r && (is_digit(c[k]) || c[k] == '_'))
        k++;
    return k;
}

static bool is_name_char(char ch, bool first)
{
    return ch == '_' || ((ch | 32) >= 'a' && (ch | 32) <= 'z') || (!first && is_digit(ch));
}

static bool starts(const char *s, size_t n, const char *lit)
{
    size_t l = strlen(lit);
    return n >= l && memcmp(s, lit, l) == 0;
}

/* Appends code point @v as UTF-8 at *@o. */
static void put_utf8(char **o, unsigned v)
{
    char *d = *o;
    if (v < 0x80) {
        *d++ = (char)v;
    } else if (v < 0x800) {
        *d++ = (char)(0xc0 | v >> 6);
        *d++ = (char)(0x80 | (v & 63));
    } else if (v < 0x10000) {
        *d++ = (char)(0xe0 | v >> 12);
        *d++ = (char)(0x80 | (v >> 6 & 63));
        *d++ = (char)(0x80 | (v & 63));
    } else {
        *d++ = (char)(0xf0 | v >> 18);
        *d++ = (char)(0x80 | (v >> 12 & 63));
        *d++ = (char)(0x80 | (v >> 6 & 63));
        *d++ = (char)(0x80 | (v & 63));
    }
    *o = d;
}

/* A string literal's body (between the quotes) decoded as Jinja2 does: Python's unicode-escape
 * over the ASCII characters, the others kept. An escape never writes more bytes than it reads
 * (\x41 -> 1, \u0800 -> 3, \U0010ffff -> 4), so @n + 1 bytes hold the result. */
static void decode_string(struct jparse *p, const char *s, size_t n, int line)
{
    char *d = jinja_alloc(p->a, n + 1, p->f), *o = d;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\' || i + 1 == n) {
            *o++ = s[i];
            continue;
        }
        char e = s[++i];
        const char *simple = "\\\\''\"\"a\ab\bf\fn\nr\rt\tv\v";
        const char *m = NULL;
        for (const char *q = simple; *q; q += 2)
            if (*q == e)
                m = q;
        unsigned v = 0;
        if (m) {
            *o++ = m[1];
            continue;
        } else if (e == '\n') {
            continue; /* a line continuation */
        } else if (e >= '0' && e <= '7') {
            for (int k = 0; k < 3 && i < n && s[i] >= '0' && s[i] <= '7'; k++)
                v = v * 8 + (unsigned)(s[i++] - '0');
            i--;
        } else if (e == 'x' || e == 'u' || e == 'U') {
            int k = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            for (int j = 1; j <= k; j++) {
                char h = i + (size_t)j < n ? s[i + (size_t)j] : 0;
                int d4 = h >= '0' && h <= '9'   ? h - '0'
                         : h >= 'a' && h <= 'f' ? h - 'a' + 10
                         : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                                : -1;
                if (d4 < 0)
                    perr(p, line, "a truncated \\x, \\u or \\U escape");
                v = v * 16 + (unsigned)d4;
            }
            i += (size_t)k;
        } else {
            *o++ = '\\';
            *o++ = e;
            continue;
        }
        if (v >= 0x110000 || (v >= 0xd800 && v < 0xe000))
            perr(p, line, "a string escape outside Unicode");
        put_utf8(&o, v);
    }
    *o = 0;
    struct jtok *k = &p->toks[p->ntok - 1];
    k->s = d;
    k->n = (size_t)(o - d);
}

/* The tokens inside a tag from @pos, through its end (%} or }}): returns the position after it.
 * @line is updated; @nl_end says whether the end consumed ended with a newline. */
static size_t lex_tag(struct jparse *p, size_t pos, bool block, int *line, bool *nl_end)
{
    const char *s = p->src;
    size_t n = p->len;
    char stack[64];
    int sp = 0;
    const char end = block ? '%' : '}';
    for (;;) {
        size_t w = span_space(s + pos, n - pos);
        *line += count_nl(s + pos, w);
        pos += w;
        if (pos >= n)
            perr(p, *line, block ? "a tag without its %}" : "an expression without its }}");
        const char *c = s + pos;
        size_t r = n - pos;
        if (sp == 0) {
            size_t e = 0;
            if (starts(c, r, "-") && r >= 3 && c[1] == end && c[2] == '}') {
                e = 3;
                e += span_space(c + 3, r - 3);
            } else if (block && starts(c, r, "+%}")) {
                e = 3;
            } else if (r >= 2 && c[0] == end && c[1] == '}') {
                e = 2;
                if (block && r > 2 && c[2] == '\n')
                    e = 3; /* trim_blocks */
            }
            if (e) {
                emit(p, block ? JT_BLOCK_END : JT_VAR_END, *line, NULL, 0);
                *line += count_nl(c, e);
                *nl_end = c[e - 1] == '\n';
                return pos + e;
            }
        }
        unsigned char ch = (unsigned char)*c;
        if (is_name_char((char)ch, true)) {
            size_t k = 1;
            while (k < r && is_name_char(c[k], false))
                k++;
            emit(p, JT_NAME, *line, c, k);
            pos += k;
        } else if (ch >= '0' && ch <= '9') {
            /* the literal's extent first (Python's forms, '_' between digits), then its
             * characters without the underscores */
            size_t k = 0, start = 0;
            bool flt = false;
            int base = 10;
            if (r > 2 && c[0] == '0' && c[1] && strchr("xXoObB", c[1])) {
                base = (c[1] | 32) == 'x' ? 16 : (c[1] | 32) == 'o' ? 8 : 2;
                k = start = 2;
                while (k < r && (c[k] == '_' || is_base_digit(c[k], base)))
                    k++;
            } else {
                k = digits_end(c, r, 0);
                if (k + 1 < r && c[k] == '.' && is_digit(c[k + 1])) {
                    flt = true;
                    k = digits_end(c, r, k + 1);
                }
                size_t q = k + 1;
                if (k < r && (c[k] | 32) == 'e' && q < r && (c[q] == '+' || c[q] == '-'))
                    q++;
                if (k < r && (c[k] | 32) == 'e' && q < r && is_digit(c[q])) {
                    flt = true;
                    k = digits_end(c, r, q);
                }
            }
            char num[256];
            size_t m = 0;
            if (k >= sizeof(num))
                perr(p, *line, "a number literal longer than 255 characters");
            for (size_t z = start; z < k; z++)
                if (c[z] != '_')
                    num[m++] = c[z];
            num[m] = 0;
            emit(p, flt ? JT_FLOAT : JT_INT, *line, c, k);
            struct jtok *t = &p->toks[p->ntok - 1];
            errno = 0;
            if (flt) {
                t->f = strtod(num, NULL);
            } else {
                unsigned long long v = m ? strtoull(num, NULL, base) : 0;
                if (errno || v > INT64_MAX)
                    perr(p, *line, "an integer literal past 64 bits");
                t->i = (int64_t)v;
            }
            pos += k;
        } else if (ch == '\'' || ch == '"') {
            size_t k = 1;
            while (k < r && c[k] != (char)ch)
                k += c[k] == '\\' ? 2 : 1;
            if (k >= r)
                perr(p, *line, "a string without its closing quote");
            emit(p, JT_STRING, *line, NULL, 0);
            decode_string(p, c + 1, k - 1, *line);
            *line += count_nl(c, k);
            pos += k + 1;
        } else {
            static const char *ops2[] = {"//", "**", "==", "!=", ">=", "<="};
            size_t k = 0;
            for (size_t i = 0; i < sizeof(ops2) / sizeof(*ops2); i++)
                if (starts(c, r, ops2[i]))
                    k = 2;
            if (!k && ch && strchr("+-/*%~[](){}><=.:|,;", ch))
                k = 1;
            if (!k)
                perr(p, *line, "a character Jinja does not know in a tag");
            if (k == 1 && strchr("([{", ch)) {
                if (sp == (int)sizeof(stack))
                    jinja_throw(p->f, -E2BIG, "line %d: brackets nested too deep", *line);
                stack[sp++] = ch == '(' ? ')' : ch == '[' ? ']' : '}';
            } else if (k == 1 && strchr(")]}", ch)) {
                if (!sp || stack[sp - 1] != (char)ch)
                    perr(p, *line, "an unbalanced bracket");
                sp--;
            }
            emit(p, JT_OP, *line, c, k);
            pos += k;
        }
    }
}

/* Normalizes newlines, drops the last one (Jinja2's keep_trailing_newline false) and lexes. */
static void lex(struct jparse *p, const char *src, size_t len)
{
    char *s = jinja_alloc(p->a, len + 1, p->f);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n')
                i++;
        } else {
            s[n++] = src[i];
        }
    }
    if (n && s[n - 1] == '\n')
        n--;
    s[n] = 0;
    p->src = s;
    p->len = n;

    size_t pos = 0;
    int line = 1;
    bool line_starting = true;
    while (pos < n) {
        size_t k = pos;
        while (k + 1 < n &&
               !(s[k] == '{' && (s[k + 1] == '{' || s[k + 1] == '%' || s[k + 1] == '#')))
            k++;
        if (k + 1 >= n) {
            emit(p, JT_DATA, line, s + pos, n - pos);
            break;
        }
        char kind = s[k + 1],
             mod = k + 2 < n && (s[k + 2] == '-' || s[k + 2] == '+') ? s[k + 2] : 0;
        size_t tl = k - pos; /* the text before the tag, after whitespace control */
        if (mod == '-') {
            tl = rstrip_len(s + pos, tl);
        } else if (mod != '+' && kind != '{') { /* lstrip_blocks */
            size_t l = tl;
            while (l > 0 && s[pos + l - 1] != '\n')
                l--;
            if ((l > 0 || line_starting) && l < tl && span_space(s + pos + l, tl - l) == tl - l)
                tl = l;
        }
        if (tl)
            emit(p, JT_DATA, line, s + pos, tl);
        line += count_nl(s + pos, k - pos);
        pos = k + 2 + (mod ? 1 : 0);
        bool nl = false;
        if (kind == '#') {
            const char *e = strstr(s + pos, "#}");
            if (!e)
                perr(p, line, "a comment without its #}");
            size_t ep = (size_t)(e - s), end = ep + 2;
            if (ep > pos && s[ep - 1] == '-')
                end += span_space(s + end, n - end);
            else if (!(ep > pos && s[ep - 1] == '+') && end < n && s[end] == '\n')
                end++;
            line += count_nl(s + pos, end - pos);
            nl = s[end - 1] == '\n';
            pos = end;
        } else if (kind == '%') {
            size_t q = pos + span_space(s + pos, n - pos);
            if (starts(s + q, n - q, "raw") && !(q + 3 < n && is_name_char(s[q + 3], false))) {
                /* {% raw %} ... {% endraw %}: the text between, as it is */
                q += 3;
                q += span_space(s + q, n - q);
                if (starts(s + q, n - q, "-%}"))
                    q += 3 + span_space(s + q + 3, n - q - 3);
                else if (starts(s + q, n - q, "%}"))
                    q += 2;
                else
                    perr(p, line, "raw: a tag without its %}");
                size_t b = q;
                for (;;) {
                    const char *e = strstr(s + q, "{%");
                    if (!e)
                        perr(p, line, "raw without endraw");
                    size_t t = (size_t)(e - s) + 2;
                    char m2 = t < n && (s[t] == '-' || s[t] == '+') ? s[t] : 0;
                    size_t u = t + (m2 ? 1 : 0);
                    u += span_space(s + u, n - u);
                    if (!starts(s + u, n - u, "endraw")) {
                        q = t;
                        continue;
                    }
                    u += 6;
                    u += span_space(s + u, n - u);
                    size_t tl2 = (size_t)(e - s) - b;
                    if (m2 == '-')
                        tl2 = rstrip_len(s + b, tl2);
                    if (starts(s + u, n - u, "-%}"))
                        u += 3 + span_space(s + u + 3, n - u - 3);
                    else if (starts(s + u, n - u, "+%}"))
                        u += 3;
                    else if (starts(s + u, n - u, "%}"))
                        u += 2 + (u + 2 < n && s[u + 2] == '\n');
                    else
                        perr(p, line, "endraw: a tag without its %}");
                    if (tl2)
                        emit(p, JT_DATA, line, s + b, tl2);
                    line += count_nl(s + pos, u - pos);
                    nl = s[u - 1] == '\n';
                    pos = u;
                    break;
                }
            } else {
                emit(p, JT_BLOCK_BEGIN, line, NULL, 0);
                pos = lex_tag(p, pos, true, &line, &nl);
            }
        } else {
            emit(p, JT_VAR_BEGIN, line, NULL, 0);
            pos = lex_tag(p, pos, false, &line, &nl);
        }
        line_starting = nl;
    }
    emit(p, JT_EOF, line, NULL, 0);
}

/* ---- parser ---- */

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
        perr(p, t->line, "expected a name");
    return t->s;
}
static void expect_end(struct jparse *p)
{
    if (peek(p)->t != JT_BLOCK_END)
        perr(p, peek(p)->line, "expected the end of the tag (%})");
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
            perr(p, peek(p)->line, "more than 64 arguments");
        kw[n] = NULL;
        if (peek(p)->t == JT_NAME && is_op(peek2(p), "=")) {
            kw[n] = next(p)->s;
            p->pos++;
        } else if (is_op(peek(p), "*") || is_op(peek(p), "**")) {
            perr(p, peek(p)->line, "*args and **kwargs in calls are not supported");
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
                perr(p, line, "a slice with more than three parts");
            continue;
        }
        if (skip_op(p, "]"))
            break;
        if (parts[k])
            perr(p, line, "expected ']'");
        parts[k] = parse_expr(p);
    }
    struct jx *x = node(p, slice ? JX_SLICE : JX_ITEM, line);
    x->a = obj;
    if (!slice) {
        if (!parts[0])
            perr(p, line, "an empty subscript");
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
                perr(p, t->line, "expected a name after '.'");
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
                    perr(p, u->line, "you cannot chain multiple tests with is");
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
            perr(p, t->line, "a comparison chain longer than 32");
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
            perr(p, line, "a tuple of more than 64 items");
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
            perr(p, peek(p)->line, "more than 16 names in a target");
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

/* After "{%": the tag's name is at the cursor. */
static struct js *parse_statement(struct jparse *p)
{
    struct jtok *t = next(p);
    if (t->t != JT_NAME)
        perr(p, t->line, "expected a tag name after {%");
    const char *w = t->s;
    int line = t->line;
    struct js *s;
    enter(p, line);
    if (!strcmp(w, "if")) {
        s = stmt(p, JS_IF, line);
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
                static const char *const ends2[] = {"endif"};
                cur->orelse = parse_body(p, ends2, 1);
                next(p);
                expect_end(p);
                break;
            } else {
                expect_end(p);
                break;
            }
        }
    } else if (!strcmp(w, "for")) {
        s = stmt(p, JS_FOR, line);
        parse_targets(p, s);
        if (!skip_name(p, "in"))
            perr(p, line, "for: expected 'in'");
        /* the iterable stops before 'if' (the filter) and 'recursive' */
        s->expr = parse_or(p);
        if (is_op(peek(p), ",")) {
            struct jx *tup = node(p, JX_TUPLE, line);
            struct jx *items[64];
            int n = 0;
            items[n++] = s->expr;
            while (skip_op(p, ",") && peek(p)->t != JT_BLOCK_END && !is_name(peek(p), "if")) {
                if (n == 64)
                    perr(p, line, "a tuple of more than 64 items");
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
            perr(p, line, "recursive for loops are not supported");
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
    } else if (!strcmp(w, "set")) {
        if (peek(p)->t == JT_NAME && is_op(peek2(p), ".")) {
            s = stmt(p, JS_SET, line);
            s->ntargets = 1;
            s->targets = jinja_alloc(p->a, sizeof(*s->targets), p->f);
            s->targets[0] = next(p)->s;
            p->pos++;
            s->attr = expect_name(p);
            expect_op(p, "=");
            s->expr = parse_tuple(p);
            expect_end(p);
        } else {
            s = stmt(p, JS_SET, line);
            parse_targets(p, s);
            if (skip_op(p, "=")) {
                s->expr = parse_tuple(p);
                expect_end(p);
            } else {
                s->kind = JS_SETBLOCK;
                if (s->ntargets != 1)
                    perr(p, line, "a set block assigns one name");
                while (skip_op(p, "|"))
                    s->filter = parse_filter(p, s->filter, line);
                expect_end(p);
                static const char *const ends[] = {"endset"};
                s->body = parse_body(p, ends, 1);
                next(p);
                expect_end(p);
            }
        }
    } else if (!strcmp(w, "macro")) {
        s = stmt(p, JS_MACRO, line);
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
                perr(p, line, "a macro of more than 32 parameters");
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
    } else if (!strcmp(w, "filter")) {
        s = stmt(p, JS_FILTER, line);
        do
            s->filter = parse_filter(p, s->filter, line);
        while (skip_op(p, "|"));
        expect_end(p);
        static const char *const ends[] = {"endfilter"};
        s->body = parse_body(p, ends, 1);
        next(p);
        expect_end(p);
    } else if (!strcmp(w, "break") || !strcmp(w, "continue")) {
        s = stmt(p, w[0] == 'b' ? JS_BREAK : JS_CONTINUE, line);
        expect_end(p);
    } else {
        jinja_throw(p->f, -EINVAL, "line %d: unknown or unsupported tag '%s'", line, w);
    }
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
                perr(p, t->line, "expected the end of the expression (}})");
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
            perr(p, t->line, "unexpected token");
        }
        *tail = s;
        tail = &s->next;
    }
}

struct js *jinja_parse(const char *src, size_t len, struct jarena *a, struct jfail *f, int depth)
{
    struct jparse p = {.a = a, .f = f, .max_depth = depth};
    lex(&p, src, len);
    return parse_body(&p, NULL, 0);
}
