/* SPDX-License-Identifier: MIT */
/* Fuzz target for the Hugging Face tokenizer.json builder (coordinator/tok/from_hf_json.c,
 * coord_tok_from_hf_json).
 *
 * Input: tokenizer.json text. A refusal must be one line naming the input. What is accepted
 * must encode a fixed text (with control tokens parsed) into ids inside the vocabulary, or fail
 * with -EILSEQ (a character the vocabulary cannot spell) or -EINVAL (a regex past its match
 * limit); every id is decoded back and the piece read in full, so a sanitizer sees any piece
 * outside the tokenizer; and the blob of what was built must load again and encode the same. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"

static const char text[] =
    "Hello world, it's 2024! <s>caf\xc3\xa9 \xe2\x96\x81\t\n  x\xff<|endoftext|>";

static int encode_check(const struct coord_tok *t, int32_t *ids, int max)
{
    int n = coord_tok_encode_ex(t, text, sizeof(text) - 1,
                                COORD_TOK_ENC_PARSE_SPECIAL | COORD_TOK_ENC_ADD_SPECIAL, ids, max);
    if (n == -EILSEQ || n == -EINVAL)
        return n;
    if (n < 0)
        __builtin_trap();
    volatile unsigned sink = 0;
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->vocab_size)
            __builtin_trap();
        size_t pl;
        const char *p = coord_tok_decode(t, i ? ids[i - 1] : -1, ids[i], &pl);
        for (size_t j = 0; j < pl; j++)
            sink += (unsigned char)p[j];
        (void)coord_tok_printable(p, pl);
    }
    (void)sink;
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *buf = malloc(size ? size : 1); /* an exact-size copy so a read past the end shows */
    if (!buf)
        return 0;
    memcpy(buf, data, size);
    struct coord_tok t, u;
    struct shardlm_err e;
    if (coord_tok_from_hf_json(&t, buf, size, "fuzz", &e) == 0) {
        /* at most BOS, one id per byte (and the byte-level prefix), EOS */
        enum { MAX = sizeof(text) * 4 + 8 };
        int32_t a[MAX], b[MAX];
        int na = encode_check(&t, a, MAX);
        uint8_t *blob;
        size_t bl;
        if (coord_tok_save(&t, &blob, &bl) == 0) {
            if (coord_tok_load(&u, blob, bl, "fuzz", &e) != 0)
                __builtin_trap();
            int nb = encode_check(&u, b, MAX);
            if (na != nb || (na > 0 && memcmp(a, b, (size_t)na * sizeof(int32_t)) != 0))
                __builtin_trap();
            coord_tok_free(&u);
            free(blob);
        }
        coord_tok_free(&t);
    } else if (!memchr(e.msg, 0, sizeof(e.msg)) || strncmp(e.msg, "fuzz", 4) != 0 ||
               strchr(e.msg, '\n')) {
        __builtin_trap(); /* every refusal is one line naming the input */
    }
    free(buf);
    return 0;
}
