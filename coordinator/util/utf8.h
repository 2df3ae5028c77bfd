/* SPDX-License-Identifier: MIT */
/* coordinator/util/utf8.h: the one UTF-8 validator - well-formed UTF-8 as RFC 3629 defines it:
 * no overlong forms, no surrogates (U+D800..U+DFFF), nothing past U+10FFFF. Used by the
 * tokenizer (whole texts and a stream byte by byte), the Jinja interpreter (a template's source)
 * and the calibration reader (its text). The per-character parts are inline: the tokenizer
 * calls them for every character it encodes. */
#ifndef SHARDLM_COORD_UTF8_H
#define SHARDLM_COORD_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The bytes of the well-formed character that @c starts, or 0: a continuation byte, or a lead
 * byte of an overlong form (C0, C1) or past U+10FFFF (F5..FF). */
static inline size_t coord_utf8_need(unsigned char c)
{
    return c < 0x80                 ? 1
           : c >= 0xC2 && c <= 0xDF ? 2
           : c >= 0xE0 && c <= 0xEF ? 3
           : c >= 0xF0 && c <= 0xF4 ? 4
                                    : 0;
}

/* Whether @c may follow the lead byte @lead at place @i (1..3) of a well-formed character: a
 * continuation byte, in the narrower range the second byte has after E0 and F0 (no overlong
 * forms), ED (no surrogates) and F4 (nothing past U+10FFFF). */
static inline bool coord_utf8_follows(unsigned char lead, size_t i, unsigned char c)
{
    if ((c & 0xC0) != 0x80)
        return false;
    if (i != 1)
        return true;
    return !((lead == 0xE0 && c < 0xA0) || (lead == 0xED && c > 0x9F) ||
             (lead == 0xF0 && c < 0x90) || (lead == 0xF4 && c > 0x8F));
}

/* The bytes of the well-formed character at @s (at most @n > 0 bytes), or 0: not one, or cut
 * short. */
static inline size_t coord_utf8_char(const unsigned char *s, size_t n)
{
    size_t l = coord_utf8_need(s[0]);
    if (!l || l > n)
        return 0;
    for (size_t i = 1; i < l; i++)
        if (!coord_utf8_follows(s[0], i, s[i]))
            return 0;
    return l;
}

/* The code point of the well-formed character of @l bytes at @s (coord_utf8_char()'s length). */
static inline uint32_t coord_utf8_decode(const unsigned char *s, size_t l)
{
    static const uint8_t lead_mask[5] = {0, 0x7f, 0x1f, 0x0f, 0x07};
    uint32_t c = s[0] & lead_mask[l];
    for (size_t i = 1; i < l; i++)
        c = c << 6 | (s[i] & 0x3f);
    return c;
}

/* Writes code point @cp as UTF-8 at @o (room for 4 bytes); returns its bytes. */
static inline size_t coord_utf8_put(char *o, uint32_t cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | cp >> 6);
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12);
        o[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18);
    o[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    o[2] = (char)(0x80 | (cp >> 6 & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Whether the @n bytes at @s are well-formed UTF-8 (a NUL byte is: callers that refuse one
 * check for it). *@bad (may be NULL): the offset of the first character that is not
 * well-formed, or @n. */
bool coord_utf8_valid(const char *s, size_t n, size_t *bad);

#endif
