/* SPDX-License-Identifier: MIT */
/* coordinator/grammar/schema.c: JSON Schema to a grammar.
 *
 * Each schema becomes a nonterminal (a schema reached twice, through $ref or recursion, is one
 * nonterminal); strings, numbers and literals become lexemes. A keyword is either compiled
 * exactly or refused with its place named: a grammar that lets through an instance the schema
 * rejects is a bug, one that refuses a schema is a limit. The rules:
 *  - objects: properties in the order the schema defines them, required ones present, optional
 *    ones anywhere absent; other keys (unless additionalProperties is false) after them, any key
 *    but the defined ones, with additionalProperties' schema;
 *  - allOf (and $ref beside other keywords) is merged into one schema, keyword by keyword;
 *    anyOf is a choice, oneOf too when its branches cannot both match an instance;
 *  - whitespace as JSON allows, at most opts.max_ws bytes in a row (-1: none);
 *  - annotations and keywords no validator knows are ignored, as JSON Schema says; formats
 *    no validator knows too ("int32"); known formats are compiled or refused.
 */
#include "gr_internal.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "utf8.h"
#include "util.h"

#define GR_MAX_PATTERN_PROPS 3 /* a key may match any set of them: 2^n key lexemes */

enum {
    T_NULL = 1,
    T_BOOL = 2,
    T_INT = 4,
    T_NUM = 8, /* number: integers included */
    T_STR = 16,
    T_ARR = 32,
    T_OBJ = 64,
    T_ALL = 127,
};

static const char *const type_names[] = {"null",   "boolean", "integer", "number",
                                         "string", "array",   "object"}; /* T_* bits */

struct gr_json {
    struct gr_grammar *g;
    struct gr_rebuild b;
    struct shardlm_err *e;
    json_t *root;
    int ws; /* most whitespace bytes in a row */
    int lx_obeg, lx_oend, lx_abeg, lx_aend, lx_comma, lx_colon, lx_str, lx_num, lx_true, lx_false,
        lx_null, lx_lead;
    int nt_any;
    struct memo {
        json_t *s; /* NULL: an empty slot */
        int nt;
    } * memo; /* open addressing by the schema's address (memo_mask + 1 slots) */
    int n_memo, memo_mask;
    json_t *keep; /* schemas made by merging: alive until the end */
    int depth;
    long budget; /* schemas compiled: a merge that keeps making new ones is stopped */
    char where[256];
    int where_len;
};

