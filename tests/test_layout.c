/* SPDX-License-Identifier: MIT */
/* coordinator/layout + shm CPU lists: parsing and formatting, and the layouts derived for this
 * machine (its CPUs split among workers, explicit maps, refusals). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <sched.h>

#include "layout.h"
#include "cpus.h"
#include "seg.h"
#include "testutil.h"

static void test_cpulist(void **state)
{
    int c[16];
    char out[64];
    const char *s = "0-3,8,10-11";
    assert_int_equal(seg_cpulist_parse(s, strlen(s), c, 16), 7);
    assert_int_equal(c[4], 8);
    assert_int_equal(c[6], 11);
    seg_cpulist_format(c, 7, out, sizeof(out));
    assert_string_equal(out, s);
    static const char *bad[] = {"", "-1", "3-1", "1,,2", "1,", "a", "0-", "0-2000"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        assert_int_equal(seg_cpulist_parse(bad[i], strlen(bad[i]), c, 16), -EINVAL);
    assert_int_equal(seg_cpulist_parse("0-20", 4, c, 16), -EINVAL); /* more than @max */
    assert_int_equal(seg_cpulist_parse("1,1", 3, c, 16), -EEXIST);   /* twice */
    assert_int_equal(seg_cpulist_parse("0-3,2", 5, c, 16), -EEXIST);
}

static int allowed_cpus(int *out)
{
    cpu_set_t set;
    sched_getaffinity(0, sizeof(set), &set);
    int n = 0;
    for (int i = 0; i < CPU_SETSIZE; i++)
        if (CPU_ISSET(i, &set))
            out[n++] = i;
    return n;
}

static void test_derived_layouts(void **state)
{
    int cpus[CPU_SETSIZE], n = allowed_cpus(cpus);
    struct coord_layout l;
    struct shardlm_err e;
    /* default: every CPU used exactly once, ranks never span nodes */
    struct coord_layout_opts o = {0};
    assert_int_equal(coord_layout_make(&l, &o, &e), 0);
    int total = 0;
    for (int r = 0; r < l.n_ranks; r++)
        total += l.ranks[r].n_cpus;
    assert_int_equal(total, n);
    coord_layout_free(&l);
    /* as many workers as CPUs: one each, disjoint */
    o.workers = n;
    assert_int_equal(coord_layout_make(&l, &o, &e), 0);
    assert_int_equal(l.n_ranks, n);
    for (int r = 0; r < n; r++) {
        assert_int_equal(l.ranks[r].n_cpus, 1);
        for (int q = 0; q < r; q++)
            assert_int_not_equal(l.ranks[r].cpus[0], l.ranks[q].cpus[0]);
    }
    coord_layout_free(&l);
    /* more workers than CPUs, or threads than a worker's CPUs */
    o.workers = n + 1;
    assert_int_equal(coord_layout_make(&l, &o, &e), -EINVAL);
    assert_non_null(strstr(e.msg, "more workers than the"));
    o.workers = 1;
    o.threads = n + 1;
    assert_int_equal(coord_layout_make(&l, &o, &e), -EINVAL);
    assert_non_null(strstr(e.msg, "--threads"));
    o.threads = 1;
    assert_int_equal(coord_layout_make(&l, &o, &e), 0);
    assert_int_equal(l.ranks[0].n_cpus, 1);
    coord_layout_free(&l);
}

static void test_explicit_layouts(void **state)
{
    int cpus[CPU_SETSIZE];
    allowed_cpus(cpus);
    char map[64];
    snprintf(map, sizeof(map), "%d:%d:%d", cpus[0], cpus[0], cpus[0]);
    struct coord_layout l;
    struct shardlm_err e;
    struct coord_layout_opts o = {.cpus = map};
    assert_int_equal(coord_layout_make(&l, &o, &e), 0); /* shared CPUs are allowed here */
    assert_int_equal(l.n_ranks, 3);
    assert_int_equal(l.ranks[2].cpus[0], cpus[0]);
    coord_layout_free(&l);
    o.workers = 2;
    assert_int_equal(coord_layout_make(&l, &o, &e), -EINVAL);
    o.workers = 0;
    o.cpus = "1023";
    assert_int_equal(coord_layout_make(&l, &o, &e), -EINVAL);
    assert_non_null(strstr(e.msg, "not available"));
    o.cpus = "0::1";
    assert_int_equal(coord_layout_make(&l, &o, &e), -EINVAL);
    assert_non_null(strstr(e.msg, "rank 1"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpulist),
        cmocka_unit_test(test_derived_layouts),
        cmocka_unit_test(test_explicit_layouts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
