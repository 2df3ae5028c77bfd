/* SPDX-License-Identifier: MIT */
/* coordinator/server/structured.c: structured outputs and tool calls - a request's grammar
 * compiled on its connection's thread (response_format, llama.cpp's and vLLM's fields, or its
 * tools' calls in the model's own syntax), and its answer split into reasoning_content, content
 * and tool_calls (whole, or as a stream's deltas). */
#include "srv.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- control tokens ---- */

/* Control tokens longest text first (qsort_r's, over the tokenizer @t). */
static int by_length(const void *a, const void *b, void *t)
{
    const struct coord_tok *tok = t;
    uint32_t la = tok->vocab_len[*(const int32_t *)a], lb = tok->vocab_len[*(const int32_t *)b];
    return la < lb ? 1 : la > lb ? -1 : 0;
}

char *srv_spell(const struct srv *s, const char *text, size_t *len)
{
    size_t n = strlen(text), cap = n + 1, o = 0;
    char *out = malloc(cap);
    for (size_t i = 0; out && i < n;) {
        int hit = -1;
        for (int k = 0; k < s->n_controls && hit < 0; k++) {
            int id = s->controls[k];
            size_t l = s->tok.vocab_len[id];
            if (l && l <= n - i && !memcmp(text + i, s->tok.vocab[id], l))
                hit = id;
        }
        size_t add = hit < 0 ? 1 : strlen(GR_SPECIAL) + s->tok.vocab_len[hit];
        if (o + add + 1 > cap) {
            char *g = realloc(out, cap = 2 * (o + add + 1));
            if (!g) {
                free(out);
                return NULL;
            }
            out = g;
        }
        if (hit < 0)
            out[o++] = text[i++];
        else {
            memcpy(out + o, GR_SPECIAL, strlen(GR_SPECIAL));
            memcpy(out + o + strlen(GR_SPECIAL), s->tok.vocab[hit], s->tok.vocab_len[hit]);
            o += add;
            i += s->tok.vocab_len[hit];
        }
    }
    if (out) {
        out[o] = 0;
        if (len)
            *len = o;
    }
    return out;
}

int srv_formats_init(struct srv *s)
{
    const struct coord_tok *t = &s->tok;
    s->fmt = coord_tool_format_of(
        s->chat.jinja ? (s->o->chat_template ? s->o->chat_template : t->chat_template) : NULL);
    int n = 0;
    for (int id = 0; id < t->vocab_size; id++)
        n += (t->attrs[id] & COORD_TOKA_TYPE) == COORD_TOKT_CONTROL && t->vocab_len[id];
    if (n && !(s->controls = malloc((size_t)n * sizeof(int32_t))))
        return -ENOMEM;
    for (int id = 0; id < t->vocab_size; id++)
        if ((t->attrs[id] & COORD_TOKA_TYPE) == COORD_TOKT_CONTROL && t->vocab_len[id])
            s->controls[s->n_controls++] = id;
    if (s->n_controls) /* (a llama2.c vocabulary has none) */
        qsort_r(s->controls, (size_t)s->n_controls, sizeof(int32_t), by_length, (void *)t);
    const struct coord_tool_format *f = s->fmt;
    const char *markers[] = {f->trigger,   f->think_open, f->think_close,
                             f->syn.begin, f->syn.pre,    f->syn.mid};
    for (size_t i = 0; i < sizeof(markers) / sizeof(*markers); i++) {
        if (!markers[i])
            continue;
        char *m = srv_spell(s, markers[i], NULL);
        if (!m)
            return -ENOMEM;
        s->fmt_special |= strcmp(m, markers[i]) != 0;
        free(m);
    }
    return 0;
}

/* ---- a request's grammar ---- */

/* Whether @text ends with @open (trailing whitespace aside): the template opened the
 * reasoning (DeepSeek-R1's and Qwen3's thinking variants do). */
static bool ends_open(const char *text, size_t n, const char *open)
{
    while (n && (text[n - 1] == '\n' || text[n - 1] == ' '))
        n--;
    size_t l = open ? strlen(open) : 0;
    return l && n >= l && !memcmp(text + n - l, open, l);
}

