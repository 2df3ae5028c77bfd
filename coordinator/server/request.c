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
static bool text_format(json_t *v)
{
    json_t *t = json_object_get(v, "type");
    return json_is_object(v) && json_is_string(t) && !strcmp(json_string_value(t), "text");
}
static bool auto_or_none(json_t *v)
{
    const char *t = json_string_value(v);
    return t && (!strcmp(t, "auto") || !strcmp(t, "none"));
}

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
    {"response_format", text_format, "{\"type\": \"text\"}"},
    {"tool_choice", auto_or_none, "\"auto\" or \"none\""},
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
    if ((bad = parse_stops(j, p, why, wlen)))
        return bad;
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
