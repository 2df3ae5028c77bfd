/* SPDX-License-Identifier: MIT */
/* Fuzz target for the grammar engine's parsers (coordinator/grammar/): JSON Schema, ECMAScript
 * regexes (a schema's "pattern" among them) and choices, then the matcher over what compiled.
 *
 * Input: one byte that picks the source (0 mod 4: a JSON Schema, 1: a regex, 2: choices split at
 * NUL bytes, 3: GBNF), then the source. Whatever the bytes, compiling ends within the limits (small
 * here) with a grammar or -EINVAL / -E2BIG / -ENOMEM and a one-line message: never a crash or a
 * hang. A grammar then walks up to 48 tokens of a small vocabulary, each the first the mask allows
 * after a cursor taken from the input: every token the mask allows commits, and the one before
 * it (when refused) does not. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "grammar.h"

static const char *const pieces[] = {"\"",       "\":",  "{\"", "\"}", "true", "12", "-1",   "ab",
                                     "\xc3\xa9", "\xc3", " \"", ", ",  "e+",   "]}", "\\u00"};
#define N_PIECES (int)(sizeof(pieces) / sizeof(pieces[0]))
#define N_TOK (256 + N_PIECES + 1)

static struct gr_vocab *vocab(void)
{
    static struct gr_vocab *v;
    static char bytes[256];
    if (v)
        return v;
    const char *p[N_TOK];
    uint32_t len[N_TOK];
    for (int i = 0; i < 256; i++) {
        bytes[i] = (char)i;
        p[i] = &bytes[i];
        len[i] = 1;
    }
    for (int i = 0; i < N_PIECES; i++) {
        p[256 + i] = pieces[i];
        len[256 + i] = (uint32_t)strlen(pieces[i]);
    }
    p[N_TOK - 1] = NULL;
    len[N_TOK - 1] = 0;
    struct shardlm_err e;
    if (gr_vocab_new(N_TOK, p, len, N_TOK - 1, &v, &e))
        __builtin_trap();
    return v;
}

static void check_message(const struct shardlm_err *e)
{
    if (!memchr(e->msg, 0, sizeof(e->msg)) || !e->msg[0] || strchr(e->msg, '\n'))
        __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    struct gr_opts o = {.max_nfa_states = 20000, .max_dfa_states = 2000, .max_rules = 20000};
    struct gr_grammar *g = NULL;
    struct shardlm_err e = {{0}};
    const char *src = (const char *)data + 1;
    size_t n = size - 1;
    int rc;
    if (data[0] % 4 == 0) {
        rc = gr_compile_json_schema(src, n, &o, &g, &e);
    } else if (data[0] % 4 == 1) {
        rc = gr_compile_regex(src, n, &o, &g, &e);
    } else if (data[0] % 4 == 3) {
        rc = gr_compile_gbnf(src, n, &o, &g, &e);
    } else {
        const char *s[16];
        size_t l[16];
        int k = 0;
        for (size_t i = 0, start = 0; i <= n && k < 16; i++)
            if (i == n || !src[i]) {
                s[k] = src + start;
                l[k++] = i - start;
                start = i + 1;
            }
        rc = gr_compile_choice(s, l, k, &o, &g, &e);
    }
    if (rc) {
        if (rc != -EINVAL && rc != -E2BIG && rc != -ENOMEM)
            __builtin_trap();
        check_message(&e);
        return 0;
    }
    struct gr_vocab *v = vocab();
    struct gr_matcher *m;
    if (gr_matcher_new(g, v, &m, &e)) {
        gr_grammar_free(g);
        return 0;
    }
    uint32_t mask[(N_TOK + 31) / 32];
    for (int step = 0; step < 48; step++) {
        long cnt = gr_matcher_mask(m, mask);
        if (cnt <= 0)
            break;
        int start = (int)(data[(size_t)step % size] * 7u % N_TOK), t = -1;
        for (int k = 0; k < N_TOK && t < 0; k++) {
            int c = (start + k) % N_TOK;
            if (mask[c >> 5] >> (c & 31) & 1)
                t = c;
        }
        if (t < 0)
            __builtin_trap(); /* a count without a token */
        int before = (t + N_TOK - 1) % N_TOK;
        if (!(mask[before >> 5] >> (before & 31) & 1)) {
            struct gr_matcher *c;
            if (!gr_matcher_clone(m, &c, &e)) {
                if (gr_matcher_commit(c, before))
                    __builtin_trap(); /* refused by the mask, taken by the commit */
                gr_matcher_free(c);
            }
        }
        if (!gr_matcher_commit(m, t))
            __builtin_trap(); /* allowed by the mask, refused by the commit */
        if (gr_matcher_done(m))
            break;
    }
    gr_matcher_free(m);
    gr_grammar_free(g);
    return 0;
}
