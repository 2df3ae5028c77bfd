/* SPDX-License-Identifier: MIT */
/* coordinator/grammar/regex.c: regular expressions as an AST over code-point sets, and
 * ECMAScript's syntax (what JSON Schema's "pattern" and OpenAI's regex fields are) parsed into
 * it. Backreferences, lookaround, word boundaries and anchors away from the ends are refused:
 * they are not regular, or not regular in this form. */
#include "gr_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "utf8.h"
#include "util.h"

int gr_grow(void **p, int *cap, int len, int n, size_t size)
{
    if (len + n <= *cap)
        return 0;
    long nc = *cap ? *cap : 8;
    while (nc < (long)len + n)
        nc *= 2;
    if (nc > 0x7fffffff)
        return -ENOMEM;
    void *q = realloc(*p, (size_t)nc * size);
    if (!q)
        return -ENOMEM;
    *p = q;
    *cap = (int)nc;
    return 0;
}

uint64_t gr_hash(const void *p, size_t n, uint64_t h)
{
    const uint8_t *s = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ s[i]) * 0x100000001b3ull;
    return h;
}

/* ---- code-point sets ---- */

int gr_cset_add(struct gr_cset *s, uint32_t lo, uint32_t hi)
{
    if (lo > hi)
        return 0;
    /* find the first range that ends at or after lo - 1 */
    int i = 0;
    while (i < s->n && s->r[i].hi + 1 < lo)
        i++;
    int j = i;
    while (j < s->n && s->r[j].lo <= hi + 1) {
        if (s->r[j].lo < lo)
            lo = s->r[j].lo;
        if (s->r[j].hi > hi)
            hi = s->r[j].hi;
        j++;
    }
    if (j > i) { /* merge ranges i..j-1 into one */
        s->r[i] = (struct gr_range){lo, hi};
        memmove(s->r + i + 1, s->r + j, (size_t)(s->n - j) * sizeof(*s->r));
        s->n -= j - i - 1;
        return 0;
    }
    if (gr_grow((void **)&s->r, &s->cap, s->n, 1, sizeof(*s->r)))
        return -ENOMEM;
    memmove(s->r + i + 1, s->r + i, (size_t)(s->n - i) * sizeof(*s->r));
    s->r[i] = (struct gr_range){lo, hi};
    s->n++;
    return 0;
}

int gr_cset_add_set(struct gr_cset *s, const struct gr_cset *t)
{
    for (int i = 0; i < t->n; i++)
        if (gr_cset_add(s, t->r[i].lo, t->r[i].hi))
            return -ENOMEM;
    return 0;
}

int gr_cset_negate(const struct gr_cset *s, struct gr_cset *out)
{
    uint32_t next = 0;
    for (int i = 0; i < s->n; i++) {
        if (s->r[i].lo > next && gr_cset_add(out, next, s->r[i].lo - 1))
            return -ENOMEM;
        next = s->r[i].hi + 1;
    }
    if (next <= GR_MAX_CP && gr_cset_add(out, next, GR_MAX_CP))
        return -ENOMEM;
    return 0;
}

bool gr_cset_has(const struct gr_cset *s, uint32_t c)
{
    for (int i = 0; i < s->n; i++)
        if (c >= s->r[i].lo && c <= s->r[i].hi)
            return true;
    return false;
}

void gr_cset_free(struct gr_cset *s)
{
    free(s->r);
    *s = (struct gr_cset){0};
}

/* ---- AST nodes ---- */

struct gr_re *gr_re_new(struct gr_rebuild *b, enum gr_re_kind kind)
{
    if (b->max_nodes && b->n_nodes >= b->max_nodes) {
        shardlm_fail(b->e, -E2BIG, "the grammar is too large (more than %ld regex nodes)",
                     b->max_nodes);
        return NULL;
    }
    struct gr_re *r = calloc(1, sizeof(*r));
    if (!r) {
        shardlm_fail(b->e, -ENOMEM, "out of memory");
        return NULL;
    }
    r->kind = kind;
    r->next_alloc = b->all;
    b->all = r;
    b->n_nodes++;
    return r;
}