/* The grammar of @p's tool calls (all its tools, or the named one), in the model's syntax
 * spelled for the grammar; reasoning may come first unless @no_think (a lazy grammar, or a
 * prompt that closed the reasoning). */
static int tools_grammar(struct srv *s, struct sreq *p, bool no_think, const struct gr_opts *o,
                         struct shardlm_err *e)
{
    const struct coord_tool_format *f = s->fmt;
    struct coord_completion_req *q = &p->q;
    size_t nt = json_array_size(q->tools), n = 0;
    const char **names = calloc(nt + 1, sizeof(char *));
    json_t **params = calloc(nt + 1, sizeof(json_t *));
    const char *syn_src[] = {f->syn.begin, f->syn.end,  f->syn.sep,    f->syn.pre,
                             f->syn.mid,   f->syn.post, f->think_open, f->think_close};
    char *sp[8] = {0};
    int rc = names && params ? 0 : -ENOMEM;
    for (size_t i = 0; i < 8 && !rc; i++)
        if (syn_src[i] && !(sp[i] = srv_spell(s, syn_src[i], NULL)))
            rc = -ENOMEM;
    size_t i;
    json_t *t;
    json_array_foreach(rc ? NULL : q->tools, i, t)
    {
        json_t *fn = json_object_get(t, "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        if (q->tool_choice == COORD_TOOLS_NAMED && strcmp(name, q->tool_name))
            continue;
        names[n] = name;
        params[n++] = json_is_object(json_object_get(fn, "parameters"))
                          ? json_object_get(fn, "parameters")
                          : NULL;
    }
    if (rc) {
        shardlm_fail(e, rc, "out of memory");
    } else {
        struct gr_call_syntax syn = f->syn;
        syn.begin = sp[0];
        syn.end = sp[1];
        syn.sep = sp[2];
        syn.pre = sp[3];
        syn.mid = sp[4];
        syn.post = sp[5];
        struct gr_opts framed = *o;
        if (!no_think && q->reasoning && sp[6] && sp[7]) {
            framed.think_open = p->in_think ? "" : sp[6];
            framed.think_close = sp[7];
        }
        struct gr_tools gt = {.syn = &syn,
                              .names = names,
                              .params = params,
                              .n = (int)n,
                              .parallel = f->parallel && q->parallel_tool_calls &&
                                          q->tool_choice != COORD_TOOLS_NAMED};
        rc = gr_compile_tool_calls(&gt, &framed, &p->grammar, e);
    }
    for (size_t k = 0; k < 8; k++)
        free(sp[k]);
    free(names);
    free(params);
    return rc;
}

/* @p's grammar from its response_format or guided field. */
static int field_grammar(struct sreq *p, const struct gr_opts *o, struct shardlm_err *e)
{
    struct coord_completion_req *q = &p->q;
    json_t *v = q->gsrc;
    switch (q->gkind) {
    case COORD_REQ_GR_JSON_SCHEMA: {
        char *text = json_dumps(v, JSON_ENCODE_ANY | JSON_PRESERVE_ORDER | JSON_COMPACT);
        int rc = text ? gr_compile_json_schema(text, strlen(text), o, &p->grammar, e)
                      : shardlm_fail(e, -ENOMEM, "out of memory");
        free(text);
        return rc;
    }
    case COORD_REQ_GR_JSON_OBJECT:
        return gr_compile_json_object(o, &p->grammar, e);
    case COORD_REQ_GR_REGEX:
        return gr_compile_regex(json_string_value(v), json_string_length(v), o, &p->grammar, e);
    case COORD_REQ_GR_GBNF:
        return gr_compile_gbnf(json_string_value(v), json_string_length(v), o, &p->grammar, e);
    case COORD_REQ_GR_CHOICE: {
        size_t n = json_array_size(v);
        const char **s = calloc(n, sizeof(char *));
        size_t *l = calloc(n, sizeof(size_t));
        int rc = s && l ? 0 : shardlm_fail(e, -ENOMEM, "out of memory");
        for (size_t i = 0; !rc && i < n; i++) {
            s[i] = json_string_value(json_array_get(v, i));
            l[i] = json_string_length(json_array_get(v, i));
        }
        if (!rc)
            rc = gr_compile_choice(s, l, (int)n, o, &p->grammar, e);
        free(s);
        free(l);
        return rc;
    }
    case COORD_REQ_GR_NONE:
        break;
    }
    return 0;
}

int srv_structure(struct srv *s, struct sreq *p, const char *prompt, size_t prompt_len, char *why,
                  size_t wlen)
{
    struct coord_completion_req *q = &p->q;
    const struct coord_tool_format *f = s->fmt;
    bool tools = q->tools && q->tool_choice != COORD_TOOLS_NONE;
    bool no_think = false; /* the prompt closed the reasoning already (enable_thinking false) */
    if (q->chat && f) {
        p->in_think = q->reasoning && prompt && ends_open(prompt, prompt_len, f->think_open);
        no_think = prompt && ends_open(prompt, prompt_len, f->think_close);
        p->parse = tools || (q->reasoning && f->think_open) || f->lead;
    }
    /* JSON compact or with JSON's usual single spaces (", ", ": "): room for a model's habit,
     * none for whitespace that goes on and on (a sampled model's, at temperature 1) */
    struct gr_opts o = {.max_ws = 1};
    struct shardlm_err e = {{0}};
    int rc = 0;
    const char *field = q->gfield;
    if (q->gkind) {
        /* a chat's answer in the model's frame: its reasoning first, its answer's header */
        struct gr_opts framed = o;
        bool think = q->chat && f && f->think_open && q->reasoning && !no_think;
        bool head = q->chat && f && f->lead;
        char *open = think ? (p->in_think ? strdup("") : srv_spell(s, f->think_open, NULL)) : NULL;
        char *close = think ? srv_spell(s, f->think_close, NULL) : NULL;
        char *lead = head ? srv_spell(s, f->lead, NULL) : NULL;
        framed.think_open = open;
        framed.think_close = close;
        framed.lead = lead;
        rc = (think && (!open || !close)) || (head && !lead) ? -ENOMEM
                                                             : field_grammar(p, &framed, &e);
        free(open);
        free(close);
        free(lead);
    } else if (tools && q->tool_choice >= COORD_TOOLS_REQUIRED) {
        field = "tools";
        rc = tools_grammar(s, p, no_think, &o, &e);
    } else if (tools && f->trigger) { /* auto: a call, once begun, is kept valid */
        field = "tools";
        if (!(rc = tools_grammar(s, p, true, &o, &e)) &&
            !(p->trigger = srv_spell(s, f->trigger, &p->trigger_len)))
            rc = -ENOMEM;
        p->trigger_at_start = f->at_start;
    }
    if (rc == -ENOMEM)
        return rc;
    if (rc) {
        snprintf(why, wlen, "%s: %s", field, e.msg);
        return -EINVAL;
    }
    return 0;
}

/* ---- the answer split ---- */

/* A new call id: "call_" and 24 letters and digits; Mistral's templates want exactly 9. */
static void call_id(const struct srv *s, char *out, size_t len)
{
    static const char abc[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    static uint64_t counter;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED) * 0x9E3779B97F4A7C15ull ^
                 (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 32);
    bool mistral = !strcmp(s->fmt->name, "mistral");
    int n = mistral ? 9 : 24, o = mistral ? 0 : snprintf(out, len, "call_");
    for (int i = 0; i < n && (size_t)(o + 1) < len; i++) {
        x ^= x >> 31;
        x *= 0xBF58476D1CE4E5B9ull;
        x ^= x >> 29;
        out[o++] = abc[x % (sizeof(abc) - 1)];
    }
    out[o] = 0;
}

static json_t *call_json(const struct srv *s, const struct coord_call *c, int index, bool delta)
{
    char id[40];
    call_id(s, id, sizeof(id));
    json_t *o = json_pack("{s:s,s:s,s:{s:s,s:s%}}", "id", id, "type", "function", "function",
                          "name", c->name, "arguments", c->args, c->args_len);
    if (o && delta)
        json_object_set_new(o, "index", json_integer(index));
    return o;
}

static int parse(struct sreq *p, const char *text, size_t n, bool partial, struct coord_reply *r)
{
    const struct coord_completion_req *q = &p->q;
    bool tools = q->tools && q->tool_choice != COORD_TOOLS_NONE;
    return coord_reply_parse(p->s->fmt, text, n, tools ? q->tools : NULL, q->reasoning, p->in_think,
                             partial, r);
}

json_t *srv_split_message(struct sreq *p, const char *text, size_t n, bool *called)
{
    struct coord_reply r;
    if (parse(p, text, n, false, &r))
        return NULL;
    json_t *m = json_pack("{s:s}", "role", "assistant");
    json_t *calls = r.n_calls ? json_array() : NULL;
    for (int i = 0; calls && i < r.n_calls; i++)
        json_array_append_new(calls, call_json(p->s, &r.calls[i], i, false));
    if (m) {
        json_object_set_new(m, "content",
                            r.content_len || !r.n_calls
                                ? srv_text_json(r.content ? r.content : "", r.content_len)
                                : json_null());
        if (r.reasoning_len)
            json_object_set_new(m, "reasoning_content",
                                srv_text_json(r.reasoning, r.reasoning_len));
        if (calls)
            json_object_set_new(m, "tool_calls", calls);
    }
    *called = r.n_calls > 0;
    coord_reply_free(&r);
    return m;
}

bool srv_split_delta(struct sreq *p, const char *text, size_t n, bool final, json_t **delta)
{
    struct srv_split *sp = &p->split;
    *delta = NULL;
    if (sp->len + n + 1 > sp->cap) {
        size_t cap = 2 * (sp->len + n + 1);
        char *g = realloc(sp->raw, cap);
        if (!g)
            return false;
        sp->raw = g;
        sp->cap = cap;
    }
    if (n) /* (an event without text has none) */
        memcpy(sp->raw + sp->len, text, n);
    sp->len += n;
    struct coord_reply r;
    if (parse(p, sp->raw, sp->len, !final, &r))
        return false;
    json_t *d = json_object();
    bool ok = d != NULL;
    /* each field grows (the parser holds back what may become a marker): send what is new */
    if (ok && r.reasoning_len > sp->reasoning) {
        ok = !json_object_set_new(
            d, "reasoning_content",
            srv_text_json(r.reasoning + sp->reasoning, r.reasoning_len - sp->reasoning));
        sp->reasoning = r.reasoning_len;
    }
    if (ok && r.content_len > sp->content) {
        ok = !json_object_set_new(
            d, "content", srv_text_json(r.content + sp->content, r.content_len - sp->content));
        sp->content = r.content_len;
    }
    json_t *calls = NULL;
    for (int i = 0; ok && i < r.n_calls; i++) {
        const struct coord_call *c = &r.calls[i];
        json_t *cj = NULL;
        if (i >= sp->calls) { /* a new call: its id and name, and its arguments so far */
            size_t *g = realloc(sp->args, (size_t)(i + 1) * sizeof(size_t));
            if (!(ok = g != NULL))
                break;
            sp->args = g;
            sp->args[i] = c->args_len;
            sp->calls = i + 1;
            sp->called = true;
            cj = call_json(p->s, c, i, true);
        } else if (c->args_len > sp->args[i]) { /* more of its arguments */
            cj = json_pack("{s:i,s:{s:s%}}", "index", i, "function", "arguments",
                           c->args + sp->args[i], c->args_len - sp->args[i]);
            sp->args[i] = c->args_len;
        } else
            continue;
        ok = cj && (calls || (calls = json_array())) && !json_array_append_new(calls, cj);
    }
    if (ok && calls)
        ok = !json_object_set_new(d, "tool_calls", calls);
    else
        json_decref(calls);
    coord_reply_free(&r);
    if (!ok || !json_object_size(d)) {
        json_decref(d);
        return ok;
    }
    *delta = d;
    return true;
}

void srv_split_free(struct srv_split *sp)
{
    free(sp->raw);
    free(sp->args);
}
