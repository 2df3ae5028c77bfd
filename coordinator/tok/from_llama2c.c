/* SPDX-License-Identifier: MIT */
/* coordinator/tok/from_llama2c.c: the tokenizer of a llama2.c tokenizer.bin (int32
 * max_token_length, then per token: float score, int32 length, bytes), with run.c's rules. */
#include "tok_internal.h"

#include "sniff.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int coord_tok_llama2c_count(const uint8_t *buf, size_t len)
{
    if (len < 4)
        return -EINVAL;
    int32_t maxlen;
    memcpy(&maxlen, buf, 4);
    if (maxlen <= 0 || maxlen > 4096)
        return -EINVAL;
    size_t off = 4;
    int n = 0;
    while (off < len) {
        int32_t l;
        if (len - off < 8 || n >= COORD_TOK_MAX_VOCAB)
            return -EINVAL;
        memcpy(&l, buf + off + 4, 4);
        off += 8;
        if (l < 0 || l > maxlen || (size_t)l > len - off)
            return -EINVAL;
        off += (size_t)l;
        n++;
    }
    return n > 0 ? n : -EINVAL;
}

/* Reads the @s->n entries of tokenizer.bin image @buf (@len bytes, longest piece @maxlen) into
 * @s (pieces borrowed from @buf) and @scores. Returns 0 or -EINVAL with @e set. */
static int read_entries(const uint8_t *buf, size_t len, int maxlen, struct tok_src *s,
                        float *scores, const char *what, struct shardlm_err *e)
{
    size_t off = 4;
    for (int i = 0; i < s->n; i++) {
        int32_t n;
        if (len - off < 8)
            return shardlm_fail(e, -EINVAL, "%s: truncated at token %d", what, i);
        memcpy(&scores[i], buf + off, 4);
        memcpy(&n, buf + off + 4, 4);
        off += 8;
        if (n < 0 || n > maxlen || (size_t)n > len - off)
            return shardlm_fail(e, -EINVAL,
                                "%s: token %d: length %d, expected 0..%d within the "
                                "file",
                                what, i, n, maxlen);
        /* run.c reads pieces as C strings: a NUL ends one */
        s->p[i] = (const char *)buf + off;
        s->plen[i] = (uint32_t)strnlen(s->p[i], (size_t)n);
        off += (size_t)n;
    }
    if (off != len)
        return shardlm_fail(e, -EINVAL,
                            "%s: %zu bytes after the %d tokens (wrong vocabulary "
                            "size?)",
                            what, len - off, s->n);
    return 0;
}

int coord_tok_init(struct coord_tok *t, const uint8_t *buf, size_t len, int vocab_size,
                   const char *what, struct shardlm_err *e)
{
    memset(t, 0, sizeof(*t));
    if (vocab_size <= 0 || vocab_size > (1 << 22))
        return shardlm_fail(e, -EINVAL, "%s: vocabulary size %d is out of range", what, vocab_size);
    if (len < 4)
        return shardlm_fail(e, -EINVAL, "%s: truncated before max_token_length", what);
    int32_t maxlen;
    memcpy(&maxlen, buf, 4);
    if (maxlen <= 0 || maxlen > 4096) {
        /* a file of another format (its magic, or JSON's '{' - a max_token_length of 123 reads
         * as one, so only where the field is wrong) is named as such */
        static const char *const looks_like[] = {[COORD_FORMAT_SHLM] = "a .shlm model",
                                                 [COORD_FORMAT_GGUF] = "a GGUF file",
                                                 [COORD_FORMAT_TOK_BLOB] =
                                                     "a shardlm tokenizer blob",
                                                 [COORD_FORMAT_JSON] = "JSON (a tokenizer.json?)"};
        enum coord_format fmt = coord_format_sniff_image(buf, len);
        if (fmt < sizeof(looks_like) / sizeof(looks_like[0]) && looks_like[fmt])
            return shardlm_fail(e, -EINVAL, "%s: %s, not a llama2.c tokenizer.bin", what,
                                looks_like[fmt]);
        return shardlm_fail(e, -EINVAL, "%s: field max_token_length is %d, expected 1..4096", what,
                            maxlen);
    }
    /* every entry takes at least 8 bytes: a vocabulary larger than the file cannot be real */
    if ((size_t)vocab_size > (len - 4) / 8)
        return shardlm_fail(e, -EINVAL, "%s: %zu bytes cannot hold %d tokens", what, len,
                            vocab_size);
    struct tok_src s = {.type = COORD_TOK_SPM_LLAMA2C, .flags = COORD_TOKF_ADD_BOS,
                        .n = vocab_size, .bos = 1, .eos = 2, .unk = -1,
                        .max_token_length = maxlen};
    s.p = malloc((size_t)vocab_size * sizeof(char *));
    s.plen = malloc((size_t)vocab_size * sizeof(uint32_t));
    float *scores = malloc((size_t)vocab_size * sizeof(float));
    uint8_t *attrs = calloc((size_t)vocab_size, 1); /* COORD_TOKT_UNDEFINED */
    int rc;
    if (!s.p || !s.plen || !scores || !attrs) {
        rc = shardlm_fail(e, -ENOMEM, "%s: out of memory", what);
        goto out;
    }
    if ((rc = read_entries(buf, len, maxlen, &s, scores, what, e)))
        goto out;
    s.scores = scores;
    s.attrs = attrs;
    rc = tok_finish(t, &s, what, e);
out:
    free(s.p);
    free(s.plen);
    free(scores);
    free(attrs);
    return rc;
}