static int sc_fail(struct gr_json *c, const char *kw, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int sc_fail(struct gr_json *c, const char *kw, const char *fmt, ...)
{
    char msg[320], shown[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    coord_escape(shown, sizeof(shown), msg, strlen(msg)); /* it may quote the schema's strings */
    return shardlm_fail(c->e, -EINVAL, "json_schema: %s%s\"%s\": %s", c->where_len ? c->where : "",
                        c->where_len ? ": " : "", kw, shown);
}

static int sc_rc(struct gr_json *c, int rc) { return gr_fail_code(c->e, rc, "json_schema"); }

static void where_push(struct gr_json *c, const char *a, const char *b, int *save)
{
    *save = c->where_len;
    char shown[96] = "";
    if (b)
        coord_escape(shown, sizeof(shown), b, strlen(b)); /* a key of the schema's */
    int n = snprintf(c->where + c->where_len, sizeof(c->where) - (size_t)c->where_len, "/%s%s%s", a,
                     b ? "/" : "", shown);
    if (n > 0)
        c->where_len += n;
    if (c->where_len >= (int)sizeof(c->where))
        c->where_len = (int)sizeof(c->where) - 1;
}

static void where_pop(struct gr_json *c, int save)
{
    c->where_len = save;
    c->where[save] = 0;
}

/* ---- building blocks ---- */

static int rule(struct gr_json *c, int lhs, int n, ...)
{
    int32_t sym[16];
    va_list ap;
    va_start(ap, n);
    for (int i = 0; i < n; i++)
        sym[i] = va_arg(ap, int32_t);
    va_end(ap);
    int rc = gr_cfg_rule(&c->g->cfg, lhs, sym, n);
    return rc ? sc_rc(c, rc) : 0;
}

static int nt_new(struct gr_json *c)
{
    int nt = gr_cfg_nt(&c->g->cfg);
    return nt < 0 ? sc_rc(c, nt) : nt;
}

/* A lexeme from an AST (NULL: the builder's error is set). Returns its id or -errno. */
static int lex(struct gr_json *c, struct gr_re *r)
{
    if (!r)
        return -EINVAL;
    int id = gr_lexer_add(&c->g->lex, r);
    return id < 0 ? sc_rc(c, id) : id;
}

static struct gr_re *re_src(struct gr_json *c, const char *src, enum gr_enc enc)
{
    return gr_re_parse(&c->b, src, strlen(src), enc, true);
}

/* [ \t\n\r]{0,ws} */
static struct gr_re *re_ws(struct gr_json *c, int min)
{
    struct gr_cset s = {0};
    if (gr_cset_add(&s, '\t', '\n') || gr_cset_add(&s, '\r', '\r') || gr_cset_add(&s, ' ', ' ')) {
        gr_cset_free(&s);
        shardlm_fail(c->e, -ENOMEM, "out of memory");
        return NULL;
    }
    struct gr_re *r = gr_re_rep(&c->b, gr_re_set(&c->b, GR_ENC_BYTE, &s), min, c->ws);
    gr_cset_free(&s);
    return r;
}

/* Punctuation @p with the whitespace JSON allows before (@before) and after (@after) it. */
static int lex_punct(struct gr_json *c, char p, bool before, bool after)
{
    struct gr_re *r = gr_re_new(&c->b, GR_RE_CAT);
    if (!r)
        return -ENOMEM;
    if (before && c->ws && gr_re_add(&c->b, r, re_ws(c, 0)))
        return -ENOMEM;
    if (gr_re_add(&c->b, r, gr_re_range(&c->b, GR_ENC_BYTE, (uint8_t)p, (uint8_t)p)))
        return -ENOMEM;
    if (after && c->ws && gr_re_add(&c->b, r, re_ws(c, 0)))
        return -ENOMEM;
    return lex(c, r);
}

static struct gr_re *re_quote(struct gr_json *c)
{
    return gr_re_range(&c->b, GR_ENC_BYTE, '"', '"');
}

/* "content" */
static struct gr_re *re_string(struct gr_json *c, struct gr_re *content)
{
    return gr_re_cat(&c->b, gr_re_cat(&c->b, re_quote(c), content), re_quote(c));
}

static struct gr_re *re_anychar(struct gr_json *c)
{
    return gr_re_range(&c->b, GR_ENC_JSON, 0, GR_MAX_CP);
}

static int common_lexemes(struct gr_json *c)
{
    if ((c->lx_obeg = lex_punct(c, '{', false, true)) < 0 ||
        (c->lx_oend = lex_punct(c, '}', true, false)) < 0 ||
        (c->lx_abeg = lex_punct(c, '[', false, true)) < 0 ||
        (c->lx_aend = lex_punct(c, ']', true, false)) < 0 ||
        (c->lx_comma = lex_punct(c, ',', true, true)) < 0 ||
        (c->lx_colon = lex_punct(c, ':', true, true)) < 0)
        return -EINVAL;
    c->lx_str = lex(c, re_string(c, gr_re_rep(&c->b, re_anychar(c), 0, -1)));
    c->lx_num =
        lex(c, re_src(c, "-?(?:0|[1-9][0-9]*)(?:\\.[0-9]+)?(?:[eE][+-]?[0-9]+)?", GR_ENC_BYTE));
    c->lx_true = lex(c, gr_re_lit(&c->b, GR_ENC_BYTE, "true", 4));
    c->lx_false = lex(c, gr_re_lit(&c->b, GR_ENC_BYTE, "false", 5));
    c->lx_null = lex(c, gr_re_lit(&c->b, GR_ENC_BYTE, "null", 4));
    c->lx_lead = c->ws ? lex(c, re_ws(c, 1)) : 0;
    if (c->lx_str < 0 || c->lx_num < 0 || c->lx_true < 0 || c->lx_false < 0 || c->lx_null < 0 ||
        c->lx_lead < 0)
        return -EINVAL;
    c->nt_any = -1;
    return 0;
}

/* Any JSON value. */
static int any_value(struct gr_json *c)
{
    if (c->nt_any >= 0)
        return c->nt_any;
    int v = nt_new(c), obj = nt_new(c), mem = nt_new(c), arr = nt_new(c), el = nt_new(c);
    if (v < 0 || obj < 0 || mem < 0 || arr < 0 || el < 0)
        return -ENOMEM;
    c->nt_any = v;
    int rc = rule(c, v, 1, ~obj) | rule(c, v, 1, ~arr) | rule(c, v, 1, c->lx_str) |
             rule(c, v, 1, c->lx_num) | rule(c, v, 1, c->lx_true) | rule(c, v, 1, c->lx_false) |
             rule(c, v, 1, c->lx_null) | rule(c, obj, 2, c->lx_obeg, c->lx_oend) |
             rule(c, obj, 3, c->lx_obeg, ~mem, c->lx_oend) |
             rule(c, mem, 3, c->lx_str, c->lx_colon, ~v) |
             rule(c, mem, 5, ~mem, c->lx_comma, c->lx_str, c->lx_colon, ~v) |
             rule(c, arr, 2, c->lx_abeg, c->lx_aend) |
             rule(c, arr, 3, c->lx_abeg, ~el, c->lx_aend) | rule(c, el, 1, ~v) |
             rule(c, el, 3, ~el, c->lx_comma, ~v);
    return rc ? -EINVAL : v;
}

/* ---- keywords ---- */

/* The keywords this compiler knows (validation keywords it compiles or refuses). A key that is
 * neither is not JSON Schema's, and ignored as the specification says. */
static const char *const known[] = {"type",
                                    "enum",
                                    "const",
                                    "properties",
                                    "required",
                                    "additionalProperties",
                                    "patternProperties",
                                    "propertyNames",
                                    "minProperties",
                                    "maxProperties",
                                    "dependencies",
                                    "dependentRequired",
                                    "dependentSchemas",
                                    "unevaluatedProperties",
                                    "items",
                                    "prefixItems",
                                    "additionalItems",
                                    "unevaluatedItems",
                                    "minItems",
                                    "maxItems",
                                    "uniqueItems",
                                    "contains",
                                    "minContains",
                                    "maxContains",
                                    "minLength",
                                    "maxLength",
                                    "pattern",
                                    "format",
                                    "minimum",
                                    "maximum",
                                    "exclusiveMinimum",
                                    "exclusiveMaximum",
                                    "multipleOf",
                                    "allOf",
                                    "anyOf",
                                    "oneOf",
                                    "not",
                                    "if",
                                    "then",
                                    "else",
                                    "$ref",
                                    "$dynamicRef",
                                    "$recursiveRef",
                                    NULL};

static bool in_list(const char *const *l, const char *k)
{
    for (; *l; l++)
        if (!strcmp(*l, k))
            return true;
    return false;
}

static bool is_known(const char *k) { return in_list(known, k); }

/* The types @s allows (T_*), from "type"; -1 for a type that is not one. */
static int type_mask(json_t *t)
{
    static const struct {
        const char *n;
        int m;
    } names[] = {{"null", T_NULL},  {"boolean", T_BOOL}, {"integer", T_INT}, {"number", T_NUM},
                 {"string", T_STR}, {"array", T_ARR},    {"object", T_OBJ}};
    if (!t)
        return T_ALL;
    if (json_is_string(t)) {
        for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
            if (!strcmp(json_string_value(t), names[i].n))
                return names[i].m;
        return -1;
    }
    if (json_is_array(t)) {
        int m = 0;
        size_t i;
        json_t *x;
        json_array_foreach(t, i, x)
        {
            int k = type_mask(x);
            if (k < 0 || !json_is_string(x))
                return -1;
            m |= k;
        }
        return m;
    }
    return -1;
}

/* ---- $ref ---- */

/* The schema @ref points to (a JSON pointer in this document), or NULL with @e set. */
static json_t *deref(struct gr_json *c, const char *ref)
{
    if (ref[0] != '#') {
        sc_fail(c, "$ref", "\"%.80s\" is not in this document (only \"#...\" references are)", ref);
        return NULL;
    }
    json_t *cur = c->root;
    const char *p = ref + 1;
    if (*p && *p != '/') {
        sc_fail(c, "$ref", "\"%.80s\": anchors are not supported", ref);
        return NULL;
    }
    while (*p == '/') {
        p++;
        char tok[256];
        size_t n = 0;
        for (; *p && *p != '/'; p++) {
            char ch = *p;
            if (ch == '~' && (p[1] == '0' || p[1] == '1')) {
                ch = p[1] == '0' ? '~' : '/';
                p++;
            } else if (ch == '%' && p[1] && p[2]) {
                char hx[3] = {p[1], p[2], 0};
                char *end;
                long v = strtol(hx, &end, 16);
                if (!*end) {
                    ch = (char)v;
                    p += 2;
                }
            }
            if (n + 1 >= sizeof(tok)) {
                sc_fail(c, "$ref", "a part of \"%.80s\" is too long", ref);
                return NULL;
            }
            tok[n++] = ch;
        }
        tok[n] = 0;
        if (json_is_object(cur)) {
            cur = json_object_get(cur, tok);
        } else if (json_is_array(cur)) {
            char *end;
            long i = strtol(tok, &end, 10);
            cur = *end || !*tok ? NULL : json_array_get(cur, (size_t)i);
        } else {
            cur = NULL;
        }
        if (!cur) {
            sc_fail(c, "$ref", "\"%.80s\" points to nothing", ref);
            return NULL;
        }
    }
    if (!json_is_object(cur) && !json_is_boolean(cur)) {
        sc_fail(c, "$ref", "\"%.80s\" is not a schema", ref);
        return NULL;
    }
    return cur;
}

/* ---- merging (allOf) ---- */

static json_t *keep(struct gr_json *c, json_t *j)
{
    if (j)
        json_array_append_new(c->keep, j);
    return j;
}

static bool has_validation(json_t *s, const char *except)
{
    const char *k;
    json_t *v;
    json_object_foreach(s, k, v)
    {
        if (except && !strcmp(k, except))
            continue;
        if (is_known(k))
            return true;
    }
    return false;
}

static json_t *merge(struct gr_json *c, json_t *a, json_t *b);

/* @s with its $ref and allOf folded in: a schema object (kept alive by c->keep), or NULL with
 * @e set. */
static json_t *flatten(struct gr_json *c, json_t *s, int depth)
{
    if (depth > 32) {
        sc_fail(c, "allOf", "references nest more than 32 deep inside allOf (recursive?)");
        return NULL;
    }
    if (json_is_true(s))
        return keep(c, json_object());
    if (json_is_false(s))
        return keep(c, json_pack("{s:b}", "not", 1)); /* nothing matches (apply_not) */
    if (!json_is_object(s)) {
        sc_fail(c, "schema", "a schema is an object or a boolean");
        return NULL;
    }
    json_t *ref = json_object_get(s, "$ref");
    json_t *all = json_object_get(s, "allOf");
    if (!ref && !all)
        return s;
    /* the referenced and the allOf schemas first, the schema's own keywords last: properties
     * keep that order (a base's before those its extension adds) */
    json_t *own = keep(c, json_deep_copy(s)), *out = keep(c, json_object());
    if (!own || !out)
        return NULL;
    json_object_del(own, "$ref");
    json_object_del(own, "allOf");
    if (ref) {
        if (!json_is_string(ref)) {
            sc_fail(c, "$ref", "not a string");
            return NULL;
        }
        json_t *t = deref(c, json_string_value(ref));
        t = t ? flatten(c, t, depth + 1) : NULL;
        if (!t || !(out = merge(c, out, t)))
            return NULL;
    }
    if (all) {
        if (!json_is_array(all) || !json_array_size(all)) {
            sc_fail(c, "allOf", "not a non-empty array");
            return NULL;
        }
        size_t i;
        json_t *x;
        json_array_foreach(all, i, x)
        {
            json_t *t = flatten(c, x, depth + 1);
            if (!t || !(out = merge(c, out, t)))
                return NULL;
        }
    }
    if (!(out = merge(c, out, own)))
        return NULL;
    return out;
}

static json_t *all_of2(json_t *a, json_t *b) { return json_pack("{s:[OO]}", "allOf", a, b); }

/* The keys of the object schema @s allows for key @k: its schema (borrowed or made), NULL when
 * not allowed. */
static json_t *prop_schema(json_t *s, const char *k)
{
    json_t *p = json_object_get(json_object_get(s, "properties"), k);
    if (p)
        return p;
    json_t *ap = json_object_get(s, "additionalProperties");
    if (json_is_false(ap))
        return NULL;
    return ap ? ap : json_true();
}

/* One schema that matches what both @a and @b match (both flattened; @a is ours to change). */
/* Schema @s's array items: its prefix (prefixItems, or draft 4's items as an array) in *@pre
 * (NULL: none) and what the items after it follow (items, or draft 4's additionalItems) in
 * *@rest (NULL: anything). */
static void array_parts(json_t *s, json_t **pre, json_t **rest)
{
    json_t *items = json_object_get(s, "items");
    *pre = json_object_get(s, "prefixItems");
    *rest = items;
    if (json_is_array(items)) {
        *pre = items;
        *rest = json_object_get(s, "additionalItems");
    }
}

/* The item at @i of a schema whose parts array_parts() gave: its schema, or NULL (anything). */
static json_t *item_at(json_t *pre, json_t *rest, size_t i)
{
    return i < json_array_size(pre) ? json_array_get(pre, i) : rest;
}

/* Both sides' array items in @a (in 2020-12's form: prefixItems, items): item i follows both
 * sides' schema for item i, so a prefix on one side meets the other's items. Returns 0 or
 * -ENOMEM. */
static int merge_arrays(struct gr_json *c, json_t *a, json_t *b)
{
    json_t *pa, *ra, *pb, *rb;
    array_parts(a, &pa, &ra);
    array_parts(b, &pb, &rb);
    size_t n =
        json_array_size(pa) > json_array_size(pb) ? json_array_size(pa) : json_array_size(pb);
    json_t *pre = n ? keep(c, json_array()) : NULL;
    if (n && !pre)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++) {
        json_t *x = item_at(pa, ra, i), *y = item_at(pb, rb, i);
        json_t *both = !x ? json_incref(y) : !y ? json_incref(x) : keep(c, all_of2(x, y));
        if (!both || json_array_append(pre, both))
            return -ENOMEM;
        if (!x || !y)
            json_decref(both);
    }
    json_t *rest = !ra ? rb : !rb ? ra : keep(c, all_of2(ra, rb));
    json_object_del(a, "additionalItems");
    json_object_del(a, "items");
    json_object_del(a, "prefixItems");
    if ((pre && json_object_set(a, "prefixItems", pre)) ||
        (rest && json_object_set(a, "items", rest)))
        return -ENOMEM;
    return 0;
}

static json_t *merge(struct gr_json *c, json_t *a, json_t *b)
{
    const char *k;
    json_t *bv;
    /* arrays: each item's schema is both sides' schema for it */
    bool arr_a = json_object_get(a, "items") || json_object_get(a, "prefixItems");
    bool arr_b = json_object_get(b, "items") || json_object_get(b, "prefixItems");
    bool arr = arr_a && arr_b;
    if (arr && merge_arrays(c, a, b)) {
        sc_rc(c, -ENOMEM);
        return NULL;
    }
    if (json_object_get(a, "patternProperties") || json_object_get(b, "patternProperties")) {
        if (json_object_get(a, "patternProperties") && json_object_get(b, "patternProperties")) {
            sc_fail(c, "allOf", "two schemas with patternProperties cannot be merged");
            return NULL;
        }
    }
    /* objects: each key's schema is both sides' schema for it */
    bool obj = json_object_get(a, "properties") || json_object_get(b, "properties") ||
               json_object_get(a, "additionalProperties") ||
               json_object_get(b, "additionalProperties");
    if (obj) {
        if (json_object_get(a, "patternProperties") || json_object_get(b, "patternProperties")) {
            sc_fail(c, "allOf", "patternProperties beside properties cannot be merged");
            return NULL;
        }
        json_t *props = keep(c, json_object());
        json_t *keys = keep(c, json_array());
        json_t *pa = json_object_get(a, "properties"), *pb = json_object_get(b, "properties");
        json_t *v;
        json_object_foreach(pa, k, v) json_array_append_new(keys, json_string(k));
        json_object_foreach(pb, k, v) if (!json_object_get(pa, k))
            json_array_append_new(keys, json_string(k));
        size_t i;
        json_t *kj;
        json_array_foreach(keys, i, kj)
        {
            const char *key = json_string_value(kj);
            json_t *x = prop_schema(a, key), *y = prop_schema(b, key);
            if (!x || !y)
                json_object_set_new(props, key, json_false());
            else if (json_is_true(x))
                json_object_set(props, key, y);
            else if (json_is_true(y))
                json_object_set(props, key, x);
            else
                json_object_set_new(props, key, all_of2(x, y));
        }
        json_t *aa = json_object_get(a, "additionalProperties");
        json_t *ab = json_object_get(b, "additionalProperties");
        json_t *ap = !aa                                      ? ab
                     : !ab                                    ? aa
                     : json_is_false(aa) || json_is_false(ab) ? json_false()
                                                              : keep(c, all_of2(aa, ab));
        json_object_set(a, "properties", props);
        if (ap)
            json_object_set(a, "additionalProperties", ap);
    }
    json_object_foreach(b, k, bv)
    {
        if (obj && (!strcmp(k, "properties") || !strcmp(k, "additionalProperties")))
            continue;
        if (arr &&
            (!strcmp(k, "items") || !strcmp(k, "prefixItems") || !strcmp(k, "additionalItems")))
            continue;
        json_t *av = json_object_get(a, k);
        if (!av) {
            json_object_set(a, k, bv);
            continue;
        }
        if (!is_known(k) || json_equal(av, bv))
            continue;
        if (!strcmp(k, "type")) {
            int m = type_mask(av), n = type_mask(bv);
            if (m < 0 || n < 0) {
                sc_fail(c, "type", "not a type or list of types");
                return NULL;
            }
            /* number and integer: integer */
            int both = m & n;
            if ((m & T_NUM) && (n & T_INT))
                both |= T_INT;
            if ((n & T_NUM) && (m & T_INT))
                both |= T_INT;
            json_t *t = json_array();
            for (int i = 0; i < 7; i++)
                if (both & (1 << i))
                    json_array_append_new(t, json_string(type_names[i]));
            json_object_set_new(a, "type", t);
        } else if (!strcmp(k, "required")) {
            av = json_copy(av); /* it may be another schema's: the union is a new list */
            json_object_set_new(a, k, av);
            size_t i;
            json_t *x;
            json_array_foreach(bv, i, x)
            {
                bool dup = false;
                size_t j;
                json_t *y;
                json_array_foreach(av, j, y) dup |= json_equal(x, y);
                if (!dup)
                    json_array_append(av, x);
            }
        } else if (!strcmp(k, "items") || !strcmp(k, "additionalItems") ||
                   !strcmp(k, "propertyNames") || !strcmp(k, "contains")) {
            if (json_is_array(av) || json_is_array(bv)) {
                sc_fail(c, "allOf", "\"%s\" as arrays cannot be merged", k);
                return NULL;
            }
            json_object_set_new(a, k, all_of2(av, bv));
        } else if (!strcmp(k, "minimum") || !strcmp(k, "minLength") || !strcmp(k, "minItems") ||
                   !strcmp(k, "minProperties")) {
            if (json_number_value(bv) > json_number_value(av))
                json_object_set(a, k, bv);
        } else if (!strcmp(k, "maximum") || !strcmp(k, "maxLength") || !strcmp(k, "maxItems") ||
                   !strcmp(k, "maxProperties")) {
            if (json_number_value(bv) < json_number_value(av))
                json_object_set(a, k, bv);
        } else if (!strcmp(k, "enum")) {
            json_t *e2 = json_array();
            size_t i, j;
            json_t *x, *y;
            json_array_foreach(av, i, x) json_array_foreach(bv, j, y) if (json_equal(x, y))
            {
                json_array_append(e2, x);
                break;
            }
            json_object_set_new(a, "enum", e2);
        } else if (!strcmp(k, "anyOf") || !strcmp(k, "oneOf")) {
            /* (A1 | A2) and (B1 | B2): the pairs */
            json_t *alt = json_array();
            size_t i, j;
            json_t *x, *y;
            json_array_foreach(av, i, x) json_array_foreach(bv, j, y)
                json_array_append_new(alt, all_of2(x, y));
            if (!strcmp(k, "oneOf")) {
                sc_fail(c, "allOf", "two oneOf cannot be merged");
                json_decref(alt);
                return NULL;
            }
            json_object_set_new(a, k, alt);
        } else {
            sc_fail(c, "allOf", "two different \"%s\" cannot be merged", k);
            return NULL;
        }
    }
    return a;
}

/* ---- literals ---- */

static int literal(struct gr_json *c, json_t *v, int nt);

/* The number @v as it is written: an integer, or the shortest decimal that reads back. */
static struct gr_re *re_number_lit(struct gr_json *c, json_t *v)
{
    char buf[64];
    if (json_is_integer(v)) {
        snprintf(buf, sizeof(buf), "%lld", (long long)json_integer_value(v));
        struct gr_re *r = gr_re_lit(&c->b, GR_ENC_BYTE, buf, strlen(buf));
        return gr_re_cat(&c->b, r, gr_re_rep(&c->b, re_src(c, "\\.0+", GR_ENC_BYTE), 0, 1));
    }
    double d = json_real_value(v);
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, sizeof(buf), "%.*g", p, d);
        if (strtod(buf, NULL) == d)
            break;
    }
    if (d == floor(d) && fabs(d) < 1e15) { /* 3.0 is also 3 */
        snprintf(buf, sizeof(buf), "%.0f", d);
        struct gr_re *r = gr_re_lit(&c->b, GR_ENC_BYTE, buf, strlen(buf));
        return gr_re_cat(&c->b, r, gr_re_rep(&c->b, re_src(c, "\\.0+", GR_ENC_BYTE), 0, 1));
    }
    return gr_re_lit(&c->b, GR_ENC_BYTE, buf, strlen(buf));
}

