/* SPDX-License-Identifier: MIT */
/* coordinator/server/request.c: a completion request's JSON body into its parameters, every
 * field checked against what the scheduler takes (libFuzzer target: tests/fuzz/fuzz_request.c). */
#include "request.h"

#include "chat.h"

#include <errno.h>
#include <jansson.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A number field @k of @o within [lo, hi] into @out (left alone when absent or null). Returns
 * NULL or the complaint. */
static const char *get_number(json_t *o, const char *k, double lo, double hi, double *out)
{
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v))
        return NULL;
    if (!json_is_number(v) || json_number_value(v) < lo || json_number_value(v) > hi)
        return k;
    *out = json_number_value(v);
    return NULL;
}

/* get_number() for an integer field. */
static const char *get_int(json_t *o, const char *k, long lo, long hi, long *out)
{
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v))
        return NULL;
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return k;
    *out = (long)json_integer_value(v);
    return NULL;
}

/* Whether @v asks for nothing of the OpenAI fields the server does not implement. */
static bool empty_object(json_t *v) { return json_is_object(v) && !json_object_size(v); }
static bool one(json_t *v) { return json_is_number(v) && json_number_value(v) == 1; }
static bool empty_string(json_t *v) { return json_is_string(v) && !json_string_length(v); }

/* OpenAI fields the server does not implement, taken only at a value that asks for nothing (a
 * client sending another is told, not given something else without a word). */
static const struct {
    const char *name;
    bool (*neutral)(json_t *v);
    const char *what; /* the neutral values, for the message */
} inert_fields[] = {
    {"logit_bias", empty_object, "{}"},
    {"best_of", one, "1"},
    {"suffix", empty_string, "\"\""},
};

/* Why @j holds one of inert_fields at another value, or NULL (absent and null are neutral). */
static const char *inert_error(json_t *j, char *why, size_t wlen)
{
    for (size_t i = 0; i < sizeof(inert_fields) / sizeof(inert_fields[0]); i++) {
        json_t *v = json_object_get(j, inert_fields[i].name);
        if (v && !json_is_null(v) && !inert_fields[i].neutral(v)) {
            snprintf(why, wlen, "%s: not supported (only %s)", inert_fields[i].name,
                     inert_fields[i].what);
            return why;
        }
    }
    return NULL;
}

/* A chat request's messages, kwargs, add_generation_prompt and logprobs into @p. Returns NULL
 * or the message of a 400 (maybe in @why). */
static const char *parse_chat(json_t *j, struct coord_completion_req *p, char *why, size_t wlen)
{
    json_t *m = json_object_get(j, "messages");
    if (!json_is_array(m) || json_array_size(m) == 0)
        return "messages: expected a non-empty array of messages";
    json_t *agp = json_object_get(j, "add_generation_prompt");
    if (agp && !json_is_null(agp) && !json_is_boolean(agp))
        return "add_generation_prompt: expected true or false";
    p->add_generation_prompt = !json_is_false(agp);
    json_t *lp = json_object_get(j, "logprobs"), *top = json_object_get(j, "top_logprobs");
    if (lp && !json_is_null(lp) && !json_is_boolean(lp))
        return "logprobs: expected true or false";
    if (top && !json_is_null(top) &&
        (!json_is_integer(top) || json_integer_value(top) < 0 ||
         json_integer_value(top) > COORD_MAX_LOGPROBS)) {
        snprintf(why, wlen, "top_logprobs: expected 0..%d", COORD_MAX_LOGPROBS);
        return why;
    }
    if (json_is_integer(top) && !json_is_true(lp))
        return "top_logprobs: only with logprobs true";
    p->logprobs = json_is_true(lp) ? (json_is_integer(top) ? (int)json_integer_value(top) : 0) : -1;
    /* chat_template_kwargs, tools and documents: as POST /apply-template renders them */
    json_t *vars;
    if (coord_chat_request_vars(j, &vars, why, wlen))
        return why;
    p->chat = true;
    p->messages = json_incref(m);
    p->tmpl_kwargs = vars;
    return NULL;
}

