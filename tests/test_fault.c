/* SPDX-License-Identifier: MIT */
/* tests/test_fault.c: every error path of the engine's start, load and step, walked by fault
 * injection (shm/fault.h), as SQLite's fault simulation walks its own: for one site at a time,
 * the Nth call fails, for N = 1, 2, ... until a run makes fewer than N calls. A run is a start
 * (the weights streamed from the file into fresh segments), a prefill step, a decode step and a
 * stop, in this process with a real worker on stories260K. Each run must end either in a clear
 * error (-errno, one line naming what failed) or, where the engine has a way around the fault,
 * with the logits of a run without faults; either way nothing is left in the runtime directory
 * and no worker lives on. Under ASan (.ci/run) whatever a failed run leaks is reported at exit.
 *
 * coordinator sites: malloc, calloc, realloc and posix_memalign of our code (this test is linked
 *                    with -Wl,--wrap, so the calls of the engine's libraries come here first;
 *                    libc's, ZeroMQ's and protobuf-c's own allocations do not), mmap, fallocate
 *                    and mbind of segments and files, io_uring submissions of the load; with
 *                    memfd segments (--no-persist) and with persistent ones built cold;
 * worker sites:      mmap in the worker (its segments), armed through SHARDLM_FAULT in the
 *                    environment the workers inherit. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>


#include "engine.h"
#include "fault.h"
#include "testutil.h"

/* ---- the allocator behind SHARDLM_FAULT_MALLOC ---- */

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
int __real_posix_memalign(void **p, size_t align, size_t n);

void *__wrap_malloc(size_t n)
{
    if (shardlm_fault(SHARDLM_FAULT_MALLOC)) {
        errno = ENOMEM;
        return NULL;
    }
    return __real_malloc(n);
}

void *__wrap_calloc(size_t n, size_t size)
{
    if (shardlm_fault(SHARDLM_FAULT_MALLOC)) {
        errno = ENOMEM;
        return NULL;
    }
    return __real_calloc(n, size);
}

void *__wrap_realloc(void *p, size_t n)
{
    if (shardlm_fault(SHARDLM_FAULT_MALLOC)) {
        errno = ENOMEM;
        return NULL;
    }
    return __real_realloc(p, n);
}

int __wrap_posix_memalign(void **p, size_t align, size_t n)
{
    return shardlm_fault(SHARDLM_FAULT_MALLOC) ? ENOMEM : __real_posix_memalign(p, align, n);
}

/* ---- one run ---- */

#define VOCAB 512        /* stories260K */
#define MAX_CALLS 100000 /* a site that never stops firing is a bug in the loop, not a pass */

static char dir[4096];    /* this test's files */
static char rundir[4200]; /* the engine's runtime directory */
static char model[4300];  /* stories260K at w4a8: the load repacks into tiles */
static char worker[4300]; /* shardlm-worker beside the shardlm binary */

static void ignore_log(void *ctx, enum coord_log_level level, const char *msg) {}

static const int32_t prompt[] = {1, 403, 407, 261}; /* BOS, then some tokens of the vocabulary */

/* The logits of a run: after the prefill of the prompt and after one decode step. */
struct logits {
    float prefill[VOCAB], decode[VOCAB];
};

/* Starts the engine (@persist: persistent weights segments, else memfds), runs the prefill and
 * one decode step into @out, stops. Returns 0 or the first error, with @e set; nothing in here
 * allocates but the engine, so an armed malloc fault counts the engine's calls only. */
static int run(bool persist, struct logits *out, struct shardlm_err *e)
{
    struct coord_engine_opts o = {.model_path = model,
                                  .rundir = rundir,
                                  .worker_path = worker,
                                  .log = ignore_log,
                                  .load.no_persist = !persist};
    struct coord_engine *g = NULL;
    int rc = coord_engine_start(&g, &o, e);
    if (rc)
        return rc;
    struct coord_seq_step s = {.n_tokens = 4, .tokens = prompt};
    if (!(rc = coord_engine_step(g, &s, 1, e))) {
        memcpy(out->prefill, s.logits, sizeof(out->prefill));
        s = (struct coord_seq_step){.pos = 4, .n_tokens = 1, .tokens = prompt + 3};
        if (!(rc = coord_engine_step(g, &s, 1, e)))
            memcpy(out->decode, s.logits, sizeof(out->decode));
    }
    coord_engine_stop(g);
    return rc;
}

/* Removes the persistent weights segments of the runtime directory: the next start builds its
 * own from the file. */
static void purge_weights(void)
{
    char cmd[4400];
    tu_path(cmd, sizeof(cmd), "rm -f '%s'/w-*", rundir);
    assert_int_equal(system(cmd), 0);
}

static struct logits clean; /* a run without faults */

static int setup(void **state)
{
    tu_mkdtemp(dir, sizeof(dir), "fault");
    tu_path(rundir, sizeof(rundir), "%s/run", dir);
    tu_path(model, sizeof(model), "%s/w4a8.shlm", dir);
    tu_worker(worker, sizeof(worker));
    if (tu_convert(model, "w4a8", NULL))
        return -1;
    struct shardlm_err e = {{0}};
    int rc = run(false, &clean, &e);
    if (rc)
        fprintf(stderr, "a run without faults failed: %s\n", e.msg);
    return rc;
}

static int teardown(void **state)
{
    tu_rmdir(dir);
    return 0;
}

