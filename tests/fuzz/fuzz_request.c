/* SPDX-License-Identifier: MIT */
/* Fuzz target for the completion request parser (coordinator/server/request.c), each input
 * read as a completion and as a chat completion.
 *
 * Input: a request body, any bytes. What coord_completion_parse() accepts must be what the
 * scheduler takes: a text prompt without NUL or 1..context token ids inside the vocabulary,
 * parameters inside their ranges, at most 16 stop strings of 1..256 bytes; a refusal is one
 * NUL-terminated line. */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "request.h"

enum { VOCAB = 512, CONTEXT = 256 };

static void check(const uint8_t *data, size_t size, bool chat)
{
    struct coord_completion_req r;
    char why[300];
    memset(why, 'x', sizeof(why));
    int rc = coord_completion_parse((const char *)data, size, VOCAB, CONTEXT, chat, &r, why,
                                    sizeof(why));
    if (rc == 0) {
        if (!chat && (!r.prompt == !r.ids || (r.ids && (r.n_ids < 1 || r.n_ids > CONTEXT))))
            __builtin_trap();
        if (chat && (!json_is_array(r.messages) || !json_array_size(r.messages) || r.prompt ||
                     r.ids || (r.tmpl_kwargs && !json_is_object(r.tmpl_kwargs))))
            __builtin_trap();
        if (r.logprobs < -1 || r.logprobs > COORD_MAX_LOGPROBS)
            __builtin_trap();
        for (int i = 0; r.ids && i < r.n_ids; i++)
            if (r.ids[i] < 0 || r.ids[i] >= VOCAB)
                __builtin_trap();
        const struct coord_sampling *s = &r.sampling;
        if (r.max_tokens < (chat ? 0 : 1) || r.max_tokens > (1 << 24) ||
            !(s->temp >= 0 && s->temp <= 2) || !(s->top_p > 0 && s->top_p <= 1) || s->top_k < 0 ||
            !(s->min_p >= 0 && s->min_p < 1) ||
            !(s->repetition_penalty >= 0.01f && s->repetition_penalty <= 10) ||
            !(s->frequency_penalty >= -2 && s->frequency_penalty <= 2) ||
            !(s->presence_penalty >= -2 && s->presence_penalty <= 2))
            __builtin_trap();
        if (r.n_stops < 0 || r.n_stops > COORD_REQ_MAX_STOPS)
            __builtin_trap();
        for (int i = 0; i < r.n_stops; i++) {
            size_t n = strlen(r.stops[i]);
            if (n < 1 || n > COORD_REQ_STOP_BYTES)
                __builtin_trap();
        }
        coord_completion_req_free(&r);
    } else if ((rc != -EINVAL && rc != -ENOMEM) || !memchr(why, 0, sizeof(why)) || !why[0] ||
               strchr(why, '\n') || r.prompt || r.ids || r.n_stops || r.messages) {
        __builtin_trap(); /* a refusal: one line, nothing held */
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    check(data, size, false);
    check(data, size, true);
    return 0;
}