/* A completion request's prompt, logprobs and echo into @p. Returns NULL or the message of a
 * 400 (maybe in @why). */
static const char *parse_prompt(json_t *j, int vocab, int context, struct coord_completion_req *p,
                                char *why, size_t wlen)
{
    json_t *pr = json_object_get(j, "prompt");
    if (json_is_array(pr) && json_array_size(pr) == 1 && json_is_string(json_array_get(pr, 0)))
        pr = json_array_get(pr, 0);
    if (json_is_string(pr)) {
        const char *t = json_string_value(pr);
        size_t n = json_string_length(pr);
        if (memchr(t, '\0', n))
            return "prompt: a NUL character";
        if (!(p->prompt = strdup(t)))
            return "out of memory";
    } else if (json_is_array(pr) && json_array_size(pr) > 0) {
        size_t n = json_array_size(pr);
        if (n > (size_t)context)
            return "prompt: more token ids than the context";
        if (!(p->ids = malloc(n * sizeof(int32_t))))
            return "out of memory";
        for (size_t i = 0; i < n; i++) {
            json_t *v = json_array_get(pr, i);
            if (!json_is_integer(v) || json_integer_value(v) < 0 ||
                json_integer_value(v) >= (json_int_t)vocab) {
                snprintf(why, wlen, "prompt: token ids are integers in [0, %d)", vocab);
                return why;
            }
            p->ids[i] = (int32_t)json_integer_value(v);
        }
        p->n_ids = (int)n;
    } else
        return "prompt: expected a string or an array of token ids";
    json_t *lp = json_object_get(j, "logprobs");
    p->logprobs = -1;
    if (json_is_integer(lp) && json_integer_value(lp) >= 0 &&
        json_integer_value(lp) <= COORD_MAX_LOGPROBS)
        p->logprobs = (int)json_integer_value(lp);
    else if (lp && !json_is_null(lp) && !json_is_false(lp)) {
        snprintf(why, wlen, "logprobs: expected 0..%d alternatives", COORD_MAX_LOGPROBS);
        return why;
    }
    json_t *echo = json_object_get(j, "echo");
    if (echo && !json_is_null(echo) && !json_is_false(echo))
        return "echo: not supported";
    return NULL;
}

/* The sampling parameters of a request within their ranges, with their defaults (max_tokens and
 * the seed are parsed apart). */
static const struct {
    const char *name;
    double lo, hi, dflt;
    bool integer;
    size_t off; /* into struct coord_sampling */
} number_fields[] = {
    {"temperature", 0, 2, 1.0, false, offsetof(struct coord_sampling, temp)},
    {"top_p", 1e-6, 1, 1.0, false, offsetof(struct coord_sampling, top_p)},
    {"top_k", 0, 1 << 24, 0, true, offsetof(struct coord_sampling, top_k)},
    {"min_p", 0, 0.999, 0, false, offsetof(struct coord_sampling, min_p)},
    {"repetition_penalty", 0.01, 10, 1, false, offsetof(struct coord_sampling, repetition_penalty)},
    {"frequency_penalty", -2, 2, 0, false, offsetof(struct coord_sampling, frequency_penalty)},
    {"presence_penalty", -2, 2, 0, false, offsetof(struct coord_sampling, presence_penalty)},
};

/* max_tokens and the sampling parameters into @p (@chat: its default max_tokens). Returns NULL
 * or the message of a 400 (maybe in @why). */
