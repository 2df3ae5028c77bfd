/* SPDX-License-Identifier: MIT */
/* Fuzz target for the tokenizer blob parser (coordinator/tok/blob.c, coord_tok_load: .shlm
 * tok_kind 2) and the encoder over what it accepts.
 *
 * Input: a blob. Its trailing checksum is recomputed first, so mutations reach the parser
 * rather than stopping at the checksum (the unit tests cover the checksum itself). What loads
 * must encode a fixed text into ids inside the vocabulary (or fail with -EILSEQ, or -EINVAL
 * for a regex past its match limit), decode every id back, and save to the same bytes. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "shlm.h"
#include "tokenizer.h"

static const char text[] =
    "Once upon a time, Lily's dog ran 1234 miles! <s>\xc3\xa9\xe2\x96\x81 \n\t\xff";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf)
        return 0;
    memcpy(buf, data, size);
    if (size >= 8) { /* FNV-1a 64 of everything before the last 8 bytes */
        uint64_t h = shlm_fnv1a(SHLM_FNV_OFFSET, buf, size - 8);
        memcpy(buf + size - 8, &h, 8);
    }
    struct coord_tok t;
    struct shardlm_err e;
    if (coord_tok_load(&t, buf, size, "fuzz", &e) == 0) {
        enum { MAX = sizeof(text) * 4 + 8 };
        int32_t ids[MAX];
        for (unsigned fl = 0; fl < 2; fl++) {
            unsigned flags = fl ? COORD_TOK_ENC_PARSE_SPECIAL | COORD_TOK_ENC_BOS |
                                  COORD_TOK_ENC_EOS : 0;
            int n = coord_tok_encode_ex(&t, text, sizeof(text) - 1, flags, ids, MAX);
            if (n == -EILSEQ || n == -EINVAL)
                continue;
            if (n < 0)
                __builtin_trap();
            volatile unsigned sink = 0;
            for (int i = 0; i < n; i++) {
                if (ids[i] < 0 || ids[i] >= t.vocab_size)
                    __builtin_trap();
                size_t pl;
                const char *p = coord_tok_decode(&t, i ? ids[i - 1] : -1, ids[i], &pl);
                for (size_t j = 0; j < pl; j++)
                    sink += (unsigned char)p[j];
            }
            (void)sink;
        }
        uint8_t *again;
        size_t al;
        if (coord_tok_save(&t, &again, &al) == 0) {
            if (al != size || memcmp(again, buf, size) != 0)
                __builtin_trap();
            free(again);
        }
        coord_tok_free(&t);
    } else if (!memchr(e.msg, 0, sizeof(e.msg)) || strncmp(e.msg, "fuzz", 4) != 0) {
        __builtin_trap();
    }
    free(buf);
    return 0;
}
