/* SPDX-License-Identifier: MIT */
/* coordinator/chat/jinja_lex.c: a Jinja template into tokens, by Jinja2's rules with trim_blocks
 * and lstrip_blocks: newlines normalized, the last one dropped, the whitespace controls. */
#include "jinja_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

_Noreturn void jinja_perr(struct jparse *p, int line, const char *what)
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
                    jinja_perr(p, line, "a truncated \\x, \\u or \\U escape");
                v = v * 16 + (unsigned)d4;
            }
            i += (size_t)k;
        } else {
            *o++ = '\\';
            *o++ = e;
            continue;
        }
        if (v >= 0x110000 || (v >= 0xd800 && v < 0xe000))
            jinja_perr(p, line, "a string escape outside Unicode");
        put_utf8(&o, v);
    }
    *o = 0;
    struct jtok *k = &p->toks[p->ntok - 1];
    k->s = d;
    k->n = (size_t)(o - d);
}

#define LEX_BRACKETS 64 /* brackets open at once in a tag */

/* The number literal at @c (@r bytes left): emits its token, returns its length. */
static size_t lex_number(struct jparse *p, const char *c, size_t r, int line)
{
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
        jinja_perr(p, line, "a number literal longer than 255 characters");
    for (size_t z = start; z < k; z++)
        if (c[z] != '_')
            num[m++] = c[z];
    num[m] = 0;
    emit(p, flt ? JT_FLOAT : JT_INT, line, c, k);
    struct jtok *t = &p->toks[p->ntok - 1];
    errno = 0;
    if (flt) {
        t->f = strtod(num, NULL);
    } else {
        unsigned long long v = m ? strtoull(num, NULL, base) : 0;
        if (errno || v > INT64_MAX)
            jinja_perr(p, line, "an integer literal past 64 bits");
        t->i = (int64_t)v;
    }
    return k;
}

/* The operator at @c (@r bytes left), brackets kept balanced on @stack (*@sp deep): emits its
 * token, returns its length. */
static size_t lex_op(struct jparse *p, const char *c, size_t r, int line, char *stack, int *sp)
{
    unsigned char ch = (unsigned char)*c;
    static const char *const ops2[] = {"//", "**", "==", "!=", ">=", "<="};
    size_t k = 0;
    for (size_t i = 0; i < sizeof(ops2) / sizeof(*ops2); i++)
        if (starts(c, r, ops2[i]))
            k = 2;
    if (!k && ch && strchr("+-/*%~[](){}><=.:|,;", ch))
        k = 1;
    if (!k)
        jinja_perr(p, line, "a character Jinja does not know in a tag");
    if (k == 1 && strchr("([{", ch)) {
        if (*sp == LEX_BRACKETS)
            jinja_throw(p->f, -E2BIG, "line %d: brackets nested too deep", line);
        stack[(*sp)++] = ch == '(' ? ')' : ch == '[' ? ']' : '}';
    } else if (k == 1 && strchr(")]}", ch)) {
        if (!*sp || stack[*sp - 1] != (char)ch)
            jinja_perr(p, line, "an unbalanced bracket");
        (*sp)--;
    }
    emit(p, JT_OP, line, c, k);
    return k;
}

/* The tokens inside a tag from @pos, through its end (%} or }}): returns the position after it.
 * @line is updated; @nl_end says whether the end consumed ended with a newline. */
static size_t lex_tag(struct jparse *p, size_t pos, bool block, int *line, bool *nl_end)
{
    const char *s = p->src;
    size_t n = p->len;
    char stack[LEX_BRACKETS]; /* the closing brackets awaited */
    int sp = 0;
    const char end = block ? '%' : '}';
    for (;;) {
        size_t w = span_space(s + pos, n - pos);
        *line += count_nl(s + pos, w);
        pos += w;
        if (pos >= n)
            jinja_perr(p, *line, block ? "a tag without its %}" : "an expression without its }}");
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
            pos += lex_number(p, c, r, *line);
        } else if (ch == '\'' || ch == '"') {
            size_t k = 1;
            while (k < r && c[k] != (char)ch)
                k += c[k] == '\\' ? 2 : 1;
            if (k >= r)
                jinja_perr(p, *line, "a string without its closing quote");
            emit(p, JT_STRING, *line, NULL, 0);
            decode_string(p, c + 1, k - 1, *line);
            *line += count_nl(c, k);
            pos += k + 1;
        } else {
            pos += lex_op(p, c, r, *line, stack, &sp);
        }
    }
}

/* @src into p->src with newlines normalized and the last one dropped (Jinja2's
 * keep_trailing_newline false) */
static void normalize_newlines(struct jparse *p, const char *src, size_t len)
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
}

/* A comment from @pos (after its {#): returns the position after it, its whitespace control
 * applied. @line is updated; @nl_end says whether it ended with a newline. */
static size_t lex_comment(struct jparse *p, size_t pos, int *line, bool *nl_end)
{
    const char *s = p->src;
    size_t n = p->len;
    const char *e = strstr(s + pos, "#}");
    if (!e)
        jinja_perr(p, *line, "a comment without its #}");
    size_t ep = (size_t)(e - s), end = ep + 2;
    if (ep > pos && s[ep - 1] == '-')
        end += span_space(s + end, n - end);
    else if (!(ep > pos && s[ep - 1] == '+') && end < n && s[end] == '\n')
        end++;
    *line += count_nl(s + pos, end - pos);
    *nl_end = s[end - 1] == '\n';
    return end;
}

/* {% raw %} ... {% endraw %} from @pos (after its {%), "raw" at @q: the text between as it is.
 * Returns the position after the endraw tag; @line and @nl_end as lex_comment's. */
static size_t lex_raw(struct jparse *p, size_t pos, size_t q, int *line, bool *nl_end)
{
    const char *s = p->src;
    size_t n = p->len;
    q += 3;
    q += span_space(s + q, n - q);
    if (starts(s + q, n - q, "-%}"))
        q += 3 + span_space(s + q + 3, n - q - 3);
    else if (starts(s + q, n - q, "%}"))
        q += 2;
    else
        jinja_perr(p, *line, "raw: a tag without its %}");
    size_t b = q;
    for (;;) {
        const char *e = strstr(s + q, "{%");
        if (!e)
            jinja_perr(p, *line, "raw without endraw");
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
            jinja_perr(p, *line, "endraw: a tag without its %}");
        if (tl2)
            emit(p, JT_DATA, *line, s + b, tl2);
        *line += count_nl(s + pos, u - pos);
        *nl_end = s[u - 1] == '\n';
        return u;
    }
}

/* Normalizes newlines, drops the last one and lexes. */
void jinja_lex(struct jparse *p, const char *src, size_t len)
{
    normalize_newlines(p, src, len);
    const char *s = p->src;
    size_t n = p->len;
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
            pos = lex_comment(p, pos, &line, &nl);
        } else if (kind == '%') {
            size_t q = pos + span_space(s + pos, n - pos);
            if (starts(s + q, n - q, "raw") && !(q + 3 < n && is_name_char(s[q + 3], false))) {
                pos = lex_raw(p, pos, q, &line, &nl);
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