static int literal(struct gr_json *c, json_t *v, int nt)
{
    int lx;
    switch (json_typeof(v)) {
    case JSON_NULL:
        return rule(c, nt, 1, c->lx_null);
    case JSON_TRUE:
        return rule(c, nt, 1, c->lx_true);
    case JSON_FALSE:
        return rule(c, nt, 1, c->lx_false);
    case JSON_INTEGER:
    case JSON_REAL:
        lx = lex(c, re_number_lit(c, v));
        return lx < 0 ? lx : rule(c, nt, 1, lx);
    case JSON_STRING:
        lx = lex(c, re_string(c, gr_re_lit(&c->b, GR_ENC_JSON, json_string_value(v),
                                           json_string_length(v))));
        return lx < 0 ? lx : rule(c, nt, 1, lx);
    case JSON_ARRAY: {
        if (!json_array_size(v))
            return rule(c, nt, 2, c->lx_abeg, c->lx_aend);
        int cur = nt;
        size_t i;
        json_t *x;
        json_array_foreach(v, i, x)
        {
            int el = nt_new(c), rest = nt_new(c);
            if (el < 0 || rest < 0 || literal(c, x, el))
                return -EINVAL;
            int rc = i == 0 ? rule(c, cur, 3, c->lx_abeg, ~el, ~rest)
                            : rule(c, cur, 3, c->lx_comma, ~el, ~rest);
            if (rc)
                return rc;
            cur = rest;
        }
        return rule(c, cur, 1, c->lx_aend);
    }
    case JSON_OBJECT: {
        if (!json_object_size(v))
            return rule(c, nt, 2, c->lx_obeg, c->lx_oend);
        int cur = nt;
        const char *k;
        json_t *x;
        bool first = true;
        json_object_foreach(v, k, x)
        {
            int el = nt_new(c), rest = nt_new(c);
            if (el < 0 || rest < 0 || literal(c, x, el))
                return -EINVAL;
            int kl = lex(c, re_string(c, gr_re_lit(&c->b, GR_ENC_JSON, k, strlen(k))));
            if (kl < 0)
                return kl;
            int rc = rule(c, cur, 5, first ? c->lx_obeg : c->lx_comma, kl, c->lx_colon, ~el, ~rest);
            if (rc)
                return rc;
            first = false;
            cur = rest;
        }
        return rule(c, cur, 1, c->lx_oend);
    }
    }
    return -EINVAL;
}

/* ---- numbers ---- */

/* Decimal digits of @lo..@hi (both >= 0, same digit count @w) as a regex. */
static struct gr_re *re_digits_fixed(struct gr_json *c, unsigned long long lo,
                                     unsigned long long hi, int w)
{
    if (!w)
        return gr_re_new(&c->b, GR_RE_EMPTY);
    unsigned long long p = 1;
    for (int i = 1; i < w; i++)
        p *= 10;
    unsigned dl = (unsigned)(lo / p), dh = (unsigned)(hi / p);
    unsigned long long rl = lo % p, rh = hi % p;
    if (dl == dh)
        return gr_re_cat(&c->b, gr_re_range(&c->b, GR_ENC_BYTE, '0' + dl, '0' + dl),
                         re_digits_fixed(c, rl, rh, w - 1));
    struct gr_re *alt = gr_re_new(&c->b, GR_RE_ALT);
    if (!alt)
        return NULL;
    if (rl) {
        if (gr_re_add(&c->b, alt,
                      gr_re_cat(&c->b, gr_re_range(&c->b, GR_ENC_BYTE, '0' + dl, '0' + dl),
                                re_digits_fixed(c, rl, p - 1, w - 1))))
            return NULL;
        dl++;
    }
    bool upper = rh != p - 1;
    unsigned top = dh;
    if (upper)
        dh--;
    if (dl <= dh && gr_re_add(&c->b, alt,
                              gr_re_cat(&c->b, gr_re_range(&c->b, GR_ENC_BYTE, '0' + dl, '0' + dh),
                                        re_digits_fixed(c, 0, p - 1, w - 1))))
        return NULL;
    if (upper && gr_re_add(&c->b, alt,
                           gr_re_cat(&c->b, gr_re_range(&c->b, GR_ENC_BYTE, '0' + top, '0' + top),
                                     re_digits_fixed(c, 0, rh, w - 1))))
        return NULL;
    return alt;
}