static const char *parse_sampling(json_t *j, bool chat, struct coord_completion_req *p, char *why,
                                  size_t wlen)
{
    const char *bad;
    /* chat: no limit but the context (OpenAI's, vLLM's and llama.cpp's default): 0, which the
     * scheduler reads as what the prompt leaves of it; completions: OpenAI's legacy 16 */
    long mt = chat ? 0 : COORD_REQ_DEFAULT_MAX_TOKENS;
    if ((bad = get_int(j, "max_tokens", 1, 1 << 24, &mt)) ||
        (bad = get_int(j, "max_completion_tokens", 1, 1 << 24, &mt)))
        goto bad;
    p->max_tokens = (int)mt;
    for (size_t i = 0; i < sizeof(number_fields) / sizeof(number_fields[0]); i++) {
        char *field = (char *)&p->sampling + number_fields[i].off;
        if (number_fields[i].integer) {
            long k = (long)number_fields[i].dflt;
            if ((bad = get_int(j, number_fields[i].name, (long)number_fields[i].lo,
                               (long)number_fields[i].hi, &k)))
                goto bad;
            *(int *)field = (int)k;
        } else {
            double d = number_fields[i].dflt;
            if ((bad = get_number(j, number_fields[i].name, number_fields[i].lo,
                                  number_fields[i].hi, &d)))
                goto bad;
            *(float *)field = (float)d;
        }
    }
    json_t *seed = json_object_get(j, "seed");
    if (json_is_integer(seed)) {
        p->sampling.seed = (uint64_t)json_integer_value(seed);
        p->seeded = true;
    } else if (seed && !json_is_null(seed))
        return "seed: expected an integer";
    return NULL;
bad:
    snprintf(why, wlen, "%s: out of range or not a number of the right kind", bad);
    return why;
}

/* stop (a string or up to COORD_REQ_MAX_STOPS) into @p. Returns NULL or the message of a 400
 * (maybe in @why). */
static const char *parse_stops(json_t *j, struct coord_completion_req *p, char *why, size_t wlen)
{
    json_t *st = json_object_get(j, "stop");
    if (st && !json_is_null(st) && !json_is_string(st) && !json_is_array(st))
        return "stop: expected a string or an array of strings";
    if (!json_is_string(st) && !json_is_array(st))
        return NULL;
    size_t ns = json_is_string(st) ? 1 : json_array_size(st);
    if (ns > COORD_REQ_MAX_STOPS) {
        snprintf(why, wlen, "stop: at most %d strings", COORD_REQ_MAX_STOPS);
        return why;
    }
    for (size_t i = 0; i < ns; i++) {
        json_t *v = json_is_string(st) ? st : json_array_get(st, i);
        if (!json_is_string(v) || !json_string_length(v) ||
            json_string_length(v) > COORD_REQ_STOP_BYTES ||
            memchr(json_string_value(v), '\0', json_string_length(v))) {
            snprintf(why, wlen, "stop: strings of 1..%d bytes", COORD_REQ_STOP_BYTES);
            return why;
        }
        if (!(p->stops[p->n_stops] = strdup(json_string_value(v))))
            return "out of memory";
        p->n_stops++;
    }
    return NULL;
}

/* Sets @p's grammar to @kind from @v (a reference) found at @field, refusing a second one.
 * Returns NULL or the message of a 400. */
static const char *set_grammar(struct coord_completion_req *p, enum coord_req_grammar kind,
                               json_t *v, const char *field, char *why, size_t wlen)
{
    if (p->gkind) {
        snprintf(why, wlen, "%s: the output is constrained by %s already (one at most)", field,
                 p->gfield);
        return why;
    }
    bool ok = kind == COORD_REQ_GR_JSON_SCHEMA   ? json_is_object(v) || json_is_boolean(v)
              : kind == COORD_REQ_GR_JSON_OBJECT ? true
              : kind == COORD_REQ_GR_CHOICE      ? json_is_array(v) && json_array_size(v) > 0
                                                 : json_is_string(v) && json_string_length(v) > 0;
    for (size_t i = 0; ok && kind == COORD_REQ_GR_CHOICE && i < json_array_size(v); i++)
        ok = json_is_string(json_array_get(v, i));
    if (!ok) {
        static const char *const want[] = {"",
                                           "a JSON Schema (an object or a boolean)",
                                           "",
                                           "a regular expression (a non-empty string)",
                                           "a non-empty array of strings",
                                           "a GBNF grammar (a non-empty string)"};
        snprintf(why, wlen, "%s: expected %s", field, want[kind]);
        return why;
    }
    p->gkind = kind;
    p->gsrc = json_incref(v);
    snprintf(p->gfield, sizeof(p->gfield), "%s", field);
    return NULL;
}

