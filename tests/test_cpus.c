/* SPDX-License-Identifier: MIT */
/* shm/cpus: CPU lists - what a list may say, and that parsing never reads past the length it is
 * given (the coordinator parses each rank's part of "0-3:4-7" in place). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "cpus.h"
#include "testutil.h"

static void test_parse_format(void **state)
{
    int c[SEG_MAX_CPUS];
    char out[64];
    const char *s = "0-3,8,10-11";
    assert_int_equal(seg_cpulist_parse(s, strlen(s), c, 16), 7);
    assert_int_equal(c[4], 8);
    assert_int_equal(c[6], 11);
    seg_cpulist_format(c, 7, out, sizeof(out));
    assert_string_equal(out, s);
    assert_int_equal(seg_cpulist_parse("1023", 4, c, 16), 1); /* the highest CPU */
    assert_int_equal(c[0], 1023);
    assert_int_equal(seg_cpulist_parse("0-1023", 6, c, SEG_MAX_CPUS), SEG_MAX_CPUS);
    seg_cpulist_format(c, SEG_MAX_CPUS, out, sizeof(out));
    assert_string_equal(out, "0-1023");
}

/* Digits, '-' and ',' only: strtol's leading blanks and signs are not CPU numbers. */
static void test_refused(void **state)
{
    int c[16];
    static const char *bad[] = {"",     "-1", "3-1", "1,,2", "1,",   "a",  "0-",   "0-2000",
                                "1024", " 1", "+1",  "1- 3", "1-+3", "1 ", "1,2x", "0x1"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        if (seg_cpulist_parse(bad[i], strlen(bad[i]), c, 16) != -EINVAL)
            fail_msg("'%s' was accepted", bad[i]);
    assert_int_equal(seg_cpulist_parse("0-20", 4, c, 16), -EINVAL); /* more than @max */
    assert_int_equal(seg_cpulist_parse("1,1", 3, c, 16), -EEXIST);  /* twice */
    assert_int_equal(seg_cpulist_parse("0-3,2", 5, c, 16), -EEXIST);
}

/* Only the first @len bytes count, even when the digits go on after them. */
static void test_length_bounds(void **state)
{
    int c[16];
    assert_int_equal(seg_cpulist_parse("12", 1, c, 16), 1);
    assert_int_equal(c[0], 1);
    assert_int_equal(seg_cpulist_parse("0-35", 3, c, 16), 4); /* "0-3" */
    assert_int_equal(c[3], 3);
    const char *two = "0-3:4-7"; /* each rank's part in place, as the layout parses it */
    assert_int_equal(seg_cpulist_parse(two, 3, c, 16), 4);
    assert_int_equal(seg_cpulist_parse(two + 4, 3, c, 16), 4);
    assert_int_equal(c[0], 4);
    assert_int_equal(seg_cpulist_parse("7,8", 2, c, 16), -EINVAL); /* "7," */
}

/* Formatting into a short buffer cuts the list, never overruns it. */
static void test_format_short(void **state)
{
    int c[] = {0, 1, 2, 5, 7, 8};
    char out[8];
    memset(out, 'x', sizeof(out));
    seg_cpulist_format(c, 6, out, 6);
    assert_true(strlen(out) < 6);
    assert_int_equal(out[6], 'x');
    seg_cpulist_format(c, 0, out, sizeof(out));
    assert_string_equal(out, "");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_format),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_length_bounds),
        cmocka_unit_test(test_format_short),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