struct gr_re *gr_re_set(struct gr_rebuild *b, enum gr_enc enc, const struct gr_cset *s)
{
    struct gr_re *r = gr_re_new(b, GR_RE_SET);
    if (!r)
        return NULL;
    r->enc = enc;
    if (gr_cset_add_set(&r->set, s)) {
        shardlm_fail(b->e, -ENOMEM, "out of memory");
        return NULL;
    }
    if (!r->set.n)
        r->kind = GR_RE_NONE;
    return r;
}

struct gr_re *gr_re_range(struct gr_rebuild *b, enum gr_enc enc, uint32_t lo, uint32_t hi)
{
    struct gr_cset s = {0};
    if (gr_cset_add(&s, lo, hi)) {
        shardlm_fail(b->e, -ENOMEM, "out of memory");
        return NULL;
    }
    struct gr_re *r = gr_re_set(b, enc, &s);
    gr_cset_free(&s);
    return r;
}

int gr_re_add(struct gr_rebuild *b, struct gr_re *parent, struct gr_re *child)
{
    if (!child)
        return -EINVAL;
    if (GR_PUSH(parent->sub, parent->n_sub, parent->cap_sub, child))
        return shardlm_fail(b->e, -ENOMEM, "out of memory");
    return 0;
}

static struct gr_re *re_pair(struct gr_rebuild *b, enum gr_re_kind k, struct gr_re *x,
                             struct gr_re *y)
{
    if (!x || !y)
        return NULL;
    struct gr_re *r = gr_re_new(b, k);
    if (!r || gr_re_add(b, r, x) || gr_re_add(b, r, y))
        return NULL;
    return r;
}

struct gr_re *gr_re_cat(struct gr_rebuild *b, struct gr_re *x, struct gr_re *y)
{
    return re_pair(b, GR_RE_CAT, x, y);
}

struct gr_re *gr_re_alt(struct gr_rebuild *b, struct gr_re *x, struct gr_re *y)
{
    return re_pair(b, GR_RE_ALT, x, y);
}

struct gr_re *gr_re_rep(struct gr_rebuild *b, struct gr_re *x, int min, int max)
{
    if (!x)
        return NULL;
    struct gr_re *r = gr_re_new(b, GR_RE_REP);
    if (!r || gr_re_add(b, r, x))
        return NULL;
    r->min = min;
    r->max = max;
    return r;
}

struct gr_re *gr_re_but(struct gr_rebuild *b, struct gr_re *pos, struct gr_re *const *neg,
                        int n_neg)
{
    if (!pos)
        return NULL;
    struct gr_re *r = gr_re_new(b, GR_RE_BOOL);
    if (!r || gr_re_add(b, r, pos))
        return NULL;
    r->n_pos = 1;
    for (int i = 0; i < n_neg; i++)
        if (gr_re_add(b, r, neg[i]))
            return NULL;
    return r;
}

struct gr_re *gr_re_and(struct gr_rebuild *b, struct gr_re *x, struct gr_re *y)
{
    struct gr_re *r = re_pair(b, GR_RE_BOOL, x, y);
    if (r)
        r->n_pos = 2;
    return r;
}

struct gr_re *gr_re_lit(struct gr_rebuild *b, enum gr_enc enc, const char *s, size_t n)
{
    struct gr_re *r = gr_re_new(b, GR_RE_CAT);
    if (!r)
        return NULL;
    for (size_t i = 0; i < n;) {
        uint32_t c = (uint8_t)s[i];
        size_t l = 1;
        if (enc != GR_ENC_BYTE && c >= 0x80) {
            l = coord_utf8_char((const unsigned char *)s + i, n - i);
            if (!l) {
                shardlm_fail(b->e, -EINVAL, "a literal is not UTF-8");
                return NULL;
            }
            c = coord_utf8_decode((const unsigned char *)s + i, l);
        }
        if (gr_re_add(b, r, gr_re_range(b, enc, c, c)))
            return NULL;
        i += l;
    }
    if (!r->n_sub)
        r->kind = GR_RE_EMPTY;
    return r;
}

