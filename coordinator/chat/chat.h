/* SPDX-License-Identifier: MIT */
/* coordinator/chat/chat.h: chat templates - a model's Jinja template rendered over an OpenAI
 * messages list, the way Hugging Face transformers' apply_chat_template renders it. */
#ifndef SHARDLM_COORD_CHAT_H
#define SHARDLM_COORD_CHAT_H

#include "jinja.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#define COORD_CHAT_TEMPLATE_MAX (1u << 20) /* bytes of a template */

struct coord_chat_tmpl {
    struct coord_jinja *jinja;
    char *bos, *eos; /* the text of the BOS and EOS tokens the template may print ("" if none) */
};

/* Parses the template @src (@len bytes) with @bos / @eos (NULL: ""). Returns 0, or -EINVAL
 * (-E2BIG, -ENOMEM) with a one-line message in @why. Release with coord_chat_tmpl_free(). */
int coord_chat_tmpl_init(struct coord_chat_tmpl *t, const char *src, size_t len, const char *bos,
                         const char *eos, char *why, size_t wlen);
void coord_chat_tmpl_free(struct coord_chat_tmpl *t);

/* Renders @messages (an OpenAI messages array: objects with a string role, and content a string,
 * null, or a list of {"type": "text", "text": ...} parts, joined with newlines as vLLM and
 * llama.cpp join them; an assistant turn with tool_calls has its calls' JSON-text arguments as
 * objects and a null content as "", as llama.cpp hands them to templates; other members pass
 * through) with add_generation_prompt, bos_token,
 * eos_token and the members of @kwargs (an object or NULL, e.g. a request's
 * chat_template_kwargs; they cannot replace those four). Returns 0 and *@out (malloc'd,
 * NUL-terminated, *@len bytes); -EINVAL with @why set: the messages are malformed (@bad_request
 * set) or the template failed or raised (raise_exception's message); -E2BIG (a limit of the
 * template passed), -ENOMEM. */
int coord_chat_render(const struct coord_chat_tmpl *t, json_t *messages, bool add_generation_prompt,
                      json_t *kwargs, char **out, size_t *len, bool *bad_request, char *why,
                      size_t wlen);

/* The template variables of request object @req beside its messages: the members of its
 * chat_template_kwargs (an object, null or absent), and its top-level tools and documents
 * (arrays, as Hugging Face's apply_chat_template passes them; they win over kwargs' own). The
 * one way a chat completion and POST /apply-template build them. Returns 0 and *@vars (an object
 * the caller releases with json_decref()); -EINVAL (a kwargs that is not an object) or -ENOMEM
 * with @why set. */
int coord_chat_request_vars(json_t *req, json_t **vars, char *why, size_t wlen);

/* coord_chat_render() of a request object {"messages": [...], "add_generation_prompt": bool
 * (default true), "chat_template_kwargs": {...}, "tools": [...], "documents": [...]} with
 * coord_chat_request_vars()' variables (`shardlm template`, POST /apply-template). */
int coord_chat_render_request(const struct coord_chat_tmpl *t, json_t *req, char **out, size_t *len,
                              bool *bad_request, char *why, size_t wlen);

#endif
