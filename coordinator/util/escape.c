/* SPDX-License-Identifier: MIT */
/* coordinator/util/escape.c: strings from files and clients made safe for a terminal or a log
 * line - a model's name, architecture or chat template must not move the cursor, clear the
 * screen or start a forged line. */
#include "util.h"

#include <stdio.h>
#include <string.h>

/* Length of the well-formed UTF-8 sequence at @p (@n bytes left) that is neither a C1 control
 * (U+0080..U+009F: CSI and friends on some terminals) nor a bidirectional override or isolate
 * (U+202A..U+202E, U+2066..U+2069: text that reads other than it is); 0 for anything else. */
static size_t utf8_printable(const unsigned char *p, size_t n)
{
    unsigned c;
    size_t len;
    if (p[0] >= 0xc2 && p[0] <= 0xdf) {
        len = 2;
        c = p[0] & 0x1fu;
    } else if (p[0] >= 0xe0 && p[0] <= 0xef) {
        len = 3;
        c = p[0] & 0x0fu;
    } else if (p[0] >= 0xf0 && p[0] <= 0xf4) {
        len = 4;
        c = p[0] & 0x07u;
    } else {
        return 0;
    }
    if (n < len)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((p[i] & 0xc0) != 0x80)
            return 0;
        c = c << 6 | (p[i] & 0x3fu);
    }
    if ((len == 3 && c < 0x800) || (len == 4 && (c < 0x10000 || c > 0x10ffff)) ||
        (c >= 0xd800 && c <= 0xdfff))
        return 0; /* overlong, past Unicode, or a surrogate */
    if (c <= 0x9f || (c >= 0x202a && c <= 0x202e) || (c >= 0x2066 && c <= 0x2069))
        return 0;
    return len;
}

const char *coord_escape(char *buf, size_t cap, const char *s, size_t len)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t o = 0;
    if (cap < 8) {
        if (cap)
            buf[0] = 0;
        return buf;
    }
    for (size_t i = 0; i < len;) {
        char esc[8];
        size_t n = 1, w;
        const char *out = esc;
        if (p[i] >= 0x20 && p[i] < 0x7f && p[i] != '\\') {
            esc[0] = (char)p[i];
            w = 1;
        } else if (p[i] >= 0x80 && (n = utf8_printable(p + i, len - i))) {
            out = s + i;
            w = n;
        } else {
            n = 1;
            static const char named[][3] = {['\n'] = "\\n", ['\t'] = "\\t", ['\r'] = "\\r"};
            if (p[i] == '\\')
                memcpy(esc, "\\\\", w = 2);
            else if (p[i] < sizeof(named) / sizeof(named[0]) && named[p[i]][0])
                memcpy(esc, named[p[i]], w = 2);
            else
                w = (size_t)snprintf(esc, sizeof(esc), "\\x%02x", p[i]);
        }
        /* room for this piece, and for "..." and the NUL if more follows */
        size_t need = w + (i + n < len ? 4 : 1);
        if (o + need > cap) {
            memcpy(buf + o, "...", 3);
            o += 3;
            break;
        }
        memcpy(buf + o, out, w);
        o += w;
        i += n;
    }
    buf[o] = 0;
    return buf;
}

const char *coord_escape_str(char *buf, size_t cap, const char *s)
{
    return coord_escape(buf, cap, s ? s : "(null)", s ? strlen(s) : 6);
}
