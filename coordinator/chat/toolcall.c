/* SPDX-License-Identifier: MIT */
/* coordinator/chat/toolcall.c: model families' tool-call and reasoning formats, and the parser
 * that splits an answer into reasoning, content and calls.
 *
 * The parser reads what a model may write without a grammar too (tool_choice auto): literal
 * markers match with any whitespace where the marker has some, a call's JSON is scanned as
 * JSON, not matched byte by byte. A partial parse (a stream) holds back the bytes that may still
 * become a marker, so each field only grows. */
#include "toolcall.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ---- the families ---- */

/* Hermes' (Qwen's) calls: <tool_call>\n{"name": ..., "arguments": ...}\n</tool_call> */
#define HERMES                                                                                     \
    .kind = COORD_CALLS_JSON,                                                                      \
    .syn = {.pre = "<tool_call>\n",                                                                \
            .post = "\n</tool_call>",                                                              \
            .sep = "\n",                                                                           \
            .name_key = "name",                                                                    \
            .args_key = "arguments"},                                                              \
    .parallel = true, .trigger = "<tool_call>"

/* In the order a template is tried: the first whose markers it holds is its family. */
static const struct coord_tool_format formats[] = {
    {.name = "gpt-oss",
     .marker = "<|channel|>",
     .kind = COORD_CALLS_HARMONY,
     .syn = {.pre = "<|channel|>commentary to=functions.", .mid = " <|constrain|>json<|message|>"},
     .trigger = "<|channel|>commentary to=functions.",
     .think_open = "<|channel|>analysis<|message|>",
     .think_close = "<|end|><|start|>assistant",
     .lead = "<|channel|>final<|message|>"},
    {.name = "qwen3-coder",
     .marker = "<parameter=",
     .kind = COORD_CALLS_XML,
     .syn = {.pre = "<tool_call>\n<function=",
             .mid = ">\n",
             .post = "</function>\n</tool_call>",
             .sep = "\n",
             .xml = true},
     .parallel = true,
     .trigger = "<tool_call>",
     .think_open = "<think>",
     .think_close = "</think>"},
    {.name = "hermes",
     .marker = "<tool_call>",
     HERMES,
     .think_open = "<think>",
     .think_close = "</think>"},
    {.name = "mistral",
     .marker = "[TOOL_CALLS]",
     .kind = COORD_CALLS_JSON,
     .syn = {.begin = "[TOOL_CALLS][",
             .end = "]",
             .sep = ", ",
             .name_key = "name",
             .args_key = "arguments"},
     .parallel = true,
     .trigger = "[TOOL_CALLS]"},
    {.name = "deepseek",
     .marker = "tool▁calls▁begin", /* (its markers' bars and spaces: U+FF5C, U+2581) */
     .kind = COORD_CALLS_NAMED,
     .syn = {.begin = "<｜tool▁calls▁begin｜>",
             .end = "<｜tool▁calls▁end｜>",
             .pre = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>",
             .mid = "\n```json\n",
             .post = "\n```<｜tool▁call▁end｜>",
             .sep = "\n"},
     .parallel = true,
     .trigger = "<｜tool▁calls▁begin｜>",
     .think_open = "<think>",
     .think_close = "</think>"},
    {.name = "granite",
     .marker = "<|tool_call|>",
     .kind = COORD_CALLS_JSON,
     .syn = {.begin = "<|tool_call|>[",
             .end = "]",
             .sep = ", ",
             .name_key = "name",
             .args_key = "arguments"},
     .parallel = true,
     .trigger = "<|tool_call|>",
     .think_open = "<think>",
     .think_close = "</think>"},
    {.name = "llama3",
     .marker = "<|start_header_id|>",
     .also = "\"parameters\"",
     .kind = COORD_CALLS_JSON,
     .syn = {.name_key = "name", .args_key = "parameters"},
     .trigger = "{",
     .at_start = true},
};

static const struct coord_tool_format generic = {.name = "generic (hermes)", HERMES};

const struct coord_tool_format *coord_tool_format_of(const char *tmpl)
{
    for (size_t i = 0; tmpl && i < sizeof(formats) / sizeof(*formats); i++)
        if (strstr(tmpl, formats[i].marker) && (!formats[i].also || strstr(tmpl, formats[i].also)))
            return &formats[i];
    return &generic;
}

