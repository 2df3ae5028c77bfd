/* SPDX-License-Identifier: MIT */
/* Fuzz target for the tokenizer.bin parser and the encoder over what it accepts
 * (coordinator/tok/from_llama2c.c, encode.c, decode.c).
 *
 * Input: 2 bytes little-endian v, the vocabulary size is v % 1024 + 1; the rest is the
 * tokenizer.bin image. When coord_tok_init() accepts it, a fixed ASCII text is encoded (with BOS
 * and EOS) and every id decoded back; decoded pieces are read in full so a sanitizer sees any
 * piece that points outside the vocabulary. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"

static const char text[] = "Once upon a time, Lily saw a big dog. <0x41> \"Hi!\" 123\n";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    int vocab = (int)((data[0] | (unsigned)data[1] << 8) % 1024) + 1;
    /* an exact-size copy so a read past the end is caught */
    size_t len = size - 2;
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf)
        return 0;
    memcpy(buf, data + 2, len);

    struct coord_tok t;
    struct shardlm_err e;
    if (coord_tok_init(&t, buf, len, vocab, "fuzz", &e) == 0) {
        int32_t ids[sizeof(text) + 3];
        int n = coord_tok_encode(&t, text, true, true, ids, (int)(sizeof(ids) / sizeof(ids[0])));
        /* -EILSEQ: a vocabulary without byte tokens cannot spell the text. Otherwise at most
         * BOS, the dummy prefix, one id per byte, EOS */
        if (n == -EILSEQ)
            n = 0;
        if (n < 0 || n > (int)sizeof(text) + 2)
            __builtin_trap();
        volatile unsigned sink = 0;
        for (int i = 0; i < n; i++) {
            if (ids[i] < 0 || ids[i] >= t.vocab_size)
                __builtin_trap();
            size_t pl;
            const char *p = coord_tok_decode(&t, i ? ids[i - 1] : -1, ids[i], &pl);
            for (size_t j = 0; j < pl; j++)
                sink += (unsigned char)p[j];
            (void)coord_tok_printable(p, pl);
        }
        (void)sink;
        coord_tok_free(&t);
    }
    free(buf);
    return 0;
}