struct gr_re *gr_re_until(struct gr_rebuild *b, const char *stop)
{
    size_t n = strlen(stop);
#define ANY(min) gr_re_rep(b, gr_re_range(b, GR_ENC_UTF8, 0, GR_MAX_CP), (min), -1)
    struct gr_re *ends = gr_re_cat(b, ANY(0), gr_re_lit(b, GR_ENC_BYTE, stop, n));
    struct gr_re *more =
        gr_re_cat(b, gr_re_cat(b, ANY(0), gr_re_lit(b, GR_ENC_BYTE, stop, n)), ANY(1));
#undef ANY
    return more ? gr_re_but(b, ends, &more, 1) : NULL;
}

void gr_rebuild_free(struct gr_rebuild *b)
{
    for (struct gr_re *r = b->all, *n; r; r = n) {
        n = r->next_alloc;
        gr_cset_free(&r->set);
        free(r->sub);
        free(r);
    }
    b->all = NULL;
    b->n_nodes = 0;
}

bool gr_re_nullable(const struct gr_re *r)
{
    switch (r->kind) {
    case GR_RE_NONE:
    case GR_RE_SET:
        return false;
    case GR_RE_EMPTY:
        return true;
    case GR_RE_CAT:
        for (int i = 0; i < r->n_sub; i++)
            if (!gr_re_nullable(r->sub[i]))
                return false;
        return true;
    case GR_RE_ALT:
        for (int i = 0; i < r->n_sub; i++)
            if (gr_re_nullable(r->sub[i]))
                return true;
        return false;
    case GR_RE_REP:
        return r->min == 0 || gr_re_nullable(r->sub[0]);
    case GR_RE_BOOL:
        for (int i = 0; i < r->n_sub; i++)
            if (gr_re_nullable(r->sub[i]) != (i < r->n_pos))
                return false;
        return true;
    }
    return false;
}

/* ---- canonical text (interning) ---- */

struct sbuf {
    char *p;
    int n, cap;
    bool oom;
};

static void sb_put(struct sbuf *s, const char *t, int n)
{
    if (s->oom || gr_grow((void **)&s->p, &s->cap, s->n, n + 1, 1)) {
        s->oom = true;
        return;
    }
    memcpy(s->p + s->n, t, (size_t)n);
    s->n += n;
    s->p[s->n] = 0;
}

static void sb_fmt(struct sbuf *s, const char *fmt, unsigned a, unsigned b)
{
    char t[48];
    int n = snprintf(t, sizeof(t), fmt, a, b);
    sb_put(s, t, n);
}

static void re_key(const struct gr_re *r, struct sbuf *s)
{
    switch (r->kind) {
    case GR_RE_NONE:
        sb_put(s, "!", 1);
        return;
    case GR_RE_EMPTY:
        sb_put(s, "e", 1);
        return;
    case GR_RE_SET:
        sb_fmt(s, "[%u", r->enc, 0);
        for (int i = 0; i < r->set.n; i++)
            sb_fmt(s, r->set.r[i].lo == r->set.r[i].hi ? " %x" : " %x-%x", r->set.r[i].lo,
                   r->set.r[i].hi);
        sb_put(s, "]", 1);
        return;
    case GR_RE_CAT:
    case GR_RE_ALT:
        sb_put(s, r->kind == GR_RE_CAT ? "(" : "{", 1);
        for (int i = 0; i < r->n_sub; i++) {
            if (i)
                sb_put(s, ",", 1);
            re_key(r->sub[i], s);
        }
        sb_put(s, r->kind == GR_RE_CAT ? ")" : "}", 1);
        return;
    case GR_RE_REP:
        sb_fmt(s, "<%u,%u:", (unsigned)r->min, (unsigned)r->max);
        re_key(r->sub[0], s);
        sb_put(s, ">", 1);
        return;
    case GR_RE_BOOL:
        sb_put(s, "&(", 2);
        for (int i = 0; i < r->n_sub; i++) {
            if (i)
                sb_put(s, i == r->n_pos ? "~" : ",", 1);
            re_key(r->sub[i], s);
        }
        sb_put(s, ")", 1);
        return;
    }
}

