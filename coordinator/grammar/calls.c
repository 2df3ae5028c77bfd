/* SPDX-License-Identifier: MIT */
/* coordinator/grammar/calls.c: tool calls as a grammar - the model's call syntax (literal
 * markers, control tokens among them) around a choice of its tools, each call's arguments
 * valid against that tool's JSON Schema (schema.c compiles them inside this grammar).
 *
 *   top   -> begin calls end                  (inside the options' frame: reasoning first)
 *   calls -> call | calls sep call            (one call unless parallel)
 *   call  -> pre NAME mid ARGS post           (a choice over the tools)
 *          | pre {"name": NAME, "arguments": ARGS} post   (name_key: one JSON object)
 *
 * Qwen3-Coder's XML arguments (syn->xml): ARGS is, for each property of the tool's schema in
 * its order (required ones present, optional ones may be left out),
 * <parameter=KEY>\nVALUE\n</parameter>\n - a plain string's VALUE raw text (without the closing
 * tag), any other value as JSON. Raw text and its closing tag are one lexeme, so greedy lexing
 * ends the text exactly at the first closing tag. */
#include "gr_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XML_CLOSE "\n</parameter>\n"

struct calls {
    struct gr_grammar *g;
    struct gr_json *js;
    struct gr_rebuild b;
    struct shardlm_err *e;
};

static int fail_rc(struct calls *c, int rc) { return gr_fail_code(c->e, rc, "tool calls"); }

/* A symbol sequence builder: up to 8 symbols, empty literals left out. */
struct seq {
    int32_t sym[8];
    int n;
};

/* The lexeme of @r (NULL: the builder failed, its error set). Returns its id or -errno. */
static int lexeme(struct calls *c, const struct gr_re *r)
{
    if (!r)
        return -EINVAL;
    int lx = gr_lexer_add(&c->g->lex, r);
    return lx < 0 ? fail_rc(c, lx) : lx;
}

/* Appends to @q the lexeme of the literal bytes @s (NULL or "": nothing). Returns 0 or -errno. */
static int add_lit(struct calls *c, struct seq *q, const char *s)
{
    if (!s || !*s)
        return 0;
    int lx = lexeme(c, gr_re_lit(&c->b, GR_ENC_BYTE, s, strlen(s)));
    if (lx < 0)
        return lx;
    q->sym[q->n++] = lx;
    return 0;
}

/* Whether @s is a string schema Qwen3-Coder writes raw: {"type": "string"} with nothing
 * but annotations beside it. */
static bool raw_string(json_t *s)
{
    if (!json_is_object(s) || !json_is_string(json_object_get(s, "type")) ||
        strcmp(json_string_value(json_object_get(s, "type")), "string"))
        return false;
    const char *k;
    json_t *v;
    json_object_foreach(s, k, v)
    {
        if (strcmp(k, "type") && strcmp(k, "description") && strcmp(k, "title") &&
            strcmp(k, "default") && strcmp(k, "examples"))
            return false;
    }
    return true;
}

/* The strings of @s's enum when it is one of strings only (of a string or untyped schema),
 * written raw in XML like a plain string; NULL otherwise. */
static json_t *string_enum(json_t *s)
{
    json_t *en = json_object_get(s, "enum"), *ty = json_object_get(s, "type"), *v;
    if (!json_is_array(en) || !json_array_size(en) ||
        (ty && (!json_is_string(ty) || strcmp(json_string_value(ty), "string"))))
        return NULL;
    size_t i;
    json_array_foreach(en, i, v) if (!json_is_string(v)) return NULL;
    return en;
}

