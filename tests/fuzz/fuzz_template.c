/* SPDX-License-Identifier: MIT */
/* Fuzz target for the Jinja interpreter (coordinator/chat/jinja*.c) and the chat layer over it.
 *
 * Input: a template, then optionally a NUL byte and a JSON messages list (else a fixed
 * conversation). Whatever the bytes, parsing and rendering end within the limits (small here,
 * so that each input is fast) with 0 or an error: never a crash, a hang, an overrun or output
 * past max_output; an error message is one NUL-terminated line. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "jinja.h"

static const char conversation[] =
    "[{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": "
    "\"H\\u00e9llo <b>\"}, {\"role\": \"assistant\", \"content\": \"<think>x</think>Hi\"}, "
    "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"a\"}]}]";

static void check_message(const char *why, size_t wlen)
{
    size_t n = strnlen(why, wlen);
    if (n == wlen)
        __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *nul = memchr(data, 0, size);
    size_t tlen = nul ? (size_t)(nul - (const char *)data) : size;
    struct coord_jinja *t;
    char why[300];
    int rc = coord_jinja_parse((const char *)data, tlen, &t, why, sizeof(why));
    if (rc) {
        if (rc != -EINVAL && rc != -E2BIG && rc != -ENOMEM)
            __builtin_trap();
        check_message(why, sizeof(why));
        return 0;
    }
    json_t *messages =
        nul ? json_loadb(nul + 1, size - tlen - 1, 0, NULL) : json_loads(conversation, 0, NULL);
    json_t *vars = json_object();
    json_object_set_new(vars, "messages", messages ? messages : json_array());
    json_object_set_new(vars, "add_generation_prompt", json_true());
    json_object_set_new(vars, "bos_token", json_string("<s>"));
    static const struct coord_jinja_limits lim = {
        .max_output = 1 << 16, .max_memory = 16 << 20, .max_steps = 200000, .max_depth = 16};
    char *out;
    size_t olen;
    rc = coord_jinja_render(t, vars, &lim, &out, &olen, why, sizeof(why));
    if (rc == 0) {
        if (olen > lim.max_output || strlen(out) > olen)
            __builtin_trap();
        free(out);
    } else {
        if (rc != -EINVAL && rc != -E2BIG && rc != -ENOMEM)
            __builtin_trap();
        check_message(why, sizeof(why));
    }
    json_decref(vars);
    coord_jinja_free(t);
    return 0;
}