static int ndigits(unsigned long long v)
{
    int n = 1;
    while (v >= 10) {
        v /= 10;
        n++;
    }
    return n;
}

/* Whole numbers lo..hi (>= 0; @inf: no upper end) written without leading zeros. */
static struct gr_re *re_uint_range(struct gr_json *c, unsigned long long lo, unsigned long long hi,
                                   bool inf)
{
    struct gr_re *alt = gr_re_new(&c->b, GR_RE_ALT);
    if (!alt)
        return NULL;
    int dlo = ndigits(lo), dhi = inf ? dlo : ndigits(hi);
    for (int d = dlo; d <= dhi; d++) {
        unsigned long long first = 1;
        for (int i = 1; i < d; i++)
            first *= 10;
        unsigned long long a = d == 1 ? 0 : first, b = d >= 19 ? ~0ull : first * 10 - 1;
        if (a < lo)
            a = lo;
        if (!inf && b > hi)
            b = hi;
        if (a <= b && gr_re_add(&c->b, alt, re_digits_fixed(c, a, b, d)))
            return NULL;
    }
    /* unbounded: every number of more digits than lo's, [1-9][0-9]{dlo,} */
    if (inf &&
        gr_re_add(&c->b, alt,
                  gr_re_cat(&c->b, gr_re_range(&c->b, GR_ENC_BYTE, '1', '9'),
                            gr_re_rep(&c->b, gr_re_range(&c->b, GR_ENC_BYTE, '0', '9'), dlo, -1))))
        return NULL;
    if (!alt->n_sub)
        alt->kind = GR_RE_NONE;
    return alt;
}

struct bound {
    bool set, excl;
    double v;
};

/* Numbers (@integer: integers only) within @lo / @hi, without an exponent when bounded. */
static struct gr_re *re_number_range(struct gr_json *c, bool integer, struct bound lo,
                                     struct bound hi)
{
    const char *plain =
        integer ? "-?(?:0|[1-9][0-9]*)" : "-?(?:0|[1-9][0-9]*)(?:\\.[0-9]+)?(?:[eE][+-]?[0-9]+)?";
    if (!lo.set && !hi.set)
        return re_src(c, plain, GR_ENC_BYTE);
    const double lim = 9e15;
    if ((lo.set && fabs(lo.v) > lim) || (hi.set && fabs(hi.v) > lim)) {
        sc_fail(c, "minimum", "a bound past 9e15");
        return NULL;
    }
    /* integers: the whole numbers in range */
    if (integer) {
        long long a = LLONG_MIN, b = LLONG_MAX;
        if (lo.set)
            a = lo.excl ? (long long)floor(lo.v) + 1 : (long long)ceil(lo.v);
        if (hi.set)
            b = hi.excl ? (long long)ceil(hi.v) - 1 : (long long)floor(hi.v);
        struct gr_re *alt = gr_re_new(&c->b, GR_RE_ALT);
        if (!alt)
            return NULL;
        if (b >= 0 && b >= a) { /* 0.. */
            unsigned long long x = a > 0 ? (unsigned long long)a : 0;
            if (gr_re_add(&c->b, alt, re_uint_range(c, x, (unsigned long long)b, !hi.set)))
                return NULL;
        }
        if (a < 0 && a <= b) { /* -1..: magnitudes max(1, -b)..-a */
            unsigned long long x = b < 0 ? (unsigned long long)-b : 1;
            if (gr_re_add(
                    &c->b, alt,
                    gr_re_cat(&c->b, gr_re_lit(&c->b, GR_ENC_BYTE, "-", 1),
                              re_uint_range(c, x, lo.set ? (unsigned long long)-a : 0, !lo.set))))
                return NULL;
        }
        if (!alt->n_sub)
            alt->kind = GR_RE_NONE;
        return alt;
    }
    /* numbers: whole bounds only (a fraction or exponent beside them is refused) */
    if ((lo.set && lo.v != floor(lo.v)) || (hi.set && hi.v != floor(hi.v))) {
        sc_fail(c, "minimum", "a bound with a fraction is not supported");
        return NULL;
    }
    struct gr_re *alt = gr_re_new(&c->b, GR_RE_ALT);
    if (!alt)
        return NULL;
    /* one side of zero: magnitude m = n + f, n whole, f in [0, 1); f == 0 or f > 0.
     * sign +: L <= v <= U; sign -: -U <= m <= -L (m > 0). */
    for (int neg = 0; neg < 2; neg++) {
        struct bound l = neg ? hi : lo, u = neg ? lo : hi;
        if (neg) {
            l.v = -l.v;
            u.v = -u.v;
        }
        /* zero fraction: n in [l0, u0]; fraction > 0: n in [l1, u1] */
        long long l0 = 0, l1 = 0, u0 = LLONG_MAX, u1 = LLONG_MAX;
        if (l.set && l.v >= 0) {
            l0 = (long long)l.v + (l.excl ? 1 : 0);
            l1 = (long long)l.v;
        } else if (l.set && l.v < 0) {
            /* m >= negative: no bound; excl with l < 0: nothing changes */
        }
        if (u.set) {
            if (u.v < 0 || (u.v == 0 && u.excl))
                continue; /* this side is empty (except 0 itself, taken by +) */
            u0 = (long long)u.v - (u.excl ? 1 : 0);
            u1 = (long long)u.v - 1;
        }
        if (neg && l0 == 0) /* -0 is 0: the + side has it */
            l0 = 1;
        struct gr_re *sign =
            neg ? gr_re_lit(&c->b, GR_ENC_BYTE, "-", 1) : gr_re_new(&c->b, GR_RE_EMPTY);
        if (l0 <= u0 && u0 >= 0) {
            struct gr_re *r =
                gr_re_cat(&c->b,
                          gr_re_cat(&c->b, sign,
                                    re_uint_range(c, (unsigned long long)l0, (unsigned long long)u0,
                                                  u0 == LLONG_MAX)),
                          gr_re_rep(&c->b, re_src(c, "\\.0+", GR_ENC_BYTE), 0, 1));
            if (gr_re_add(&c->b, alt, r))
                return NULL;
        }
        if (l1 <= u1 && u1 >= 0) {
            struct gr_re *r =
                gr_re_cat(&c->b,
                          gr_re_cat(&c->b,
                                    neg ? gr_re_lit(&c->b, GR_ENC_BYTE, "-", 1)
                                        : gr_re_new(&c->b, GR_RE_EMPTY),
                                    re_uint_range(c, (unsigned long long)l1, (unsigned long long)u1,
                                                  u1 == LLONG_MAX)),
                          re_src(c, "\\.[0-9]*[1-9][0-9]*", GR_ENC_BYTE));
            if (gr_re_add(&c->b, alt, r))
                return NULL;
        }
    }
    if (!alt->n_sub)
        alt->kind = GR_RE_NONE;
    return alt;
}

/* The count keyword @kw of @s (minLength, maxItems...) into *@out: -1 when absent, or for an
 * upper bound of 2^32 or more (no instance that long can be written or held: no limit).
 * Returns 0 or -EINVAL (not a non-negative number). */
static int count_kw(struct gr_json *c, json_t *s, const char *kw, bool upper, long *out)
{
    json_t *v = json_object_get(s, kw);
    *out = -1;
    if (!v)
        return 0;
    if (!json_is_number(v) || json_number_value(v) < 0)
        return sc_fail(c, kw, "not a non-negative number");
    double d = upper ? floor(json_number_value(v)) : ceil(json_number_value(v));
    if (d >= 4294967296.0) {
        if (upper)
            return 0;
        d = 4294967296.0;
    }
    *out = (long)d;
    return 0;
}

/* ---- strings ---- */

/* The regex (content, JSON-encoded, anchored) of a format, NULL when not known to validators
 * (then ignored: *@unknown), or NULL with @e set when known but not supported. */
#define TIME                                                                                       \
    "(?:(?:[01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(?:\\.\\d+)?(?:[Zz]|[+-](?:[01]\\d|2[0-3]):[0-5]\\d)|" \
    "23:59:60(?:\\.\\d+)?(?:[Zz]|[+-]00:00))"

static const char *format_regex(const char *f, bool *unknown)
{
    static const struct {
        const char *name, *re;
    } fm[] = {
        {"date", "(?:\\d{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\\d|3[01])|(?:0[469]|11)-"
                 "(?:0[1-9]|[12]\\d|30)|02-(?:0[1-9]|1\\d|2[0-8]))|(?:\\d\\d(?:0[48]|[2468][048]|"
                 "[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)-02-29)"},
        /* a leap second only at 23:59:60 UTC, with the offset zero (one at another offset's
         * local 23:59 + the offset is refused: a limit, never an invalid time let through) */
        {"time", TIME},
        {"date-time",
         "(?:\\d{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\\d|3[01])|(?:0[469]|11)-"
         "(?:0[1-9]|[12]\\d|30)|02-(?:0[1-9]|1\\d|2[0-8]))|(?:\\d\\d(?:0[48]|[2468][048]|"
         "[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)-02-29)[Tt]" TIME},
        {"uuid", "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"},
        {"ipv4", "(?:(?:25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)\\.){3}(?:25[0-5]|2[0-4]\\d|1\\d\\d|"
                 "[1-9]?\\d)"},
        {"email", "[a-zA-Z0-9!#$%&'*+/=?^_`{|}~-]+(?:\\.[a-zA-Z0-9!#$%&'*+/=?^_`{|}~-]+)*@"
                  "(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?\\.)+[a-zA-Z0-9](?:[a-zA-Z0-9-]"
                  "{0,61}[a-zA-Z0-9])?"},
    };
    static const char *const refused[] = {"duration",      "idn-email",
                                          "hostname",      "idn-hostname",
                                          "ipv6",          "uri",
                                          "uri-reference", "iri",
                                          "iri-reference", "uri-template",
                                          "json-pointer",  "relative-json-pointer",
                                          "regex",         NULL};
    for (size_t i = 0; i < sizeof(fm) / sizeof(fm[0]); i++)
        if (!strcmp(f, fm[i].name))
            return fm[i].re;
    *unknown = !in_list(refused, f);
    return NULL;
}