/* What one site's walk found. */
struct walk {
    int failed;    /* runs that ended in an error */
    int tolerated; /* runs whose fault fired and that still gave the clean logits */
    long calls;    /* calls the site saw in a run without its fault firing */
    char first[sizeof(((struct shardlm_err *)0)->msg)]; /* the first run's error, for the log */
};

/* Checks the end of one run whose fault @fired (or, for a worker site, may have): an error is a
 * clear one, a success gives the clean logits, and nothing is left behind. */
static void check_run(const char *what, long n, bool fired, int rc, const struct shardlm_err *e,
                      const struct logits *got, struct walk *w)
{
    if (rc) {
        if (!fired || rc > 0 || rc == -ECANCELED || !e->msg[0] || strchr(e->msg, '\n'))
            fail_msg("%s, call %ld: error %d \"%s\"%s", what, n, rc, e->msg,
                     fired ? "" : " with no fault fired");
        if (!w->failed++)
            snprintf(w->first, sizeof(w->first), "%s", e->msg);
    } else {
        if (memcmp(got, &clean, sizeof(clean)))
            fail_msg("%s, call %ld failed: the run went on with other logits", what, n);
        w->tolerated += fired;
    }
    int left = tu_count_run_files(rundir);
    if (left != 0) {
        char ls[4400], out[2048];
        tu_path(ls, sizeof(ls), "ls -A '%s'", rundir);
        tu_cmd_output(ls, out, sizeof(out));
        fail_msg("%s, call %ld: %d files left in the runtime directory:\n%s", what, n, left, out);
    }
    if (tu_workers_alive(rundir))
        fail_msg("%s, call %ld: a worker outlived the engine", what, n);
}

/* Fails the Nth call of coordinator site @site, N = 1, 2, ..., one run each, until a run ends
 * without the fault firing. */
static struct walk walk_site(enum shardlm_fault_site site, bool persist)
{
    struct walk w = {0};
    char what[64];
    snprintf(what, sizeof(what), "%s (%s segments)", shardlm_fault_name(site),
             persist ? "persistent" : "memfd");
    for (long n = 1;; n++) {
        assert_true(n < MAX_CALLS);
        if (persist)
            purge_weights();
        struct shardlm_err e = {{0}};
        struct logits got;
        shardlm_fault_arm(site, n);
        int rc = run(persist, &got, &e);
        bool fired = shardlm_fault_fired(site);
        long calls = shardlm_fault_calls(site);
        shardlm_fault_arm(site, 0);
        check_run(what, n, fired, rc, &e, &got, &w);
        if (!fired) {
            w.calls = calls;
            break;
        }
    }
    print_message("%-30s %4ld calls a run: %d failed cleanly (the first: %s), %d went on as "
                  "without the fault\n",
                  what, w.calls, w.failed, w.first, w.tolerated);
    return w;
}

static void test_coordinator_malloc(void **state)
{
    for (int persist = 0; persist < 2; persist++) {
        struct walk w = walk_site(SHARDLM_FAULT_MALLOC, persist);
        assert_true(w.calls >= 20 && w.failed >= 20); /* the wrap is in place */
    }
}

static void test_coordinator_mmap(void **state)
{
    for (int persist = 0; persist < 2; persist++) {
        struct walk w = walk_site(SHARDLM_FAULT_MMAP, persist);
        assert_true(w.calls >= 3 && w.failed >= 3); /* the model file, KV and exchange at least */
    }
}

static void test_coordinator_fallocate(void **state)
{
    for (int persist = 0; persist < 2; persist++) {
        struct walk w = walk_site(SHARDLM_FAULT_FALLOCATE, persist);
        assert_true(w.calls >= 3 && w.failed >= 3); /* weights, KV, exchange, logits rows */
    }
}

static void test_coordinator_mbind(void **state)
{
    for (int persist = 0; persist < 2; persist++) {
        struct walk w = walk_site(SHARDLM_FAULT_MBIND, persist);
        assert_true(w.calls >= 2 && w.failed >= 2); /* weights and KV are bound to the node */
    }
}

static void test_coordinator_io_uring(void **state)
{
    for (int persist = 0; persist < 2; persist++) {
        struct walk w = walk_site(SHARDLM_FAULT_URING, persist);
        assert_true(w.calls >= 1 && w.failed >= 1); /* the load reads through io_uring */
    }
}

/* The worker's Nth mmap fails (SHARDLM_FAULT in the environment it inherits): its attach fails,
 * and the start with it, until N passes the worker's calls. */
static void test_worker_mmap(void **state)
{
    struct walk w = {0};
    long n;
    for (n = 1; n < 64; n++) {
        char spec[64];
        snprintf(spec, sizeof(spec), "mmap=%ld", n);
        setenv("SHARDLM_FAULT", spec, 1);
        struct shardlm_err e = {{0}};
        struct logits got;
        int rc = run(false, &got, &e);
        unsetenv("SHARDLM_FAULT");
        check_run("worker mmap", n, true, rc, &e, &got, &w);
        if (!rc)
            break;
    }
    print_message("worker mmap: runs %ld.. go through, %d before failed cleanly (the first: %s)\n",
                  n, w.failed, w.first);
    assert_true(n < 64);
    assert_true(w.failed >= 3); /* weights, KV, exchange */
}

int main(void)
{
    if (!tu_have_data())
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_coordinator_mmap),   cmocka_unit_test(test_coordinator_fallocate),
        cmocka_unit_test(test_coordinator_mbind),  cmocka_unit_test(test_coordinator_io_uring),
        cmocka_unit_test(test_coordinator_malloc), cmocka_unit_test(test_worker_mmap),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