/* A JSON Schema given as an object, or as a string holding one (vLLM's guided_json). */
static const char *set_schema(struct coord_completion_req *p, json_t *v, const char *field,
                              char *why, size_t wlen)
{
    if (!json_is_string(v))
        return set_grammar(p, COORD_REQ_GR_JSON_SCHEMA, v, field, why, wlen);
    json_t *s = json_loadb(json_string_value(v), json_string_length(v), 0, NULL);
    const char *bad =
        s ? set_grammar(p, COORD_REQ_GR_JSON_SCHEMA, s, field, why, wlen)
          : (snprintf(why, wlen, "%s: a string that is not a JSON Schema", field), why);
    json_decref(s);
    return bad;
}

/* response_format, llama.cpp's json_schema / grammar, vLLM's guided_* and structured_outputs
 * into @p. Returns NULL or the message of a 400. */
static const char *parse_grammar(json_t *j, struct coord_completion_req *p, char *why, size_t wlen)
{
    const char *bad = NULL;
    json_t *rf = json_object_get(j, "response_format");
    if (rf && !json_is_null(rf)) {
        const char *type = json_string_value(json_object_get(rf, "type"));
        json_t *js = json_object_get(rf, "json_schema");
        if (!json_is_object(rf) || !type)
            return "response_format: expected {\"type\": \"text\", \"json_object\" or "
                   "\"json_schema\"}";
        if (!strcmp(type, "json_object")) /* llama.cpp: with a schema beside the type */
            bad = json_object_get(rf, "schema")
                      ? set_schema(p, json_object_get(rf, "schema"), "response_format.schema", why,
                                   wlen)
                      : set_grammar(p, COORD_REQ_GR_JSON_OBJECT, rf, "response_format", why, wlen);
        else if (!strcmp(type, "json_schema")) {
            json_t *schema = json_object_get(js, "schema");
            if (!json_is_object(js))
                return "response_format.json_schema: expected {\"name\", \"schema\", \"strict\"}";
            bad = schema
                      ? set_schema(p, schema, "response_format.json_schema.schema", why, wlen)
                      : set_grammar(p, COORD_REQ_GR_JSON_OBJECT, rf, "response_format", why, wlen);
        } else if (strcmp(type, "text"))
            return "response_format.type: expected \"text\", \"json_object\" or \"json_schema\"";
        if (bad)
            return bad;
    }
    static const struct {
        const char *field;
        enum coord_req_grammar kind;
    } fields[] = {
        {"json_schema", COORD_REQ_GR_JSON_SCHEMA},
        {"grammar", COORD_REQ_GR_GBNF},
        {"guided_json", COORD_REQ_GR_JSON_SCHEMA},
        {"guided_regex", COORD_REQ_GR_REGEX},
        {"guided_choice", COORD_REQ_GR_CHOICE},
        {"guided_grammar", COORD_REQ_GR_GBNF},
        {"structured_outputs.json", COORD_REQ_GR_JSON_SCHEMA},
        {"structured_outputs.regex", COORD_REQ_GR_REGEX},
        {"structured_outputs.choice", COORD_REQ_GR_CHOICE},
        {"structured_outputs.grammar", COORD_REQ_GR_GBNF},
    };
    json_t *so = json_object_get(j, "structured_outputs");
    if (so && !json_is_null(so) && !json_is_object(so))
        return "structured_outputs: expected an object";
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]) && !bad; i++) {
        const char *f = fields[i].field;
        json_t *v = strncmp(f, "structured_outputs.", 19) ? json_object_get(j, f)
                                                          : json_object_get(so, f + 19);
        if (!v || json_is_null(v))
            continue;
        bad = fields[i].kind == COORD_REQ_GR_JSON_SCHEMA
                  ? set_schema(p, v, f, why, wlen)
                  : set_grammar(p, fields[i].kind, v, f, why, wlen);
    }
    return bad;
}