/* The nonterminal of one argument in XML: <parameter=KEY>\nVALUE\n</parameter>\n. */
static int xml_param(struct calls *c, const char *key, json_t *ps, json_t *root)
{
    int nt = gr_cfg_nt(&c->g->cfg);
    if (nt < 0)
        return fail_rc(c, nt);
    char open[300];
    if (snprintf(open, sizeof(open), "<parameter=%s>\n", key) >= (int)sizeof(open))
        return shardlm_fail(c->e, -EINVAL, "tool calls: a parameter name of over 280 bytes");
    struct seq q = {0};
    int rc = add_lit(c, &q, open);
    if (rc)
        return rc;
    json_t *en = string_enum(ps);
    if (en) { /* one of the strings, raw, and the closing tag */
        struct gr_re *alt = gr_re_new(&c->b, GR_RE_ALT);
        size_t i;
        json_t *v;
        json_array_foreach(
            en, i, v) if (alt && gr_re_add(&c->b, alt,
                                           gr_re_lit(&c->b, GR_ENC_UTF8, json_string_value(v),
                                                     json_string_length(v)))) alt = NULL;
        int lx = lexeme(
            c, gr_re_cat(&c->b, alt, gr_re_lit(&c->b, GR_ENC_BYTE, XML_CLOSE, strlen(XML_CLOSE))));
        if (lx < 0)
            return lx;
        q.sym[q.n++] = lx;
    } else if (raw_string(ps)) {
        int lx = lexeme(c, gr_re_until(&c->b, XML_CLOSE));
        if (lx < 0)
            return lx;
        q.sym[q.n++] = lx;
    } else {
        int v = gr_json_value(c->js, ps, root);
        if (v < 0)
            return v;
        q.sym[q.n++] = ~v;
        if ((rc = add_lit(c, &q, XML_CLOSE)))
            return rc;
    }
    rc = gr_cfg_rule(&c->g->cfg, nt, q.sym, q.n);
    return rc ? fail_rc(c, rc) : nt;
}

/* The nonterminal of a tool's XML arguments: its properties in order, the optional ones
 * nullable. */
static int xml_args(struct calls *c, json_t *params)
{
    json_t *props = json_object_get(params, "properties"),
           *req = json_object_get(params, "required");
    if (props && !json_is_object(props))
        return shardlm_fail(c->e, -EINVAL, "tool calls: \"properties\" is not an object");
    int next = gr_cfg_nt(&c->g->cfg); /* the empty rest */
    if (next < 0)
        return fail_rc(c, next);
    int rc = gr_cfg_rule(&c->g->cfg, next, NULL, 0);
    if (rc)
        return fail_rc(c, rc);
    /* built back to front: A_i -> P_i A_i+1 (| A_i+1 when optional) */
    size_t n = props ? json_object_size(props) : 0;
    const char **keys = calloc(n + 1, sizeof(*keys));
    if (!keys)
        return fail_rc(c, -ENOMEM);
    size_t i = 0;
    const char *k;
    json_t *v;
    json_object_foreach(props, k, v) keys[i++] = k;
    for (size_t j = n; j-- > 0 && !rc;) {
        bool required = false;
        size_t ri;
        json_t *rv;
        json_array_foreach(req, ri, rv) required |=
            json_is_string(rv) && !strcmp(json_string_value(rv), keys[j]);
        int p = xml_param(c, keys[j], json_object_get(props, keys[j]), params);
        if (p < 0) {
            rc = p;
            break;
        }
        int a = gr_cfg_nt(&c->g->cfg);
        if (a < 0) {
            rc = fail_rc(c, a);
            break;
        }
        int32_t sym[2] = {~p, ~next};
        rc = gr_cfg_rule(&c->g->cfg, a, sym, 2);
        if (!rc && !required)
            rc = gr_cfg_rule(&c->g->cfg, a, &sym[1], 1);
        if (rc)
            rc = fail_rc(c, rc);
        next = a;
    }
    free(keys);
    return rc ? rc : next;
}