/* ---- scanning ---- */

enum scan { SCAN_OK, SCAN_PARTIAL, SCAN_BAD };

static bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

static size_t skip_ws(const char *t, size_t n, size_t i)
{
    while (i < n && is_ws(t[i]))
        i++;
    return i;
}

/* Matches the literal @lit at @t[*i]: whitespace in it matches any run of whitespace (none
 * too). OK with *i past it; PARTIAL when the text ends inside it; else BAD. */
static enum scan match_lit(const char *t, size_t n, size_t *i, const char *lit)
{
    size_t k = *i;
    for (const char *l = lit ? lit : ""; *l;) {
        if (is_ws(*l)) {
            while (is_ws(*l))
                l++;
            k = skip_ws(t, n, k);
            continue;
        }
        if (k == n)
            return SCAN_PARTIAL;
        if (t[k] != *l)
            return SCAN_BAD;
        k++;
        l++;
    }
    *i = k;
    return SCAN_OK;
}

/* Scans one JSON value from @t[*i] (whitespace before it skipped): OK with *i past it;
 * PARTIAL when the text ends inside it (a number or literal at the very end counts as partial
 * when @partial, since it may go on); BAD when it is not JSON. */
static enum scan scan_json(const char *t, size_t n, size_t *i, bool partial)
{
    size_t k = skip_ws(t, n, *i);
    int depth = 0;
    if (k == n)
        return SCAN_PARTIAL;
    for (;;) {
        if (k == n)
            return SCAN_PARTIAL;
        char c = t[k];
        if (c == '"') {
            for (k++;; k++) {
                if (k >= n)
                    return SCAN_PARTIAL;
                if (t[k] == '\\')
                    k++;
                else if (t[k] == '"')
                    break;
                else if ((unsigned char)t[k] < 0x20)
                    return SCAN_BAD;
            }
            k++;
        } else if (c == '{' || c == '[') {
            depth++;
            k++;
        } else if (c == '}' || c == ']') {
            if (!depth)
                return SCAN_BAD;
            depth--;
            k++;
        } else if (c == ',' || c == ':' || is_ws(c)) {
            if (!depth)
                return SCAN_BAD;
            k++;
        } else if (c == '-' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z')) {
            while (k < n &&
                   (t[k] == '-' || t[k] == '+' || t[k] == '.' || (t[k] >= '0' && t[k] <= '9') ||
                    (t[k] >= 'a' && t[k] <= 'z') || t[k] == 'E'))
                k++;
            if (k == n && (partial || depth))
                return SCAN_PARTIAL;
        } else
            return SCAN_BAD;
        if (!depth) {
            /* a whole value: check it is JSON (the scan above is lenient on literals) */
            size_t from = skip_ws(t, n, *i);
            json_t *j = json_loadb(t + from, k - from, JSON_DECODE_ANY, NULL);
            if (!j)
                return SCAN_BAD;
            json_decref(j);
            *i = k;
            return SCAN_OK;
        }
    }
}

/* The longest end of @t[from..n) that begins @lit (bytes a stream holds back). */
static size_t held(const char *t, size_t from, size_t n, const char *lit)
{
    size_t l = lit ? strlen(lit) : 0;
    for (size_t k = l ? l - 1 : 0; k > 0; k--)
        if (k <= n - from && !memcmp(t + n - k, lit, k))
            return k;
    return 0;
}

static const char *find(const char *t, size_t from, size_t n, const char *lit)
{
    return from <= n ? memmem(t + from, n - from, lit, strlen(lit)) : NULL;
}

/* ---- the reply ---- */

static int put(char **s, size_t *len, const char *t, size_t n)
{
    if (!n)
        return 0;
    char *p = realloc(*s, *len + n + 1);
    if (!p)
        return -ENOMEM;
    memcpy(p + *len, t, n);
    p[*len + n] = 0;
    *s = p;
    *len += n;
    return 0;
}

