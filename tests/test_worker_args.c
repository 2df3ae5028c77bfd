/* SPDX-License-Identifier: MIT */
/* worker/main: shardlm-worker's command line, run as the built binary (beside SHARDLM_BIN). Every
 * integer strict and within its range, unknown options and left-over arguments refused, the
 * required ones demanded: each a one-line "shardlm-worker: ..." naming the argument and exit 2,
 * before the worker looks for its coordinator. Arguments that are right get as far as that check
 * (the coordinator pid given is not this test, the parent, so the worker exits 1 there). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <limits.h>

#include "testutil.h"

static char worker[PATH_MAX + 32];

static void run_worker(struct tu_run *r, const char *const args[])
{
    char *argv[32] = {worker};
    int n = 1;
    for (int i = 0; args[i] && n < 31; i++)
        argv[n++] = (char *)args[i];
    argv[n] = NULL;
    tu_run_cmd(r, argv, NULL, 20, NULL, NULL);
}

#define E "--endpoint", "ipc:///nonexistent/shardlm-test.sock"
#define R "--rank", "0"
#define C "--coordinator-pid", "1"

struct bad_case {
    const char *args[16];
    const char *needle; /* what the one line must say */
};

static void test_refused(void **state)
{
    static const struct bad_case cases[] = {
        {{NULL}, "--endpoint is required"},
        {{E, C}, "--rank is required"},
        {{E, R}, "--coordinator-pid is required"},
        {{E, "--endpoint", "", R, C}, "--endpoint is empty"},
        {{E, "--rank", "x", C}, "--rank 'x': expected 0..63"},
        {{E, "--rank", "5x", C}, "--rank '5x'"},
        {{E, "--rank", "64", C}, "--rank '64'"},
        {{E, "--rank", "-1", C}, "--rank '-1'"},
        {{E, "--rank", "", C}, "--rank ''"},
        {{E, R, "--coordinator-pid", "12abc"}, "--coordinator-pid '12abc': expected 1..2147483647"},
        {{E, R, "--coordinator-pid", "0"}, "--coordinator-pid '0'"},
        {{E, R, "--coordinator-pid", "99999999999999999999"}, "--coordinator-pid '9999"},
        {{E, R, C, "--node", "1.5"}, "--node '1.5': expected -1..1023"},
        {{E, R, C, "--node", "-2"}, "--node '-2'"},
        {{E, R, C, "--threads", "3x"}, "--threads '3x': expected 0..1024"},
        {{E, R, C, "--threads", "-1"}, "--threads '-1'"},
        {{E, R, C, "--threads", "4", "--cpus", "0-1"}, "--threads 4: only 2 CPUs given"},
        {{E, R, C, "--cpus", "0-x"}, "--cpus '0-x' is not a CPU list"},
        {{E, R, C, "--cpus", "1,1"}, "--cpus '1,1' is not a CPU list (a CPU twice)"},
        {{E, R, C, "--bogus"}, "unknown option '--bogus'"},
        {{E, R, C, "-x"}, "unknown option '-x'"},
        {{E, C, "--rank"}, "option '--rank' needs a value"},
        {{E, R, C, "stray"}, "unexpected argument 'stray'"},
        /* the kernel table and the prefetch mode come on the command line, checked there */
        {{E, R, C, "--isa", "sse9"}, "--isa 'sse9': unknown kernel table 'sse9'"},
        {{E, R, C, "--isa", ""}, "--isa '': unknown kernel table ''"},
        {{E, R, C, "--prefetch", "l3"}, "--prefetch 'l3': expected auto, hw, l1 or l2"},
        {{E, R, C, "--prefetch", "L2"}, "--prefetch 'L2'"},
        {{E, R, C, "--isa"}, "option '--isa' needs a value"},
    };
    struct tu_run *r = malloc(sizeof(*r));
    int wrong = 0;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const struct bad_case *c = &cases[i];
        run_worker(r, c->args);
        const char *nl = strchr(r->err, '\n');
        bool one_line = nl && nl[1] == 0 && !strncmp(r->err, "shardlm-worker: ", 16);
        if (r->status != 2 || !one_line || !strstr(r->err, c->needle) || r->out_len) {
            print_message("case %zu (wanted exit 2 and one line with '%s'): exit %d, stderr: %s\n",
                          i, c->needle, r->status, r->err);
            wrong++;
        }
    }
    free(r);
    assert_int_equal(wrong, 0);
}

/* Right arguments, in every form, get to the coordinator check: exit 1 saying so. */
static void test_accepted(void **state)
{
    static const char *const cases[][16] = {
        {E, R, C},
        {C, R, E}, /* any order */
        {E, "--rank=63", "--coordinator-pid=2147483647", "--node", "-1"},
        {E, R, C, "--node", "0", "--cpus", "0", "--threads", "1", "--keys", "/nonexistent"},
        {E, R, C, "--cpus", "0-1", "--threads", "0"},
        {E, R, C, "--isa", "ref", "--prefetch", "hw"},
        {E, R, C, "--isa=ref", "--prefetch=auto"},
        {E, R, C, "--prefetch", "l2"},
    };
    struct tu_run *r = malloc(sizeof(*r));
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        run_worker(r, cases[i]);
        if (r->status != 1 || !strstr(r->err, "is not my parent"))
            fail_msg("case %zu: exit %d, stderr: %s", i, r->status, r->err);
    }
    static const char *const help[] = {"--help", NULL};
    run_worker(r, help);
    assert_int_equal(r->status, 0);
    assert_non_null(strstr(r->out, "usage: shardlm-worker --endpoint ENDPOINT --rank R"));
    free(r);
}

int main(void)
{
    tu_worker(worker, sizeof(worker));
    if (access(worker, X_OK) != 0) {
        fprintf(stderr, "FAIL: no shardlm-worker at %s (beside SHARDLM_BIN)\n", worker);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_accepted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
