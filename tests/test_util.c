/* SPDX-License-Identifier: MIT */
/* Tests of coordinator/util: the UTF-8 validator (utf8.h) - well-formed text, and each way a
 * text fails (overlong forms, surrogates, past U+10FFFF, cut short, stray bytes) with the
 * offset of the character that does. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <string.h>

#include "utf8.h"

static void test_utf8(void **state)
{
    (void)state;
    static const struct {
        const char *s;
        size_t n;
        long bad; /* -1: well-formed */
    } cases[] = {
#define CASE(lit, bad) {lit, sizeof(lit) - 1, bad}
        CASE("", -1),
        CASE("plain ASCII", -1),
        CASE("a\0b", -1), /* NUL is a character; callers that refuse it check it */
        CASE("\xc2\x80 \xdf\xbf \xe0\xa0\x80 \xed\x9f\xbf \xee\x80\x80 \xef\xbf\xbf", -1),
        CASE("\xf0\x90\x80\x80 \xf4\x8f\xbf\xbf h\xc3\xa9llo \xe2\x98\x83", -1),
        /* overlong forms */
        CASE("ab\xc0\x80", 2),
        CASE("\xc1\xbf", 0),
        CASE("x\xe0\x80\xaf", 1),
        CASE("\xe0\x9f\xbf", 0),
        CASE("\xf0\x8f\xbf\xbf", 0),
        /* surrogates */
        CASE("\xed\xa0\x80", 0),
        CASE("ok \xed\xbf\xbf", 3),
        /* past U+10FFFF */
        CASE("\xf4\x90\x80\x80", 0),
        CASE("\xf5\x80\x80\x80", 0),
        CASE("\xf8\x88\x80\x80\x80", 0),
        CASE("\xff", 0),
        /* cut short, or a continuation missing or stray */
        CASE("abc\xc3", 3),
        CASE("\xe2\x98", 0),
        CASE("a\xf0\x9f\x98", 1),
        CASE("\xc3(", 0),
        CASE("\xe2\x28\xa1", 0),
        CASE("\xe2\x82\x28", 0),
        CASE("\x80", 0),
        CASE("\xc3\xa9\xbf", 2),
#undef CASE
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(*cases); i++) {
        size_t bad = 12345;
        bool ok = coord_utf8_valid(cases[i].s, cases[i].n, &bad);
        if (ok != (cases[i].bad < 0) ||
            bad != (cases[i].bad < 0 ? cases[i].n : (size_t)cases[i].bad))
            fail_msg("case %zu: valid %d, bad %zu", i, ok, bad);
        assert_int_equal(coord_utf8_valid(cases[i].s, cases[i].n, NULL), ok);
    }
    /* every code point's encoding is well-formed and one character long; every 2-byte pair
     * agrees with the definition */
    for (unsigned cp = 0; cp <= 0x10ffff; cp++) {
        unsigned char b[4];
        size_t l = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
        if (l == 1)
            b[0] = (unsigned char)cp;
        else {
            b[0] = (unsigned char)((0xf00 >> l) | (cp >> (6 * (l - 1))));
            for (size_t k = 1; k < l; k++)
                b[k] = (unsigned char)(0x80 | ((cp >> (6 * (l - 1 - k))) & 0x3f));
        }
        size_t got = coord_utf8_char(b, l);
        bool surrogate = cp >= 0xd800 && cp <= 0xdfff;
        if (got != (surrogate ? 0 : l))
            fail_msg("U+%04X: %zu bytes", cp, got);
    }
    for (unsigned p = 0; p < 0x10000; p++) { /* RFC 3629's table for two bytes */
        unsigned char b[2] = {(unsigned char)(p >> 8), (unsigned char)p};
        bool cont = b[1] >= 0x80 && b[1] <= 0xbf;
        bool want = (b[0] < 0x80 && b[1] < 0x80) || (b[0] >= 0xc2 && b[0] <= 0xdf && cont);
        if (coord_utf8_valid((const char *)b, 2, NULL) != want)
            fail_msg("%02X %02X: valid %d", b[0], b[1], !want);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_utf8),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
