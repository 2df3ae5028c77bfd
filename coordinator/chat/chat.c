/* SPDX-License-Identifier: MIT */
/* coordinator/chat/chat.c: a messages list checked and normalized, then rendered through the
 * model's chat template. */
#include "chat.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int coord_chat_tmpl_init(struct coord_chat_tmpl *t, const char *src, size_t len, const char *bos,
                         const char *eos, char *why, size_t wlen)
{
    memset(t, 0, sizeof(*t));
    int rc = coord_jinja_parse(src, len, &t->jinja, why, wlen);
    if (rc)
        return rc;
    t->bos = strdup(bos ? bos : "");
    t->eos = strdup(eos ? eos : "");
    if (!t->bos || !t->eos) {
        coord_chat_tmpl_free(t);
        snprintf(why, wlen, "out of memory");
        return -ENOMEM;
    }
    return 0;
}

void coord_chat_tmpl_free(struct coord_chat_tmpl *t)
{
    coord_jinja_free(t->jinja);
    free(t->bos);
    free(t->eos);
    memset(t, 0, sizeof(*t));
}

/* An assistant turn @m that made tool calls as templates take it (as llama.cpp hands it over):
 * its calls' arguments objects where they are JSON text (OpenAI sends a string; templates print
 * them with tojson), its null content "" (templates search it for text). A copy, or @m itself
 * (a new reference) when nothing changes; NULL when out of memory. */
static json_t *tool_turn(json_t *m)
{
    json_t *calls = json_object_get(m, "tool_calls");
    if (!json_is_array(calls))
        return json_incref(m);
    json_t *copy = json_deep_copy(m);
    if (!copy)
        return NULL;
    if (json_is_null(json_object_get(copy, "content")))
        json_object_set_new(copy, "content", json_string(""));
    size_t k;
    json_t *c;
    json_array_foreach(json_object_get(copy, "tool_calls"), k, c)
    {
        json_t *fn = json_object_get(c, "function"), *a = json_object_get(fn, "arguments");
        if (!json_is_string(a))
            continue;
        json_t *o = json_loadb(json_string_value(a), json_string_length(a), 0, NULL);
        if (json_is_object(o))
            json_object_set(fn, "arguments", o);
        json_decref(o);
    }
    return copy;
}

/* A copy of message @m (index @i) with its content a string or null, its tool calls as
 * tool_turn() makes them. Returns NULL with @why. */
static json_t *normalize(json_t *m, size_t i, char *why, size_t wlen)
{
    if (!json_is_object(m)) {
        snprintf(why, wlen, "messages[%zu]: expected an object", i);
        return NULL;
    }
    if (!json_is_string(json_object_get(m, "role"))) {
        snprintf(why, wlen, "messages[%zu].role: expected a string", i);
        return NULL;
    }
    json_t *content = json_object_get(m, "content");
    if (!json_is_array(content)) {
        if (content && !json_is_string(content) && !json_is_null(content)) {
            snprintf(why, wlen,
                     "messages[%zu].content: expected a string, null or a list of "
                     "text parts",
                     i);
            return NULL;
        }
        json_t *t = tool_turn(m);
        if (!t)
            snprintf(why, wlen, "out of memory");
        return t;
    }
    size_t total = 0, k;
    json_t *part;
    json_array_foreach(content, k, part)
    {
        json_t *text = json_object_get(part, "text");
        if (!json_is_object(part) || !json_is_string(json_object_get(part, "type")) ||
            strcmp(json_string_value(json_object_get(part, "type")), "text") ||
            !json_is_string(text)) {
            snprintf(why, wlen,
                     "messages[%zu].content[%zu]: only {\"type\": \"text\", \"text\": "
                     "...} parts are supported",
                     i, k);
            return NULL;
        }
        total += json_string_length(text) + 1;
    }
    char *joined = malloc(total + 1), *o = joined;
    if (!joined) {
        snprintf(why, wlen, "out of memory");
        return NULL;
    }
    json_array_foreach(content, k, part)
    {
        json_t *text = json_object_get(part, "text");
        if (k)
            *o++ = '\n';
        memcpy(o, json_string_value(text), json_string_length(text));
        o += json_string_length(text);
    }
    json_t *copy = json_copy(m), *s = json_stringn_nocheck(joined, (size_t)(o - joined));
    free(joined);
    if (!copy || !s || json_object_set_new(copy, "content", s)) {
        json_decref(copy);
        snprintf(why, wlen, "out of memory");
        return NULL;
    }
    json_t *t = tool_turn(copy);
    json_decref(copy);
    if (!t)
        snprintf(why, wlen, "out of memory");
    return t;
}

