/* coordinator/: SentencePiece-BPE tokenizer over a llama2.c tokenizer.bin vocabulary.
 * tokenizer.bin: int32 max_token_length, then per token: float score, int32 length, bytes. */
#ifndef SHARDLM_COORD_TOKENIZER_H
#define SHARDLM_COORD_TOKENIZER_H

#include "util.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct coord_tok_entry {
    const char *str; /* NUL-terminated piece */
    int id;
};

struct coord_tok {
    int vocab_size;
    int max_token_length;
    int bos_id, eos_id;
    char **vocab;   /* (vocab_size) pieces, NUL-terminated */
    float *scores;  /* (vocab_size) merge priority */
    struct coord_tok_entry *sorted; /* (vocab_size) by piece, for lookups */
    char byte_pieces[512]; /* "<0xNN>" pieces decode to the single byte NN */
};

/* Parses a tokenizer.bin image of exactly @vocab_size entries (@what names it in errors).
 * Returns 0 or -EINVAL with @e set. Release with coord_tok_free(). */
int coord_tok_init(struct coord_tok *t, const uint8_t *buf, size_t len, int vocab_size,
                   const char *what, struct coord_err *e);
void coord_tok_free(struct coord_tok *t);

/* Encodes @text (llama2.c rules: dummy-prefix space, UTF-8 characters or byte fallback, then
 * best-score pair merges). Writes at most @max ids to @out; returns the count, or -ENOSPC when
 * @max is too small, -EILSEQ for a character the vocabulary cannot spell (no byte tokens), -ENOMEM. */
int coord_tok_encode(const struct coord_tok *t, const char *text, bool bos, bool eos, int32_t *out,
                     int max);
/* The text of @token following @prev: a leading space after BOS is dropped, "<0xNN>" pieces are
 * that byte. Never NULL; *@len gets the byte count (pieces may contain NUL bytes). */
const char *coord_tok_decode(const struct coord_tok *t, int prev, int token, size_t *len);
/* Whether a decoded piece is worth printing (llama2.c safe_printf: a lone control byte is not). */
bool coord_tok_printable(const char *piece, size_t len);

#endif