static int add_call(struct coord_reply *r, const char *name, size_t name_len, const char *args,
                    size_t args_len, bool done)
{
    struct coord_call *c = realloc(r->calls, (size_t)(r->n_calls + 1) * sizeof(*c));
    if (!c)
        return -ENOMEM;
    r->calls = c;
    c = &r->calls[r->n_calls];
    *c = (struct coord_call){.name = strndup(name, name_len), .done = done};
    c->args = malloc(args_len + 1);
    if (!c->name || !c->args) {
        free(c->name);
        free(c->args);
        return -ENOMEM;
    }
    memcpy(c->args, args, args_len);
    c->args[args_len] = 0;
    c->args_len = args_len;
    r->n_calls++;
    return 0;
}

static bool declared(json_t *tools, const char *name, size_t len, json_t **params)
{
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t)
    {
        json_t *nm = json_object_get(json_object_get(t, "function"), "name");
        if (json_is_string(nm) && json_string_length(nm) == len &&
            !memcmp(json_string_value(nm), name, len)) {
            if (params)
                *params = json_object_get(json_object_get(t, "function"), "parameters");
            return true;
        }
    }
    return false;
}

/* One call of a JSON kind from @t[*i]: the object {"name": ..., args: ...}. OK with the call
 * added; PARTIAL with what is known added (done false); BAD. */
static enum scan json_call(const struct coord_tool_format *f, const char *t, size_t n, size_t *i,
                           json_t *tools, bool partial, struct coord_reply *r)
{
    size_t k = skip_ws(t, n, *i);
    if (k == n)
        return SCAN_PARTIAL;
    if (t[k] != '{')
        return SCAN_BAD;
    k++;
    char *name = NULL;
    size_t a0 = 0, a1 = 0;
    bool have_args = false;
    enum scan st = SCAN_OK;
    for (bool first = true;; first = false) {
        k = skip_ws(t, n, k);
        if (k < n && t[k] == '}' && first) {
            k++;
            break;
        }
        size_t k0 = k;
        if ((st = scan_json(t, n, &k, partial)) != SCAN_OK)
            break;
        json_t *key = json_loadb(t + k0, k - k0, JSON_DECODE_ANY, NULL);
        bool is_name = json_is_string(key) && !strcmp(json_string_value(key), f->syn.name_key);
        bool is_args = json_is_string(key) && (!strcmp(json_string_value(key), "arguments") ||
                                               !strcmp(json_string_value(key), "parameters"));
        bool is_str = json_is_string(key);
        json_decref(key);
        if (!is_str) {
            st = SCAN_BAD;
            break;
        }
        k = skip_ws(t, n, k);
        if ((st = match_lit(t, n, &k, ":")) != SCAN_OK)
            break;
        size_t v0 = skip_ws(t, n, k);
        k = v0;
        st = scan_json(t, n, &k, partial);
        if (is_args && st != SCAN_BAD) {
            a0 = v0;
            a1 = st == SCAN_OK ? k : n;
            have_args = true;
        }
        if (st != SCAN_OK)
            break;
        if (is_name) {
            json_t *v = json_loadb(t + v0, k - v0, JSON_DECODE_ANY, NULL);
            free(name);
            name = json_is_string(v) ? strdup(json_string_value(v)) : NULL;
            json_decref(v);
            if (!name) {
                st = SCAN_BAD;
                break;
            }
        }
        k = skip_ws(t, n, k);
        if (k == n) {
            st = SCAN_PARTIAL;
            break;
        }
        if (t[k] == '}') {
            k++;
            break;
        }
        if (t[k] != ',') {
            st = SCAN_BAD;
            break;
        }
        k++;
    }
    if (st == SCAN_OK && (!name || !have_args || !declared(tools, name, strlen(name), NULL)))
        st = SCAN_BAD;
    if (st == SCAN_PARTIAL && name && !declared(tools, name, strlen(name), NULL))
        st = SCAN_BAD;
    int rc = 0;
    if (st != SCAN_BAD && name) /* a partial call: its arguments only when they started */
        rc = add_call(r, name, strlen(name), t + a0, have_args ? a1 - a0 : 0, st == SCAN_OK);
    free(name);
    if (rc)
        return SCAN_BAD;
    if (st == SCAN_OK)
        *i = k;
    return st;
}

static bool name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-' || c == '.';
}

/* Qwen3-Coder's arguments, from @t[*i] to </function>: an object built parameter by
 * parameter (a value is JSON where it parses and the schema does not call it a string). */
