/* SPDX-License-Identifier: MIT */
/* coordinator/server/structured.c: structured outputs and tool calls - a request's grammar
 * compiled on its connection's thread (response_format, llama.cpp's and vLLM's fields, or its
 * tools' calls in the model's own syntax), and its answer split into reasoning_content, content
 * and tool_calls (whole, or as a stream's deltas). */
#include "srv.h"

#include "shlm.h"

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

/* The markers of a format spelled for grammars (srv.spelled's fields): first the N_SHOWN an
 * answer shows (where calls and reasoning begin: fmt_special), then the others. */
enum { N_SHOWN = 6, N_SPELLED = 10 };
static void spelled_fields(struct coord_tool_format *sp, const char **out[N_SPELLED])
{
    const char **f[N_SPELLED] = {&sp->trigger,  &sp->think_open, &sp->think_close, &sp->syn.begin,
                                 &sp->syn.pre,  &sp->syn.mid,    &sp->syn.end,     &sp->syn.sep,
                                 &sp->syn.post, &sp->lead};
    memcpy(out, f, sizeof(f));
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
    /* the markers as grammars spell them: control tokens as themselves */
    struct coord_tool_format *sp = &s->spelled;
    *sp = *s->fmt;
    const char **fields[N_SPELLED];
    spelled_fields(sp, fields);
    const char *plain[N_SPELLED];
    for (size_t i = 0; i < N_SPELLED; i++) {
        plain[i] = *fields[i];
        *fields[i] = NULL; /* (srv_formats_free frees what is not NULL) */
    }
    for (size_t i = 0; i < N_SPELLED; i++) {
        if (!plain[i])
            continue;
        size_t len;
        if (!(*fields[i] = srv_spell(s, plain[i], &len)))
            return -ENOMEM;
        s->fmt_special |= i < N_SHOWN && strcmp(*fields[i], plain[i]) != 0;
        if (fields[i] == &sp->trigger)
            s->trigger_len = len;
    }
    return 0;
}

void srv_formats_free(struct srv *s)
{
    const char **fields[N_SPELLED];
    spelled_fields(&s->spelled, fields);
    for (size_t i = 0; i < N_SPELLED; i++)
        free((char *)*fields[i]);
    memset(&s->spelled, 0, sizeof(s->spelled));
}

/* ---- compiled grammars, kept for the next requests ---- */

/* A grammar's key: what it is compiled from, each part with its length (binary: spelled markers
 * hold 0xFF). */
struct gkey {
    char *b;
    size_t n, cap;
    bool oom;
};

static void gkey_add(struct gkey *k, const void *p, size_t n)
{
    uint64_t len = p ? n : UINT64_MAX; /* (NULL apart from "") */
    if (k->oom)
        return;
    if (k->n + sizeof(len) + (p ? n : 0) > k->cap) {
        size_t cap = 2 * (k->n + sizeof(len) + (p ? n : 0)) + 64;
        char *b = realloc(k->b, cap);
        if (!b) {
            k->oom = true;
            return;
        }
        k->b = b;
        k->cap = cap;
    }
    memcpy(k->b + k->n, &len, sizeof(len));
    k->n += sizeof(len);
    if (p && n) {
        memcpy(k->b + k->n, p, n);
        k->n += n;
    }
}

static void gkey_str(struct gkey *k, const char *s) { gkey_add(k, s, s ? strlen(s) : 0); }

static uint64_t gkey_hash(const struct gkey *k) { return shlm_fnv1a(SHLM_FNV_OFFSET, k->b, k->n); }

static void gkey_int(struct gkey *k, long long v) { gkey_add(k, &v, sizeof(v)); }

static void gkey_json(struct gkey *k, const json_t *v)
{
    char *t = v ? json_dumps(v, JSON_ENCODE_ANY | JSON_PRESERVE_ORDER | JSON_COMPACT) : NULL;
    if (v && !t)
        k->oom = true;
    gkey_str(k, t);
    free(t);
}

static void gkey_opts(struct gkey *k, const struct gr_opts *o)
{
    gkey_str(k, o->think_open);
    gkey_str(k, o->think_close);
    gkey_str(k, o->lead);
    gkey_int(k, o->max_ws);
}

static void gram_free(struct srv_gram *c)
{
    gr_grammar_free(c->g);
    free(c->key);
    free(c);
}

/* Gives @p the cached grammar of key @k, if there is one. */
static bool gram_find(struct srv *s, struct sreq *p, const struct gkey *k)
{
    uint64_t h = gkey_hash(k);
    pthread_mutex_lock(&s->mu);
    struct srv_gram *hit = NULL;
    for (int i = 0; i < SRV_GRAMS && !hit; i++) {
        struct srv_gram *c = s->grams[i];
        if (c && c->hash == h && c->key_len == k->n && !memcmp(c->key, k->b, k->n))
            hit = c;
    }
    if (hit) {
        hit->refs++;
        hit->used = ++s->gram_clock;
        s->m.grammars_reused++;
        p->gram = hit;
        p->grammar = hit->g;
    }
    pthread_mutex_unlock(&s->mu);
    return hit;
}