static int string_lexeme(struct gr_json *c, json_t *s)
{
    json_t *pat = json_object_get(s, "pattern"), *fmt = json_object_get(s, "format");
    long lo, hi;
    if (count_kw(c, s, "minLength", false, &lo) || count_kw(c, s, "maxLength", true, &hi))
        return -EINVAL;
    bool mn = lo >= 0, mx = hi >= 0;
    if (lo < 0)
        lo = 0;
    if (lo > 10000 || hi > 10000)
        return sc_fail(c, mn && lo > 10000 ? "minLength" : "maxLength", "over 10000");
    if (hi >= 0 && hi < lo)
        return sc_fail(c, "maxLength", "below minLength: no string matches");
    const char *fre = NULL;
    if (fmt && json_is_string(fmt)) {
        bool unknown = false;
        fre = format_regex(json_string_value(fmt), &unknown);
        if (!fre && !unknown)
            return sc_fail(c, "format", "\"%s\" is not supported", json_string_value(fmt));
    }
    if (pat && !json_is_string(pat))
        return sc_fail(c, "pattern", "not a string");
    /* each constraint a regex over the content; several: their intersection */
    struct gr_re *content = NULL, *part;
    if (pat) {
        int save;
        where_push(c, "pattern", NULL, &save);
        part =
            gr_re_parse(&c->b, json_string_value(pat), json_string_length(pat), GR_ENC_JSON, false);
        where_pop(c, save);
        if (!part) {
            char why[sizeof(c->e->msg)];
            snprintf(why, sizeof(why), "%s", c->e->msg);
            return sc_fail(c, "pattern", "%s", why);
        }
        content = part;
    }
    if (fre) {
        part = re_src(c, fre, GR_ENC_JSON);
        content = content ? gr_re_and(&c->b, content, part) : part;
    }
    if (mn || mx || !content) {
        part = gr_re_rep(&c->b, re_anychar(c), (int)lo, (int)hi);
        content = content ? gr_re_and(&c->b, content, part) : part;
    }
    return lex(c, re_string(c, content));
}

/* ---- objects and arrays ---- */

static int value(struct gr_json *c, json_t *s);

/* The key of an additional property: any string but the @n keys @keys, as a lexeme. Built from
 * the keys' trie: at each node, a character that leaves the trie then anything, or a child,
 * or the end where no key ends. */
static struct gr_re *re_key_trie(struct gr_json *c, const char **keys, int n, size_t depth)
{
    /* keys[0..n) share their first @depth bytes and are sorted */
    struct gr_re *alt = gr_re_new(&c->b, GR_RE_ALT);
    if (!alt)
        return NULL;
    bool ends_here = false;
    struct gr_cset seen = {0};
    int i = 0;
    while (i < n && strlen(keys[i]) == depth) {
        ends_here = true;
        i++;
    }
    if (!ends_here && gr_re_add(&c->b, alt, gr_re_new(&c->b, GR_RE_EMPTY)))
        goto fail;
    while (i < n) {
        /* the next code point at @depth and the keys that share it */
        const unsigned char *u = (const unsigned char *)keys[i] + depth;
        size_t l = coord_utf8_char(u, strlen(keys[i]) - depth);
        if (!l) {
            sc_fail(c, "properties", "a key is not UTF-8");
            goto fail;
        }
        int j = i + 1;
        while (j < n && strlen(keys[j]) >= depth + l && !memcmp(keys[j] + depth, u, l))
            j++;
        uint32_t cp = coord_utf8_decode(u, l);
        if (gr_cset_add(&seen, cp, cp))
            goto fail;
        struct gr_re *sub = re_key_trie(c, keys + i, j - i, depth + l);
        if (gr_re_add(&c->b, alt, gr_re_cat(&c->b, gr_re_range(&c->b, GR_ENC_JSON, cp, cp), sub)))
            goto fail;
        i = j;
    }
    struct gr_cset other = {0};
    if (gr_cset_negate(&seen, &other))
        goto fail;
    struct gr_re *leave = gr_re_cat(&c->b, gr_re_set(&c->b, GR_ENC_JSON, &other),
                                    gr_re_rep(&c->b, re_anychar(c), 0, -1));
    gr_cset_free(&other);
    if (gr_re_add(&c->b, alt, leave))
        goto fail;
    gr_cset_free(&seen);
    return alt;
fail:
    gr_cset_free(&seen);
    return NULL;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Whether the content regex @content matches the string @key (written as JSON writes it):
 * 1, 0, or -errno. */
static int re_matches(struct gr_json *c, const struct gr_re *content, const char *key)
{
    struct gr_lexer x = {.max_states = 200000, .max_dstates = 20000};
    int32_t id = gr_lexer_add(&x, content);
    int rc = id;
    if (id >= 0) {
        int32_t q = gr_lexer_start(&x, &id, 1);
        for (const unsigned char *p = (const unsigned char *)key; *p && q >= 0; p++) {
            char esc[8];
            int n = 1;
            esc[0] = (char)*p;
            if (*p == '"' || *p == '\\')
                n = snprintf(esc, sizeof(esc), "\\%c", *p);
            else if (*p < 0x20)
                n = snprintf(esc, sizeof(esc), "\\u%04x", *p);
            for (int i = 0; i < n && q >= 0; i++)
                q = gr_lexer_step(&x, q, (uint8_t)esc[i]);
        }
        rc = q >= 0 && x.ds[q].n_acc > 0;
        if (x.overflow)
            rc = -E2BIG;
    }
    gr_lexer_free(&x);
    return rc < 0 ? sc_fail(c, "patternProperties", "a pattern is too large to test a key") : rc;
}

/* The alternatives of @ex: for each non-empty set S of the @n_pat patterns, a key S's
 * patterns match and no other (nor one of the @n defined @keys), with the value of all of S's
 * schemas; then, if @add, a key no pattern matches (nor a defined one) with @add's value. */
static int pattern_keys(struct gr_json *c, struct gr_re **pat_re, json_t **pat_s, int n_pat,
                        const char **keys, int n, json_t *add, int ex)
{
    struct gr_re **lits = calloc((size_t)n + 1, sizeof(*lits));
    int rc = lits ? 0 : -ENOMEM;
    for (int j = 0; j < n && !rc; j++)
        if (!(lits[j] = gr_re_lit(&c->b, GR_ENC_JSON, keys[j], strlen(keys[j]))))
            rc = -EINVAL;
    for (int set = 1; set <= (1 << n_pat) && !rc; set++) {
        bool rest = set == (1 << n_pat); /* the last: additional keys */
        if (rest && !add)
            break;
        struct gr_re *r = gr_re_new(&c->b, GR_RE_BOOL);
        json_t *v = NULL;
        if (!r) {
            rc = -EINVAL;
            break;
        }
        if (rest) {
            rc = gr_re_add(&c->b, r, gr_re_rep(&c->b, re_anychar(c), 0, -1));
            r->n_pos = 1;
            v = add;
        } else {
            for (int i = 0; i < n_pat && !rc; i++)
                if (set >> i & 1) {
                    rc = gr_re_add(&c->b, r, pat_re[i]);
                    r->n_pos++;
                    v = !v ? pat_s[i] : keep(c, all_of2(v, pat_s[i]));
                }
        }
        for (int i = 0; i < n_pat && !rc; i++)
            if (rest || !(set >> i & 1))
                rc = gr_re_add(&c->b, r, pat_re[i]);
        for (int j = 0; j < n && !rc; j++)
            rc = gr_re_add(&c->b, r, lits[j]);
        if (rc)
            break;
        int save;
        where_push(c, rest ? "additionalProperties" : "patternProperties", NULL, &save);
        int kl = lex(c, re_string(c, r));
        int val = kl < 0 ? kl : json_is_true(v) ? any_value(c) : value(c, v);
        where_pop(c, save);
        if (kl < 0 || val < 0)
            rc = kl < 0 ? kl : val;
        else
            rc = rule(c, ex, 3, kl, c->lx_colon, ~val);
    }
    free(lits);
    return rc;
}

static int object_rules(struct gr_json *c, json_t *s, int nt)
{
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    json_t *ap = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props))
        return sc_fail(c, "properties", "not an object");
    if (req && !json_is_array(req))
        return sc_fail(c, "required", "not an array");
    /* patternProperties: each pattern a regex over the key's content */
    json_t *pp = json_object_get(s, "patternProperties");
    struct gr_re *pat_re[GR_MAX_PATTERN_PROPS];
    json_t *pat_s[GR_MAX_PATTERN_PROPS];
    int n_pat = 0;
    if (pp && !json_is_object(pp))
        return sc_fail(c, "patternProperties", "not an object");
    if (json_object_size(pp) > GR_MAX_PATTERN_PROPS)
        return sc_fail(c, "patternProperties", "more than %d patterns are not supported",
                       GR_MAX_PATTERN_PROPS);
    const char *pk;
    json_t *pv;
    json_object_foreach(pp, pk, pv)
    {
        int save;
        where_push(c, "patternProperties", pk, &save);
        pat_re[n_pat] = gr_re_parse(&c->b, pk, strlen(pk), GR_ENC_JSON, false);
        where_pop(c, save);
        if (!pat_re[n_pat]) {
            char why[sizeof(c->e->msg)];
            snprintf(why, sizeof(why), "%s", c->e->msg);
            return sc_fail(c, "patternProperties", "%s", why);
        }
        pat_s[n_pat++] = pv;
    }
    if (json_object_get(s, "unevaluatedProperties"))
        return sc_fail(c, "unevaluatedProperties", "is not supported");
    json_t *pn = json_object_get(s, "propertyNames");
    if (pn && !json_is_true(pn) && !(json_is_object(pn) && !has_validation(pn, "type")))
        return sc_fail(c, "propertyNames", "is not supported");
    static const char *const deps[] = {"dependencies", "dependentRequired", "dependentSchemas"};
    for (int i = 0; i < 3; i++) {
        json_t *d = json_object_get(s, deps[i]);
        if (d && json_object_size(d))
            return sc_fail(c, deps[i], "is not supported");
    }
    /* the keys in order: the defined ones, then required ones not defined */
    int n = 0;
    const char *k;
    json_t *v;
    size_t total = json_object_size(props) + json_array_size(req);
    const char **keys = calloc(total + 1, sizeof(char *));
    json_t **schemas = calloc(total + 1, sizeof(json_t *));
    bool *required = calloc(total + 1, 1);
    int *kv = calloc(total + 1, sizeof(int));
    const char **sorted = calloc(total + 1, sizeof(char *));
    int rc = -ENOMEM;
    if (!keys || !schemas || !required || !kv || !sorted)
        goto out;
    json_object_foreach(props, k, v)
    {
        keys[n] = k;
        schemas[n++] = v;
    }
    size_t i;
    json_t *r;
    json_array_foreach(req, i, r)
    {
        if (!json_is_string(r)) {
            rc = sc_fail(c, "required", "an entry is not a string");
            goto out;
        }
        int j;
        for (j = 0; j < n && strcmp(keys[j], json_string_value(r)); j++)
            ;
        if (j == n) { /* its schema: the patterns' it matches, else additionalProperties' */
            keys[n] = json_string_value(r);
            schemas[n++] = NULL;
        }
        required[j] = true;
    }
    /* a defined key a pattern matches is also that pattern's */
    for (int j = 0; j < n; j++) {
        for (int i = 0; i < n_pat; i++) {
            int hit = re_matches(c, pat_re[i], keys[j]);
            if (hit < 0) {
                rc = hit;
                goto out;
            }
            if (!hit || json_is_false(schemas[j]))
                continue;
            schemas[j] = !schemas[j] ? pat_s[i] : keep(c, all_of2(schemas[j], pat_s[i]));
        }
        if (!schemas[j])
            schemas[j] = ap ? ap : json_true();
    }
    long min_p, max_p;
    if (count_kw(c, s, "minProperties", false, &min_p) ||
        count_kw(c, s, "maxProperties", true, &max_p)) {
        rc = -EINVAL;
        goto out;
    }
    /* present keys: those whose schema is not false */
    int m = 0, n_req = 0;
    for (int j = 0; j < n; j++) {
        if (json_is_false(schemas[j])) {
            if (required[j]) { /* required and not allowed: no object matches */
                rc = 0;
                goto out;
            }
        }
        n_req += required[j];
        sorted[m++] = keys[j];
    }
    bool extra = !json_is_false(ap);
    bool open = extra || n_pat;
    if (min_p > n_req) {
        rc = sc_fail(c, "minProperties", "more than the required properties is not supported");
        goto out;
    }
    if (max_p >= 0 && (open || max_p < n)) {
        int possible = 0;
        for (int j = 0; j < n; j++)
            possible += !json_is_false(schemas[j]);
        if (open || max_p < possible) {
            rc = sc_fail(c, "maxProperties", "fewer than the possible properties is not supported");
            goto out;
        }
    }
    int save;
    for (int j = 0; j < n; j++) {
        if (json_is_false(schemas[j])) {
            kv[j] = -1;
            continue;
        }
        int kl = lex(c, re_string(c, gr_re_lit(&c->b, GR_ENC_JSON, keys[j], strlen(keys[j]))));
        where_push(c, "properties", keys[j], &save);
        int val = value(c, schemas[j]);
        where_pop(c, save);
        if (kl < 0 || val < 0) {
            rc = kl < 0 ? kl : val;
            goto out;
        }
        kv[j] = nt_new(c);
        if (kv[j] < 0 || (rc = rule(c, kv[j], 3, kl, c->lx_colon, ~val)))
            goto out;
    }
    /* extras: keys not defined, after the defined ones: a pattern's (each set of patterns a
     * key may match, less the others and the defined keys) or additionalProperties' */
    int ex = -1;
    if (n_pat) {
        if ((ex = nt_new(c)) < 0 || (rc = pattern_keys(c, pat_re, pat_s, n_pat, keys, n,
                                                       extra ? (ap ? ap : json_true()) : NULL, ex)))
            goto out;
    } else if (extra) {
        if (m)
            qsort(sorted, (size_t)m, sizeof(char *), cmp_str);
        int kl = lex(c, re_string(c, re_key_trie(c, sorted, m, 0)));
        where_push(c, "additionalProperties", NULL, &save);
        int val = ap ? value(c, ap) : any_value(c);
        where_pop(c, save);
        if (kl < 0 || val < 0) {
            rc = kl < 0 ? kl : val;
            goto out;
        }
        ex = nt_new(c);
        if (ex < 0 || (rc = rule(c, ex, 3, kl, c->lx_colon, ~val)))
            goto out;
    }
    /* F_j: keys j.. with none before; C_j: with some before (each after a comma) */
    int fn = nt_new(c), cn = nt_new(c);
    if (fn < 0 || cn < 0) {
        rc = -ENOMEM;
        goto out;
    }
    if ((rc = rule(c, cn, 0)))
        goto out;
    if (ex >= 0) {
        if ((rc = rule(c, cn, 3, c->lx_comma, ~ex, ~cn)) || (rc = rule(c, fn, 2, ~ex, ~cn)))
            goto out;
    }
    if ((rc = rule(c, fn, 0)))
        goto out;
    for (int j = n - 1; j >= 0; j--) {
        if (kv[j] < 0)
            continue;
        int f = nt_new(c), cc = nt_new(c);
        if (f < 0 || cc < 0) {
            rc = -ENOMEM;
            goto out;
        }
        if ((rc = rule(c, f, 2, ~kv[j], ~cn)) || (rc = rule(c, cc, 3, c->lx_comma, ~kv[j], ~cn)))
            goto out;
        if (!required[j] && ((rc = rule(c, f, 1, ~fn)) || (rc = rule(c, cc, 1, ~cn))))
            goto out;
        fn = f;
        cn = cc;
    }
    rc = rule(c, nt, 3, c->lx_obeg, ~fn, c->lx_oend);
