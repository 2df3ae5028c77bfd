/* SPDX-License-Identifier: MIT */
/* coordinator/server/request.h: the body of a completion request, parsed and checked. */
#ifndef SHARDLM_COORD_REQUEST_H
#define SHARDLM_COORD_REQUEST_H

#include "sampler.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define COORD_REQ_MAX_STOPS 16          /* stop strings of a request */
#define COORD_REQ_STOP_BYTES 256        /* bytes of one */
#define COORD_REQ_DEFAULT_MAX_TOKENS 16 /* OpenAI's default for completions */

/* What constrains the output (one source at most). */
enum coord_req_grammar {
    COORD_REQ_GR_NONE,
    COORD_REQ_GR_JSON_SCHEMA, /* gsrc: the schema (an object or a boolean) */
    COORD_REQ_GR_JSON_OBJECT, /* any JSON object */
    COORD_REQ_GR_REGEX,       /* gsrc: a string */
    COORD_REQ_GR_CHOICE,      /* gsrc: a non-empty array of strings */
    COORD_REQ_GR_GBNF,        /* gsrc: a string */
};

/* tool_choice (chat). */
enum coord_tool_choice {
    COORD_TOOLS_NONE,     /* no tools, or "none": the tools are shown to the template only */
    COORD_TOOLS_AUTO,     /* the model may call one (a grammar keeps a call valid once it starts) */
    COORD_TOOLS_REQUIRED, /* the answer is calls */
    COORD_TOOLS_NAMED,    /* the answer is a call of tool_name */
};

#define COORD_REQ_TOOL_NAME_MAX 64 /* bytes of a function's name, [A-Za-z0-9_.-] */

/* What POST /v1/completions or /v1/chat/completions asked for. */
struct coord_completion_req {
    bool chat;
    json_t *messages;    /* chat: the messages (a reference), rendered by the chat template */
    json_t *tmpl_kwargs; /* chat: chat_template_kwargs with tools and documents (its own) */
    bool add_generation_prompt; /* chat (default true) */
    char *prompt; /* the prompt's text (malloc'd), or NULL when token ids were given */
    int32_t *ids; /* the token ids (malloc'd; the server tokenizes a text prompt into it) */
    int n_ids;
    int max_tokens; /* max_tokens or max_completion_tokens; 0: what the context leaves */
    struct coord_sampling sampling;
    bool seeded; /* seed given (else sampling.seed is 0: the server picks one) */
    char *stops[COORD_REQ_MAX_STOPS];
    int n_stops;
    bool stream, include_usage;
    bool ignore_eos; /* vLLM's and llama.cpp's extension: only max_tokens and stop end it */
    int logprobs; /* -1: none; else the sampled token's and this many alternatives' (0..20) */
    enum coord_req_grammar gkind;
    json_t *gsrc;    /* the grammar's source (a reference) */
    char gfield[48]; /* the field it came from ("response_format.json_schema.schema") */
    json_t *tools;   /* chat: the tools given (a reference; NULL: none) */
    enum coord_tool_choice tool_choice;
    char tool_name[COORD_REQ_TOOL_NAME_MAX + 1]; /* COORD_TOOLS_NAMED */
    bool parallel_tool_calls;                    /* default true */
    bool reasoning; /* chat: reasoning split out as reasoning_content (reasoning_format not
                     * "none") */
};

/* Parses the JSON body @body (@len bytes, any bytes) of a completion request against a model of
 * @vocab tokens and @context positions. Completions (@chat false): prompt (a string, or one in an
 * array, or a non-empty array of token ids in [0, vocab), at most @context of them), logprobs
 * (0..20 alternatives; null or false: none), echo refused. Chat: messages (a non-empty array: the
 * chat template checks its items), chat_template_kwargs (an object), add_generation_prompt,
 * logprobs (true or false) with top_logprobs (0..20). Both: max_tokens /
 * max_completion_tokens (an integer 1..2^24; absent or null: 16, and for a chat 0, that is what
 * the prompt leaves of the context), temperature (0..2, default 1), top_p ((0, 1], default 1),
 * top_k, min_p, repetition_penalty, frequency_penalty, presence_penalty, seed, stop (a string or up
 * to 16, each 1..256 bytes without NUL), stream, stream_options {include_usage}; n other than 1 is
 * refused. What constrains the output, one at most: response_format ({"type": "text"},
 * "json_object", or "json_schema" with json_schema.schema), llama.cpp's json_schema and
 * grammar (GBNF), vLLM's guided_json / guided_regex / guided_choice / guided_grammar and
 * structured_outputs {json, regex, choice, grammar}. Chat: tools (OpenAI function tools, names
 * of [A-Za-z0-9_.-], at most 64 bytes), tool_choice ("none", "auto", "required" or a named
 * function among the tools; default auto with tools), parallel_tool_calls, reasoning_format
 * ("none": no reasoning_content). Other fields are ignored. Returns 0; -EINVAL with @why set to a
 * 400's one-line message; or -ENOMEM. *@r is zeroed first and freed on failure. */
int coord_completion_parse(const char *body, size_t len, int vocab, int context, bool chat,
                           struct coord_completion_req *r, char *why, size_t wlen);
void coord_completion_req_free(struct coord_completion_req *r);

#endif