static enum scan xml_args(const char *t, size_t n, size_t *i, json_t *params, json_t **out)
{
    json_t *o = json_object();
    size_t k = *i;
    for (;;) {
        k = skip_ws(t, n, k);
        size_t save = k;
        enum scan st = match_lit(t, n, &k, "<parameter=");
        if (st == SCAN_BAD) {
            k = save;
            break;
        }
        const char *gt = st == SCAN_OK ? memchr(t + k, '>', n - k) : NULL;
        const char *close = gt ? find(t, (size_t)(gt - t), n, "</parameter>") : NULL;
        if (!close) {
            json_decref(o);
            return SCAN_PARTIAL;
        }
        char *key = strndup(t + k, (size_t)(gt - t) - k);
        size_t v0 = (size_t)(gt - t) + 1, v1 = (size_t)(close - t);
        if (v0 < v1 && t[v0] == '\n')
            v0++;
        if (v1 > v0 && t[v1 - 1] == '\n')
            v1--;
        json_t *ps = json_object_get(json_object_get(params, "properties"), key ? key : "");
        json_t *ty = json_object_get(ps, "type");
        bool str = json_is_string(ty) && !strcmp(json_string_value(ty), "string");
        json_t *v = str ? NULL : json_loadb(t + v0, v1 - v0, JSON_DECODE_ANY, NULL);
        if (!v)
            v = json_stringn(t + v0, v1 - v0);
        if (!key || !v || json_object_set_new(o, key, v)) {
            free(key);
            json_decref(o);
            return SCAN_BAD;
        }
        free(key);
        k = v1;
        if (match_lit(t, n, &k, "\n</parameter>") != SCAN_OK) {
            json_decref(o);
            return SCAN_BAD;
        }
    }
    *i = k;
    *out = o;
    return SCAN_OK;
}

/* One call of a named kind (pre NAME mid ARGS post, or XML) from @t[*i] (pre matched). */
static enum scan named_call(const struct coord_tool_format *f, const char *t, size_t n, size_t *i,
                            json_t *tools, bool partial, struct coord_reply *r)
{
    size_t k = *i, n0 = k;
    while (k < n && name_char(t[k]))
        k++;
    if (k == n)
        return SCAN_PARTIAL;
    size_t n1 = k;
    json_t *params = NULL;
    if (n1 == n0 || !declared(tools, t + n0, n1 - n0, &params))
        return SCAN_BAD;
    enum scan st = match_lit(t, n, &k, f->syn.mid);
    if (st != SCAN_OK)
        return st;
    if (f->kind == COORD_CALLS_XML) {
        json_t *o = NULL;
        if ((st = xml_args(t, n, &k, params, &o)) != SCAN_OK)
            return st == SCAN_PARTIAL && add_call(r, t + n0, n1 - n0, "", 0, false) ? SCAN_BAD : st;
        char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
        json_decref(o);
        int rc = s ? add_call(r, t + n0, n1 - n0, s, strlen(s), true) : -ENOMEM;
        free(s);
        if (rc)
            return SCAN_BAD;
    } else {
        size_t a0 = skip_ws(t, n, k);
        k = a0;
        st = scan_json(t, n, &k, partial);
        if (st == SCAN_BAD ||
            add_call(r, t + n0, n1 - n0, t + a0, (st == SCAN_OK ? k : n) - a0, st == SCAN_OK))
            return SCAN_BAD;
        if (st != SCAN_OK)
            return st;
    }
    *i = k;
    return SCAN_OK;
}

/* The calls from @t[*i] (where the trigger was found). OK: *i past the last call and the end
 * marker; PARTIAL: the text ends inside, *i where the unfinished part begins; BAD: *i at the
 * call that is malformed (the calls before it kept). */