out:
    free(keys);
    free(schemas);
    free(required);
    free(kv);
    free(sorted);
    return rc;
}

static int array_rules(struct gr_json *c, json_t *s, int nt)
{
    json_t *items = json_object_get(s, "items"), *prefix = json_object_get(s, "prefixItems");
    json_t *addi = json_object_get(s, "additionalItems");
    if (json_object_get(s, "contains"))
        return sc_fail(c, "contains", "is not supported");
    if (json_object_get(s, "unevaluatedItems"))
        return sc_fail(c, "unevaluatedItems", "is not supported");
    long lo, hi;
    if (count_kw(c, s, "minItems", false, &lo) || count_kw(c, s, "maxItems", true, &hi))
        return -EINVAL;
    if (lo < 0)
        lo = 0;
    json_t *uniq = json_object_get(s, "uniqueItems");
    if (json_is_true(uniq) && !(hi >= 0 && hi <= 1))
        return sc_fail(c, "uniqueItems", "is not supported");
    /* positional schemas, then the rest */
    json_t *pos = NULL, *rest = NULL;
    if (json_is_array(items)) { /* draft 4-2019: items as a tuple, additionalItems the rest */
        pos = items;
        rest = addi ? addi : json_true();
    } else {
        pos = json_is_array(prefix) ? prefix : NULL;
        rest = items ? items : json_true();
    }
    long k = pos ? (long)json_array_size(pos) : 0;
    if (json_is_false(rest) && (hi < 0 || hi > k))
        hi = k;
    if (hi >= 0 && hi < lo)
        return sc_fail(c, "maxItems", "below minItems: no array matches");
    long chain = hi >= 0 ? hi : (lo > k ? lo : k);
    if (chain > 2000)
        return sc_fail(c, hi >= 0 ? "maxItems" : "minItems", "over 2000 is not supported");
    int *el = calloc((size_t)chain + 1, sizeof(int));
    if (!el)
        return sc_rc(c, -ENOMEM);
    int rc = 0, save;
    int rest_nt = -1;
    for (long j = 0; j < chain + 1 && !rc; j++) {
        json_t *sj = j < k ? json_array_get(pos, (size_t)j) : rest;
        if (j == chain && (hi >= 0 || json_is_false(sj)))
            break;
        if (j >= k && rest_nt >= 0) {
            el[j] = rest_nt;
            continue;
        }
        char idx[24];
        snprintf(idx, sizeof(idx), "%ld", j);
        where_push(c, j < k ? (json_is_array(items) ? "items" : "prefixItems") : "items",
                   j < k ? idx : NULL, &save);
        el[j] = json_is_false(sj) ? -1 : value(c, sj);
        where_pop(c, save);
        if (el[j] < -1) {
            rc = el[j];
            break;
        }
        if (j >= k)
            rest_nt = el[j];
    }
    if (rc)
        goto out;
    /* A_j: the elements after j of them; A_chain loops when unbounded */
    int next = nt_new(c);
    if (next < 0) {
        rc = next;
        goto out;
    }
    rc = rule(c, next, 0);
    if (!rc && hi < 0 && rest_nt >= 0) /* A_chain -> , rest A_chain | empty */
        rc = rule(c, next, 3, c->lx_comma, ~rest_nt, ~next);
    int loop = next;
    for (long j = chain - 1; j >= 0 && !rc; j--) {
        int a = nt_new(c);
        if (a < 0) {
            rc = a;
            break;
        }
        if (el[j] >= 0)
            rc = j ? rule(c, a, 3, c->lx_comma, ~el[j], ~next) : rule(c, a, 2, ~el[j], ~next);
        if (!rc && j >= lo)
            rc = rule(c, a, 0);
        next = a;
    }
    if (!rc && chain == 0) {
        /* no positions: A_0 -> empty | rest A_loop */
        int a = nt_new(c);
        rc = a < 0 ? a : rule(c, a, 0);
        if (!rc && rest_nt >= 0 && hi < 0)
            rc = rule(c, a, 2, ~rest_nt, ~loop);
        next = a;
    }
    if (!rc)
        rc = rule(c, nt, 3, c->lx_abeg, ~next, c->lx_aend);
out:
    free(el);
    return rc;
}