/* The nonterminal of one call of tool @i. */
static int call_rule(struct calls *c, const struct gr_tools *t, int i, int nt)
{
    const struct gr_call_syntax *syn = t->syn;
    json_t *params = t->params[i];
    if (!params)
        params = gr_json_keep(c->js, json_pack("{s:s}", "type", "object"));
    if (!params)
        return fail_rc(c, -ENOMEM);
    struct seq q = {0};
    int rc, v;
    if (syn->name_key) { /* pre, then one JSON object: the name, then the arguments */
        json_t *call = gr_json_keep(
            c->js, json_pack("{s:s,s:{s:{s:s},s:O},s:[s,s],s:b}", "type", "object", "properties",
                             syn->name_key, "const", t->names[i], syn->args_key, params, "required",
                             syn->name_key, syn->args_key, "additionalProperties", 0));
        if ((rc = add_lit(c, &q, syn->pre)))
            return rc;
        v = call ? gr_json_value(c->js, call, params) : fail_rc(c, -ENOMEM);
    } else { /* pre, the name and mid: one literal; then the arguments */
        const char *pre = syn->pre ? syn->pre : "", *mid = syn->mid ? syn->mid : "";
        size_t n = strlen(pre) + strlen(t->names[i]) + strlen(mid) + 1;
        char *head = malloc(n);
        if (!head)
            return fail_rc(c, -ENOMEM);
        snprintf(head, n, "%s%s%s", pre, t->names[i], mid);
        rc = add_lit(c, &q, head);
        free(head);
        if (rc)
            return rc;
        v = syn->xml ? xml_args(c, params) : gr_json_value(c->js, params, params);
    }
    if (v < 0)
        return v;
    q.sym[q.n++] = ~v;
    if ((rc = add_lit(c, &q, syn->post)))
        return rc;
    rc = gr_cfg_rule(&c->g->cfg, nt, q.sym, q.n);
    return rc ? fail_rc(c, rc) : 0;
}

/* The rules of @t's calls. Returns the start symbol, or -errno. */
static int build(struct calls *c, const struct gr_tools *t)
{
    const struct gr_call_syntax *syn = t->syn;
    int call = gr_cfg_nt(&c->g->cfg), list = gr_cfg_nt(&c->g->cfg), top = gr_cfg_nt(&c->g->cfg);
    if (call < 0 || list < 0 || top < 0)
        return fail_rc(c, -ENOMEM);
    for (int i = 0; i < t->n; i++) {
        if (!t->names[i] || !*t->names[i])
            return shardlm_fail(c->e, -EINVAL, "tool calls: a tool without a name");
        int rc = call_rule(c, t, i, call);
        if (rc)
            return rc;
    }
    /* calls -> call | calls sep call */
    int32_t one = ~call;
    int rc = gr_cfg_rule(&c->g->cfg, list, &one, 1);
    if (!rc && t->parallel) {
        struct seq q = {.sym = {~list}, .n = 1};
        if ((rc = add_lit(c, &q, syn->sep)))
            return rc;
        q.sym[q.n++] = ~call;
        rc = gr_cfg_rule(&c->g->cfg, list, q.sym, q.n);
    }
    if (rc)
        return fail_rc(c, rc);
    struct seq q = {0};
    if ((rc = add_lit(c, &q, syn->begin)))
        return rc;
    q.sym[q.n++] = ~list;
    if ((rc = add_lit(c, &q, syn->end)))
        return rc;
    if ((rc = gr_cfg_rule(&c->g->cfg, top, q.sym, q.n)))
        return fail_rc(c, rc);
    return top;
}

int gr_compile_tool_calls(const struct gr_tools *t, const struct gr_opts *o,
                          struct gr_grammar **out, struct shardlm_err *e)
{
    if (t->n <= 0)
        return shardlm_fail(e, -EINVAL, "tool calls: no tools to call");
    struct calls c = {.e = e, .b = {.max_nodes = 2000000, .e = e}};
    int rc = gr_grammar_new(o, "tool calls", &c.g, e);
    if (rc)
        return rc;
    int start = -EINVAL;
    if (!(rc = gr_json_new(c.g, o, &c.js, e)) && (rc = start = build(&c, t)) >= 0) {
        rc = gr_finish(c.g, start);
        if (rc == -ENOENT)
            rc = shardlm_fail(e, -EINVAL, "tool calls: no call of these tools is valid");
        else if (rc)
            rc = fail_rc(&c, rc);
    }
    gr_json_free(c.js);
    gr_rebuild_free(&c.b);
    if (rc) {
        gr_grammar_free(c.g);
        return rc;
    }
    *out = c.g;
    return 0;
}
