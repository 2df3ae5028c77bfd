/* SPDX-License-Identifier: MIT */
/* coordinator/chat/toolcall.h: how a model family writes tool calls and its reasoning, found
 * from its chat template; a generated text split into reasoning, content and tool calls (the
 * way vLLM's tool and reasoning parsers and llama.cpp's chat parsers split it). */
#ifndef SHARDLM_COORD_TOOLCALL_H
#define SHARDLM_COORD_TOOLCALL_H

#include "grammar.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

enum coord_call_kind {
    COORD_CALLS_JSON,    /* begin pre {"name": NAME, "<args_key>": ARGS} post ... end */
    COORD_CALLS_NAMED,   /* begin pre NAME mid ARGS post ... end (ARGS JSON) */
    COORD_CALLS_XML,     /* Qwen3-Coder: pre NAME mid <parameter=K>\nV\n</parameter>\n... post */
    COORD_CALLS_HARMONY, /* gpt-oss: channels; a call's header names functions.NAME */
};

/* A model family's way: its calls' syntax as text (control tokens by their text: the server
 * marks them for the grammar), the text that starts them, its reasoning markers. */
struct coord_tool_format {
    const char *name;          /* "hermes", "llama3", ... (the server's log and docs) */
    const char *marker, *also; /* what a template of the family holds (and @also, unless NULL) */
    enum coord_call_kind kind;
    struct gr_call_syntax syn;
    bool parallel;       /* the family writes several calls in one turn */
    const char *trigger; /* where calls begin in a free answer (tool_choice auto) */
    bool at_start;       /* ... only at the answer's start (after its reasoning) */
    const char *think_open, *think_close; /* reasoning (NULL: none) */
    const char *lead; /* what comes before an answer's text (gpt-oss' final channel), NULL */
};

/* The format of the chat template @tmpl (its source; NULL: none): the family whose markers it
 * holds, else the generic one (Hermes' <tool_call> JSON, no reasoning). Never NULL. */
const struct coord_tool_format *coord_tool_format_of(const char *tmpl);

/* One call as parsed: the function's name and its arguments' JSON text. */
struct coord_call {
    char *name;
    char *args;
    size_t args_len;
    bool done; /* the call is complete (a partial parse's last one may not be) */
};

/* A generated text split. Strings malloc'd (NULL when empty). */
struct coord_reply {
    char *reasoning, *content;
    size_t reasoning_len, content_len;
    struct coord_call *calls;
    int n_calls;
};

/* Splits the @n bytes of @text (the answer so far, control tokens as their text) as format @f
 * writes it: reasoning (when @think: its markers are split out; @in_think: the prompt opened
 * the reasoning already), content, and tool calls (when @tools, an array of OpenAI tool
 * objects, is non-NULL: calls of tools it does not declare stay content). @partial: the text
 * may go on - what could still become a marker is held back, so that each field of a partial
 * reply is a prefix of the same field later (streams send the difference). A malformed call
 * ends the calls; it and what follows stay content. A text that ends inside a call (cut by
 * max_tokens) has that call last, not done, as OpenAI returns one. Returns 0 or -ENOMEM. */
int coord_reply_parse(const struct coord_tool_format *f, const char *text, size_t n, json_t *tools,
                      bool think, bool in_think, bool partial, struct coord_reply *r);
void coord_reply_free(struct coord_reply *r);

#endif