/* ---- a schema ---- */

static int bound_of(struct gr_json *c, json_t *s, bool upper, struct bound *b)
{
    const char *inc = upper ? "maximum" : "minimum";
    const char *exc = upper ? "exclusiveMaximum" : "exclusiveMinimum";
    json_t *i = json_object_get(s, inc), *x = json_object_get(s, exc);
    *b = (struct bound){0};
    if (i) {
        if (!json_is_number(i))
            return sc_fail(c, inc, "not a number");
        *b = (struct bound){true, false, json_number_value(i)};
    }
    if (x) {
        if (json_is_boolean(x)) { /* draft 4 */
            if (json_is_true(x) && b->set)
                b->excl = true;
        } else if (json_is_number(x)) {
            double v = json_number_value(x);
            if (!b->set || (upper ? v <= b->v : v >= b->v))
                *b = (struct bound){true, true, v};
        } else {
            return sc_fail(c, exc, "not a number");
        }
    }
    return 0;
}

/* Whether @v (an enum or const value) satisfies what @s says besides enum/const, as far as the
 * keywords beside it go: -1 when a keyword beside it is one this check does not read. */
static int enum_ok(json_t *s, json_t *v, int types)
{
    const char *k;
    json_t *x;
    json_object_foreach(s, k, x)
    {
        if (!is_known(k) || !strcmp(k, "enum") || !strcmp(k, "const") || !strcmp(k, "type"))
            continue;
        if (!strcmp(k, "format") || !strcmp(k, "pattern") || !strcmp(k, "minLength") ||
            !strcmp(k, "maxLength") || !strcmp(k, "properties") || !strcmp(k, "required") ||
            !strcmp(k, "additionalProperties") || !strcmp(k, "items") || !strcmp(k, "minimum") ||
            !strcmp(k, "maximum")) {
            /* these only constrain a type that a literal's shape shows: refuse when it applies */
            bool str = json_is_string(v), num = json_is_number(v), obj = json_is_object(v),
                 arr = json_is_array(v);
            bool applies = ((!strcmp(k, "format") || !strcmp(k, "pattern") ||
                             !strcmp(k, "minLength") || !strcmp(k, "maxLength")) &&
                            str) ||
                           ((!strcmp(k, "minimum") || !strcmp(k, "maximum")) && num) ||
                           ((!strcmp(k, "properties") || !strcmp(k, "required") ||
                             !strcmp(k, "additionalProperties")) &&
                            obj) ||
                           (!strcmp(k, "items") && arr);
            if (!applies)
                continue;
            if (!strcmp(k, "minimum") && json_number_value(v) < json_number_value(x))
                return 0;
            if (!strcmp(k, "maximum") && json_number_value(v) > json_number_value(x))
                return 0;
            if (!strcmp(k, "minimum") || !strcmp(k, "maximum"))
                continue;
            return -1;
        }
        return -1;
    }
    int t =
        json_is_null(v)      ? T_NULL
        : json_is_boolean(v) ? T_BOOL
        : json_is_integer(v) || (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)))
            ? T_INT | T_NUM
        : json_is_number(v) ? T_NUM
        : json_is_string(v) ? T_STR
        : json_is_array(v)  ? T_ARR
                            : T_OBJ;
    return (t & types) != 0;
}

/* Whether two branches of a oneOf cannot match the same instance: their types differ, or their
 * literals, or a required property's literals. */
static bool disjoint(struct gr_json *c, json_t *a, json_t *b, int depth);

static int literal_set(json_t *s, json_t **out)
{
    json_t *e = json_object_get(s, "enum"), *k = json_object_get(s, "const");
    if (k) {
        *out = k;
        return 1;
    }
    if (json_is_array(e)) {
        *out = e;
        return 2;
    }
    return 0;
}

static bool disjoint(struct gr_json *c, json_t *a, json_t *b, int depth)
{
    if (depth > 8)
        return false;
    a = flatten(c, a, 0);
    b = flatten(c, b, 0);
    if (!a || !b)
        return false;
    int ta = type_mask(json_object_get(a, "type")), tb = type_mask(json_object_get(b, "type"));
    if (ta > 0 && (ta & T_NUM))
        ta |= T_INT;
    if (tb > 0 && (tb & T_NUM))
        tb |= T_INT;
    if (ta > 0 && tb > 0 && !(ta & tb))
        return true;
    json_t *la, *lb;
    int ka = literal_set(a, &la), kb = literal_set(b, &lb);
    if (ka && kb) {
        size_t i, j;
        json_t *x, *y;
        if (ka == 1 && kb == 1)
            return !json_equal(la, lb);
        if (ka == 1) {
            json_array_foreach(lb, j, y) if (json_equal(la, y)) return false;
            return true;
        }
        if (kb == 1) {
            json_array_foreach(la, i, x) if (json_equal(x, lb)) return false;
            return true;
        }
        json_array_foreach(la, i, x)
            json_array_foreach(lb, j, y) if (json_equal(x, y)) return false;
        return true;
    }
    /* objects: a property both require whose schemas are disjoint */
    json_t *ra = json_object_get(a, "required"), *rb = json_object_get(b, "required");
    json_t *pa = json_object_get(a, "properties"), *pb = json_object_get(b, "properties");
    if ((ta & ~T_OBJ) == 0 && (tb & ~T_OBJ) == 0 && ta > 0 && tb > 0) {
        size_t i;
        json_t *x;
        json_array_foreach(ra, i, x)
        {
            const char *key = json_string_value(x);
            if (!key)
                continue;
            /* required in a but not allowed in b */
            json_t *sb = json_object_get(pb, key);
            if (!sb && json_is_false(json_object_get(b, "additionalProperties")) &&
                !json_object_get(b, "patternProperties"))
                return true;
            json_t *sa = json_object_get(pa, key);
            bool in_rb = false;
            size_t j;
            json_t *y;
            json_array_foreach(rb, j, y) in_rb |=
                json_is_string(y) && !strcmp(key, json_string_value(y));
            if (sa && sb && in_rb && disjoint(c, sa, sb, depth + 1))
                return true;
        }
        json_array_foreach(rb, i, x)
        {
            const char *key = json_string_value(x);
            if (key && !json_object_get(pa, key) &&
                json_is_false(json_object_get(a, "additionalProperties")) &&
                !json_object_get(a, "patternProperties"))
                return true;
        }
    }
    return false;
}

/* @s (flattened) with its "not" folded into the other keywords, for the forms that fold: not
 * {} or true (nothing matches), not false, not {"type": ...} (the other types), not
 * {"required": [k]} (k absent). NULL with @e set for the others. */
static json_t *apply_not(struct gr_json *c, json_t *s)
{
    json_t *n = flatten(c, json_object_get(s, "not"), 0);
    if (!n)
        return NULL;
    json_t *out = keep(c, json_deep_copy(s));
    if (!out)
        return NULL;
    json_object_del(out, "not");
    if (!has_validation(n, NULL)) { /* not {}: nothing matches */
        json_object_set_new(out, "type", json_array());
        return out;
    }
    if (json_object_get(n, "not") && json_object_size(n) == 1 &&
        !has_validation(json_object_get(n, "not"), NULL) &&
        json_is_object(json_object_get(n, "not")))
        return out; /* not {not {}}: anything */
    if (json_object_get(n, "type") && !has_validation(n, "type")) {
        int t = type_mask(json_object_get(n, "type")), cur = type_mask(json_object_get(s, "type"));
        if (t < 0 || cur < 0) {
            sc_fail(c, "not", "a type that is not one");
            return NULL;
        }
        if (t & T_NUM)
            t |= T_INT;
        if ((cur & T_NUM) && (t & T_INT) && !(t & T_NUM)) {
            sc_fail(c, "not", "numbers that are not integers are not supported");
            return NULL;
        }
        int left = cur & ~t;
        json_t *list = json_array();
        for (int i = 0; i < 7; i++)
            if (left & (1 << i))
                json_array_append_new(list, json_string(type_names[i]));
        json_object_set_new(out, "type", list);
        return out;
    }
    json_t *req = json_object_get(n, "required");
    if (req && !has_validation(n, "required") && json_array_size(req) == 1 &&
        json_is_string(json_array_get(req, 0))) {
        json_t *props = json_object_get(out, "properties");
        props = props ? json_deep_copy(props) : json_object();
        json_object_set_new(props, json_string_value(json_array_get(req, 0)), json_false());
        json_object_set_new(out, "properties", props);
        return out;
    }
    sc_fail(c, "not",
            "only not {}, not {\"type\": ...} and not {\"required\": [one]} are "
            "supported");
    return NULL;
}

