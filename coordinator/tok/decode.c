/* SPDX-License-Identifier: MIT */
/* coordinator/tok/decode.c: ids to text: the decoded text of each token (built once), a token's
 * text after the one before it, and UTF-8 output streamed piece by piece. */
#include "tok_internal.h"
#include "utf8.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Byte-level piece @p (@n bytes) to its bytes, at @o: each GPT-2 character (@inv: code point ->
 * byte, -1) its byte, anything else as it is. Returns the bytes written (at most @n). */
static size_t unbyte_level(const int16_t *inv, const char *p, size_t n, char *o)
{
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t l = tok_get_utf8(p + i, n - i, &cp);
        if (l && cp < 324 && inv[cp] >= 0) {
            o[k++] = (char)inv[cp];
        } else { /* not a GPT-2 character: as it is */
            l = l ? l : 1;
            memcpy(o + k, p + i, l);
            k += l;
        }
        i += l;
    }
    return k;
}

/* Piece @p (@n bytes) with each U+2581 a space, at @o. Returns the bytes written. */
static size_t unescape_ws(const char *p, size_t n, char *o)
{
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        if (n - i >= 3 && memcmp(p + i, TOK_ESC_WS, 3) == 0) {
            o[k++] = ' ';
            i += 3;
        } else {
            o[k++] = p[i++];
        }
    }
    return k;
}

/* The text token @id decodes to (llama.cpp token_to_piece with special = false), at @o (room
 * for its piece's bytes). Returns the bytes written. */
static size_t decode_token(const struct coord_tok *t, const int16_t *inv, int id, char *o)
{
    const char *p = t->vocab[id];
    size_t n = t->vocab_len[id];
    int ty = tok_ttype(t, id);
    unsigned b;
    if (ty == COORD_TOKT_CONTROL || ty == COORD_TOKT_UNKNOWN)
        return 0;
    if (ty == COORD_TOKT_BYTE && tok_byte_piece(p, n, &b)) {
        o[0] = (char)b;
        return 1;
    }
    if (!(ty == COORD_TOKT_USER_DEFINED || ty == COORD_TOKT_BYTE)) {
        if (t->flags & COORD_TOKF_BYTE_LEVEL)
            return unbyte_level(inv, p, n, o);
        if (t->flags & COORD_TOKF_ESCAPE_WS)
            return unescape_ws(p, n, o);
    }
    /* user-defined runs of U+2581 (Gemma 3's "▁▁"...) are spaces too, as HF's Replace decoder
     * makes them */
    if (ty == COORD_TOKT_USER_DEFINED && (t->flags & COORD_TOKF_ESCAPE_WS))
        return unescape_ws(p, n, o);
    memcpy(o, p, n);
    return n;
}

int tok_build_decoded(struct coord_tok *t, const char *what, struct shardlm_err *e)
{
    size_t total = 0;
    for (int i = 0; i < t->vocab_size; i++)
        total += t->vocab_len[i] + 1;
    t->dec = malloc((size_t)t->vocab_size * sizeof(char *));
    t->dec_len = malloc((size_t)t->vocab_size * sizeof(uint32_t));
    t->dec_arena = malloc(total ? total : 1);
    if (!t->dec || !t->dec_len || !t->dec_arena)
        return shardlm_fail(e, -ENOMEM, "%s: out of memory", what);
    int16_t inv[324]; /* GPT-2 character -> byte */
    for (int i = 0; i < 324; i++)
        inv[i] = -1;
    for (unsigned b = 0; b < 256; b++)
        inv[tok_gpt2_cp(b)] = (int16_t)b;
    char *o = t->dec_arena;
    for (int id = 0; id < t->vocab_size; id++) {
        size_t k = decode_token(t, inv, id, o);
        o[k] = 0;
        t->dec[id] = o;
        t->dec_len[id] = (uint32_t)k;
        o += k + 1;
    }
    return 0;
}

const char *coord_tok_text(const struct coord_tok *t, int token, size_t *len)
{
    if (token >= 0 && token < t->vocab_size && t->type != COORD_TOK_SPM_LLAMA2C) {
        *len = t->dec_len[token];
        return t->dec[token];
    }
    return coord_tok_decode(t, -2, token, len); /* llama2.c: no BOS before, no dummy prefix */
}

const char *coord_tok_decode(const struct coord_tok *t, int prev, int token, size_t *len)
{
    if (token < 0 || token >= t->vocab_size) {
        *len = 0;
        return "";
    }
    if (t->type == COORD_TOK_SPM_LLAMA2C) {
        const char *piece = t->vocab[token];
        if (prev >= 0 && prev == t->bos_id && piece[0] == ' ')
            piece++;
        unsigned char byte;
        if (sscanf(piece, "<0x%02hhX>", &byte) == 1 && strlen(piece) == 6) {
            *len = 1;
            return t->byte_pieces + byte * 2;
        }
        *len = strlen(piece);
        return piece;
    }
    const char *p = t->dec[token];
    size_t n = t->dec_len[token];
    /* the dummy prefix of the first fragment, or of the one after a special token */
    if ((t->flags & COORD_TOKF_SPACE_PREFIX) && !(t->flags & COORD_TOKF_BYTE_LEVEL) && n &&
        p[0] == ' ') {
        bool start = prev < 0 || prev >= t->vocab_size || prev == t->bos_id;
        if (!(t->flags & COORD_TOKF_PREFIX_FIRST) && !start)
            start = tok_is_special(t, prev);
        if (start) {
            p++;
            n--;
        }
    }
    *len = n;
    return p;
}

bool coord_tok_printable(const char *piece, size_t len)
{
    if (len == 0)
        return false;
    if (len == 1) { /* bytes past ASCII are a part of a character: coord_utf8_feed() */
        unsigned char b = (unsigned char)piece[0];
        return b >= 0x80 || isprint(b) || isspace(b);
    }
    return true;
}

/* ---- UTF-8 output ---- */

static const char REPLACEMENT[] = "\xef\xbf\xbd"; /* U+FFFD */

size_t coord_utf8_feed(struct coord_utf8 *u, const char *in, size_t n, char *out)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)in[i];
        if (u->n && !coord_utf8_follows(u->held[0], u->n, c)) { /* cut short: c starts afresh */
            memcpy(out + o, REPLACEMENT, 3);
            o += 3;
            u->n = 0;
        }
        if (u->n) {
            u->held[u->n++] = c;
            if (u->n == u->need) {
                memcpy(out + o, u->held, u->n);
                o += u->n;
                u->n = 0;
            }
            continue;
        }
        size_t need = coord_utf8_need(c);
        if (need == 1) {
            out[o++] = (char)c;
        } else if (need == 0) {
            memcpy(out + o, REPLACEMENT, 3);
            o += 3;
        } else {
            u->held[0] = c;
            u->n = 1;
            u->need = (uint8_t)need;
        }
    }
    return o;
}

size_t coord_utf8_flush(struct coord_utf8 *u, char *out)
{
    if (!u->n)
        return 0;
    u->n = 0;
    memcpy(out, REPLACEMENT, 3);
    return 3;
}