/* Whether @s (@n bytes) is a function name: [A-Za-z0-9_.-], 1..64 bytes. */
static bool tool_name_ok(const char *s, size_t n)
{
    if (!n || n > COORD_REQ_TOOL_NAME_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
              (s[i] >= '0' && s[i] <= '9') || s[i] == '_' || s[i] == '-' || s[i] == '.'))
            return false;
    return true;
}

/* tools, tool_choice, parallel_tool_calls and reasoning_format of a chat request into @p.
 * Returns NULL or the message of a 400. */
static const char *parse_tools(json_t *j, struct coord_completion_req *p, char *why, size_t wlen)
{
    json_t *tools = json_object_get(j, "tools"), *tc = json_object_get(j, "tool_choice");
    json_t *ptc = json_object_get(j, "parallel_tool_calls");
    json_t *rf = json_object_get(j, "reasoning_format");
    if (rf && !json_is_null(rf) && !json_is_string(rf))
        return "reasoning_format: expected a string (\"none\": no reasoning_content)";
    p->reasoning = !json_is_string(rf) || strcmp(json_string_value(rf), "none");
    if (ptc && !json_is_null(ptc) && !json_is_boolean(ptc))
        return "parallel_tool_calls: expected true or false";
    p->parallel_tool_calls = !json_is_false(ptc);
    if (tools && !json_is_null(tools) && !json_is_array(tools))
        return "tools: expected an array of {\"type\": \"function\", \"function\": {...}}";
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t)
    {
        json_t *fn = json_object_get(t, "function"), *nm = json_object_get(fn, "name");
        json_t *type = json_object_get(t, "type"), *params = json_object_get(fn, "parameters");
        if (!json_is_object(t) ||
            (type && !json_is_null(type) &&
             (!json_is_string(type) || strcmp(json_string_value(type), "function")))) {
            snprintf(why, wlen,
                     "tools[%zu]: expected {\"type\": \"function\", \"function\": {...}}", i);
            return why;
        }
        if (!json_is_string(nm) || !tool_name_ok(json_string_value(nm), json_string_length(nm))) {
            snprintf(why, wlen,
                     "tools[%zu].function.name: expected 1..%d characters of a-z, A-Z, "
                     "0-9, _ . -",
                     i, COORD_REQ_TOOL_NAME_MAX);
            return why;
        }
        if (params && !json_is_null(params) && !json_is_object(params)) {
            snprintf(why, wlen, "tools[%zu].function.parameters: expected a JSON Schema object", i);
            return why;
        }
        for (size_t k = 0; k < i; k++)
            if (json_equal(
                    json_object_get(json_object_get(json_array_get(tools, k), "function"), "name"),
                    nm)) {
                snprintf(why, wlen, "tools[%zu].function.name: \"%s\" is declared twice", i,
                         json_string_value(nm));
                return why;
            }
    }
    bool have = json_is_array(tools) && json_array_size(tools) > 0;
    const char *choice = json_string_value(tc);
    if (!tc || json_is_null(tc))
        p->tool_choice = have ? COORD_TOOLS_AUTO : COORD_TOOLS_NONE;
    else if (choice && !strcmp(choice, "none"))
        p->tool_choice = COORD_TOOLS_NONE;
    else if (choice && !strcmp(choice, "auto"))
        p->tool_choice = have ? COORD_TOOLS_AUTO : COORD_TOOLS_NONE;
    else if (choice && !strcmp(choice, "required"))
        p->tool_choice = COORD_TOOLS_REQUIRED;
    else if (json_is_object(tc) &&
             json_is_string(json_object_get(json_object_get(tc, "function"), "name"))) {
        json_t *nm = json_object_get(json_object_get(tc, "function"), "name");
        bool found = false;
        json_array_foreach(tools, i, t) found |=
            json_equal(json_object_get(json_object_get(t, "function"), "name"), nm);
        if (!found) {
            snprintf(why, wlen, "tool_choice: no tool named \"%.64s\" among the tools",
                     json_string_value(nm));
            return why;
        }
        p->tool_choice = COORD_TOOLS_NAMED;
        snprintf(p->tool_name, sizeof(p->tool_name), "%s", json_string_value(nm));
    } else
        return "tool_choice: expected \"none\", \"auto\", \"required\" or {\"type\": "
               "\"function\", \"function\": {\"name\": ...}}";
    if (p->tool_choice >= COORD_TOOLS_REQUIRED && !have)
        return "tool_choice: no tools were given";
    if (p->tool_choice >= COORD_TOOLS_REQUIRED && p->gkind)
        snprintf(why, wlen, "tool_choice: the answer is a tool call, it cannot follow %s too",
                 p->gfield);
    if (p->tool_choice >= COORD_TOOLS_REQUIRED && p->gkind)
        return why;
    if (have)
        p->tools = json_incref(tools);
    return NULL;
}