char *gr_re_key(const struct gr_re *r, size_t *len)
{
    struct sbuf s = {0};
    re_key(r, &s);
    if (s.oom) {
        free(s.p);
        return NULL;
    }
    *len = (size_t)s.n;
    return s.p;
}

/* ---- ECMAScript syntax ---- */

struct rp {
    struct gr_rebuild *b;
    const char *s;
    size_t n, i;
    enum gr_enc enc;
    int depth;
};

static struct gr_re *rp_fail(struct rp *p, const char *what)
{
    char shown[100];
    coord_escape(shown, sizeof(shown), p->s, p->n);
    shardlm_fail(p->b->e, -EINVAL, "regex /%s/: %s at offset %zu", shown, what, p->i);
    return NULL;
}

static long rp_err(struct rp *p, const char *what)
{
    rp_fail(p, what);
    return -1;
}

static int cls_add(struct rp *p, struct gr_cset *s, uint32_t lo, uint32_t hi)
{
    if (gr_cset_add(s, lo, hi))
        return shardlm_fail(p->b->e, -ENOMEM, "out of memory");
    return 0;
}

/* \d \w \s and their negations into @s. */
static int cls_escape(struct rp *p, struct gr_cset *s, char c)
{
    struct gr_cset t = {0};
    int rc = 0;
    switch (c | 0x20) {
    case 'd':
        rc = gr_cset_add(&t, '0', '9');
        break;
    case 'w':
        rc = gr_cset_add(&t, '0', '9') | gr_cset_add(&t, 'A', 'Z') | gr_cset_add(&t, '_', '_') |
             gr_cset_add(&t, 'a', 'z');
        break;
    case 's':
        rc = gr_cset_add(&t, 9, 13) | gr_cset_add(&t, ' ', ' ') | gr_cset_add(&t, 0xa0, 0xa0) |
             gr_cset_add(&t, 0x1680, 0x1680) | gr_cset_add(&t, 0x2000, 0x200a) |
             gr_cset_add(&t, 0x2028, 0x2029) | gr_cset_add(&t, 0x202f, 0x202f) |
             gr_cset_add(&t, 0x205f, 0x205f) | gr_cset_add(&t, 0x3000, 0x3000) |
             gr_cset_add(&t, 0xfeff, 0xfeff);
        break;
    }
    if (!rc && c >= 'A' && c <= 'Z') {
        struct gr_cset neg = {0};
        rc = gr_cset_negate(&t, &neg) | gr_cset_add_set(s, &neg);
        gr_cset_free(&neg);
    } else if (!rc) {
        rc = gr_cset_add_set(s, &t);
    }
    gr_cset_free(&t);
    return rc ? shardlm_fail(p->b->e, -ENOMEM, "out of memory") : 0;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f')
        return (c | 0x20) - 'a' + 10;
    return -1;
}

/* Reads @k hex digits at p->i: the value, or -1 (p->i unchanged). */
static long rp_hex(struct rp *p, int k)
{
    long v = 0;
    if (p->i + (size_t)k > p->n)
        return -1;
    for (int j = 0; j < k; j++) {
        int h = hexval(p->s[p->i + (size_t)j]);
        if (h < 0)
            return -1;
        v = v * 16 + h;
    }
    p->i += (size_t)k;
    return v;
}

/* One character at p->i (after any backslash handling by the caller): its code point. */
static long rp_char(struct rp *p)
{
    const unsigned char *u = (const unsigned char *)p->s + p->i;
    size_t l = coord_utf8_char(u, p->n - p->i);
    if (!l)
        return -1;
    p->i += l;
    return (long)coord_utf8_decode(u, l);
}

/* An escape after '\' (p->i at the letter): a code point >= 0, -2 when a class went into @cls
 * (\d \w \s ...), -1 with the error set. @in_class: [\b] is backspace. */