/* Keeps @p's new grammar (key @k, taken) for the next requests: in a free place or the one
 * asked for least lately that no request holds; not kept when every place is held. */
static void gram_keep(struct srv *s, struct sreq *p, struct gkey *k)
{
    struct srv_gram *c = calloc(1, sizeof(*c));
    if (!c)
        return; /* (the request keeps the grammar as its own) */
    *c = (struct srv_gram){
        .g = p->grammar, .key = k->b, .key_len = k->n, .hash = gkey_hash(k), .refs = 1};
    k->b = NULL;
    struct srv_gram *old = NULL;
    pthread_mutex_lock(&s->mu);
    int at = -1;
    for (int i = 0; i < SRV_GRAMS; i++) {
        struct srv_gram *o = s->grams[i];
        if (!o) {
            at = i;
            break;
        }
        if (!o->refs && (at < 0 || o->used < s->grams[at]->used))
            at = i;
    }
    if (at >= 0) {
        old = s->grams[at];
        s->grams[at] = c;
        c->cached = true;
        c->used = ++s->gram_clock;
    }
    s->m.grammars_compiled++;
    p->gram = c;
    pthread_mutex_unlock(&s->mu);
    if (old) /* (held by no request) */
        gram_free(old);
}

void srv_grammar_release(struct srv *s, struct sreq *p)
{
    struct srv_gram *c = p->gram;
    if (!c) {
        gr_grammar_free(p->grammar);
        p->grammar = NULL;
        return;
    }
    pthread_mutex_lock(&s->mu);
    bool last = --c->refs == 0 && !c->cached;
    pthread_mutex_unlock(&s->mu);
    if (last)
        gram_free(c);
    p->gram = NULL;
    p->grammar = NULL;
}

void srv_grams_free(struct srv *s)
{
    for (int i = 0; i < SRV_GRAMS; i++) {
        if (s->grams[i])
            gram_free(s->grams[i]);
        s->grams[i] = NULL;
    }
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
    const struct coord_tool_format *f = &s->spelled;
    struct coord_completion_req *q = &p->q;
    size_t nt = json_array_size(q->tools), n = 0;
    const char **names = calloc(nt + 1, sizeof(char *));
    json_t **params = calloc(nt + 1, sizeof(json_t *));
    int rc = names && params ? 0 : -ENOMEM;
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
        struct gr_opts framed = *o;
        if (!no_think && q->reasoning && f->think_open && f->think_close) {
            framed.think_open = p->in_think ? "" : f->think_open;
            framed.think_close = f->think_close;
        }
        struct gr_tools gt = {.syn = &f->syn,
                              .names = names,
                              .params = params,
                              .n = (int)n,
                              .parallel = f->parallel && q->parallel_tool_calls &&
                                          q->tool_choice != COORD_TOOLS_NAMED};
        rc = gr_compile_tool_calls(&gt, &framed, &p->grammar, e);
    }
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
    struct gkey k = {0}; /* the grammar's, to find it compiled already */
    if (q->gkind) {
        /* a chat's answer in the model's frame: its reasoning first, its answer's header */
        struct gr_opts framed = o;
        const struct coord_tool_format *sp = &s->spelled;
        if (q->chat && f && f->think_open && q->reasoning && !no_think) {
            framed.think_open = p->in_think ? "" : sp->think_open;
            framed.think_close = sp->think_close;
        }
        if (q->chat && f && f->lead)
            framed.lead = sp->lead;
        gkey_int(&k, q->gkind);
        gkey_opts(&k, &framed);
        if (json_is_string(q->gsrc))
            gkey_add(&k, json_string_value(q->gsrc), json_string_length(q->gsrc));
        else
            gkey_json(&k, q->gsrc);
        if (k.oom || !gram_find(s, p, &k))
            rc = field_grammar(p, &framed, &e);
    } else if (tools && (q->tool_choice >= COORD_TOOLS_REQUIRED || f->trigger)) {
        /* required or named: a call; auto: a call, once begun, is kept valid (a lazy grammar) */
        bool lazy = q->tool_choice < COORD_TOOLS_REQUIRED;
        field = "tools";
        gkey_int(&k, lazy ? -2 : -1);
        gkey_int(&k, q->tool_choice);
        gkey_str(&k, q->tool_choice == COORD_TOOLS_NAMED ? q->tool_name : NULL);
        gkey_int(&k, q->parallel_tool_calls);
        gkey_int(&k, lazy || no_think);
        gkey_int(&k, q->reasoning);
        gkey_int(&k, p->in_think);
        gkey_opts(&k, &o);
        gkey_json(&k, q->tools);
        if (k.oom || !gram_find(s, p, &k))
            rc = tools_grammar(s, p, lazy || no_think, &o, &e);
        if (!rc && lazy) {
            if (!(p->trigger = malloc(s->trigger_len + 1)))
                rc = -ENOMEM;
            else {
                memcpy(p->trigger, s->spelled.trigger, s->trigger_len + 1);
                p->trigger_len = s->trigger_len;
            }
            p->trigger_at_start = f->at_start;
        }
    }
    if (!rc && p->grammar && !p->gram && !k.oom)
        gram_keep(s, p, &k); /* compiled now: kept for the next request */
    free(k.b);
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
