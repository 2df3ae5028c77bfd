/* coordinator/: SentencePiece-BPE over a llama2.c vocabulary, the rules of llama2.c's run.c. */
#include "tokenizer.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_entry(const void *a, const void *b)
{
    return strcmp(((const struct coord_tok_entry *)a)->str, ((const struct coord_tok_entry *)b)->str);
}

void coord_tok_free(struct coord_tok *t)
{
    if (t->vocab)
        for (int i = 0; i < t->vocab_size; i++)
            free(t->vocab[i]);
    free(t->vocab);
    free(t->scores);
    free(t->sorted);
    memset(t, 0, sizeof(*t));
}

int coord_tok_init(struct coord_tok *t, const uint8_t *buf, size_t len, int vocab_size,
                   const char *what, struct coord_err *e)
{
    memset(t, 0, sizeof(*t));
    if (vocab_size <= 0 || vocab_size > (1 << 22))
        return coord_fail(e, -EINVAL, "%s: vocabulary size %d is out of range", what, vocab_size);
    if (len < 4)
        return coord_fail(e, -EINVAL, "%s: truncated before max_token_length", what);
    int32_t maxlen;
    memcpy(&maxlen, buf, 4);
    if (maxlen <= 0 || maxlen > 4096)
        return coord_fail(e, -EINVAL, "%s: field max_token_length is %d, expected 1..4096", what,
                          maxlen);
    /* every entry takes at least 8 bytes: a vocabulary larger than the file cannot be real */
    if ((size_t)vocab_size > (len - 4) / 8)
        return coord_fail(e, -EINVAL, "%s: %zu bytes cannot hold %d tokens", what, len, vocab_size);
    t->vocab_size = vocab_size;
    t->max_token_length = maxlen;
    t->bos_id = 1;
    t->eos_id = 2;
    t->vocab = calloc((size_t)vocab_size, sizeof(char *));
    t->scores = calloc((size_t)vocab_size, sizeof(float));
    t->sorted = calloc((size_t)vocab_size, sizeof(*t->sorted));
    if (!t->vocab || !t->scores || !t->sorted) {
        coord_tok_free(t);
        return coord_fail(e, -ENOMEM, "%s: out of memory", what);
    }
    size_t off = 4;
    for (int i = 0; i < vocab_size; i++) {
        int32_t n;
        if (len - off < 8) {
            coord_tok_free(t);
            return coord_fail(e, -EINVAL, "%s: truncated at token %d", what, i);
        }
        memcpy(&t->scores[i], buf + off, 4);
        memcpy(&n, buf + off + 4, 4);
        off += 8;
        if (n < 0 || n > maxlen || (size_t)n > len - off) {
            coord_tok_free(t);
            return coord_fail(e, -EINVAL, "%s: token %d: length %d, expected 0..%d within the file",
                              what, i, n, maxlen);
        }
        t->vocab[i] = malloc((size_t)n + 1);
        if (!t->vocab[i]) {
            coord_tok_free(t);
            return coord_fail(e, -ENOMEM, "%s: out of memory", what);
        }
        memcpy(t->vocab[i], buf + off, (size_t)n);
        t->vocab[i][n] = 0;
        off += (size_t)n;
        t->sorted[i].str = t->vocab[i];
        t->sorted[i].id = i;
    }
    if (off != len) {
        coord_tok_free(t);
        return coord_fail(e, -EINVAL, "%s: %zu bytes after the %d tokens (wrong vocabulary size?)",
                          what, len - off, vocab_size);
    }
    qsort(t->sorted, (size_t)vocab_size, sizeof(*t->sorted), cmp_entry);
    for (int i = 0; i < 256; i++) {
        t->byte_pieces[i * 2] = (char)i;
        t->byte_pieces[i * 2 + 1] = 0;
    }
    return 0;
}

static int lookup(const struct coord_tok *t, const char *s)
{
    struct coord_tok_entry key = {.str = s};
    const struct coord_tok_entry *r =
        bsearch(&key, t->sorted, (size_t)t->vocab_size, sizeof(key), cmp_entry);
    return r ? r->id : -1;
}

int coord_tok_encode(const struct coord_tok *t, const char *text, bool bos, bool eos, int32_t *out,
                     int max)
{
    size_t tl = strlen(text);
    /* worst case: bos, prefix, one id per byte, eos */
    int32_t *ids = malloc((tl + 3) * sizeof(int32_t));
    char *buf = malloc((size_t)t->max_token_length * 2 + 3);
    if (!ids || !buf) {
        free(ids);
        free(buf);
        return -ENOMEM;
    }
    int n = 0;
    if (bos)
        ids[n++] = t->bos_id;
    if (text[0]) {
        int prefix = lookup(t, " ");
        if (prefix >= 0)
            ids[n++] = prefix;
    }
    /* UTF-8 characters (at most 4 bytes) that are pieces, else their bytes (ids 3 + byte) */
    size_t blen = 0;
    for (const char *c = text; *c; c++) {
        if ((*c & 0xC0) != 0x80)
            blen = 0;
        buf[blen++] = *c;
        buf[blen] = 0;
        if ((c[1] & 0xC0) == 0x80 && blen < 4)
            continue;
        int id = lookup(t, buf);
        if (id >= 0) {
            ids[n++] = id;
        } else {
            /* byte fallback: ids 3..258 are <0x00>..<0xFF> in a llama2.c vocabulary */
            for (size_t i = 0; i < blen; i++) {
                int id = (unsigned char)buf[i] + 3;
                if (id >= t->vocab_size) {
                    free(ids);
                    free(buf);
                    return -EILSEQ;
                }
                ids[n++] = id;
            }
        }
        blen = 0;
    }
    /* merge the best-scoring adjacent pair until none is in the vocabulary */
    for (;;) {
        float best = -1e10f;
        int best_id = -1, best_i = -1;
        for (int i = 0; i + 1 < n; i++) {
            const char *a = t->vocab[ids[i]], *b = t->vocab[ids[i + 1]];
            size_t la = strlen(a), lb = strlen(b);
            if (la + lb > (size_t)t->max_token_length * 2)
                continue;
            memcpy(buf, a, la);
            memcpy(buf + la, b, lb + 1);
            int id = lookup(t, buf);
            if (id >= 0 && t->scores[id] > best) {
                best = t->scores[id];
                best_id = id;
                best_i = i;
            }
        }
        if (best_i < 0)
            break;
        ids[best_i] = best_id;
        memmove(ids + best_i + 1, ids + best_i + 2, (size_t)(n - best_i - 2) * sizeof(int32_t));
        n--;
    }
    if (eos)
        ids[n++] = t->eos_id;
    int rc = n;
    if (n > max)
        rc = -ENOSPC;
    else
        memcpy(out, ids, (size_t)n * sizeof(int32_t));
    free(ids);
    free(buf);
    return rc;
}

const char *coord_tok_decode(const struct coord_tok *t, int prev, int token, size_t *len)
{
    if (token < 0 || token >= t->vocab_size) {
        *len = 0;
        return "";
    }
    const char *piece = t->vocab[token];
    if (prev == t->bos_id && piece[0] == ' ')
        piece++;
    unsigned char byte;
    if (sscanf(piece, "<0x%02hhX>", &byte) == 1 && strlen(piece) == 6) {
        *len = 1;
        return t->byte_pieces + byte * 2;
    }
    *len = strlen(piece);
    return piece;
}

bool coord_tok_printable(const char *piece, size_t len)
{
    if (len == 0)
        return false;
    if (len == 1) {
        unsigned char b = (unsigned char)piece[0];
        return isprint(b) || isspace(b);
    }
    return true;
}