static enum scan calls(const struct coord_tool_format *f, const char *t, size_t n, size_t *i,
                       json_t *tools, bool partial, struct coord_reply *r)
{
    size_t k = *i;
    enum scan st = match_lit(t, n, &k, f->syn.begin);
    if (st != SCAN_OK)
        return st;
    for (int c = 0;; c++) {
        size_t at = k;
        if (c) { /* the separator and the next call, or the end */
            size_t s = k;
            enum scan e = match_lit(t, n, &s, f->syn.sep);
            size_t p = s;
            enum scan q = e == SCAN_OK ? match_lit(t, n, &p, f->syn.pre ? f->syn.pre : "{") : e;
            if (q == SCAN_PARTIAL) { /* the text ends where the next call may begin */
                *i = at;
                return SCAN_PARTIAL;
            }
            if (q != SCAN_OK) {
                enum scan en = match_lit(t, n, &k, f->syn.end);
                if (en == SCAN_OK || en == SCAN_PARTIAL) {
                    *i = k;
                    return en;
                }
                *i = at; /* no end marker: the calls end here, the rest is text */
                return f->syn.end && *f->syn.end ? SCAN_BAD : SCAN_OK;
            }
            k = s;
        }
        int before = r->n_calls;
        enum scan cs;
        if (f->kind == COORD_CALLS_JSON) {
            if ((cs = match_lit(t, n, &k, f->syn.pre)) == SCAN_OK)
                cs = json_call(f, t, n, &k, tools, partial, r);
        } else if ((cs = match_lit(t, n, &k, f->syn.pre)) == SCAN_OK)
            cs = named_call(f, t, n, &k, tools, partial, r);
        if (cs == SCAN_OK)
            cs = match_lit(t, n, &k, f->syn.post);
        if (cs == SCAN_BAD) {
            while (r->n_calls > before) { /* the malformed call is text */
                r->n_calls--;
                free(r->calls[r->n_calls].name);
                free(r->calls[r->n_calls].args);
            }
            *i = at;
            return SCAN_BAD;
        }
        if (cs == SCAN_PARTIAL) {
            *i = at;
            return SCAN_PARTIAL;
        }
        if (!f->parallel && (!f->syn.end || !*f->syn.end)) {
            *i = k;
            return SCAN_OK;
        }
    }
}

/* gpt-oss' channels: <|channel|>NAME[ to=functions.F][ <|constrain|>json]<|message|>BODY and
 * <|end|> (then <|start|>assistant[ to=functions.F]), the end of the text at <|call|> or
 * <|return|>. analysis is reasoning, a message to functions.F a call, the rest content. */
static int harmony(const char *t, size_t n, json_t *tools, bool think, bool partial,
                   struct coord_reply *r)
{
    size_t k = 0;
    char to[128] = "";
    while (k < n) {
        size_t save = k;
        enum scan ss = match_lit(t, n, &k, "<|start|>");
        if (ss == SCAN_PARTIAL && partial)
            return 0;
        /* a header: after <|start|>, or at the very beginning the rest of the prompt's
         * "<|start|>assistant" ( to=functions.F before the channel) */
        size_t h = skip_ws(t, n, k);
        bool rest = k == 0 && ss == SCAN_BAD && n - h >= 3 && !memcmp(t + h, "to=", 3);
        if (k == 0 && ss == SCAN_BAD && partial && n - h < 3 && !memcmp(t + h, "to=", n - h))
            return 0;
        if (ss == SCAN_OK || rest) {
            const char *ch = find(t, k, n, "<|channel|>");
            if (!ch)
                return partial ? 0 : put(&r->content, &r->content_len, t + save, n - save);
            const char *f = find(t, k, (size_t)(ch - t), "to=functions.");
            size_t a = f ? (size_t)(f - t) + 13 : 0, b = a;
            while (f && b < (size_t)(ch - t) && name_char(t[b]))
                b++;
            snprintf(to, sizeof(to), "%.*s", (int)(b - a), t + a);
            k = (size_t)(ch - t);
        }
        enum scan st = match_lit(t, n, &k, "<|channel|>");
        if (st == SCAN_PARTIAL && partial)
            return 0;
        if (st != SCAN_OK) { /* no channels: text */
            size_t e = n - (partial ? held(t, save, n, "<|channel|>") : 0);
            return put(&r->content, &r->content_len, t + save, e - save);
        }
        const char *msg = find(t, k, n, "<|message|>");
        if (!msg)
            return 0;
        size_t h0 = k, h1 = (size_t)(msg - t);
        const char *fn = find(t, h0, h1, "to=functions.");
        if (fn) {
            size_t a = (size_t)(fn - t) + 13, b = a;
            while (b < h1 && name_char(t[b]))
                b++;
            snprintf(to, sizeof(to), "%.*s", (int)(b - a), t + a);
        }
        bool analysis = h1 - h0 >= 8 && !memcmp(t + h0, "analysis", 8);
        size_t b0 = h1 + 11;
        const char *end = find(t, b0, n, "<|end|>");
        size_t b1 = end ? (size_t)(end - t) : n;
        if (!end && partial) /* (the markers come whole as tokens; spelled out, they may not) */
            b1 -= held(t, b0, n, "<|end|>");
        int rc = 0;
        if (*to && tools && declared(tools, to, strlen(to), NULL)) {
            size_t a = skip_ws(t, n, b0), z = a;
            enum scan js = scan_json(t, b1, &z, partial && !end);
            if (js == SCAN_BAD)
                rc = put(&r->content, &r->content_len, t + b0, b1 - b0);
            else
                rc =
                    add_call(r, to, strlen(to), t + a, (js == SCAN_OK ? z : b1) - a, js == SCAN_OK);
        } else if (analysis && think)
            rc = put(&r->reasoning, &r->reasoning_len, t + b0, b1 - b0);
        else
            rc = put(&r->content, &r->content_len, t + b0, b1 - b0);
        if (rc || !end)
            return rc;
        k = b1 + 7;
        to[0] = 0;
    }
    return 0;
}

