/* tests/test_engine.c: the engine as a library (coordinator/engine/engine.h), in this process with
 * real workers on stories260K:
 *
 * reports:  nothing is printed (stderr stays empty); the weight path comes through the log
 *           callback, the layout, heartbeat and step timings too with verbose and only then;
 *           the accessors say what was started;
 * cancel:   a cancel flag set before the start or a step stops it with -ECANCELED, and nothing
 *           is left in the runtime directory. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <libgen.h>
#include <pthread.h>

#include "engine.h"
#include "testutil.h"

static char dir[4096];    /* this test's files */
static char rundir[4200]; /* the engine's runtime directory */
static char model[4300];  /* stories260K at f32 */
static char worker[4300]; /* shardlm-worker beside the shardlm binary */

static int setup(void **state)
{
    char bin[4096];
    tu_mkdtemp(dir, sizeof(dir), "engine");
    tu_path(rundir, sizeof(rundir), "%s/run", dir);
    tu_path(model, sizeof(model), "%s/f32.shlm", dir);
    snprintf(bin, sizeof(bin), "%s", tu_bin());
    tu_path(worker, sizeof(worker), "%s/shardlm-worker", dirname(bin));
    return tu_convert(model, "f32", NULL) ? -1 : 0;
}

static int teardown(void **state)
{
    tu_rmdir(dir);
    return 0;
}

/* What the log callback got: one line per message, "D ", "I " or "W " before it. */
struct capture {
    pthread_mutex_t lock;
    char text[1 << 16];
    size_t len;
};

static void capture_log(void *ctx, enum coord_log_level level, const char *msg)
{
    struct capture *c = ctx;
    pthread_mutex_lock(&c->lock);
    int n = snprintf(c->text + c->len, sizeof(c->text) - c->len, "%c %s\n", "DIW"[level], msg);
    c->len += n > 0 && (size_t)n < sizeof(c->text) - c->len ? (size_t)n : 0;
    pthread_mutex_unlock(&c->lock);
}

static struct coord_engine_opts options(struct capture *c)
{
    memset(c, 0, sizeof(*c));
    pthread_mutex_init(&c->lock, NULL);
    return (struct coord_engine_opts){.model_path = model,
                                      .rundir = rundir,
                                      .worker_path = worker,
                                      .log = capture_log,
                                      .log_ctx = c};
}

static int32_t prompt[] = {1, 403, 407, 261}; /* BOS, then some tokens of the vocabulary */

static void test_reports_through_log(void **state)
{
    for (int verbose = 0; verbose < 2; verbose++) {
        struct capture c;
        struct coord_engine_opts o = options(&c);
        o.verbose = verbose;
        /* stderr into a file for the engine's whole life: it must stay empty */
        char err_path[4300];
        tu_path(err_path, sizeof(err_path), "%s/stderr", dir);
        fflush(stderr);
        int saved = dup(2), fd = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        assert_true(saved >= 0 && fd >= 0);
        dup2(fd, 2);
        close(fd);
        struct shardlm_err e = {{0}};
        struct coord_engine *g = NULL;
        int rc = coord_engine_start(&g, &o, &e);
        struct coord_seq_step s = {.n_tokens = 4, .tokens = prompt};
        int step = rc ? rc : coord_engine_step(g, &s, 1, &e);
        struct coord_rank_info ri = {0};
        if (!rc) {
            assert_int_equal(coord_engine_n_ranks(g), 1);
            assert_int_equal(coord_engine_model(g)->hdr->cfg.vocab_size, 512);
            assert_string_equal(coord_engine_rundir(g), rundir);
            assert_string_equal(coord_engine_model_path(g), model);
            assert_int_equal(coord_engine_n_seqs(g), 1);
            assert_true(coord_engine_logit_rows(g) >= 1);
            assert_true(coord_engine_exchange_bytes(g) > 0);
            assert_true(coord_engine_stats(g)->ready_ns > coord_engine_stats(g)->start_ns);
            coord_engine_rank(g, 0, &ri);
            assert_true(ri.isa[0]); /* it lives in the engine */
        }
        coord_engine_stop(g);
        fflush(stderr);
        dup2(saved, 2);
        close(saved);
        size_t len = 0;
        char *printed = tu_slurp(err_path, &len);
        if (rc || step)
            fprintf(stderr, "start %d, step %d: %s\n", rc, step, e.msg);
        assert_int_equal(rc, 0);
        assert_int_equal(step, 0);
        assert_true(ri.pid > 0 && ri.weights_bytes > 0 && ri.kv_bytes > 0);
        assert_non_null(printed);
        if (len)
            fprintf(stderr, "printed on stderr:\n%s", printed);
        assert_int_equal(len, 0);
        free(printed);
        assert_non_null(strstr(c.text, "I weights f32; kernels "));
        static const char *debug[] = {"D coordinator listens on ipc://", "D rank 0 node ",
                                      "D heartbeat rtt ", "D step 1 prefill tokens 4 wall "};
        for (int i = 0; i < 4 && verbose; i++)
            assert_non_null(strstr(c.text, debug[i]));
        if (!verbose)
            assert_true(c.text[0] != 'D' && !strstr(c.text, "\nD "));
        assert_int_equal(tu_count_run_files(rundir), 0);
    }
}

/* A cancel flag set before the start, or before a step: -ECANCELED, nothing left behind. */
static void test_cancel(void **state)
{
    struct capture c;
    struct coord_engine_opts o = options(&c);
    volatile sig_atomic_t cancel = 1;
    o.cancel = &cancel;
    o.load.no_persist = true; /* a load each time: its cancel check too */
    struct shardlm_err e = {{0}};
    struct coord_engine *g = (struct coord_engine *)&e; /* start must set it to NULL */
    uint64_t t0 = shardlm_now_ns();
    assert_int_equal(coord_engine_start(&g, &o, &e), -ECANCELED);
    assert_null(g);
    assert_string_equal(e.msg, "cancelled");
    assert_true(shardlm_now_ns() - t0 < 3000000000ull); /* no timeout waited out */
    assert_int_equal(tu_count_run_files(rundir), 0);
    assert_false(tu_workers_alive(rundir));

    o.load.no_persist = false;
    cancel = 0;
    assert_int_equal(coord_engine_start(&g, &o, &e), 0);
    struct coord_seq_step s = {.n_tokens = 4, .tokens = prompt};
    assert_int_equal(coord_engine_step(g, &s, 1, &e), 0);
    cancel = 1;
    s = (struct coord_seq_step){.pos = 4, .n_tokens = 1, .tokens = prompt + 1};
    assert_int_equal(coord_engine_step(g, &s, 1, &e), -ECANCELED);
    coord_engine_stop(g);
    assert_int_equal(tu_count_run_files(rundir), 0);
    assert_false(tu_workers_alive(rundir));
}

int main(void)
{
    if (!tu_have_data())
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reports_through_log),
        cmocka_unit_test(test_cancel),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