int coord_chat_render(const struct coord_chat_tmpl *t, json_t *messages, bool add_generation_prompt,
                      json_t *kwargs, char **out, size_t *len, bool *bad_request, char *why,
                      size_t wlen)
{
    *out = NULL;
    *len = 0;
    *bad_request = true;
    if (!json_is_array(messages) || json_array_size(messages) == 0) {
        snprintf(why, wlen, "messages: expected a non-empty list");
        return -EINVAL;
    }
    if (kwargs && !json_is_null(kwargs) && !json_is_object(kwargs)) {
        snprintf(why, wlen, "chat_template_kwargs: expected an object");
        return -EINVAL;
    }
    json_t *vars = json_is_object(kwargs) ? json_copy(kwargs) : json_object();
    json_t *list = json_array();
    int rc = -ENOMEM;
    if (!vars || !list)
        goto out;
    size_t i;
    json_t *m;
    json_array_foreach(messages, i, m)
    {
        json_t *n = normalize(m, i, why, wlen);
        if (!n) {
            rc = -EINVAL;
            goto out;
        }
        if (json_array_append_new(list, n))
            goto out;
    }
    if (json_object_set(vars, "messages", list) ||
        json_object_set_new(vars, "add_generation_prompt", json_boolean(add_generation_prompt)) ||
        json_object_set_new(vars, "bos_token", json_string(t->bos)) ||
        json_object_set_new(vars, "eos_token", json_string(t->eos)))
        goto out;
    *bad_request = false;
    rc = coord_jinja_render(t->jinja, vars, NULL, out, len, why, wlen);
out:
    if (rc == -ENOMEM && !*out)
        snprintf(why, wlen, "out of memory");
    json_decref(vars);
    json_decref(list);
    return rc;
}

int coord_chat_request_vars(json_t *req, json_t **vars, char *why, size_t wlen)
{
    *vars = NULL;
    json_t *kw = json_object_get(req, "chat_template_kwargs");
    if (kw && !json_is_null(kw) && !json_is_object(kw)) {
        snprintf(why, wlen, "chat_template_kwargs: expected an object");
        return -EINVAL;
    }
    json_t *v = json_is_object(kw) ? json_copy(kw) : json_object();
    if (!v)
        goto out_nomem;
    /* tools and documents are template variables too, as apply_chat_template passes them (the
     * model sees them; its tool calls come back as text) */
    static const char *const passed[] = {"tools", "documents"};
    for (size_t i = 0; i < 2; i++) {
        json_t *a = json_object_get(req, passed[i]);
        if (json_is_array(a) && json_object_set(v, passed[i], a)) {
            json_decref(v);
            goto out_nomem;
        }
    }
    *vars = v;
    return 0;
out_nomem:
    snprintf(why, wlen, "out of memory");
    return -ENOMEM;
}

int coord_chat_render_request(const struct coord_chat_tmpl *t, json_t *req, char **out, size_t *len,
                              bool *bad_request, char *why, size_t wlen)
{
    *bad_request = true;
    if (!json_is_object(req)) {
        snprintf(why, wlen, "expected a JSON object with messages");
        return -EINVAL;
    }
    json_t *agp = json_object_get(req, "add_generation_prompt");
    if (agp && !json_is_boolean(agp) && !json_is_null(agp)) {
        snprintf(why, wlen, "add_generation_prompt: expected true or false");
        return -EINVAL;
    }
    json_t *vars;
    int rc = coord_chat_request_vars(req, &vars, why, wlen);
    if (rc)
        return rc;
    rc = coord_chat_render(t, json_object_get(req, "messages"), !agp || !json_is_false(agp), vars,
                           out, len, bad_request, why, wlen);
    json_decref(vars);
    return rc;
}