/* Rules for @nt: the schema @s (an object or boolean). */
static int schema_rules(struct gr_json *c, json_t *s, int nt)
{
    if (++c->budget > 20000)
        return sc_fail(c, "schema", "more than 20000 subschemas to compile (recursive allOf?)");
    if (++c->depth > 64) {
        c->depth--;
        return sc_fail(c, "schema", "nested more than 64 deep");
    }
    int rc = 0, save;
    json_t *f = flatten(c, s, 0);
    if (!f) {
        rc = -EINVAL;
        goto out;
    }
    s = f;
    if (json_object_get(s, "not") && !(s = apply_not(c, s))) {
        rc = -EINVAL;
        goto out;
    }
    if (json_object_get(s, "if") || json_object_get(s, "$dynamicRef") ||
        json_object_get(s, "$recursiveRef")) {
        rc = sc_fail(c, json_object_get(s, "if") ? "if" : "$dynamicRef", "is not supported");
        goto out;
    }
    json_t *any = json_object_get(s, "anyOf"), *one = json_object_get(s, "oneOf");
    if (any || one) {
        const char *kw = any ? "anyOf" : "oneOf";
        json_t *alts = any ? any : one;
        if (any && one) {
            rc = sc_fail(c, "oneOf", "beside anyOf is not supported");
            goto out;
        }
        if (!json_is_array(alts) || !json_array_size(alts)) {
            rc = sc_fail(c, kw, "not a non-empty array");
            goto out;
        }
        json_t *base = json_deep_copy(s);
        keep(c, base);
        json_object_del(base, kw);
        bool plain = !has_validation(base, NULL);
        size_t i, j;
        json_t *x, *y;
        if (one)
            json_array_foreach(alts, i, x)
                json_array_foreach(alts, j, y) if (j > i && !disjoint(c, x, y, 0))
            {
                rc = sc_fail(c, "oneOf", "branches %zu and %zu may both match (not supported)", i,
                             j);
                goto out;
            }
        json_array_foreach(alts, i, x)
        {
            char idx[24];
            snprintf(idx, sizeof(idx), "%zu", i);
            where_push(c, kw, idx, &save);
            int v;
            if (plain) {
                v = value(c, x);
            } else {
                json_t *fx = flatten(c, x, 0);
                json_t *m = fx ? merge(c, keep(c, json_deep_copy(base)), fx) : NULL;
                v = m ? value(c, m) : -EINVAL;
            }
            where_pop(c, save);
            if (v < 0) {
                rc = v;
                goto out;
            }
            if ((rc = rule(c, nt, 1, ~v)))
                goto out;
        }
        goto out;
    }
    int types = type_mask(json_object_get(s, "type"));
    if (types < 0) {
        rc = sc_fail(c, "type", "not a type or list of types");
        goto out;
    }
    if (types & T_NUM)
        types |= T_INT;
    json_t *lits = json_object_get(s, "enum"), *cst = json_object_get(s, "const");
    if (lits || cst) {
        if (lits && !json_is_array(lits)) {
            rc = sc_fail(c, "enum", "not an array");
            goto out;
        }
        json_t *vals = lits ? lits : keep(c, json_pack("[O]", cst));
        if (lits && cst) {
            json_t *both = keep(c, json_array());
            size_t i;
            json_t *x;
            json_array_foreach(lits, i, x) if (json_equal(x, cst)) json_array_append(both, x);
            vals = both;
        }
        size_t i;
        json_t *x;
        json_array_foreach(vals, i, x)
        {
            int ok = enum_ok(s, x, types);
            if (ok < 0) {
                rc = sc_fail(c, lits ? "enum" : "const",
                             "beside other keywords that apply to its values is not supported");
                goto out;
            }
            if (!ok)
                continue;
            if ((rc = literal(c, x, nt)))
                goto out;
        }
        goto out; /* no value allowed: nt has no rule, and what needs it cannot complete */
    }
    if (types & T_NULL && (rc = rule(c, nt, 1, c->lx_null)))
        goto out;
    if (types & T_BOOL && ((rc = rule(c, nt, 1, c->lx_true)) || (rc = rule(c, nt, 1, c->lx_false))))
        goto out;
    if (types & (T_INT | T_NUM)) {
        struct bound lo, hi;
        if ((rc = bound_of(c, s, false, &lo)) || (rc = bound_of(c, s, true, &hi)))
            goto out;
        json_t *mo = json_object_get(s, "multipleOf");
        bool integer = !(types & T_NUM);
        if (mo && !(json_is_number(mo) && json_number_value(mo) == 1)) {
            rc = sc_fail(c, "multipleOf", "is not supported");
            goto out;
        }
        if (mo)
            integer = true;
        int lx = lex(c, re_number_range(c, integer, lo, hi));
        if (lx < 0 || (rc = rule(c, nt, 1, lx))) {
            rc = lx < 0 ? lx : rc;
            goto out;
        }
    }
    if (types & T_STR) {
        int lx = string_lexeme(c, s);
        if (lx < 0 || (rc = rule(c, nt, 1, lx))) {
            rc = lx < 0 ? lx : rc;
            goto out;
        }
    }
    if (types & T_ARR && (rc = array_rules(c, s, nt)))
        goto out;
    if (types & T_OBJ && (rc = object_rules(c, s, nt)))
        goto out;
out:
    c->depth--;
    return rc;
}

/* Remembers that schema @s is nonterminal @nt. Returns 0 or -ENOMEM. */
static int memo_add(struct gr_json *c, json_t *s, int nt)
{
    if ((c->n_memo + 1) * 2 > c->memo_mask) {
        int nm = c->memo_mask ? c->memo_mask * 2 + 1 : 255;
        struct memo *t = calloc((size_t)nm + 1, sizeof(*t));
        if (!t)
            return -ENOMEM;
        for (int j = 0; c->memo && j <= c->memo_mask; j++) {
            if (!c->memo[j].s)
                continue;
            uint64_t i = ((uint64_t)(uintptr_t)c->memo[j].s * 0x9E3779B97F4A7C15ull) >> 24;
            while (t[i & (uint64_t)nm].s)
                i++;
            t[i & (uint64_t)nm] = c->memo[j];
        }
        free(c->memo);
        c->memo = t;
        c->memo_mask = nm;
    }
    uint64_t i = ((uint64_t)(uintptr_t)s * 0x9E3779B97F4A7C15ull) >> 24;
    while (c->memo[i & (uint64_t)c->memo_mask].s)
        i++;
    c->memo[i & (uint64_t)c->memo_mask] = (struct memo){s, nt};
    c->n_memo++;
    return 0;
}

/* The nonterminal of schema @s: made once per schema object. */
static int value(struct gr_json *c, json_t *s)
{
    uint64_t h = ((uint64_t)(uintptr_t)s * 0x9E3779B97F4A7C15ull) >> 24;
    for (uint64_t i = h; c->memo; i++) {
        const struct memo *m = &c->memo[i & (uint64_t)c->memo_mask];
        if (!m->s)
            break;
        if (m->s == s)
            return m->nt;
    }
    if (json_is_true(s) || (json_is_object(s) && !json_object_size(s)))
        return any_value(c);
    int nt = nt_new(c);
    if (nt >= 0 && json_is_false(s))
        return nt; /* no rule: nothing matches (a property that must be absent) */
    if (nt < 0)
        return nt;
    if (memo_add(c, s, nt))
        return sc_rc(c, -ENOMEM);
    int rc = schema_rules(c, s, nt);
    return rc < 0 ? rc : nt;
}

/* ---- the compiler's life: inside a grammar of another source too (calls.c) ---- */

int gr_json_new(struct gr_grammar *g, const struct gr_opts *o, struct gr_json **out,
                struct shardlm_err *e)
{
    struct gr_json *c = calloc(1, sizeof(*c));
    if (!c)
        return shardlm_fail(e, -ENOMEM, "json_schema: out of memory");
    c->g = g;
    c->e = e;
    c->ws = o && o->max_ws ? (o->max_ws < 0 ? 0 : o->max_ws) : 16;
    c->b = (struct gr_rebuild){.max_nodes = 2000000, .e = e};
    c->keep = json_array();
    int rc = c->keep ? common_lexemes(c) : sc_rc(c, -ENOMEM);
    if (rc) {
        gr_json_free(c);
        return rc;
    }
    *out = c;
    return 0;
}

int gr_json_value(struct gr_json *c, json_t *schema, json_t *root)
{
    c->root = root;
    int v = value(c, schema);
    c->root = NULL;
    return v;
}

json_t *gr_json_keep(struct gr_json *c, json_t *j) { return keep(c, j); }

void gr_json_free(struct gr_json *c)
{
    if (!c)
        return;
    gr_rebuild_free(&c->b);
    json_decref(c->keep);
    free(c->memo);
    free(c);
}

/* @schema (NULL: json_object's any object) as a whole grammar, with the whitespace JSON allows
 * around the value. */
static int compile(json_t *schema, const struct gr_opts *o, struct gr_grammar **out,
                   struct shardlm_err *e)
{
    struct gr_grammar *g;
    int rc = gr_grammar_new(o, "json_schema", &g, e);
    if (rc)
        return rc;
    struct gr_json *c = NULL;
    if ((rc = gr_json_new(g, o, &c, e)))
        goto out;
    int v = schema ? gr_json_value(c, schema, schema) : -1;
    if (!schema) { /* json_object: any object */
        json_t *obj = keep(c, json_pack("{s:s}", "type", "object"));
        v = obj ? gr_json_value(c, obj, obj) : -ENOMEM;
    }
    if (v < 0) {
        rc = v;
        goto out;
    }
    int top = nt_new(c);
    if (top < 0 ||
        (c->ws && ((rc = rule(c, top, 2, c->lx_lead, ~v)) ||
                   (rc = rule(c, top, 3, c->lx_lead, ~v, c->lx_lead)) ||
                   (rc = rule(c, top, 2, ~v, c->lx_lead)))) ||
        (rc = rule(c, top, 1, ~v))) {
        rc = top < 0 ? top : rc;
        goto out;
    }
    rc = gr_finish(g, top);
    if (rc == -ENOENT)
        rc = sc_fail(c, "schema", "no instance matches it");
    else if (rc)
        rc = sc_rc(c, rc);
out:
    if (rc && (rc == -ENOMEM || rc == -E2BIG))
        gr_fail_code(e, rc, "json_schema");
    gr_json_free(c);
    if (rc) {
        gr_grammar_free(g);
        return rc;
    }
    *out = g;
    return 0;
}

int gr_compile_json_schema(const char *schema, size_t len, const struct gr_opts *o,
                           struct gr_grammar **out, struct shardlm_err *e)
{
    json_error_t je;
    json_t *s = json_loadb(schema, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    if (!s && strstr(je.text, "too big integer")) /* past int64: numbers, as JSON has them */
        s = json_loadb(schema, len, JSON_DECODE_ANY | JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL,
                       &je);
    if (!s) {
        char shown[200];
        coord_escape(shown, sizeof(shown), je.text, strlen(je.text));
        return shardlm_fail(e, -EINVAL, "json_schema: not JSON (line %d: %s)", je.line, shown);
    }
    if (!json_is_object(s) && !json_is_boolean(s)) {
        json_decref(s);
        return shardlm_fail(e, -EINVAL, "json_schema: a schema is an object or a boolean");
    }
    int rc = compile(s, o, out, e);
    json_decref(s);
    return rc;
}

int gr_compile_json_object(const struct gr_opts *o, struct gr_grammar **out, struct shardlm_err *e)
{
    return compile(NULL, o, out, e);
}