/* The fields of @j into @p. Returns NULL or the message of a 400 (maybe in @why). */
static const char *parse_fields(json_t *j, int vocab, int context, bool chat,
                                struct coord_completion_req *p, char *why, size_t wlen)
{
    if (!json_is_object(j))
        return "the body must be a JSON object";
    const char *bad =
        chat ? parse_chat(j, p, why, wlen) : parse_prompt(j, vocab, context, p, why, wlen);
    if (bad || (bad = parse_sampling(j, chat, p, why, wlen)) || (bad = inert_error(j, why, wlen)))
        return bad;
    json_t *n = json_object_get(j, "n");
    if (n && !json_is_null(n) && !(json_is_integer(n) && json_integer_value(n) == 1))
        return "n: only 1 is supported";
    if ((bad = parse_stops(j, p, why, wlen)) || (bad = parse_grammar(j, p, why, wlen)))
        return bad;
    json_t *tc = json_object_get(j, "tool_choice");
    if (chat && (bad = parse_tools(j, p, why, wlen)))
        return bad;
    if (!chat && tc && !json_is_null(tc) &&
        !(json_is_string(tc) &&
          (!strcmp(json_string_value(tc), "none") || !strcmp(json_string_value(tc), "auto"))))
        return "tool_choice: tools are for chat completions";
    json_t *str = json_object_get(j, "stream");
    if (str && !json_is_null(str) && !json_is_boolean(str))
        return "stream: expected true or false";
    p->stream = json_is_true(str);
    json_t *ie = json_object_get(j, "ignore_eos");
    if (ie && !json_is_null(ie) && !json_is_boolean(ie))
        return "ignore_eos: expected true or false";
    p->ignore_eos = json_is_true(ie);
    json_t *so = json_object_get(j, "stream_options");
    p->include_usage = json_is_object(so) && json_is_true(json_object_get(so, "include_usage"));
    return NULL;
}

void coord_completion_req_free(struct coord_completion_req *r)
{
    json_decref(r->messages);
    json_decref(r->tmpl_kwargs);
    json_decref(r->gsrc);
    json_decref(r->tools);
    free(r->prompt);
    free(r->ids);
    for (int i = 0; i < r->n_stops; i++)
        free(r->stops[i]);
    memset(r, 0, sizeof(*r));
}

int coord_completion_parse(const char *body, size_t len, int vocab, int context, bool chat,
                           struct coord_completion_req *r, char *why, size_t wlen)
{
    memset(r, 0, sizeof(*r));
    json_error_t je;
    json_t *j = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!j) {
        /* jansson quotes the input near the error: its control and non-ASCII bytes become '?',
         * so that the message stays one line of text whatever the body held */
        for (char *c = je.text; *c; c++)
            if ((unsigned char)*c < 0x20 || (unsigned char)*c >= 0x7f)
                *c = '?';
        snprintf(why, wlen, "malformed JSON: %s (offset %d)", je.text, je.position);
        return -EINVAL;
    }
    char msg[200];
    const char *bad = parse_fields(j, vocab, context, chat, r, msg, sizeof(msg));
    json_decref(j);
    if (!bad)
        return 0;
    int rc = strcmp(bad, "out of memory") ? -EINVAL : -ENOMEM;
    snprintf(why, wlen, "%s", bad);
    coord_completion_req_free(r);
    return rc;
}
