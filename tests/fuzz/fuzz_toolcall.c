/* SPDX-License-Identifier: MIT */
/* Fuzz target for the answer parser of tool calls and reasoning (coordinator/chat/toolcall.c).
 *
 * Input: one byte that picks the family (by a template marker) and the flags (tools declared,
 * reasoning split, the prompt opened it), then the answer's bytes. Whatever the bytes, the whole
 * parse ends with every call of a declared tool and JSON arguments where it is done; and for a
 * short answer every prefix's partial parse gives a reasoning and a content that are prefixes of
 * the whole's (a stream never takes text back). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "toolcall.h"

static const char *const templates[] = {
    "<|channel|>",
    "<parameter=<tool_call>",
    "<tool_call><think>",
    "[TOOL_CALLS]",
    "tool\xe2\x96\x81"
    "calls\xe2\x96\x81"
    "begin<think>",
    "<|tool_call|>",
    "<|start_header_id|>\"parameters\"",
    "plain",
};

static json_t *tools(void)
{
    static json_t *t;
    if (!t)
        t = json_loads(
            "[{\"type\": \"function\", \"function\": {\"name\": \"add\", \"parameters\": "
            "{\"properties\": {\"a\": {\"type\": \"integer\"}, \"s\": {\"type\": "
            "\"string\"}}}}}, {\"type\": \"function\", \"function\": {\"name\": "
            "\"get_weather\"}}]",
            0, NULL);
    return t;
}

static bool prefix(const char *a, size_t na, const char *b, size_t nb)
{
    return na <= nb && (!na || !memcmp(a, b, na));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const struct coord_tool_format *f = coord_tool_format_of(templates[data[0] & 7]);
    json_t *tl = data[0] & 8 ? tools() : NULL;
    bool think = data[0] & 16, in_think = data[0] & 32;
    const char *text = (const char *)data + 1;
    size_t n = size - 1;
    struct coord_reply r;
    if (coord_reply_parse(f, text, n, tl, think, in_think, false, &r))
        __builtin_trap(); /* (no allocation here fails but by running out of memory) */
    for (int i = 0; i < r.n_calls; i++) {
        json_t *a = json_loadb(r.calls[i].args, r.calls[i].args_len,
                               JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
        bool declared = false;
        size_t k;
        json_t *t;
        json_array_foreach(tl, k, t)
        {
            declared |=
                !strcmp(json_string_value(json_object_get(json_object_get(t, "function"), "name")),
                        r.calls[i].name);
        }
        if (!declared || (r.calls[i].done && !a))
            __builtin_trap();
        json_decref(a);
    }
    for (size_t k = 0; n <= 512 && k <= n; k++) {
        struct coord_reply p;
        if (coord_reply_parse(f, text, k, tl, think, in_think, true, &p))
            __builtin_trap();
        if (!prefix(p.reasoning, p.reasoning_len, r.reasoning, r.reasoning_len) ||
            !prefix(p.content, p.content_len, r.content, r.content_len))
            __builtin_trap();
        coord_reply_free(&p);
    }
    coord_reply_free(&r);
    return 0;
}
