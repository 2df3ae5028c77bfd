/* SPDX-License-Identifier: MIT */
/* coordinator/util/utf8.c: the UTF-8 validator (utf8.h). */
#include "utf8.h"

bool coord_utf8_valid(const char *s, size_t n, size_t *bad)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, l;
    while (i < n && (l = coord_utf8_char(u + i, n - i)))
        i += l;
    if (bad)
        *bad = i;
    return i == n;
}