int coord_reply_parse(const struct coord_tool_format *f, const char *text, size_t n, json_t *tools,
                      bool think, bool in_think, bool partial, struct coord_reply *r)
{
    memset(r, 0, sizeof(*r));
    const char *t = text;
    int rc = 0;
    if (f->kind == COORD_CALLS_HARMONY) {
        if ((rc = harmony(t, n, tools, think, partial, r)))
            coord_reply_free(r);
        return rc;
    }
    size_t pos = 0;
    if (think && f->think_open) {
        size_t k = skip_ws(t, n, 0);
        enum scan st = in_think ? SCAN_OK : match_lit(t, n, &k, f->think_open);
        if (st == SCAN_PARTIAL && partial)
            return 0;
        if (st == SCAN_OK) {
            const char *close = find(t, k, n, f->think_close);
            size_t e =
                close ? (size_t)(close - t) : n - (partial ? held(t, k, n, f->think_close) : 0);
            if ((rc = put(&r->reasoning, &r->reasoning_len, t + k, e - k)))
                goto fail;
            if (!close)
                return 0;
            pos = skip_ws(t, n, e + strlen(f->think_close));
        }
    }
    const char *trig = tools && f->trigger ? find(t, pos, n, f->trigger) : NULL;
    if (trig && f->at_start && trig != t + skip_ws(t, n, pos))
        trig = NULL;
    if (!trig) {
        size_t e = n - (partial && tools && !f->at_start ? held(t, pos, n, f->trigger) : 0);
        if (partial && tools && f->at_start && skip_ws(t, n, pos) == n)
            e = pos; /* (whitespace so far: the call may still begin) */
        rc = put(&r->content, &r->content_len, t + pos, e - pos);
        goto out;
    }
    size_t k = (size_t)(trig - t);
    if ((rc = put(&r->content, &r->content_len, t + pos, k - pos)))
        goto fail;
    int before = r->n_calls;
    enum scan st = calls(f, t, n, &k, tools, partial, r);
    /* the whole text ends in what only might have become a call: it was text */
    bool cut_text =
        st == SCAN_PARTIAL && !partial && (r->n_calls == before || r->calls[r->n_calls - 1].done);
    if (st == SCAN_OK || st == SCAN_BAD ||
        cut_text) { /* what follows the calls, or the malformed one */
        size_t from = st == SCAN_OK ? skip_ws(t, n, k) : k;
        rc = put(&r->content, &r->content_len, t + from, n - from);
    }
out:
    if (!rc)
        return 0;
fail:
    coord_reply_free(r);
    return rc;
}

void coord_reply_free(struct coord_reply *r)
{
    free(r->reasoning);
    free(r->content);
    for (int i = 0; i < r->n_calls; i++) {
        free(r->calls[i].name);
        free(r->calls[i].args);
    }
    free(r->calls);
    memset(r, 0, sizeof(*r));
}