static long rp_escape(struct rp *p, struct gr_cset *cls, bool in_class)
{
    if (p->i >= p->n)
        return rp_err(p, "a lone \\ at the end");
    char c = p->s[p->i++];
    switch (c) {
    case 'd':
    case 'D':
    case 'w':
    case 'W':
    case 's':
    case 'S':
        return cls_escape(p, cls, c) ? -1 : -2;
    case 'n':
        return '\n';
    case 'r':
        return '\r';
    case 't':
        return '\t';
    case 'f':
        return '\f';
    case 'v':
        return '\v';
    case '0':
        if (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9')
            break;
        return 0;
    case 'b':
        if (in_class)
            return '\b';
        rp_fail(p, "\\b (a word boundary) is not supported");
        return -1;
    case 'B':
        rp_fail(p, "\\B is not supported");
        return -1;
    case 'c':
        if (p->i < p->n && ((p->s[p->i] | 0x20) >= 'a' && (p->s[p->i] | 0x20) <= 'z'))
            return p->s[p->i++] % 32;
        p->i--;
        return '\\';
    case 'x': {
        long v = rp_hex(p, 2);
        return v >= 0 ? v : 'x';
    }
    case 'u': {
        if (p->i < p->n && p->s[p->i] == '{') {
            size_t j = p->i + 1;
            long v = 0;
            while (j < p->n && hexval(p->s[j]) >= 0 && v <= GR_MAX_CP)
                v = v * 16 + hexval(p->s[j++]);
            if (j < p->n && p->s[j] == '}' && j > p->i + 1 && v <= GR_MAX_CP) {
                p->i = j + 1;
                return v;
            }
            return 'u';
        }
        long v = rp_hex(p, 4);
        if (v < 0)
            return 'u';
        if (v >= 0xD800 && v <= 0xDBFF && p->i + 6 <= p->n && p->s[p->i] == '\\' &&
            p->s[p->i + 1] == 'u') {
            size_t save = p->i;
            p->i += 2;
            long w = rp_hex(p, 4);
            if (w >= 0xDC00 && w <= 0xDFFF)
                return 0x10000 + ((v - 0xD800) << 10) + (w - 0xDC00);
            p->i = save;
        }
        if (v >= 0xD800 && v <= 0xDFFF) {
            rp_fail(p, "a lone surrogate is not supported");
            return -1;
        }
        return v;
    }
    case 'p':
    case 'P':
        rp_fail(p, "Unicode property escapes (\\p{...}) are not supported");
        return -1;
    case 'k':
        rp_fail(p, "named backreferences are not supported");
        return -1;
    default:
        break;
    }
    if (c >= '1' && c <= '9') {
        rp_fail(p, "backreferences are not supported");
        return -1;
    }
    p->i--; /* an identity escape: the character itself */
    long v = rp_char(p);
    return v < 0 ? rp_err(p, "not UTF-8") : v;
}

static struct gr_re *rp_class(struct rp *p)
{
    struct gr_cset s = {0};
    bool neg = false;
    struct gr_re *r = NULL;
    if (p->i < p->n && p->s[p->i] == '^') {
        neg = true;
        p->i++;
    }
    for (;;) {
        if (p->i >= p->n) {
            rp_fail(p, "an unclosed [");
            goto out;
        }
        if (p->s[p->i] == ']') {
            p->i++;
            break;
        }
        long lo;
        if (p->s[p->i] == '\\') {
            p->i++;
            lo = rp_escape(p, &s, true);
        } else {
            lo = rp_char(p);
            if (lo < 0) {
                rp_fail(p, "not UTF-8");
                goto out;
            }
        }
        if (lo == -1)
            goto out;
        if (lo == -2)
            continue;
        long hi = lo;
        if (p->i + 1 < p->n && p->s[p->i] == '-' && p->s[p->i + 1] != ']') {
            size_t save = p->i++;
            if (p->s[p->i] == '\\') {
                p->i++;
                struct gr_cset t = {0};
                hi = rp_escape(p, &t, true);
                gr_cset_free(&t);
                if (hi == -1)
                    goto out;
                if (hi == -2) { /* [a-\d]: '-' is literal */
                    p->i = save;
                    hi = lo;
                }
            } else {
                hi = rp_char(p);
            }
            if (hi < lo) {
                rp_fail(p, "a class range out of order");
                goto out;
            }
        }
        if (cls_add(p, &s, (uint32_t)lo, (uint32_t)hi))
            goto out;
    }
    if (neg) {
        struct gr_cset t = {0};
        if (gr_cset_negate(&s, &t)) {
            shardlm_fail(p->b->e, -ENOMEM, "out of memory");
            goto out;
        }
        gr_cset_free(&s);
        s = t;
    }
    r = gr_re_set(p->b, p->enc, &s);
out:
    gr_cset_free(&s);
    return r;
}

static struct gr_re *rp_alt(struct rp *p);

static struct gr_re *rp_atom(struct rp *p)
{
    char c = p->s[p->i];
    if (c == '(') {
        p->i++;
        if (p->i < p->n && p->s[p->i] == '?') {
            p->i++;
            if (p->i < p->n && p->s[p->i] == ':') {
                p->i++;
            } else if (p->i < p->n && p->s[p->i] == '<' && p->i + 1 < p->n &&
                       p->s[p->i + 1] != '=' && p->s[p->i + 1] != '!') {
                while (p->i < p->n && p->s[p->i] != '>')
                    p->i++;
                if (p->i >= p->n)
                    return rp_fail(p, "an unclosed group name");
                p->i++;
            } else {
                return rp_fail(p, "lookaround and inline flags are not supported");
            }
        }
        if (++p->depth > 200)
            return rp_fail(p, "groups nested too deep");
        struct gr_re *r = rp_alt(p);
        p->depth--;
        if (!r)
            return NULL;
        if (p->i >= p->n || p->s[p->i] != ')')
            return rp_fail(p, "an unclosed (");
        p->i++;
        return r;
    }
    if (c == '[') {
        p->i++;
        return rp_class(p);
    }
    if (c == '.') {
        p->i++;
        struct gr_cset s = {0};
        int rc = gr_cset_add(&s, 0, 9) | gr_cset_add(&s, 11, 12) | gr_cset_add(&s, 14, 0x2027) |
                 gr_cset_add(&s, 0x202a, GR_MAX_CP);
        struct gr_re *r = rc ? NULL : gr_re_set(p->b, p->enc, &s);
        gr_cset_free(&s);
        return r;
    }
    if (c == '^' || c == '$')
        return rp_fail(p, "an anchor inside the pattern is not supported");
    if (c == ')')
        return rp_fail(p, "an unmatched )");
    if (c == '*' || c == '+' || c == '?')
        return rp_fail(p, "a quantifier without anything to repeat");
    long cp;
    struct gr_cset s = {0};
    if (c == '\\') {
        p->i++;
        cp = rp_escape(p, &s, false);
    } else {
        cp = rp_char(p);
        if (cp < 0)
            return rp_fail(p, "not UTF-8");
    }
    struct gr_re *r = NULL;
    if (cp == -2)
        r = gr_re_set(p->b, p->enc, &s);
    else if (cp >= 0)
        r = gr_re_range(p->b, p->enc, (uint32_t)cp, (uint32_t)cp);
    gr_cset_free(&s);
    return r;
}

/* {n}, {n,}, {n,m} at p->i: true with *lo, *hi (-1: unbounded), p->i past it; false (a literal
 * '{', as Annex B reads it) with p->i unchanged. */
static bool rp_braces(struct rp *p, long *lo, long *hi)
{
    size_t j = p->i + 1;
    long a = 0, b;
    if (j >= p->n || p->s[j] < '0' || p->s[j] > '9')
        return false;
    while (j < p->n && p->s[j] >= '0' && p->s[j] <= '9' && a < 1000000)
        a = a * 10 + (p->s[j++] - '0');
    b = a;
    if (j < p->n && p->s[j] == ',') {
        j++;
        b = -1;
        if (j < p->n && p->s[j] >= '0' && p->s[j] <= '9') {
            b = 0;
            while (j < p->n && p->s[j] >= '0' && p->s[j] <= '9' && b < 1000000)
                b = b * 10 + (p->s[j++] - '0');
        }
    }
    if (j >= p->n || p->s[j] != '}')
        return false;
    p->i = j + 1;
    *lo = a;
    *hi = b;
    return true;
}

static struct gr_re *rp_seq(struct rp *p)
{
    struct gr_re *cat = gr_re_new(p->b, GR_RE_CAT);
    if (!cat)
        return NULL;
    while (p->i < p->n && p->s[p->i] != '|' && p->s[p->i] != ')') {
        struct gr_re *a;
        if (p->s[p->i] == '$' && !p->depth)
            break; /* the caller's: an alternative's end anchor */
        if (p->s[p->i] == '{') {
            long lo, hi;
            size_t save = p->i;
            if (rp_braces(p, &lo, &hi)) {
                p->i = save;
                return rp_fail(p, "a quantifier without anything to repeat");
            }
            p->i++;
            a = gr_re_range(p->b, p->enc, '{', '{');
        } else {
            a = rp_atom(p);
        }
        if (!a)
            return NULL;
        for (;;) {
            long lo, hi;
            if (p->i >= p->n)
                break;
            char q = p->s[p->i];
            if (q == '*' || q == '+' || q == '?') {
                p->i++;
                lo = q == '+';
                hi = q == '?' ? 1 : -1;
            } else if (q == '{' && rp_braces(p, &lo, &hi)) {
                if (hi >= 0 && hi < lo)
                    return rp_fail(p, "a {n,m} with m < n");
                if (lo > 100000 || hi > 100000)
                    return rp_fail(p, "a repetition count over 100000");
            } else {
                break;
            }
            if (p->i < p->n && p->s[p->i] == '?') /* lazy: the same language */
                p->i++;
            a = gr_re_rep(p->b, a, (int)lo, (int)hi);
            if (!a)
                return NULL;
        }
        if (gr_re_add(p->b, cat, a))
            return NULL;
    }
    if (!cat->n_sub)
        cat->kind = GR_RE_EMPTY;
    return cat;
}

static struct gr_re *rp_alt(struct rp *p)
{
    struct gr_re *alt = gr_re_new(p->b, GR_RE_ALT);
    if (!alt)
        return NULL;
    for (;;) {
        if (gr_re_add(p->b, alt, rp_seq(p)))
            return NULL;
        if (p->i < p->n && p->s[p->i] == '|') {
            p->i++;
            continue;
        }
        break;
    }
    return alt->n_sub == 1 ? alt->sub[0] : alt;
}

struct gr_re *gr_re_parse(struct gr_rebuild *b, const char *src, size_t n, enum gr_enc enc,
                          bool anchored)
{
    struct rp p = {.b = b, .s = src, .n = n, .enc = enc};
    struct gr_re *top = gr_re_new(b, GR_RE_ALT);
    if (!top)
        return NULL;
    struct gr_cset all = {0};
    if (gr_cset_add(&all, 0, GR_MAX_CP)) {
        shardlm_fail(b->e, -ENOMEM, "out of memory");
        return NULL;
    }
    struct gr_re *res = NULL;
    /* each top-level alternative may start with ^ and end with $ */
    for (;;) {
        bool a0 = anchored, a1 = anchored;
        while (p.i < p.n && p.s[p.i] == '^') {
            p.i++;
            a0 = true;
        }
        struct gr_re *seq = rp_seq(&p);
        if (!seq)
            goto out;
        if (p.i < p.n && p.s[p.i] == '$') {
            p.i++;
            a1 = true;
            if (p.i < p.n && p.s[p.i] != '|') {
                rp_fail(&p, "an anchor inside the pattern is not supported");
                goto out;
            }
        }
        struct gr_re *cat = gr_re_new(b, GR_RE_CAT);
        if (!cat)
            goto out;
        if (!a0 && gr_re_add(b, cat, gr_re_rep(b, gr_re_set(b, enc, &all), 0, -1)))
            goto out;
        if (gr_re_add(b, cat, seq))
            goto out;
        if (!a1 && gr_re_add(b, cat, gr_re_rep(b, gr_re_set(b, enc, &all), 0, -1)))
            goto out;
        if (gr_re_add(b, top, cat))
            goto out;
        if (p.i < p.n && p.s[p.i] == '|') {
            p.i++;
            continue;
        }
        if (p.i < p.n) {
            rp_fail(&p, p.s[p.i] == ')' ? "an unmatched )" : "unexpected text");
            goto out;
        }
        break;
    }
    res = top->n_sub == 1 ? top->sub[0] : top;
out:
    gr_cset_free(&all);
    return res;
}
